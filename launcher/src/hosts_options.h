// dist-launch's options for a job on many hosts (--hosts, --hostfile, ssh, exported variables), as
// cli.cc adds them to its command line, and the job they describe.
#pragma once

#include <string>
#include <vector>

#include "command_line.h"
#include "dist/agent/config.h"
#include "dist/launcher/hosts_job.h"

namespace dist::launcher {

struct HostsFlags {
  std::string hosts, hostfile, include, exclude;
  std::string ssh_program = "ssh";
  std::string ssh_config;
  int ssh_port = 0;
  std::vector<std::string> ssh_options;
  std::vector<std::string> exports;          // VAR or VAR=VALUE, each
  std::vector<std::string> export_prefixes;  // NCCL_, ...
  std::string remote_dist_launch = "dist-launch";
  bool given() const { return !hosts.empty() || !hostfile.empty(); }
};

// Adds the options, in a group of their own. They have no PET_ variables: an agent started by
// --hosts must never take its environment for a request to start more hosts.
void add_hosts_options(CommandLine& app, HostsFlags& flags);

struct RawOptions;

// The job over ssh, from the command line: `raw` as given (the agents get its options, less the
// launcher's own), `parsed` what config_from_options read of it before anything specific to this
// machine (the store's liveness, signals, shutdown timeout). Throws HostsError for what cannot be
// run.
HostsJobConfig hosts_job_config(const RawOptions& raw, const agent::LaunchConfig& parsed);

}  // namespace dist::launcher
