// The agent's whole configuration: what the launcher produces from argv, PET_* and SLURM_*, and the
// only thing the agent reads. Durations carry their unit in the name.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dist/contract/worker_contract.h"
#include "dist/store/server.h"

namespace dist::agent {

// Which worker streams go to files (and not the console) or to both: torchrun's -r / -t values.
struct StreamSelection {
  bool stdout_stream = false;
  bool stderr_stream = false;
  bool any() const { return stdout_stream || stderr_stream; }
};

// Which accelerator each worker gets (agent/src/resources/devices.h). Neither field: every worker
// sees what the agent sees, as with torchrun.
struct DeviceOptions {
  std::vector<int> devices;         // --devices: indices of the devices the agent sees, one each
  bool virtual_local_rank = false;  // --virtual-local-rank: own device only, LOCAL_RANK=0
};

// CPU and memory binding of each worker (agent/src/resources/placement.h): torchrun's
// --numa-binding modes, or --cpu-bind (one core set per worker, or explicit CPU lists). At most one
// of the two.
enum class NumaBinding { kNone, kNode, kSocket, kExclusive, kCoreComplex };
enum class CpuBind { kNone, kCore, kList };
struct PlacementOptions {
  NumaBinding numa_binding = NumaBinding::kNone;
  CpuBind cpu_bind = CpuBind::kNone;
  std::vector<std::vector<int>> cpu_lists;  // kList: local rank i's CPUs
  bool binds() const { return numa_binding != NumaBinding::kNone || cpu_bind != CpuBind::kNone; }
};

// Hang watchdogs (agent/src/health/worker_watchdogs.h) and torch's health check.
struct WatchdogOptions {
  bool file_timer = false;  // TORCHELASTIC_ENABLE_FILE_TIMER=1: serve torch's file timer pipe
  std::string timer_file;   // TORCHELASTIC_TIMER_FILE: its path (empty: a fresh one in TMPDIR)
  std::chrono::milliseconds worker_heartbeat_timeout{0};  // --worker-heartbeat-timeout; 0: off
  std::optional<std::uint16_t> health_check_port;  // TORCHELASTIC_HEALTH_CHECK_PORT (0: a free one)
  // --hang-timeout: how long a worker that counts steps may make no progress before the hang
  // detector looks at it (agent/src/health/hang_detector.h). None: automatic (10 x the p99 of its
  // step times, at least 30 s); zero: hang detection off.
  std::optional<std::chrono::milliseconds> hang_timeout;
  bool step_hook = true;  // --no-step-hook off: the progress hook in Python workers (python_hook.h)
};

// The environment variable that names --metrics-token-file's file when the option is not given.
inline constexpr char kMetricsTokenFileVariable[] = "DIST_LAUNCH_METRICS_TOKEN_FILE";

// What the agent tells the outside (agent/src/health/telemetry.h).
struct TelemetryOptions {
  std::string event_log;                      // --event-log: JSON lines appended to this file
  std::optional<std::uint16_t> metrics_port;  // --metrics-port: Prometheus text (0: a free one)
  // --metrics-addr: where the metrics' port listens, an address or a name (0.0.0.0, ::: every
  // interface). Empty: loopback for a job of one node, else the node's own address (local_addr).
  std::string metrics_addr;
  // --metrics-token-file's token: the status page, status.json and /metrics answer only requests
  // that present it (agent/src/health/metrics_access.h); empty: none asked for.
  std::string metrics_token;
};

// Warm restarts and snapshots (agent/src/warm/).
struct WarmOptions {
  bool warm_restart = false;  // --warm-restart: Python workers forked from a preloaded zygote
  std::optional<std::vector<std::string>> preload;  // --preload; none: torch, numpy if installed
  std::uint64_t snapshot_memory_bytes = 0;  // --snapshot-memory; 0: half the free shm (with a dir)
  std::string snapshot_dir;                 // --snapshot-dir: snapshots persisted there too
  int snapshot_replicas = 0;  // --snapshot-replicas: other nodes' agents keeping each rank's newest
  bool snapshots() const {
    return snapshot_memory_bytes > 0 || !snapshot_dir.empty() || snapshot_replicas > 0;
  }
};

// Which worker records carry the prefix on the console. kAll: every one (dist-launch's default:
// interleaved output says whose it is). kTee: only the tee'd streams' (torchrun's console: what
// is neither tee'd nor redirected passes unchanged). kNone: none.
enum class ConsolePrefix { kAll, kTee, kNone };

// Ports torchrun uses when none is given: a static job's store on node rank 0 (--master-port),
// and a c10d rendezvous endpoint's (--rdzv-endpoint HOST).
inline constexpr std::uint16_t kDefaultStaticPort = 29500;
inline constexpr std::uint16_t kDefaultC10dPort = 29400;
// RendezvousConfig::keep_alive_max_attempt's defaults (seconds, at 1 s intervals).
inline constexpr int kElasticKeepAliveMaxAttempt = 8;
inline constexpr int kFixedSizeKeepAliveMaxAttempt = 30;

// --rdzv-backend.
enum class RendezvousBackend { kStatic, kC10d, kEtcdV3 };
// "static", "c10d", "etcd-v3".
const char* backend_name(RendezvousBackend backend);

// --rdzv-backend etcd-v3: the members and the backend's --rdzv-conf keys (docs/ETCD.md).
struct EtcdConfig {
  std::vector<std::string>
      endpoints;         // --rdzv-endpoint's members: host:port, or scheme://host:port
  std::string protocol;  // protocol=http|https, for members given without a scheme
  std::string ca_file;   // cacert, cert, key: as etcdctl's --cacert/--cert/--key
  std::string cert_file;
  std::string key_file;
  std::string user;           // user=, with password_file= (its first line is the password)
  std::string password_file;  // read when the agent connects
  std::string prefix = "/dist-launch";  // etcd_prefix: the job's keys are <prefix>/<run id>/...
  std::optional<std::chrono::milliseconds> unavailable_timeout;  // before a call gives up
  bool spread_over_members = true;  // member_order=spread (a random first member) or given
};

// --restart-policy: what a worker's failure does. kGroup: every worker of the job stops and the
// group restarts (torchrun's behaviour). kInPlace: the failed worker alone is replaced, the others
// keep running and rebuild their process group with it (dist/contract/worker_contract.h says
// how); a failure during that recovery, or several at once, restart the group.
// The agent reads it once (recovery/recovery_policy.h's make_recovery_policy).
enum class RestartPolicy { kGroup, kInPlace };

// A configuration the agent cannot run; what() is one line naming the option and what to change.
// The agent's own checks (devices, placement, the prefix template) throw subclasses of it.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The configuration in parts, one for each room that acts on it; LaunchConfig, the launcher's
// product, is all of them. A room takes the job's shape and its own part (rendezvous/ and store/:
// RendezvousConfig; output/ and the run directory: OutputConfig; workers/: WorkerCommand;
// lifecycle/ and recovery/: LifecycleConfig; health/, resources/, warm/: their option structs
// above). A flag is one field, in the part of the room where it acts.

// The job's shape, which most rooms read: its nodes, its workers per node, its name, the restarts
// it may use.
struct JobConfig {
  int min_nodes = 1;
  int max_nodes = 1;
  int nproc_per_node = 1;
  int node_rank = 0;
  std::string role = "default";
  std::string run_id = "none";
  bool elastic = false;  // dynamic rendezvous (c10d, etcd-v3): --nnodes MIN:MAX, ranks assigned
  int max_restarts = 0;  // group restarts and in-place replacements, counted together
};

// How this node meets the others (rendezvous/, store/). master_addr:master_port is the store's
// endpoint in every mode: static multi-node jobs (node 0's agent hosts it), elastic jobs
// (--rdzv-endpoint) and the workers' MASTER_*.
struct RendezvousConfig {
  std::string master_addr = "127.0.0.1";
  std::optional<std::uint16_t> master_port;  // none: the agent picks a free port
  RendezvousBackend rdzv_backend = RendezvousBackend::kStatic;
  EtcdConfig etcd;         // etcd-v3: each round's node rank 0 hosts the workers' store
  std::string local_addr;  // this node's address as published to the others (empty: hostname)
  std::chrono::milliseconds rdzv_timeout{900'000};      // static: until every node joined
  std::chrono::milliseconds join_timeout{600'000};      // elastic: until a round forms
  std::chrono::milliseconds last_call_timeout{30'000};  // elastic: MIN reached, waiting for more
  // Host the store. Elastic: none hosts it if the endpoint is this machine's. Static: none means
  // node rank 0 hosts it; false, that node connects to master_addr:master_port like the others
  // (a store someone else hosts: dist-launch --hosts).
  std::optional<bool> is_host;
  // This agent is a node's second (or later) on this job: its first, cut off from the store (no
  // answer for the keepalive's length), stopped its workers and left, and the node now rejoins
  // the job (a dynamic rendezvous: it joins the next round, as a newcomer). A store that refuses
  // the connection is gone (the job ended, or its host's agent did): this agent gives up at once.
  bool rejoining = false;
  // Liveness between agents (several nodes): TCP keepalive on their store connections; a node that
  // vanished (a partition, a dead host) is noticed after about interval * max_attempt seconds, a
  // dead agent on a live host at once. By default (launcher: default_keep_alive) a job that goes
  // on without a lost node (--nnodes MIN:MAX, MIN < MAX) notices it within 10 s (1 x 8: a link's
  // flap of a few seconds is still ridden out); a job of a fixed size, which cannot go on without
  // it, gives it 30 s (1 x 30): a network outage of that long (a switch's failover or reboot) is
  // ridden out, as torchrun rides it out, rather than ending the job at 8 s.
  int keep_alive_interval_seconds = 1;
  int keep_alive_max_attempt = kFixedSizeKeepAliveMaxAttempt;
  // Given (--rdzv-conf keep_alive_max_attempt=N): etcd's leases follow it too; by default they
  // stay at interval * 2 (2 s: a lost node is noticed over etcd only when its lease expires,
  // even a dead agent's, and docs/ETCD.md's survivors come back within 3 s).
  bool keep_alive_max_attempt_given = false;
  // How long a node whose workers all succeeded waits for the other nodes' (several nodes).
  std::chrono::milliseconds exit_barrier_timeout{300'000};
  // The job's token (docs/STORE.md, Authentication); empty: none. With one, this agent proves it
  // to the store it joins, and the store it hosts asks every client for it, admitting clients
  // without it (PyTorch workers) by `unauthenticated`. Workers get token_file's path in
  // DIST_LAUNCH_TOKEN_FILE, never the secret; token_file empty (a token generated, or read from
  // stdin): the agent writes one, mode 0600, in its run directory.
  std::string secret;
  std::string token_file;  // absolute
  store::UnauthenticatedPolicy unauthenticated = store::UnauthenticatedPolicy::kKnownHosts;
};

// Where the workers' output goes (output/, workers/worker_output.h, the run directory).
struct OutputConfig {
  std::string log_dir;        // empty: a temporary directory, removed at exit
  StreamSelection redirects;  // to files only (every local rank...)
  StreamSelection tee;        // to files and the console
  std::map<int, StreamSelection> redirects_by_rank;  // (...unless given for that local rank)
  std::map<int, StreamSelection> tee_by_rank;
  std::set<int> local_ranks_filter;  // empty: every local rank reaches the console
  // The console prefix: torchrun's --log-line-prefix-template (${role_name}, ${rank},
  // ${local_rank}, ${hostname}; empty: "[<role><local_rank>]:"), and which records carry it.
  std::string log_line_prefix_template;
  ConsolePrefix console_prefix = ConsolePrefix::kAll;
  // torchrun's --duplicate-stdout-filters / --duplicate-stderr-filters: the tee'd lines (of the
  // local ranks shown) that contain any of these are copied, prefixed, to
  // attempt_<n>/filtered_stdout.log / filtered_stderr.log. Empty: no such file.
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;
  // The failure report on the console. dist-launch --hosts shows one agent's (node rank 0's): every
  // node's console is the same one there.
  bool print_failure_report = true;
  // The terminal the workers' lines end on, (columns, lines), where it is not this agent's stdout:
  // dist-launch --hosts gives each host's agent the launcher's. None: this agent's stdout, when
  // that is a terminal.
  std::optional<std::pair<int, int>> relayed_terminal_size;

  StreamSelection redirects_for(int local_rank) const {
    auto it = redirects_by_rank.find(local_rank);
    return it == redirects_by_rank.end() ? redirects : it->second;
  }
  StreamSelection tee_for(int local_rank) const {
    auto it = tee_by_rank.find(local_rank);
    return it == tee_by_rank.end() ? tee : it->second;
  }
  bool writes_log_files() const {
    return !log_dir.empty() || redirects.any() || tee.any() || !redirects_by_rank.empty() ||
           !tee_by_rank.empty();
  }
  bool shows_on_console(int local_rank) const {
    return local_ranks_filter.empty() || local_ranks_filter.contains(local_rank);
  }
};

// What each worker runs (workers/, warm/).
struct WorkerCommand {
  // argv[0] is what to exec (python, or the executable with --no-python).
  std::vector<std::string> worker_argv;
  std::string script_name;      // for the failure report's title
  bool python_workers = false;  // worker_argv is `python -u SCRIPT|-m MODULE ...`
  // OMP_NUM_THREADS was unset: workers get 1, or their bound core count when placement binds.
  bool omp_threads_defaulted = false;
};

// What a failure and a signal do (lifecycle/, recovery/).
struct LifecycleConfig {
  RestartPolicy restart_policy = RestartPolicy::kGroup;
  // --in-place-timeout: from a worker's failure to its group's word that it recovered in place
  // (or a regroup's); past it the whole group restarts. The workers get it too (their wait for the
  // group and its state).
  std::chrono::milliseconds in_place_timeout = worker_contract::kDefaultInPlaceTimeout;
  std::chrono::milliseconds shutdown_timeout{30'000};
  std::vector<int> signals_to_handle;  // forwarded to every worker
  // A pipe from the launcher that started this agent (dist-launch --hosts; agent_launch.h): its
  // control lines act as signals, its end (the launcher, or its ssh connection, gone) as SIGHUP.
  // -1: none.
  int launcher_fd = -1;
};

struct LaunchConfig : JobConfig, RendezvousConfig, OutputConfig, WorkerCommand, LifecycleConfig {
  DeviceOptions devices;
  PlacementOptions placement;

  WatchdogOptions watchdogs;
  TelemetryOptions telemetry;
  WarmOptions warm;
};

// What the agent would refuse only once started, checked now: each local rank's devices and
// CPU/NUMA placement (planned as the agent will plan them), the log line prefix template, and a
// restart policy the job's shape allows. Throws ConfigError.
void check(const LaunchConfig& config);

// Bounds no real job reaches, held so that a typo's value is a usage error, not the memory of a
// worker table (or a list of one store key per node) the size of the number.
inline constexpr int kMaxWorkersPerNode = 4096;
inline constexpr int kMaxNodes = 65536;

// --nproc-per-node: an integer (at most kMaxWorkersPerNode); cpu (this machine's CPUs); gpu (the
// CUDA or ROCm devices this process may use; with --devices, one worker per listed device); xpu
// (Intel GPUs); auto (the GPUs, else the XPUs, else the CPUs). Throws ConfigError when the text is
// none of these, or no such device exists.
int resolve_nproc_per_node(const std::string& text, const DeviceOptions& devices);

// A CPU list as taskset and cgroups write it, "0-3,8,10-11", for the option `flag`. Throws
// ConfigError.
std::vector<int> parse_cpu_list(const std::string& flag, const std::string& text);

}  // namespace dist::agent
