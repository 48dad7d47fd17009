// The agent's driver (lifecycle/agent.cc): one Agent, its state machine and its event loop, run
// to the end. run_agent() (lifecycle/run_agent.cc) puts the process around it.
#pragma once

#include <functional>

#include "dist/agent/config.h"
#include "processes/janitor.h"
#include "processes/job_processes.h"

namespace dist::agent {

// Runs the job on this node and returns the agent's exit code. `stopped` runs once every worker
// and helper is stopped and reaped, before the agent tears down (its run directory, store and
// console). `janitor` may be null (it could not start).
int drive_agent(const LaunchConfig& config, const AgentId& agent_id, Janitor* janitor,
                const std::function<void()>& stopped);

}  // namespace dist::agent
