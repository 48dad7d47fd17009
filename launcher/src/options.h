// dist-launch's command line, declared: every option of a job as the text it was given (argv, or
// its PET_<NAME> variable), before any of it means anything. config_from_options.h gives it
// meaning; cli.cc runs the two, as torch's run.py keeps get_args_parser() apart from
// config_from_args().
#pragma once

#include <set>
#include <string>
#include <vector>

#include "command_line.h"
#include "dist/contract/worker_contract.h"
#include "hosts_options.h"
#include "job_token.h"
#include "warm_options.h"

namespace dist::launcher {

struct RawOptions {
  // Nodes and workers.
  std::string nnodes = "1";
  std::string nproc_per_node = "1";
  std::string node_rank = "0";
  std::string role = "default";
  // Rendezvous.
  std::string master_addr = "127.0.0.1";
  std::string master_port;
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;
  std::string rdzv_id = "none";
  std::string rdzv_conf;
  std::string local_addr;
  bool standalone = false;
  TokenOptions token;
  // Lifecycle.
  std::string max_restarts = "0";
  std::string restart_policy = "group";
  std::string in_place_timeout =  // seconds
      std::to_string(worker_contract::kDefaultInPlaceTimeout.count() / 1000);
  std::string monitor_interval = "0.1";  // accepted for torchrun compatibility
  std::string start_method = "spawn";    // (the same)
  std::string event_log_handler = "null";
  std::string shutdown_timeout;  // empty: TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30
  std::string exit_barrier_timeout = "300";
  std::string signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  // The worker command.
  bool module = false;
  bool no_python = false;
  bool run_path = false;
  // Logs and console.
  std::string log_dir;
  std::string redirects = "0";
  std::string tee = "0";
  std::string log_line_prefix_template;
  std::string console_prefix = "all";
  std::string local_ranks_filter;
  std::string duplicate_stdout_filters;
  std::string duplicate_stderr_filters;
  std::string logs_specs;
  // Devices and placement.
  std::string devices;
  bool virtual_local_rank = false;
  std::string numa_binding;
  std::string cpu_bind;
  // Watchdogs and telemetry.
  std::string worker_heartbeat_timeout = "0";
  std::string hang_timeout = "auto";
  bool no_step_hook = false;
  std::string event_log;
  std::string metrics_port;
  std::string metrics_addr;
  std::string metrics_token_file;
  // Warm restarts and snapshots (--warm-restart, --preload, --snapshot-memory, --snapshot-dir).
  WarmFlags warm;
  // Several hosts from one command.
  HostsFlags hosts;
  std::string print_completion;

  // Filled by the parse (CommandLine::Parsed): the training script and its arguments; the command
  // line with abbreviated options written out; the long names (both spellings) of every option
  // given, on the command line or in its PET_ variable.
  std::vector<std::string> script_and_args;
  // A `--` ended the options before the script: a second one after it is the script's (argparse
  // keeps it then; one right after the script it drops).
  bool script_after_dash_dash = false;
  std::vector<std::string> expanded_args;
  std::set<std::string> given;
  bool was_given(const std::string& name) const { return given.contains(name); }
};

// Declares every option on `app`, each bound to its field of `raw`.
void declare_options(CommandLine& app, RawOptions& raw);

}  // namespace dist::launcher
