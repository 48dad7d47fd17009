// One command for many hosts (dist-launch --hosts a:2,b:2 / --hostfile F): the launching process
// is the job. It hosts the rendezvous store, starts one agent per host (`dist-launch remote-agent`
// over ssh, all at once; directly, as a child process, for this host when it is listed), shows
// every host's output, forwards its signals to every agent, and ends with the job's exit code.
//
// Static rendezvous: a host's node rank is its place in the list, and each agent gets its node
// rank, the node count, the store's address and the run id on its command line (agent_launch.h
// says how that travels). A worker's failure ends or restarts the round on every host as in any
// static job. A host the launcher loses (ssh failed, the agent died, the connection dropped) ends
// the job: every other agent is told to stop.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dist/store/server.h"

namespace dist::launcher {

struct JobHost {
  std::string name;          // as ssh takes it: a name, an address, user@host, an ssh_config alias
  int slots = 1;             // workers, unless --nproc-per-node says otherwise
  std::vector<int> devices;  // slots chosen by --include/--exclude (device indices); empty: all
};

// The OpenSSH client's command line: `<program> -T -x -o BatchMode=yes [-F config_file]
// [-o option]... [-p port] -o ServerAlive... -- <host> <command>`.
struct SshOptions {
  std::string program = "ssh";
  std::string config_file;           // -F; empty: the user's own (~/.ssh/config)
  std::optional<int> port;           // -p
  std::vector<std::string> options;  // each one -o (ControlMaster=auto, User=..., ...)
};

struct HostsJobConfig {
  std::vector<JobHost> hosts;  // node ranks in this order
  SshOptions ssh;
  std::string remote_command = "dist-launch";  // on each host's PATH, or a path
  // The agents' own options (dist-launch's, less the ones the launcher sets: nodes, store, run
  // id), then the script and its arguments.
  std::vector<std::string> agent_options;
  std::vector<std::string> script_and_args;
  bool nproc_given = false;    // --nproc-per-node in agent_options: slots do not set it
  bool devices_given = false;  // --devices in agent_options: a slot selection cannot
  std::string rdzv_conf;       // the user's --rdzv-conf, forwarded with is_host=0 added
  std::string run_id;
  // How the hosts reach this one; empty: the address their ssh connection came from.
  std::string master_addr;
  std::optional<std::uint16_t> master_port;        // the store's; none: a free one
  std::map<std::string, std::string> environment;  // exported to every agent
  std::string working_directory;                   // every agent's (and so its workers')
  std::string token;  // the job's store token, sent to every agent; empty: one is generated
  // Who may use the store without the token (PyTorch workers cannot authenticate).
  store::UnauthenticatedPolicy unauthenticated = store::UnauthenticatedPolicy::kKnownHosts;
  std::vector<int> signals_to_handle;  // forwarded to every agent
  std::chrono::milliseconds shutdown_timeout{30'000};
  // The store's TCP keepalive on the agents' connections, and ssh's ServerAlive*: the agents' own
  // (given, or their defaults for the job's shape: agent/include/dist/agent/config.h).
  int keep_alive_interval_seconds = 1;
  int keep_alive_max_attempt = 30;
};

// Whether `host` names this machine without ssh: localhost, 127.0.0.1, ::1, or its host name
// (short or as gethostname() gives it). Other loopback addresses (127.0.0.2) go through ssh.
bool is_launching_host(const std::string& host);

// Runs the job to its end. Returns 0 when every host's workers succeeded; the job's exit code when
// it failed (the root cause worker's, as a single agent returns it); 1 when a host could not be
// started or was lost; 128 + signal when this process was told to stop.
int run_hosts_job(const HostsJobConfig& config);

}  // namespace dist::launcher
