#include "dist/launcher/cli.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <ostream>
#include <random>
#include <sstream>
#include <thread>
#include <utility>

#include "completion.h"
#include "dist/agent/devices.h"
#include "dist/agent/etcd_options.h"
#include "dist/agent/log_line_prefix.h"
#include "dist/agent/placement.h"
#include "dist/agent/signals.h"
#include "dist/agent/worker_resources.h"
#include "dist/launcher/slurm.h"
#include "dist/launcher/torchelastic_env.h"
#include "hosts_options.h"
#include "job_token.h"
#include "option_scan.h"
#include "warm_options.h"

namespace dist::launcher {
namespace {

namespace fs = std::filesystem;

// A user error: reported as one line, exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int parse_int_at_least(const std::string& flag, const std::string& text, int minimum) {
  std::size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || v < minimum) {
    throw UsageError(flag + " must be " + (minimum > 0 ? "a positive" : "a non-negative") +
                     " integer, got '" + text + "'");
  }
  return v;
}
int parse_positive(const std::string& flag, const std::string& text) {
  return parse_int_at_least(flag, text, 1);
}
int parse_non_negative(const std::string& flag, const std::string& text) {
  return parse_int_at_least(flag, text, 0);
}

// gpu counts the GPUs this process may use (CUDA or ROCm), xpu the Intel GPUs, auto either (else
// the CPUs, as torch.accelerator decides); with --devices, one worker per listed device.
int resolve_nproc(const std::string& text, const agent::DeviceOptions& devices) {
  const int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (text == "cpu") return cpus;
  if ((text == "gpu" || text == "auto") && !devices.devices.empty()) {
    return static_cast<int>(devices.devices.size());
  }
  if (text == "gpu") {
    const agent::Accelerators found = agent::discover_accelerators();
    if (found.count() == 0) throw UsageError("--nproc-per-node gpu: " + found.source);
    return found.count();
  }
  if (text == "xpu") {
    const agent::Accelerators found = agent::discover_intel_gpus();
    if (found.count() == 0) throw UsageError("--nproc-per-node xpu: " + found.source);
    return found.count();
  }
  if (text == "auto") {
    if (const int gpus = agent::discover_accelerators().count(); gpus > 0) return gpus;
    if (const int xpus = agent::discover_intel_gpus().count(); xpus > 0) return xpus;
    return cpus;
  }
  std::size_t used = 0;
  try {
    const int n = std::stoi(text, &used);
    if (used == text.size() && n > 0) return n;
  } catch (const std::exception&) {
  }
  throw UsageError("--nproc-per-node must be a positive integer, cpu, gpu, xpu or auto, got '" +
                   text + "'");
}

std::vector<int> parse_devices(const std::string& text) {
  std::vector<int> devices;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) devices.push_back(parse_non_negative("--devices", item));
  if (devices.empty()) throw UsageError("--devices needs a list like 0,2,5");
  return devices;
}

agent::NumaBinding parse_numa_binding(const std::string& text) {
  if (text.empty()) return agent::NumaBinding::kNone;
  if (text == "node") return agent::NumaBinding::kNode;
  if (text == "socket") return agent::NumaBinding::kSocket;
  if (text == "exclusive") return agent::NumaBinding::kExclusive;
  if (text == "core-complex") return agent::NumaBinding::kCoreComplex;
  throw UsageError("--numa-binding takes node, socket, exclusive or core-complex, got '" + text +
                   "'");
}

// core, none, or one CPU list per local rank: "0-3;4-7".
void parse_cpu_bind(const std::string& text, agent::PlacementOptions& placement) {
  if (text.empty() || text == "none") return;
  if (text == "core") {
    placement.cpu_bind = agent::CpuBind::kCore;
    return;
  }
  placement.cpu_bind = agent::CpuBind::kList;
  std::stringstream lists(text);
  std::string list;
  while (std::getline(lists, list, ';')) {
    try {
      placement.cpu_lists.push_back(agent::parse_cpu_list("--cpu-bind", list));
    } catch (const agent::PlacementError& e) {
      throw UsageError(std::string(e.what()) + " (--cpu-bind takes core, none or LIST;LIST)");
    }
  }
}

void parse_nnodes(const std::string& text, agent::LaunchConfig& c) {
  const auto colon = text.find(':');
  if (colon == std::string::npos) {
    c.min_nodes = c.max_nodes = parse_positive("--nnodes", text);
    return;
  }
  c.min_nodes = parse_positive("--nnodes (MIN)", text.substr(0, colon));
  c.max_nodes = parse_positive("--nnodes (MAX)", text.substr(colon + 1));
  if (c.min_nodes > c.max_nodes) {
    throw UsageError("--nnodes " + text + ": MIN must not exceed MAX");
  }
}

// torchrun's "0".."3" (none, stdout, stderr, both), or per local rank "0:1,1:3".
void parse_streams(const std::string& flag, const std::string& text, agent::StreamSelection& all,
                   std::map<int, agent::StreamSelection>& by_rank) {
  auto decode = [&](const std::string& v) {
    if (v.size() != 1 || v[0] < '0' || v[0] > '3') {
      throw UsageError(flag +
                       " takes 0 (none), 1 (stdout), 2 (stderr), 3 (both) or "
                       "LOCAL_RANK:VALUE,...; got '" +
                       text + "'");
    }
    const int bits = v[0] - '0';
    return agent::StreamSelection{(bits & 1) != 0, (bits & 2) != 0};
  };
  if (text.find(':') == std::string::npos) {
    all = decode(text);
    return;
  }
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    const auto colon = item.find(':');
    if (colon == std::string::npos) throw UsageError(flag + ": '" + item + "' is not RANK:VALUE");
    by_rank[parse_non_negative(flag, item.substr(0, colon))] = decode(item.substr(colon + 1));
  }
}

// Longer than any job: a bound that keeps milliseconds far from overflow.
constexpr double kMaxSeconds = 1e9;

enum class Zero { kRejected, kAllowed };

std::chrono::milliseconds parse_seconds(const std::string& flag, const std::string& text,
                                        Zero zero = Zero::kRejected) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const bool in_range = zero == Zero::kAllowed ? v >= 0 : v > 0;
  if (used == 0 || used != text.size() || !in_range || !(v <= kMaxSeconds)) {
    throw UsageError(flag + " must be a " + (zero == Zero::kAllowed ? "non-negative" : "positive") +
                     " number of seconds, got '" + text + "'");
  }
  return std::chrono::milliseconds(static_cast<long long>(v * 1000));
}

// 0 to 65535; 0 asks for a free port.
int parse_port(const std::string& flag, const std::string& text) {
  const int port = parse_non_negative(flag, text);
  if (port > 65535) throw UsageError(flag + " " + text + " is not below 65536");
  return port;
}

bool parse_bool(const std::string& flag, const std::string& text) {
  if (text == "1" || text == "true" || text == "True") return true;
  if (text == "0" || text == "false" || text == "False") return false;
  throw UsageError(flag + " must be 1 or 0, got '" + text + "'");
}

// --rdzv-conf key=value,...: timeout (static), join_timeout and last_call_timeout (elastic, in
// seconds), keep_alive_interval and keep_alive_max_attempt (liveness), is_host (elastic);
// close_timeout, heartbeat_timeout, read_timeout and cas_backoff_max_seconds are accepted for
// torchrun compatibility (liveness is TCP keepalive here), store_type=tcp too (torch's file store
// is refused); etcd-v3's own keys
// (cacert, cert, key, ...) go to the backend. A value quoted as a whole ("'a=1,b=2'", as a test
// that runs torchrun without a shell passes it) is unquoted first, as argparse's users expect.
void parse_rdzv_conf(std::string text, agent::LaunchConfig& c) {
  if (text.size() >= 2 && (text.front() == '\'' || text.front() == '"') &&
      text.back() == text.front()) {
    text = text.substr(1, text.size() - 2);
  }
  static const std::set<std::string> kKnown = {"timeout",
                                               "join_timeout",
                                               "last_call_timeout",
                                               "close_timeout",
                                               "keep_alive_interval",
                                               "keep_alive_max_attempt",
                                               "read_timeout",
                                               "heartbeat_timeout",
                                               "cas_backoff_max_seconds",
                                               "store_type",
                                               "is_host"};
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const bool etcd_key = std::find(agent::kEtcdConfKeys.begin(), agent::kEtcdConfKeys.end(),
                                    key) != agent::kEtcdConfKeys.end();
    if (eq == std::string::npos || (!kKnown.contains(key) && !etcd_key)) {
      throw UsageError("--rdzv-conf: '" + item + "' is not one of key=value with key in timeout, " +
                       "join_timeout, last_call_timeout, close_timeout, heartbeat_timeout, " +
                       "keep_alive_interval, keep_alive_max_attempt, read_timeout, " +
                       "cas_backoff_max_seconds, store_type, is_host (etcd-v3 also: cacert, " +
                       "cert, key, user, password_file, protocol, etcd_prefix, " +
                       "unavailable_timeout, member_order)");
    }
    const std::string value = item.substr(eq + 1);
    const std::string flag = "--rdzv-conf " + key;
    if (etcd_key) c.etcd_conf[key] = value;
    if (key == "keep_alive_interval") c.keep_alive_interval_seconds = parse_positive(flag, value);
    if (key == "keep_alive_max_attempt") c.keep_alive_max_attempt = parse_positive(flag, value);
    if (key == "timeout") c.rdzv_timeout = parse_seconds(flag, value);
    if (key == "join_timeout") c.join_timeout = parse_seconds(flag, value);
    if (key == "last_call_timeout") c.last_call_timeout = parse_seconds(flag, value);
    if (key == "is_host") c.is_host = parse_bool(flag, value);
    if (key == "store_type" && value != "tcp") {
      throw UsageError(flag + "=" + value +
                       ": dist-launch's c10d rendezvous runs over its TCP store only "
                       "(store_type=tcp, the default)");
    }
  }
}

// host[:port] or [v6]:port; the port defaults to `default_port`.
std::pair<std::string, int> parse_endpoint(const std::string& text, int default_port) {
  std::string host = text;
  std::string port;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos) throw UsageError("--rdzv-endpoint '" + text + "': missing ]");
    host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') throw UsageError("--rdzv-endpoint '" + text + "' is malformed");
      port = text.substr(close + 2);
    }
  } else if (const auto colon = text.rfind(':'); colon != std::string::npos) {
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (host.empty()) throw UsageError("--rdzv-endpoint '" + text + "' has no host");
  return {host, port.empty() ? default_port : parse_port("--rdzv-endpoint port", port)};
}

// Static or elastic, from --rdzv-backend, --rdzv-endpoint and --nnodes, as torchrun decides.
void choose_rendezvous(bool backend_given, const std::string& endpoint, const std::string& nnodes,
                       bool standalone, bool node_rank_given, std::ostream& err,
                       agent::LaunchConfig& c) {
  if (standalone && c.max_nodes > 1) {
    throw UsageError("--standalone runs a single node, but --nnodes " + nnodes +
                     " asks for more: drop --standalone and give --rdzv-endpoint HOST:PORT "
                     "(dynamic) or --master-addr and --master-port (static)");
  }
  if (standalone) return;  // one node, its own store
  if (c.rdzv_backend == "etcd" || c.rdzv_backend == "etcd-v2") {
    throw UsageError("--rdzv-backend " + c.rdzv_backend +
                     " speaks etcd's v2 API, which etcd 3.4+ turns off by default and "
                     "dist-launch does not implement: use --rdzv-backend etcd-v3 (the same "
                     "members, etcd's v3 API)");
  }
  if (c.rdzv_backend != "static" && c.rdzv_backend != "c10d" && c.rdzv_backend != "etcd-v3") {
    throw UsageError("--rdzv-backend must be static, c10d or etcd-v3, got '" + c.rdzv_backend +
                     "'");
  }
  if (c.rdzv_backend == "etcd-v3") {
    if (endpoint.empty()) {
      throw UsageError(
          "--rdzv-backend etcd-v3 needs --rdzv-endpoint with the etcd members, "
          "e.g. h1:2379,h2:2379,h3:2379");
    }
    c.elastic = true;
    c.etcd_endpoints = endpoint;
    c.node_rank = 0;  // assigned per round
    if (node_rank_given) {
      err << "[dist-launch] notice: --node-rank is ignored with dynamic rendezvous: node ranks "
             "are assigned in each round\n";
    }
    try {  // the members and the backend's keys, checked now rather than after the launch
      agent::check_etcd_options(c.etcd_endpoints, c.etcd_conf);
    } catch (const std::exception& e) {
      throw UsageError(e.what());
    }
    return;
  }
  if (!c.etcd_conf.empty()) {
    throw UsageError("--rdzv-conf " + c.etcd_conf.begin()->first +
                     " is for --rdzv-backend etcd-v3");
  }
  if (c.rdzv_backend == "static" && !endpoint.empty() && !backend_given) c.rdzv_backend = "c10d";
  if (c.rdzv_backend == "static") {
    if (c.min_nodes != c.max_nodes) {
      throw UsageError("--nnodes " + nnodes +
                       ": a range needs dynamic rendezvous (--rdzv-backend c10d "
                       "--rdzv-endpoint HOST:PORT)");
    }
    if (!endpoint.empty()) {  // torchrun: the static store's address may come this way too
      const auto [host, port] = parse_endpoint(endpoint, 29500);
      c.master_addr = host;
      c.master_port = static_cast<std::uint16_t>(port);
    }
    if (c.node_rank >= c.max_nodes) {
      throw UsageError("--node-rank " + std::to_string(c.node_rank) + " is not below --nnodes " +
                       std::to_string(c.max_nodes));
    }
    return;
  }
  c.elastic = true;  // c10d: the store at the endpoint, node ranks assigned by the rendezvous
  const auto [host, port] = parse_endpoint(endpoint.empty() ? "127.0.0.1" : endpoint, 29400);
  c.master_addr = host;
  c.master_port = static_cast<std::uint16_t>(port);
  if (node_rank_given) {
    err << "[dist-launch] notice: --node-rank is ignored with dynamic rendezvous: node ranks are "
           "assigned in each round\n";
  }
  c.node_rank = 0;  // assigned per round
}

std::set<int> parse_rank_list(const std::string& text) {
  std::set<int> ranks;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (!item.empty()) ranks.insert(parse_non_negative("--local-ranks-filter", item));
  }
  return ranks;
}

std::vector<int> parse_signals(const std::string& text) {
  std::vector<int> signals;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    const int s = agent::signal_number(item);
    if (s <= 0) throw UsageError("--signals-to-handle: unknown signal '" + item + "'");
    signals.push_back(s);
  }
  return signals;
}

enum class Executable { kFound, kNotExecutable, kMissing };

// As exec would find `name`: the path itself when it has a '/', else along PATH.
Executable find_executable(const std::string& name) {
  const auto check = [](const fs::path& p) {
    if (::access(p.c_str(), X_OK) == 0 && !fs::is_directory(p)) return Executable::kFound;
    return ::access(p.c_str(), F_OK) == 0 ? Executable::kNotExecutable : Executable::kMissing;
  };
  if (name.find('/') != std::string::npos) return check(name);
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  Executable seen = Executable::kMissing;
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (dir.empty()) continue;
    const Executable e = check(fs::path(dir) / name);
    if (e == Executable::kFound) return e;
    if (e == Executable::kNotExecutable) seen = e;
  }
  return seen;
}

void require_executable(const std::string& what, const std::string& name, const std::string& fix) {
  switch (find_executable(name)) {
    case Executable::kFound:
      return;
    case Executable::kNotExecutable:
      throw UsageError(what + " '" + name + "' is not executable (" + fix + ")");
    case Executable::kMissing:
      if (name.find('/') == std::string::npos && fs::exists(name)) {
        throw UsageError(what + " '" + name + "' not found on PATH (for the file here, give ./" +
                         name + ")");
      }
      throw UsageError(what + " '" + name + "' not found");
  }
}

// An empty PET_* value is an error, not a silent default: the Kubeflow training operator sets
// PET_STANDALONE="" for `standalone: true`, which read as unset would run a different job.
void reject_empty_environment(const CLI::App& app) {
  for (const CLI::Option* option : app.get_options()) {
    const std::string name = option->get_envname();
    if (name.empty() || option->count() > 0) continue;  // the command line gave it
    const char* value = std::getenv(name.c_str());
    if (!value || *value) continue;
    throw UsageError(name + " is set but empty: " +
                     (option->get_expected_min() == 0
                          ? "set it to 1 or 0, or unset it (for standalone: true, which the "
                            "Kubeflow training operator passes as an empty PET_STANDALONE, give "
                            "--standalone)"
                          : "give it a value or unset it (" + option->get_name() + ")"));
  }
}

// srun started several tasks on this node (--ntasks-per-node > 1): task 0 runs the node's agent,
// which starts --nproc-per-node workers; the others leave at once, successfully, saying so. Not
// when the command line lays the nodes out itself (--node-rank).
bool is_extra_slurm_task(const SlurmJob& slurm, const CLI::App& app, std::ostream& err) {
  if (slurm.local_task == 0 || app.count("--node-rank") > 0) return false;
  err << "[dist-launch] notice: Slurm task " << slurm.local_task << " of node "
      << (slurm.node_name.empty() ? std::to_string(slurm.node_rank) : slurm.node_name)
      << " exits: dist-launch runs one agent per node (task 0 starts the --nproc-per-node "
         "workers); use srun --ntasks-per-node=1\n";
  return true;
}

void fill_from_slurm(const SlurmJob& slurm, const CLI::App& app, std::string& nnodes,
                     std::string& master_port, agent::LaunchConfig& c) {
  if (app.count("--nnodes") == 0) nnodes = std::to_string(slurm.nnodes);
  if (app.count("--node-rank") == 0) c.node_rank = slurm.node_rank;
  if (app.count("--master-addr") == 0) c.master_addr = slurm.master_addr;
  if (app.count("--master-port") == 0 && slurm.nnodes > 1) {
    master_port = std::to_string(slurm.master_port);
  }
  if (app.count("--rdzv-id") == 0) c.run_id = slurm.run_id();
  if (app.count("--local-addr") == 0 && !slurm.node_name.empty()) c.local_addr = slurm.node_name;
}

// A static multi-node job laid out by Slurm needs one agent on every node: in the batch script (or
// an salloc shell) only this one would run, and it would wait for the others until the timeout.
void require_slurm_step(const SlurmJob& slurm, const CLI::App& app, const agent::LaunchConfig& c) {
  if (slurm.in_step() || c.elastic || c.max_nodes < 2 || app.count("--node-rank") > 0) return;
  throw UsageError("Slurm job " + slurm.job_id + " has " + std::to_string(c.max_nodes) +
                   " nodes but dist-launch runs outside a job step (no SLURM_STEP_ID: the batch "
                   "script or an salloc shell), so the other nodes would never join; start one "
                   "agent per node with `srun --ntasks-per-node=1 dist-launch ...`, give --nnodes "
                   "1 to run on this node only, or --node-rank when you start the others yourself");
}

std::string random_run_id() {
  std::random_device rd;
  std::ostringstream out;
  out << std::hex << rd() << rd();
  return out.str();
}

// Port 0 asks for a free port: the agent that binds the store picks it, and only that agent
// learns which. On one node it hosts the store and gives its workers the real port; with several
// nodes the others could never find the store.
void check_free_port(const agent::LaunchConfig& c) {
  if (c.master_port != 0 || c.rdzv_backend == "etcd-v3") return;
  const std::string request =
      c.elastic ? "--rdzv-endpoint " + c.master_addr + ":0" : "port 0 (--master-port 0)";
  if (c.max_nodes > 1) {
    throw UsageError(request +
                     " asks for a free port, which works on a single node only: the other nodes "
                     "must know the port to reach the store, and only the agent that binds it "
                     "learns it; give a fixed port");
  }
  if (c.elastic && c.is_host == false) {
    throw UsageError(request +
                     " with is_host=0: only the agent that hosts the store can pick "
                     "a free port; give the store's port");
  }
}

// torchrun's comma-separated list, ",," standing for a comma; empty items are dropped (so '' is no
// filter, as torchrun's help says; its parser would keep '' and copy every line).
std::vector<std::string> parse_filters(const std::string& text) {
  static const std::string kComma = "\x1f";  // a byte no filter holds
  std::string escaped = text;
  for (std::size_t at = escaped.find(",,"); at != std::string::npos; at = escaped.find(",,", at)) {
    escaped.replace(at, 2, kComma);
  }
  std::vector<std::string> filters;
  std::stringstream items(escaped);
  for (std::string item; std::getline(items, item, ',');) {
    for (std::size_t at = item.find(kComma); at != std::string::npos; at = item.find(kComma, at)) {
      item.replace(at, kComma.size(), ",");
    }
    if (!item.empty()) filters.push_back(item);
  }
  return filters;
}

bool tees(const agent::LaunchConfig& c, bool stdout_stream) {
  const auto selected = [&](const agent::StreamSelection& s) {
    return stdout_stream ? s.stdout_stream : s.stderr_stream;
  };
  if (selected(c.tee)) return true;
  return std::any_of(c.tee_by_rank.begin(), c.tee_by_rank.end(),
                     [&](const auto& entry) { return selected(entry.second); });
}

// torchrun copies the lines of tee'd streams only; said, since without --tee the file stays empty.
void note_filters_without_tee(const agent::LaunchConfig& c, std::ostream& err) {
  const std::pair<bool, const char*> flags[] = {
      {!c.duplicate_stdout_filters.empty() && !tees(c, true), "--duplicate-stdout-filters"},
      {!c.duplicate_stderr_filters.empty() && !tees(c, false), "--duplicate-stderr-filters"},
  };
  for (const auto& [idle, flag] : flags) {
    if (!idle) continue;
    err << "[dist-launch] notice: " << flag
        << " copies the lines of tee'd streams only (as torchrun does): add --tee 3 to "
           "select any\n";
  }
}

// torchrun's --logs-specs names a Python LogsSpecs class registered under the
// torchrun.logs_specs entry points; dist-launch has the default layout only.
void check_logs_specs(const std::string& name) {
  if (name.empty() || name == "default") return;
  throw UsageError(
      "--logs-specs " + name +
      ": torchrun loads a Python LogsSpecs class registered as the "
      "'torchrun.logs_specs' entry point of that name; dist-launch has only torchrun's "
      "default layout (--log-dir, -r, -t): give --logs-specs default or leave it out");
}

// torchrun's --event-log-handler names a Python logging handler for its events: "null" and
// "dynamic_rendezvous" drop them, "console" prints them.
void check_event_log_handler(const std::string& name) {
  if (name == "null" || name == "dynamic_rendezvous") return;
  if (name == "console") {
    throw UsageError(
        "--event-log-handler console: torchrun prints its Python event records there; "
        "dist-launch has no Python events (its own lifecycle messages are on the console "
        "already): leave the flag out");
  }
  throw UsageError("--event-log-handler " + name +
                   ": torchrun knows null, dynamic_rendezvous and console; dist-launch drops "
                   "events like null: leave the flag out");
}

agent::ConsolePrefix parse_console_prefix(const std::string& text) {
  if (text == "all") return agent::ConsolePrefix::kAll;
  if (text == "tee") return agent::ConsolePrefix::kTee;
  if (text == "none") return agent::ConsolePrefix::kNone;
  throw UsageError("--console-prefix takes all, tee or none, got '" + text + "'");
}

// The template is rendered for every worker at its start: a mistake is a usage error now.
std::string checked_prefix_template(const std::string& flag_value) {
  const char* env = std::getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
  const std::string text = !flag_value.empty() ? flag_value : env ? env : "";
  try {
    agent::render_log_line_prefix(text, {"default", 0, 0, "host"});
  } catch (const agent::LogLinePrefixError& e) {
    throw UsageError(std::string(e.what()) +
                     (flag_value.empty() ? " (from TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)" : ""));
  }
  return text;
}

void check_local_ranks_filter(const agent::LaunchConfig& c) {
  for (const int rank : c.local_ranks_filter) {
    if (rank >= c.nproc_per_node) {
      throw UsageError("--local-ranks-filter: local rank " + std::to_string(rank) +
                       " does not exist on this node (--nproc-per-node " +
                       std::to_string(c.nproc_per_node) + ": local ranks 0 to " +
                       std::to_string(c.nproc_per_node - 1) + ")");
    }
  }
}

// The options as the scan (option_scan.h) and the completion scripts see them.
// The command line's options, those in option groups (--hosts, ...) included.
std::vector<const CLI::Option*> all_options(const CLI::App& app) {
  std::vector<const CLI::Option*> options = app.get_options();
  for (const CLI::App* group : app.get_subcommands([](const CLI::App* sub) {
         return sub->get_name().empty();  // an option group, not a subcommand
       })) {
    const auto in_group = all_options(*group);
    options.insert(options.end(), in_group.begin(), in_group.end());
  }
  return options;
}

std::vector<OptionSpelling> spellings(const CLI::App& app) {
  std::vector<OptionSpelling> out;
  for (const CLI::Option* option : all_options(app)) {
    out.push_back({option->get_lnames(), option->get_snames(), option->get_expected_min() > 0});
  }
  return out;
}

std::vector<std::string> long_options(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* option : all_options(app)) {
    for (const auto& name : option->get_lnames()) names.push_back("--" + name);
  }
  return names;
}

}  // namespace

std::string version() {
  return DIST_VERSION;
}

// pip installs dist-launch into a venv's (or a prefix's) bin/, next to the interpreter the job's
// packages were installed for: its workers use that one, as torchrun's use torchrun's own.
std::string default_python(const fs::path& program) {
  if (!program.is_absolute()) return "python3";
  for (const char* name : {"python3", "python"}) {
    const fs::path candidate = program.parent_path() / name;
    std::error_code ec;
    if (::access(candidate.c_str(), X_OK) == 0 && !fs::is_directory(candidate, ec)) {
      return candidate.string();
    }
  }
  return "python3";
}

CliOutcome parse_command_line(const std::vector<std::string>& args, std::ostream& out,
                              std::ostream& err) {
  CLI::App app{
      "dist-launch: start and supervise the workers of a distributed job "
      "(torchrun-compatible). Every option may also come from PET_<NAME>; long options may be "
      "abbreviated to a unique prefix.",
      "dist-launch"};
  app.set_version_flag("--version", "dist-launch " + version());
  // An option given twice keeps its last value, as with argparse.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.prefix_command();  // everything from the training script on belongs to the script
  app.footer(
      "Examples:\n"
      "  dist-launch --nproc-per-node 4 train.py --lr 0.1\n"
      "  dist-launch --nproc-per-node 2 --no-python build/bin/ddp_train --epochs 5\n"
      "  dist-launch --nnodes 2 --node-rank 0 --master-addr A --master-port 29500 train.py\n"
      "  dist-launch --nnodes 1:4 --rdzv-endpoint A:29400 --rdzv-id job7 train.py\n"
      "  dist-launch --hosts A:4,B:4 train.py (an agent on each host over ssh)");

  CliOutcome outcome;
  agent::LaunchConfig& c = outcome.config;
  // Every value is read as text and checked here, so that a mistake gets a message in words.
  std::string nnodes = "1", nproc = "1", redirects = "0", tee = "0", ranks_filter;
  std::string signals = "SIGTERM,SIGINT,SIGHUP,SIGQUIT", rdzv_conf, rdzv_endpoint;
  std::string devices, numa_binding, cpu_bind, node_rank = "0", master_port, max_restarts = "0";
  std::string monitor_interval = "0.1", shutdown_timeout, exit_barrier_timeout = "300";
  std::string prefix_template, console_prefix = "all", logs_specs, event_log_handler = "null";
  std::string duplicate_stdout, duplicate_stderr, completion_shell;
  bool standalone = false, module = false, no_python = false, run_path = false;
  std::string start_method = "spawn";

  auto opt = [&](const std::string& names, auto& target, const std::string& env,
                 const std::string& help) {
    return app.add_option(names, target, help)->envname("PET_" + env);
  };
  opt("--nnodes", nnodes, "NNODES", "Number of nodes, N or MIN:MAX")->capture_default_str();
  opt("--nproc-per-node,--nproc_per_node", nproc, "NPROC_PER_NODE",
      "Workers per node: an integer, or cpu, gpu (CUDA or ROCm), xpu (Intel) or auto (the GPUs, "
      "else the CPUs)")
      ->capture_default_str();
  opt("--node-rank,--node_rank", node_rank, "NODE_RANK", "This node's rank (static rendezvous)")
      ->capture_default_str();
  opt("--master-addr,--master_addr", c.master_addr, "MASTER_ADDR",
      "Address of node rank 0 (static rendezvous)")
      ->capture_default_str();
  opt("--master-port,--master_port", master_port, "MASTER_PORT",
      "Port of the store on node rank 0 (default 29500 with several nodes); on one node, unset "
      "or 0: a free port");
  opt("--rdzv-backend,--rdzv_backend", c.rdzv_backend, "RDZV_BACKEND",
      "static, c10d (dynamic: elastic --nnodes MIN:MAX, node ranks assigned), or etcd-v3 "
      "(dynamic, over an etcd cluster: --rdzv-endpoint h1:2379,h2:2379,...)")
      ->capture_default_str();
  opt("--rdzv-endpoint,--rdzv_endpoint", rdzv_endpoint, "RDZV_ENDPOINT",
      "host[:port] of the rendezvous store (c10d; port 29400 by default, 0 on one node: a free "
      "one); implies c10d");
  opt("--rdzv-id,--rdzv_id", c.run_id, "RDZV_ID", "Job id shared by all nodes")
      ->capture_default_str();
  opt("--rdzv-conf,--rdzv_conf", rdzv_conf, "RDZV_CONF",
      "key=value,...: timeout, join_timeout, last_call_timeout (seconds), keep_alive_interval, "
      "keep_alive_max_attempt, is_host");
  app.add_flag("--standalone", standalone, "Single node, store on a free port, random run id")
      ->envname("PET_STANDALONE");
  opt("--max-restarts,--max_restarts", max_restarts, "MAX_RESTARTS",
      "Restarts of the worker group before failing")
      ->capture_default_str();
  opt("--monitor-interval,--monitor_interval", monitor_interval, "MONITOR_INTERVAL",
      "Accepted for torchrun compatibility; failures are seen at once (SIGCHLD), not polled")
      ->capture_default_str();
  opt("--start-method,--start_method", start_method, "START_METHOD",
      "Accepted for torchrun compatibility (workers are always fresh processes)")
      ->check(CLI::IsMember({"spawn", "fork", "forkserver"}));
  opt("--event-log-handler,--event_log_handler", event_log_handler, "EVENT_LOG_HANDLER",
      "torchrun's Python event handler: null (the default) and dynamic_rendezvous are accepted; "
      "dist-launch emits no Python events")
      ->capture_default_str();
  TokenOptions token;
  add_token_options(app, token);
  opt("--role", c.role, "ROLE", "Worker role name")->capture_default_str();
  app.add_flag("-m,--module", module, "Run the script as a Python module (python -m)")
      ->envname("PET_MODULE");
  app.add_flag("--no-python,--no_python", no_python,
               "Run the script as an executable, not through Python (C++ workers)")
      ->envname("PET_NO_PYTHON");
  app.add_flag("--run-path,--run_path", run_path, "Accepted; the script runs in a fresh Python")
      ->envname("PET_RUN_PATH");
  opt("--log-dir,--log_dir", c.log_dir, "LOG_DIR",
      "Write attempt_<n>/<local_rank>/{stdout,stderr}.log and error.json here");
  opt("-r,--redirects", redirects, "REDIRECTS",
      "Streams sent to log files only: 0 none, 1 stdout, 2 stderr, 3 both, or RANK:V,...")
      ->capture_default_str();
  opt("-t,--tee", tee, "TEE",
      "Streams sent to log files and the console (same values; tee wins over --redirects)")
      ->capture_default_str();
  opt("--log-line-prefix-template,--log_line_prefix_template", prefix_template,
      "LOG_LINE_PREFIX_TEMPLATE",
      "Console prefix of each worker line, e.g. '[${rank}]: ' (${role_name}, ${rank}, "
      "${local_rank}, ${hostname}); default '[${role_name}${local_rank}]:', or "
      "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
  opt("--console-prefix,--console_prefix", console_prefix, "CONSOLE_PREFIX",
      "Which console lines carry that prefix: all (default), tee (torchrun's console: only tee'd "
      "streams; the others pass unchanged) or none")
      ->capture_default_str();
  opt("--local-ranks-filter,--local_ranks_filter", ranks_filter, "LOCAL_RANKS_FILTER",
      "Only these local ranks reach the console, e.g. 0 or 0,2 (the log files keep all)");
  opt("--duplicate-stdout-filters,--duplicate_stdout_filters", duplicate_stdout,
      "DUPLICATE_STDOUT_FILTERS",
      "Tee'd stdout lines containing any of these (a,b; ',,' for a comma) are also copied to "
      "attempt_<n>/filtered_stdout.log");
  opt("--duplicate-stderr-filters,--duplicate_stderr_filters", duplicate_stderr,
      "DUPLICATE_STDERR_FILTERS", "The same for stderr, to attempt_<n>/filtered_stderr.log");
  app.add_option("--logs-specs,--logs_specs", logs_specs,
                 "torchrun's LogsSpecs entry point: only 'default' (torchrun's layout) exists");
  opt("--local-addr,--local_addr", c.local_addr, "LOCAL_ADDR",
      "This node's address as published to the others");
  opt("--signals-to-handle,--signals_to_handle", signals, "SIGNALS_TO_HANDLE",
      "Signals the agent catches and forwards to every worker. SIGTERM, SIGINT, SIGHUP and "
      "SIGQUIT then stop the job. Add SIGUSR1,SIGUSR2 (Slurm's warning before a time limit or "
      "preemption): those are forwarded to the workers and the job keeps running. Workers see "
      "the list in TORCHELASTIC_SIGNALS_TO_HANDLE")
      ->capture_default_str();
  opt("--exit-barrier-timeout,--exit_barrier_timeout", exit_barrier_timeout, "EXIT_BARRIER_TIMEOUT",
      "Seconds a node whose workers succeeded waits for the other nodes' (several nodes)")
      ->capture_default_str();
  opt("--shutdown-timeout,--shutdown_timeout", shutdown_timeout, "SHUTDOWN_TIMEOUT",
      "Seconds between the stop signal and SIGKILL (default: TORCH_ELASTIC_SHUTDOWN_TIMEOUT, "
      "else 30)");
  opt("--devices", devices, "DEVICES",
      "One device per worker, e.g. 0,2,5 (indices of the GPUs this node sees): local rank i gets "
      "the i-th as its only CUDA_VISIBLE_DEVICES (HIP_VISIBLE_DEVICES on AMD)");
  app.add_flag("--virtual-local-rank,--virtual_local_rank", c.devices.virtual_local_rank,
               "Each worker sees only its own GPU, as device 0, and LOCAL_RANK=0")
      ->envname("PET_VIRTUAL_LOCAL_RANK");
  opt("--numa-binding,--numa_binding", numa_binding, "NUMA_BINDING",
      "Bind each worker's CPUs and memory: node, socket, exclusive or core-complex, by its GPU's "
      "NUMA node (without GPUs: by local rank over the NUMA nodes)");
  opt("--cpu-bind,--cpu_bind", cpu_bind, "CPU_BIND",
      "core (each worker its own cores), none, or one CPU list per local rank: '0-3;4-7'");
  // Watchdogs and telemetry (agent/src/worker_watchdogs.h, telemetry.h).
  std::string heartbeat_timeout = "0", metrics_port;
  opt("--worker-heartbeat-timeout", heartbeat_timeout, "WORKER_HEARTBEAT_TIMEOUT",
      "Seconds a worker that called dist::sdk::heartbeat() may stay silent before it is killed as "
      "hung and the group restarts (0: off)")
      ->capture_default_str();
  opt("--event-log", c.telemetry.event_log, "EVENT_LOG",
      "Append the job's events to this file, one JSON object per line");
  opt("--metrics-port", metrics_port, "METRICS_PORT",
      "Serve Prometheus metrics at http://HOST:PORT/metrics (0: a free port, logged)");
  app.add_option("--print-completion,--print_completion", completion_shell,
                 std::string("Print a completion script for ") + kCompletionShells +
                     " and exit, e.g. eval \"$(dist-launch --print-completion bash)\"");

  HostsFlags hosts;
  add_hosts_options(app, hosts);
  WarmFlags warm;
  add_warm_options(app, warm);

  std::vector<std::string> expanded;  // the arguments with abbreviated options written out
  try {
    expanded = expand_options(args, spellings(app));
    std::vector<std::string> reversed(expanded.rbegin(), expanded.rend());  // CLI11: from the back
    app.parse(reversed);
  } catch (const OptionScanError& e) {
    err << "dist-launch: error: " << e.what() << "\n";
    return {true, kExitUsage, {}};
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    outcome.exit_now = true;
    return outcome;
  } catch (const CLI::CallForAllHelp&) {
    out << app.help("", CLI::AppFormatMode::All);
    outcome.exit_now = true;
    return outcome;
  } catch (const CLI::CallForVersion&) {
    out << "dist-launch " << version() << "\n";
    outcome.exit_now = true;
    return outcome;
  } catch (const CLI::ParseError& e) {
    err << "dist-launch: error: " << e.what() << " (see dist-launch --help)\n";
    return {true, kExitUsage, {}};
  }

  try {
    if (app.count("--print-completion") > 0) {
      const auto script = completion_script(completion_shell, long_options(app));
      if (!script) {
        throw UsageError("--print-completion takes " + std::string(kCompletionShells) + ", got '" +
                         completion_shell + "'");
      }
      out << *script;
      return {true, kExitOk, {}};
    }
    const std::vector<std::string> script_and_args = app.remaining();
    if (script_and_args.empty()) {
      throw UsageError("no training script given (dist-launch [options] SCRIPT [args...])");
    }
    reject_empty_environment(app);
    check_logs_specs(logs_specs);
    check_event_log_handler(event_log_handler);
    c.node_rank = parse_non_negative("--node-rank", node_rank);
    c.max_restarts = parse_non_negative("--max-restarts", max_restarts);
    parse_seconds("--monitor-interval", monitor_interval, Zero::kAllowed);  // checked, not used
    // Inside Slurm, what the command line leaves out comes from the job step.
    const auto slurm = standalone || hosts.given() ? std::nullopt : slurm_job_from_environment();
    if (slurm) {
      if (is_extra_slurm_task(*slurm, app, err)) return {true, kExitOk, {}};
      fill_from_slurm(*slurm, app, nnodes, master_port, c);
    }
    parse_nnodes(nnodes, c);
    if (!devices.empty()) c.devices.devices = parse_devices(devices);
    if (!hosts.given()) c.nproc_per_node = resolve_nproc(nproc, c.devices);  // each host's own
    c.placement.numa_binding = parse_numa_binding(numa_binding);
    parse_cpu_bind(cpu_bind, c.placement);
    if (!master_port.empty()) {
      c.master_port = static_cast<std::uint16_t>(parse_port("--master-port", master_port));
    }
    parse_streams("--redirects", redirects, c.redirects, c.redirects_by_rank);
    parse_streams("--tee", tee, c.tee, c.tee_by_rank);
    c.local_ranks_filter = parse_rank_list(ranks_filter);
    check_local_ranks_filter(c);
    c.log_line_prefix_template = checked_prefix_template(prefix_template);
    c.console_prefix = parse_console_prefix(console_prefix);
    c.duplicate_stdout_filters = parse_filters(duplicate_stdout);
    c.duplicate_stderr_filters = parse_filters(duplicate_stderr);
    note_filters_without_tee(c, err);
    c.signals_to_handle = parse_signals(signals);
    if (shutdown_timeout.empty()) {
      const char* env = std::getenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
      shutdown_timeout = env && *env ? env : "30";
    }
    c.shutdown_timeout = parse_seconds("--shutdown-timeout", shutdown_timeout, Zero::kAllowed);
    c.exit_barrier_timeout = parse_seconds("--exit-barrier-timeout", exit_barrier_timeout);
    parse_rdzv_conf(rdzv_conf, c);
    read_torchelastic_environment(c.watchdogs);
    c.watchdogs.worker_heartbeat_timeout =
        parse_seconds("--worker-heartbeat-timeout", heartbeat_timeout, Zero::kAllowed);
    if (!metrics_port.empty()) {
      c.telemetry.metrics_port =
          static_cast<std::uint16_t>(parse_port("--metrics-port", metrics_port));
    }
    if (hosts.given()) {  // the job over ssh (hosts.cc): each host checks the rest for itself
      apply_token_options(token, c);  // none given: the job generates one
      outcome.hosts_job = hosts_job_config(app, hosts, expanded, c);
      return outcome;
    }
    choose_rendezvous(app.count("--rdzv-backend") > 0 || std::getenv("PET_RDZV_BACKEND"),
                      rdzv_endpoint, nnodes, standalone,
                      app.count("--node-rank") > 0 || std::getenv("PET_NODE_RANK"), err, c);
    if (slurm) require_slurm_step(*slurm, app, c);
    if (standalone) {
      c.master_addr = "127.0.0.1";
      c.master_port.reset();
      c.rdzv_backend = "c10d";
      if (c.run_id == "none") c.run_id = random_run_id();
    }
    check_free_port(c);
    apply_token_options(token, c);

    const std::string& script = script_and_args.front();
    const std::vector<std::string> script_args(script_and_args.begin() + 1, script_and_args.end());
    if (no_python && module) throw UsageError("--no-python and -m cannot be used together");
    if (no_python) {
      require_executable("executable", script,
                         "chmod +x it, or run it without --no-python through its interpreter");
      c.worker_argv = script_and_args;
    } else {
      const char* python_exec = std::getenv("PYTHON_EXEC");
      std::error_code ec;  // no /proc: python3 from PATH
      const std::string python = python_exec && *python_exec
                                     ? python_exec
                                     : default_python(fs::read_symlink("/proc/self/exe", ec));
      require_executable("Python interpreter", python, "set PYTHON_EXEC to one that is");
      c.worker_argv = {python, "-u"};
      if (module) {
        c.worker_argv.push_back("-m");
      } else if (!fs::exists(script)) {
        throw UsageError("training script '" + script + "' not found");
      }
      c.worker_argv.push_back(script);
      c.worker_argv.insert(c.worker_argv.end(), script_args.begin(), script_args.end());
    }
    c.script_name = fs::path(script).filename().string();
    c.python_workers = !no_python;
    apply_warm_options(app, warm, c, err);

    // Devices and placement are planned again by the agent; planning here turns what this node
    // cannot give into a usage error before anything starts.
    try {
      agent::plan_worker_resources(c);
    } catch (const agent::DeviceError& e) {
      throw UsageError(e.what());
    } catch (const agent::PlacementError& e) {
      throw UsageError(e.what());
    }
    if ((c.nproc_per_node > 1 || c.placement.binds()) && !std::getenv("OMP_NUM_THREADS")) {
      c.omp_threads_defaulted = true;
      if (c.placement.binds()) {
        err << "[dist-launch] notice: OMP_NUM_THREADS is unset; setting it to each worker's bound "
               "core count (set it yourself to tune)\n";
      } else {
        err << "[dist-launch] warning: OMP_NUM_THREADS is unset; setting it to 1 for each of the "
            << c.nproc_per_node << " workers (set it yourself to tune)\n";
      }
    }
  } catch (const UsageError& e) {
    err << "dist-launch: error: " << e.what() << "\n";
    return {true, kExitUsage, {}};
  } catch (const std::invalid_argument&
               e) {  // a malformed SLURM_* or TORCHELASTIC_* variable, the token
    err << "dist-launch: error: " << e.what() << "\n";
    return {true, kExitUsage, {}};
  }
  return outcome;
}

}  // namespace dist::launcher
