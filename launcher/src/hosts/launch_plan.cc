#include "hosts/launch_plan.h"

namespace dist::launcher {
using agent::AgentLaunch;
namespace {

// A host name inside a log line prefix template: '$' is the template's (log_line_prefix.h).
std::string escaped_for_template(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '$') out.push_back('$');
    out.push_back(c);
  }
  return out;
}

std::string joined(const std::vector<int>& numbers) {
  std::string text;
  for (int n : numbers) text += (text.empty() ? "" : ",") + std::to_string(n);
  return text;
}

}  // namespace

std::string host_log_line_prefix_template(const std::string& host) {
  return "[${role_name}${rank}@" + escaped_for_template(host) + "]:";
}

AgentLaunch plan_agent_launch(const HostsJobConfig& config, std::size_t node_rank,
                              std::uint16_t store_port, const std::string& launcher_host,
                              bool local) {
  const JobHost& host = config.hosts.at(node_rank);
  AgentLaunch launch;
  launch.host = host.name;
  launch.node_rank = static_cast<int>(node_rank);
  launch.options = config.agent_options;
  auto add = [&](const std::string& flag, const std::string& value) {
    launch.options.push_back(flag);
    launch.options.push_back(value);
  };
  const std::size_t nodes = config.hosts.size();
  if (nodes > 1) {  // one node hosts its own store, as any single-node job
    add("--nnodes", std::to_string(nodes));
    add("--node-rank", std::to_string(node_rank));
    add("--master-port", std::to_string(store_port));
    add("--rdzv-conf", config.rdzv_conf.empty() ? "is_host=0" : config.rdzv_conf + ",is_host=0");
    if (local) {
      add("--master-addr", "127.0.0.1");
    } else if (!config.master_addr.empty()) {
      add("--master-addr", config.master_addr);
    } else {  // the agent takes the address its ssh connection came from
      launch.launcher_host = launcher_host;
    }
  }
  add("--rdzv-id", config.run_id);
  if (!config.nproc_given) {
    add("--nproc-per-node",
        std::to_string(host.devices.empty() ? host.slots : static_cast<int>(host.devices.size())));
  }
  if (!host.devices.empty()) add("--devices", joined(host.devices));
  launch.script = config.script_and_args;
  launch.environment = config.environment;
  launch.working_directory = config.working_directory;
  launch.token = config.token;
  launch.log_line_prefix_template = host_log_line_prefix_template(host.name);
  launch.print_failure_report = node_rank == 0;  // one report: every node's is the same
  return launch;
}

}  // namespace dist::launcher
