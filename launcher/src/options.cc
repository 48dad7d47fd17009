#include "options.h"

#include "completion.h"
#include "rdzv_conf.h"

namespace dist::launcher {
namespace {

// A valued option that may also come from PET_<env>, as torchrun's do.
CommandLine::Option& option(CommandLine& app, std::string_view names, std::string& target,
                            std::string_view env, std::string help) {
  return app.text(names, target, std::move(help)).env("PET_" + std::string(env));
}

void declare_nodes_and_rendezvous(CommandLine& app, RawOptions& r) {
  option(app, "--nnodes", r.nnodes, "NNODES", "Number of nodes, N or MIN:MAX").show_default();
  option(app, "--nproc-per-node,--nproc_per_node", r.nproc_per_node, "NPROC_PER_NODE",
         "Workers per node: an integer, or cpu, gpu (CUDA or ROCm), xpu (Intel) or auto (the "
         "GPUs, else the CPUs)")
      .show_default();
  option(app, "--node-rank,--node_rank", r.node_rank, "NODE_RANK",
         "This node's rank (static rendezvous)")
      .show_default();
  option(app, "--master-addr,--master_addr", r.master_addr, "MASTER_ADDR",
         "Address of node rank 0 (static rendezvous)")
      .show_default();
  option(app, "--master-port,--master_port", r.master_port, "MASTER_PORT",
         "Port of the store on node rank 0 (default 29500 with several nodes); on one node, "
         "unset or 0: a free port");
  option(app, "--rdzv-backend,--rdzv_backend", r.rdzv_backend, "RDZV_BACKEND",
         "static, c10d (dynamic: elastic --nnodes MIN:MAX, node ranks assigned), or etcd-v3 "
         "(dynamic, over an etcd cluster: --rdzv-endpoint h1:2379,h2:2379,...)")
      .show_default();
  option(app, "--rdzv-endpoint,--rdzv_endpoint", r.rdzv_endpoint, "RDZV_ENDPOINT",
         "host[:port] of the rendezvous store (c10d; port 29400 by default, 0 on one node: a "
         "free one); implies c10d");
  option(app, "--rdzv-id,--rdzv_id", r.rdzv_id, "RDZV_ID", "Job id shared by all nodes")
      .show_default();
  option(app, "--rdzv-conf,--rdzv_conf", r.rdzv_conf, "RDZV_CONF",
         "key=value,...: " + rdzv_conf_keys());
  app.flag("--standalone", r.standalone, "Single node, store on a free port, random run id")
      .env("PET_STANDALONE");
  add_token_options(app, r.token);
  option(app, "--role", r.role, "ROLE", "Worker role name").show_default();
  option(app, "--local-addr,--local_addr", r.local_addr, "LOCAL_ADDR",
         "This node's address as published to the others");
}

void declare_lifecycle(CommandLine& app, RawOptions& r) {
  option(app, "--max-restarts,--max_restarts", r.max_restarts, "MAX_RESTARTS",
         "Restarts of the worker group before failing")
      .show_default();
  option(app, "--restart-policy,--restart_policy", r.restart_policy, "RESTART_POLICY",
         "What a worker's failure does: group (stop every worker, restart the group) or in-place "
         "(replace the failed worker alone; the others keep running and rebuild their group with "
         "it; a failure during recovery, or several at once, restart the group). Each "
         "replacement counts against --max-restarts")
      .show_default();
  option(app, "--in-place-timeout,--in_place_timeout", r.in_place_timeout, "IN_PLACE_TIMEOUT",
         "Seconds an in-place recovery may take, from the failure to the group's word that it "
         "recovered; past it the whole group restarts. The workers bound their wait for the new "
         "group and its state by it too")
      .show_default();
  option(app, "--monitor-interval,--monitor_interval", r.monitor_interval, "MONITOR_INTERVAL",
         "Accepted for torchrun compatibility; failures are seen at once (SIGCHLD), not polled")
      .show_default();
  option(app, "--start-method,--start_method", r.start_method, "START_METHOD",
         "Accepted for torchrun compatibility (workers are always fresh processes)")
      .choices({"spawn", "fork", "forkserver"});
  option(app, "--event-log-handler,--event_log_handler", r.event_log_handler, "EVENT_LOG_HANDLER",
         "torchrun's Python event handler: null (the default) and dynamic_rendezvous are "
         "accepted; dist-launch emits no Python events")
      .show_default();
  option(app, "--signals-to-handle,--signals_to_handle", r.signals_to_handle, "SIGNALS_TO_HANDLE",
         "Signals the agent catches and forwards to every worker. SIGTERM, SIGINT, SIGHUP and "
         "SIGQUIT then stop the job. Add SIGUSR1,SIGUSR2 (Slurm's warning before a time limit or "
         "preemption): those are forwarded to the workers and the job keeps running. Workers see "
         "the list in TORCHELASTIC_SIGNALS_TO_HANDLE")
      .show_default();
  option(app, "--exit-barrier-timeout,--exit_barrier_timeout", r.exit_barrier_timeout,
         "EXIT_BARRIER_TIMEOUT",
         "Seconds a node whose workers succeeded waits for the other nodes' (several nodes)")
      .show_default();
  option(app, "--shutdown-timeout,--shutdown_timeout", r.shutdown_timeout, "SHUTDOWN_TIMEOUT",
         "Seconds between the stop signal and SIGKILL (default: TORCH_ELASTIC_SHUTDOWN_TIMEOUT, "
         "else 30)");
  app.flag("-m,--module", r.module, "Run the script as a Python module (python -m)")
      .env("PET_MODULE");
  app.flag("--no-python,--no_python", r.no_python,
           "Run the script as an executable, not through Python (C++ workers)")
      .env("PET_NO_PYTHON");
  app.flag("--run-path,--run_path", r.run_path, "Accepted; the script runs in a fresh Python")
      .env("PET_RUN_PATH");
}

void declare_output(CommandLine& app, RawOptions& r) {
  option(app, "--log-dir,--log_dir", r.log_dir, "LOG_DIR",
         "Write attempt_<n>/<local_rank>/{stdout,stderr}.log and error.json here");
  option(app, "-r,--redirects", r.redirects, "REDIRECTS",
         "Streams sent to log files only: 0 none, 1 stdout, 2 stderr, 3 both, or RANK:V,...")
      .show_default();
  option(app, "-t,--tee", r.tee, "TEE",
         "Streams sent to log files and the console (same values; tee wins over --redirects)")
      .show_default();
  option(app, "--log-line-prefix-template,--log_line_prefix_template", r.log_line_prefix_template,
         "LOG_LINE_PREFIX_TEMPLATE",
         "Console prefix of each worker line, e.g. '[${rank}]: ' (${role_name}, ${rank}, "
         "${local_rank}, ${hostname}); default '[${role_name}${local_rank}]:', or "
         "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
  option(app, "--console-prefix,--console_prefix", r.console_prefix, "CONSOLE_PREFIX",
         "Which console lines carry that prefix: all (default), tee (torchrun's console: only "
         "tee'd streams; the others pass unchanged) or none")
      .show_default();
  option(app, "--local-ranks-filter,--local_ranks_filter", r.local_ranks_filter,
         "LOCAL_RANKS_FILTER",
         "Only these local ranks reach the console, e.g. 0 or 0,2 (the log files keep all)");
  option(app, "--duplicate-stdout-filters,--duplicate_stdout_filters", r.duplicate_stdout_filters,
         "DUPLICATE_STDOUT_FILTERS",
         "Tee'd stdout lines containing any of these (a,b; ',,' for a comma) are also copied to "
         "attempt_<n>/filtered_stdout.log");
  option(app, "--duplicate-stderr-filters,--duplicate_stderr_filters", r.duplicate_stderr_filters,
         "DUPLICATE_STDERR_FILTERS", "The same for stderr, to attempt_<n>/filtered_stderr.log");
  app.text("--logs-specs,--logs_specs", r.logs_specs,
           "torchrun's LogsSpecs entry point: only 'default' (torchrun's layout) exists");
}

void declare_resources_and_health(CommandLine& app, RawOptions& r) {
  option(app, "--devices", r.devices, "DEVICES",
         "One device per worker, e.g. 0,2,5 (indices of the GPUs this node sees): local rank i "
         "gets the i-th as its only CUDA_VISIBLE_DEVICES (HIP_VISIBLE_DEVICES on AMD)");
  app.flag("--virtual-local-rank,--virtual_local_rank", r.virtual_local_rank,
           "Each worker sees only its own GPU, as device 0, and LOCAL_RANK=0")
      .env("PET_VIRTUAL_LOCAL_RANK");
  option(app, "--numa-binding,--numa_binding", r.numa_binding, "NUMA_BINDING",
         "Bind each worker's CPUs and memory: node, socket, exclusive or core-complex, by its "
         "GPU's NUMA node (without GPUs: by local rank over the NUMA nodes)");
  option(app, "--cpu-bind,--cpu_bind", r.cpu_bind, "CPU_BIND",
         "core (each worker its own cores), none, or one CPU list per local rank: '0-3;4-7'");
  option(app, "--worker-heartbeat-timeout", r.worker_heartbeat_timeout, "WORKER_HEARTBEAT_TIMEOUT",
         "Seconds a worker that called dist::sdk::heartbeat() may stay silent before it is killed "
         "as hung and the group restarts (0: off)")
      .show_default();
  option(app, "--hang-timeout", r.hang_timeout, "HANG_TIMEOUT",
         "Seconds a worker that counts steps (torch's optimizer steps, dist::sdk::step()) may make "
         "no progress before dist-launch looks where every rank is: auto (10x the p99 of its "
         "step times, at least 30 s; reports, and ends a rank only on proof that it cannot go "
         "on), seconds (the cause is ended), or 0 (off)")
      .show_default();
  app.flag("--no-step-hook", r.no_step_hook,
           "Do not put dist-launch's progress hook (optimizer steps, stacks on a hang) into "
           "Python workers; they may still call dist_launch.progress.step()")
      .env("PET_NO_STEP_HOOK");
  option(app, "--event-log", r.event_log, "EVENT_LOG",
         "Append the job's events to this file, one JSON object per line");
  option(app, "--metrics-port", r.metrics_port, "METRICS_PORT",
         "Serve Prometheus metrics at http://HOST:PORT/metrics and the status page at / (0: a "
         "free port, logged)");
  option(app, "--metrics-addr", r.metrics_addr, "METRICS_ADDR",
         "The address --metrics-port listens on, or a host name (0.0.0.0 or ::: every "
         "interface). Default: 127.0.0.1 when the job is one node, else the node's own address "
         "(--local-addr, else its host name)");
  option(app, "--metrics-token-file", r.metrics_token_file, "METRICS_TOKEN_FILE",
         "A file holding a token (chmod 600) the status page, status.json and /metrics then ask "
         "for: Authorization: Bearer TOKEN (Prometheus: authorization: credentials_file), or "
         "?token=TOKEN in the page's address. torch's health check never asks for it. Default: "
         "$DIST_LAUNCH_METRICS_TOKEN_FILE");
}

}  // namespace

// Each concern's options under its own heading in --help.
void declare_options(CommandLine& app, RawOptions& raw) {
  app.text("--print-completion,--print_completion", raw.print_completion,
           std::string("Print a completion script for ") + kCompletionShells +
               " and exit, e.g. eval \"$(dist-launch --print-completion bash)\"");
  app.group("Nodes and rendezvous");
  declare_nodes_and_rendezvous(app, raw);
  app.group("Restarts and the worker command");
  declare_lifecycle(app, raw);
  app.group("Logs and console");
  declare_output(app, raw);
  app.group("Devices, placement and health");
  declare_resources_and_health(app, raw);
  app.group("Several hosts",
            "One command for the whole job: an agent per host over ssh; this command hosts the "
            "store");
  add_hosts_options(app, raw.hosts);
  app.group("Warm restarts and snapshots");
  add_warm_options(app, raw.warm);
}

}  // namespace dist::launcher
