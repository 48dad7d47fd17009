// The agent's driver (lifecycle/agent.cc): one Agent, its state machine and its event loop, run
// to the end. run_agent() (lifecycle/run_agent.cc) puts the process around it.
#pragma once

#include <functional>

#include "dist/agent/config.h"
#include "processes/janitor.h"
#include "processes/job_processes.h"

namespace dist::agent {

// How an agent's run ended.
struct AgentEnd {
  int exit_code = 0;
  // Cut off from the job's store (a dynamic rendezvous): the node rejoins the job with a new
  // agent (config.rejoining) once the store answers again.
  bool rejoins = false;
};

// Runs the job on this node, to the end of this agent's part in it. `stopped` runs once every
// worker and helper is stopped and reaped, before the agent tears down (its run directory, store
// and console). `janitor` may be null (it could not start).
AgentEnd drive_agent(const LaunchConfig& config, const AgentId& agent_id, Janitor* janitor,
                     const std::function<void(const AgentEnd&)>& stopped);

}  // namespace dist::agent
