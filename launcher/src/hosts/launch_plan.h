// What dist-launch --hosts tells each host's agent (agent_launch.h): its command line (node rank,
// node count, the store, the run id, its workers), the exported variables, the working directory,
// the token and the prefix of its workers' lines. Pure: the launcher's decisions, tested alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "dist/agent/agent_launch.h"
#include "dist/launcher/hosts_job.h"

namespace dist::launcher {

// The prefix of every worker line, "[<role><global rank>@<host>]:" (torchrun's default, with the
// global rank and the host: every host's lines share one console).
std::string host_log_line_prefix_template(const std::string& host);

// Host `node_rank`'s launch. `store_port`: the launcher's store (several hosts); `local`: the agent
// runs on this machine, started directly (the store is on loopback).
agent::AgentLaunch plan_agent_launch(const HostsJobConfig& config, std::size_t node_rank,
                                     std::uint16_t store_port, const std::string& launcher_host,
                                     bool local);

}  // namespace dist::launcher
