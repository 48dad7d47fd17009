// The process around the agent: no descendant outlives the job (job_processes.h). The agent is a
// subreaper, and its janitor, started before the agent allocates much or starts a thread, cleans
// up if the agent is killed.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "dist/agent/agent.h"
#include "lifecycle/agent_driver.h"
#include "processes/janitor.h"
#include "processes/job_processes.h"
#include "processes/process.h"

namespace dist::agent {

int run_agent(const LaunchConfig& config) {
  const AgentId agent_id = AgentId::generate();
  spdlog::debug("agent id {}: every process of this job has {}={} in its environment",
                agent_id.id(), kAgentIdVariable, agent_id.value());
  if (!become_subreaper()) {
    spdlog::warn(
        "cannot become a child subreaper ({}): processes the workers start may outlive "
        "the job",
        std::strerror(errno));
  }
  std::optional<Janitor> janitor;
  try {
    janitor.emplace(agent_id.id());
  } catch (const std::exception& e) {
    spdlog::warn("{}: processes the workers start may outlive a SIGKILL of this agent", e.what());
  }
  // STOPPING ends with no descendant; whatever path missed one, nothing stays.
  const auto kill_leftovers = [&] {
    if (!has_children()) return;
    for (const ProcessRef& p : job_processes(agent_id.id(), janitor ? janitor->pid() : -1)) {
      signal_process(p, SIGKILL);
    }
  };
  const auto stopped = [&](const AgentEnd& end) {
    kill_leftovers();
    // Nothing is left for the janitor to clean: it exits while this agent tears down (its run
    // directory, store and console), and is reaped last.
    if (janitor && !end.rejoins) janitor->dismiss();
  };
  AgentEnd end = drive_agent(config, agent_id, janitor ? &*janitor : nullptr, stopped);
  // Cut off from the job's store, the node rejoins the job as a new agent: the store's host is
  // elsewhere, and one that refuses the connection is gone.
  LaunchConfig again = config;
  again.rejoining = true;
  again.is_host = false;
  while (end.rejoins) {
    if (config.rdzv_backend == RendezvousBackend::kEtcdV3) {
      spdlog::info("rejoining the job over etcd: waiting for its members to answer");
    } else {
      spdlog::info("rejoining the job at {}: waiting for its store to answer", config.master_addr);
    }
    end = drive_agent(again, agent_id, janitor ? &*janitor : nullptr, stopped);
  }
  kill_leftovers();
  return end.exit_code;  // ~Janitor reaps it
}

}  // namespace dist::agent
