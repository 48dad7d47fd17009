#include "config_from_options.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <sstream>
#include <utility>

#include "dist/agent/signals.h"
#include "dist/launcher/slurm.h"
#include "dist/launcher/torchelastic_env.h"
#include "dist/store/client.h"
#include "dist/store/endpoint.h"
#include "rdzv_conf.h"

namespace dist::launcher {
namespace {

namespace fs = std::filesystem;
using agent::LaunchConfig;
using agent::RendezvousBackend;

int parse_int_at_least(const std::string& flag, const std::string& text, int minimum) {
  std::size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(text, &used);
  } catch (const std::out_of_range&) {
    throw UsageError(flag + " " + text + " is out of range");
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
    } catch (const agent::ConfigError& e) {
      throw UsageError(std::string(e.what()) + " (--cpu-bind takes core, none or LIST;LIST)");
    }
  }
}

void parse_nnodes(const std::string& text, agent::LaunchConfig& c) {
  const auto colon = text.find(':');
  if (colon == std::string::npos) {
    c.min_nodes = c.max_nodes = parse_positive("--nnodes", text);
  } else {
    c.min_nodes = parse_positive("--nnodes (MIN)", text.substr(0, colon));
    c.max_nodes = parse_positive("--nnodes (MAX)", text.substr(colon + 1));
  }
  if (c.min_nodes > c.max_nodes) {
    throw UsageError("--nnodes " + text + ": MIN must not exceed MAX");
  }
  if (c.max_nodes > agent::kMaxNodes) {
    throw UsageError("--nnodes " + text + ": at most " + std::to_string(agent::kMaxNodes) +
                     " nodes");
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
  if (used != 0 && used == text.size() && v > kMaxSeconds) {
    throw UsageError(flag + " " + text + " s is out of range (at most " +
                     std::to_string(static_cast<long long>(kMaxSeconds)) + " s)");
  }
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
    if (s == SIGKILL || s == SIGSTOP) {
      throw UsageError("--signals-to-handle: " + item +
                       " cannot be caught, so the launcher cannot pass it on to its workers; "
                       "leave it out (SIGKILL of the launcher still ends every worker)");
    }
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

}  // namespace

std::string random_run_id() {
  std::random_device rd;
  std::ostringstream out;
  out << std::hex << rd() << rd();
  return out.str();
}

namespace {

// Port 0 asks for a free port: the agent that binds the store picks it, and only that agent
// learns which. On one node it hosts the store and gives its workers the real port; with several
// nodes the others could never find the store.
void check_free_port(const agent::LaunchConfig& c) {
  if (c.master_port != 0 || c.rdzv_backend == agent::RendezvousBackend::kEtcdV3) return;
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
void check_event_log_handler(const std::string& name, std::ostream& err) {
  if (name == "null" || name == "dynamic_rendezvous") return;
  if (name == "console") {  // a flag of the logs alone: the job runs (a shared script may pass it)
    err << "[dist-launch] warning: --event-log-handler console: torchrun prints its Python event "
           "records there; dist-launch has none (its own lifecycle messages are on the console "
           "already, and --event-log FILE writes its events as JSON lines): ignored\n";
    return;
  }
  throw UsageError("--event-log-handler " + name +
                   ": torchrun knows null, dynamic_rendezvous and console; dist-launch drops "
                   "events like null: leave the flag out");
}

agent::RestartPolicy parse_restart_policy(const std::string& text) {
  if (text == "group") return agent::RestartPolicy::kGroup;
  if (text == "in-place") return agent::RestartPolicy::kInPlace;
  throw UsageError("--restart-policy takes group or in-place, got '" + text + "'");
}

agent::ConsolePrefix parse_console_prefix(const std::string& text) {
  if (text == "all") return agent::ConsolePrefix::kAll;
  if (text == "tee") return agent::ConsolePrefix::kTee;
  if (text == "none") return agent::ConsolePrefix::kNone;
  throw UsageError("--console-prefix takes all, tee or none, got '" + text + "'");
}

// torchrun's --log-line-prefix-template, else TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE (checked with
// the rest of the configuration, agent::check).
std::string chosen_prefix_template(const std::string& flag_value) {
  const char* env = std::getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
  return !flag_value.empty() ? flag_value : env ? env : "";
}

// A local rank the node does not have shows nothing, as under torchrun (a launch script shared by
// jobs of several sizes may name it): said, and left out.
void check_local_ranks_filter(const agent::LaunchConfig& c, std::ostream& err) {
  std::vector<int> absent;
  for (const int rank : c.local_ranks_filter) {
    if (rank >= c.nproc_per_node) absent.push_back(rank);
  }
  if (absent.empty()) return;
  std::string list;
  for (const int rank : absent) list += (list.empty() ? "" : ",") + std::to_string(rank);
  err << "[dist-launch] warning: --local-ranks-filter: local rank"
      << (absent.size() > 1 ? "s " : " ") << list << (absent.size() > 1 ? " do" : " does")
      << " not exist on this node (--nproc-per-node " << c.nproc_per_node << ": local ranks 0 to "
      << c.nproc_per_node - 1 << "): nothing of it is shown\n";
}

// --rdzv-endpoint (or Slurm's node) as host[:port]; 0 asks for a free port.
store::Endpoint parse_rdzv_endpoint(const std::string& text, std::uint16_t default_port) {
  // (Several ':' read as an IPv6 address without a port: these would become a host name that
  // the agent then tries to resolve for join_timeout.)
  if (text.find(',') != std::string::npos) {
    throw UsageError("--rdzv-endpoint " + text +
                     ": one HOST:PORT (a list of endpoints is for --rdzv-backend etcd-v3)");
  }
  if (text.find("://") != std::string::npos) {
    throw UsageError("--rdzv-endpoint " + text + ": HOST:PORT, without a scheme");
  }
  try {
    return store::parse_endpoint(text, default_port, /*allow_zero=*/true);
  } catch (const store::EndpointError& e) {
    throw UsageError(std::string("--rdzv-endpoint ") + e.what());
  }
}

RendezvousBackend parse_backend(const std::string& text) {
  if (text == "etcd" || text == "etcd-v2") {
    throw UsageError("--rdzv-backend " + text +
                     " speaks etcd's v2 API, which etcd 3.4+ turns off by default and "
                     "dist-launch does not implement: use --rdzv-backend etcd-v3 (the same "
                     "members, etcd's v3 API)");
  }
  if (text == "static") return RendezvousBackend::kStatic;
  if (text == "c10d") return RendezvousBackend::kC10d;
  if (text == "etcd-v3") return RendezvousBackend::kEtcdV3;
  throw UsageError("--rdzv-backend must be static, c10d or etcd-v3, got '" + text + "'");
}

// The etcd members of --rdzv-endpoint: "h1:2379, h2:2379,h3".
std::vector<std::string> etcd_members(const std::string& text) {
  std::vector<std::string> members;
  std::stringstream items(text);
  for (std::string item; std::getline(items, item, ',');) {
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (!item.empty()) members.push_back(item);
  }
  if (members.empty()) {
    throw UsageError("--rdzv-endpoint: give the etcd members, e.g. h1:2379,h2:2379,h3:2379");
  }
  return members;
}

void notice_node_rank_ignored(bool node_rank_given, std::ostream& err) {
  if (!node_rank_given) return;
  err << "[dist-launch] notice: --node-rank is ignored with dynamic rendezvous: node ranks are "
         "assigned in each round\n";
}

// Static or elastic, from --rdzv-backend, --rdzv-endpoint and --nnodes, as torchrun decides.
// `etcd_keys`: the --rdzv-conf keys given that only the etcd-v3 backend reads.
void choose_rendezvous(const RawOptions& r, const std::vector<std::string>& etcd_keys,
                       std::ostream& err, LaunchConfig& c) {
  const bool node_rank_given = r.was_given("--node-rank") || std::getenv("PET_NODE_RANK");
  if (r.standalone && c.max_nodes > 1) {
    throw UsageError("--standalone runs a single node, but --nnodes " + r.nnodes +
                     " asks for more: drop --standalone and give --rdzv-endpoint HOST:PORT "
                     "(dynamic) or --master-addr and --master-port (static)");
  }
  if (r.standalone) return;  // one node, its own store
  c.rdzv_backend = parse_backend(r.rdzv_backend);
  if (c.rdzv_backend == RendezvousBackend::kEtcdV3) {
    if (r.rdzv_endpoint.empty()) {
      throw UsageError(
          "--rdzv-backend etcd-v3 needs --rdzv-endpoint with the etcd members, "
          "e.g. h1:2379,h2:2379,h3:2379");
    }
    c.elastic = true;
    c.etcd.endpoints = etcd_members(r.rdzv_endpoint);
    c.node_rank = 0;  // assigned per round
    notice_node_rank_ignored(node_rank_given, err);
    return;
  }
  if (!etcd_keys.empty()) {
    throw UsageError("--rdzv-conf " + etcd_keys.front() + " is for --rdzv-backend etcd-v3");
  }
  const bool backend_given = r.was_given("--rdzv-backend") || std::getenv("PET_RDZV_BACKEND");
  if (c.rdzv_backend == RendezvousBackend::kStatic && !r.rdzv_endpoint.empty() && !backend_given) {
    c.rdzv_backend = RendezvousBackend::kC10d;
  }
  if (c.rdzv_backend == RendezvousBackend::kStatic) {
    if (c.min_nodes != c.max_nodes) {
      throw UsageError("--nnodes " + r.nnodes +
                       ": a range needs dynamic rendezvous (--rdzv-backend c10d "
                       "--rdzv-endpoint HOST:PORT)");
    }
    if (!r.rdzv_endpoint.empty()) {  // torchrun: the static store's address may come this way too
      const auto endpoint = parse_rdzv_endpoint(r.rdzv_endpoint, agent::kDefaultStaticPort);
      c.master_addr = endpoint.host;
      c.master_port = endpoint.port;
    }
    if (c.node_rank >= c.max_nodes) {
      throw UsageError("--node-rank " + std::to_string(c.node_rank) + " is not below --nnodes " +
                       std::to_string(c.max_nodes));
    }
    return;
  }
  c.elastic = true;  // c10d: the store at the endpoint, node ranks assigned by the rendezvous
  const auto endpoint = parse_rdzv_endpoint(r.rdzv_endpoint.empty() ? "127.0.0.1" : r.rdzv_endpoint,
                                            agent::kDefaultC10dPort);
  c.master_addr = endpoint.host;
  c.master_port = endpoint.port;
  notice_node_rank_ignored(node_rank_given, err);
  c.node_rank = 0;  // assigned per round
}

// srun started several tasks on this node (--ntasks-per-node > 1): task 0 runs the node's agent,
// which starts --nproc-per-node workers; the others leave at once, successfully, saying so. Not
// when the command line lays the nodes out itself (--node-rank).
bool is_extra_slurm_task(const SlurmJob& slurm, const RawOptions& r, std::ostream& err) {
  if (slurm.local_task == 0 || r.was_given("--node-rank")) return false;
  err << "[dist-launch] notice: Slurm task " << slurm.local_task << " of node "
      << (slurm.node_name.empty() ? std::to_string(slurm.node_rank) : slurm.node_name)
      << " exits: dist-launch runs one agent per node (task 0 starts the --nproc-per-node "
         "workers); use srun --ntasks-per-node=1\n";
  return true;
}

// What the command line leaves out, from the job step.
void fill_from_slurm(const SlurmJob& slurm, RawOptions& r) {
  if (!r.was_given("--nnodes")) r.nnodes = std::to_string(slurm.nnodes);
  if (!r.was_given("--node-rank")) r.node_rank = std::to_string(slurm.node_rank);
  if (!r.was_given("--master-addr")) r.master_addr = slurm.master.host;
  if (!r.was_given("--master-port") && slurm.nnodes > 1) {
    r.master_port = std::to_string(slurm.master.port);
  }
  if (!r.was_given("--rdzv-id")) r.rdzv_id = slurm.run_id();
  if (!r.was_given("--local-addr") && !slurm.node_name.empty()) r.local_addr = slurm.node_name;
}

// A static multi-node job laid out by Slurm needs one agent on every node: in the batch script (or
// an salloc shell) only this one would run, and it would wait for the others until the timeout.
void require_slurm_step(const SlurmJob& slurm, const RawOptions& r, const LaunchConfig& c) {
  if (slurm.in_step() || c.elastic || c.max_nodes < 2 || r.was_given("--node-rank")) return;
  throw UsageError("Slurm job " + slurm.job_id + " has " + std::to_string(c.max_nodes) +
                   " nodes but dist-launch runs outside a job step (no SLURM_STEP_ID: the batch "
                   "script or an salloc shell), so the other nodes would never join; start one "
                   "agent per node with `srun --ntasks-per-node=1 dist-launch ...`, give --nnodes "
                   "1 to run on this node only, or --node-rank when you start the others yourself");
}

// Options torchrun has that change nothing here: checked, then dropped.
void check_compatibility_options(const RawOptions& r, std::ostream& err) {
  check_logs_specs(r.logs_specs);
  check_event_log_handler(r.event_log_handler, err);
  parse_seconds("--monitor-interval", r.monitor_interval, Zero::kAllowed);
}

// The job's shape: nodes, this node's rank and workers, devices and placement.
void read_job_shape(const RawOptions& r, LaunchConfig& c) {
  c.role = r.role;
  c.master_addr = r.master_addr;
  c.run_id = r.rdzv_id;
  c.local_addr = r.local_addr;
  c.node_rank = parse_non_negative("--node-rank", r.node_rank);
  c.max_restarts = parse_non_negative("--max-restarts", r.max_restarts);
  c.restart_policy = parse_restart_policy(r.restart_policy);
  parse_nnodes(r.nnodes, c);
  if (!r.devices.empty()) c.devices.devices = parse_devices(r.devices);
  c.devices.virtual_local_rank = r.virtual_local_rank;
  if (!r.hosts.given()) {  // each host's own
    c.nproc_per_node = agent::resolve_nproc_per_node(r.nproc_per_node, c.devices);
  }
  c.placement.numa_binding = parse_numa_binding(r.numa_binding);
  parse_cpu_bind(r.cpu_bind, c.placement);
  if (!r.master_port.empty()) {
    c.master_port = static_cast<std::uint16_t>(parse_port("--master-port", r.master_port));
  }
}

// The agents' liveness, unless --rdzv-conf gives it (config.h says why the two defaults).
void default_keep_alive(LaunchConfig& c) {
  if (c.keep_alive_max_attempt_given) return;
  c.keep_alive_max_attempt = c.min_nodes < c.max_nodes ? agent::kElasticKeepAliveMaxAttempt
                                                       : agent::kFixedSizeKeepAliveMaxAttempt;
}

// Log files and the console.
void read_output_options(const RawOptions& r, LaunchConfig& c, std::ostream& err) {
  c.log_dir = r.log_dir;
  parse_streams("--redirects", r.redirects, c.redirects, c.redirects_by_rank);
  parse_streams("--tee", r.tee, c.tee, c.tee_by_rank);
  c.local_ranks_filter = parse_rank_list(r.local_ranks_filter);
  if (!r.hosts.given()) check_local_ranks_filter(c, err);  // (--hosts: each host's agent does)
  c.log_line_prefix_template = chosen_prefix_template(r.log_line_prefix_template);
  c.console_prefix = parse_console_prefix(r.console_prefix);
  c.duplicate_stdout_filters = parse_filters(r.duplicate_stdout_filters);
  c.duplicate_stderr_filters = parse_filters(r.duplicate_stderr_filters);
  note_filters_without_tee(c, err);
}

// --metrics-token-file, else DIST_LAUNCH_METRICS_TOKEN_FILE: the token, which travels in a header
// and an address, so printable ASCII without spaces.
std::string read_metrics_token(const RawOptions& r) {
  std::string file = r.metrics_token_file;
  if (file.empty()) {
    const char* from_environment = std::getenv(agent::kMetricsTokenFileVariable);
    if (!from_environment || !*from_environment) return "";
    file = from_environment;
  }
  std::string token;
  try {
    token = store::read_secret_file(file);
  } catch (const std::exception& e) {
    throw UsageError(std::string("--metrics-token-file: ") + e.what());
  }
  while (!token.empty() && (token.back() == ' ' || token.back() == '\t')) token.pop_back();
  const bool printable = std::all_of(token.begin(), token.end(), [](char ch) {
    return static_cast<unsigned char>(ch) > 0x20 && static_cast<unsigned char>(ch) < 0x7F;
  });
  if (token.empty() || !printable) {
    throw UsageError("--metrics-token-file: the token in '" + file +
                     "' must be one line of printable ASCII without spaces (it travels in an HTTP "
                     "header and the page's address), e.g. head -c 32 /dev/urandom | xxd -p -c 64");
  }
  return token;
}

// Where the metrics' port listens and who may read it.
void read_metrics_options(const RawOptions& r, LaunchConfig& c) {
  if (!r.metrics_port.empty()) {
    c.telemetry.metrics_port =
        static_cast<std::uint16_t>(parse_port("--metrics-port", r.metrics_port));
  }
  for (const char* flag : {"--metrics-addr", "--metrics-token-file"}) {
    if (r.was_given(flag) && !c.telemetry.metrics_port) {
      throw UsageError(std::string(flag) +
                       " applies to the port --metrics-port opens: give it too");
    }
  }
  if (!c.telemetry.metrics_port) return;
  if (r.was_given("--metrics-addr") && r.metrics_addr.empty()) {
    throw UsageError("--metrics-addr needs an address or a host name (0.0.0.0: every interface)");
  }
  c.telemetry.metrics_addr = r.metrics_addr;
  c.telemetry.metrics_token = read_metrics_token(r);
}

// Signals, timeouts, --rdzv-conf, watchdogs and telemetry. Returns the etcd-only --rdzv-conf keys
// given.
std::vector<std::string> read_lifecycle_options(const RawOptions& r, LaunchConfig& c,
                                                std::ostream& err) {
  c.signals_to_handle = parse_signals(r.signals_to_handle);
  std::string shutdown_timeout = r.shutdown_timeout;
  if (shutdown_timeout.empty()) {
    const char* env = std::getenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
    shutdown_timeout = env && *env ? env : "30";
  }
  c.shutdown_timeout = parse_seconds("--shutdown-timeout", shutdown_timeout, Zero::kAllowed);
  c.exit_barrier_timeout = parse_seconds("--exit-barrier-timeout", r.exit_barrier_timeout);
  c.in_place_timeout = parse_seconds("--in-place-timeout", r.in_place_timeout);
  if (c.in_place_timeout < std::chrono::milliseconds(1)) {  // the workers get milliseconds
    throw UsageError("--in-place-timeout must be at least 0.001 seconds, got '" +
                     r.in_place_timeout + "'");
  }
  RdzvConf conf;
  try {
    conf = apply_rdzv_conf(r.rdzv_conf, c);
  } catch (const RdzvConfError& e) {
    throw UsageError(e.what());
  }
  for (const std::string& item : conf.ignored) {  // as torchrun's backends ignore it
    err << "[dist-launch] warning: --rdzv-conf " << item
        << ": no rendezvous of dist-launch reads this key; ignored (keys: " << rdzv_conf_keys()
        << ")\n";
  }
  std::vector<std::string> etcd_keys = std::move(conf.etcd_keys);
  read_torchelastic_environment(c.watchdogs);
  c.watchdogs.worker_heartbeat_timeout =
      parse_seconds("--worker-heartbeat-timeout", r.worker_heartbeat_timeout, Zero::kAllowed);
  if (r.hang_timeout != "auto") {
    try {
      c.watchdogs.hang_timeout = parse_seconds("--hang-timeout", r.hang_timeout, Zero::kAllowed);
    } catch (const UsageError&) {
      throw UsageError("--hang-timeout must be auto or a non-negative number of seconds, got '" +
                       r.hang_timeout + "'");
    }
  }
  c.watchdogs.step_hook = !r.no_step_hook;
  c.telemetry.event_log = r.event_log;
  read_metrics_options(r, c);
  return etcd_keys;
}

// What each worker runs: the executable (--no-python), or python -u [-m] SCRIPT ARGS on the
// interpreter dist-launch belongs to.
void set_worker_command(const RawOptions& r, LaunchConfig& c) {
  const std::string& script = r.script_and_args.front();
  // One `--` right after the script is dropped, as torchrun's argparse drops it (its script's
  // arguments are REMAINDER): `train.py -- --lr 1` gives the script `--lr 1`; but not after a
  // `--` that ended the options (`-- train.py -- x`: argparse keeps it).
  const auto first_arg = r.script_and_args.begin() + 1;
  const bool dash_dash =
      !r.script_after_dash_dash && first_arg != r.script_and_args.end() && *first_arg == "--";
  const std::vector<std::string> args(first_arg + (dash_dash ? 1 : 0), r.script_and_args.end());
  if (r.no_python && r.module) throw UsageError("--no-python and -m cannot be used together");
  if (r.no_python) {
    require_executable("executable", script,
                       "chmod +x it, or run it without --no-python through its interpreter");
    c.worker_argv = {script};
    c.worker_argv.insert(c.worker_argv.end(), args.begin(), args.end());
  } else {
    const char* python_exec = std::getenv("PYTHON_EXEC");
    std::error_code ec;  // no /proc: python3 from PATH
    const std::string python = python_exec && *python_exec
                                   ? python_exec
                                   : default_python(fs::read_symlink("/proc/self/exe", ec));
    require_executable("Python interpreter", python, "set PYTHON_EXEC to one that is");
    c.worker_argv = {python, "-u"};
    if (r.module) {
      c.worker_argv.push_back("-m");
    } else if (!fs::exists(script)) {
      throw UsageError("training script '" + script + "' not found");
    }
    c.worker_argv.push_back(script);
    c.worker_argv.insert(c.worker_argv.end(), args.begin(), args.end());
  }
  c.script_name = fs::path(script).filename().string();
  // A function the Python API launches: its name titles the failure report, not the script that
  // runs it (_function_worker.py). Not passed on: a launch from a worker is a job of its own.
  if (const char* title = std::getenv("DIST_LAUNCH_REPORT_TITLE"); title && *title) {
    c.script_name = title;
    ::unsetenv("DIST_LAUNCH_REPORT_TITLE");
  }
  c.python_workers = !r.no_python;
}

// Several workers and no OMP_NUM_THREADS: 1 each (or their bound core count), said.
void default_omp_threads(LaunchConfig& c, std::ostream& err) {
  if ((c.nproc_per_node < 2 && !c.placement.binds()) || std::getenv("OMP_NUM_THREADS")) return;
  c.omp_threads_defaulted = true;
  if (c.placement.binds()) {
    err << "[dist-launch] notice: OMP_NUM_THREADS is unset; setting it to each worker's bound "
           "core count (set it yourself to tune)\n";
  } else {
    err << "[dist-launch] warning: OMP_NUM_THREADS is unset; setting it to 1 for each of the "
        << c.nproc_per_node << " workers (set it yourself to tune)\n";
  }
}

void warn_loopback_hostname(const LaunchConfig& c, std::ostream& err) {
  std::array<char, 256> name{};
  if (::gethostname(name.data(), name.size() - 1) != 0) return;
  err << loopback_hostname_warning(c, name.data());
}

// The address this host reaches `host` from (the source address of a route to it: nothing is
// sent); empty when `host` does not resolve or no route leads there.
std::string address_toward(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || found == nullptr) return "";
  std::string address;
  for (const addrinfo* a = found; a != nullptr && address.empty(); a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    std::array<char, INET6_ADDRSTRLEN> text{};
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
      const void* raw =
          local.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (::inet_ntop(local.ss_family, raw, text.data(), text.size()) != nullptr) {
        address = text.data();
      }
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return address;
}

// A dynamic rendezvous publishes this node's host name for its workers' store (their MASTER_ADDR
// where this node is the round's node rank 0). A name that does not resolve here (a container's,
// a pod's) would hold every worker in init_process_group, retrying it and saying nothing of use:
// the address this host reaches the rendezvous endpoint from is published instead, said once.
void publish_an_address_for_a_name_that_does_not_resolve(LaunchConfig& c, std::ostream& err) {
  // (etcd: master_addr is not the endpoint, and each round's workers' store is on a node the
  // round picks.)
  if (!c.elastic || !c.local_addr.empty() || c.rdzv_backend == RendezvousBackend::kEtcdV3) return;
  std::array<char, 256> name{};
  if (::gethostname(name.data(), name.size() - 1) != 0) return;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(name.data(), nullptr, &hints, &found) == 0) {
    ::freeaddrinfo(found);
    return;
  }
  const std::string address = address_toward(c.master_addr);
  if (address.empty()) return;
  c.local_addr = address;
  err << "[dist-launch] warning: this host's name '" << name.data()
      << "' does not resolve here: this node is published as " << address << " (its address toward "
      << c.master_addr
      << "), its workers' MASTER_ADDR where it hosts their store; --local-addr chooses "
         "another\n";
}

}  // namespace

bool resolves_to_loopback_only(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return false;
  bool loopback = true;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      loopback = loopback && (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    } else if (a->ai_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      loopback = loopback && IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
    }
  }
  ::freeaddrinfo(found);
  return loopback;
}

namespace {

// Whether `addr` is this host's own name, whole or as its first label ("node7" and
// "node7.cluster"), whatever the case; "localhost" never is.
bool names_this_host(std::string addr, std::string hostname) {
  const auto lower = [](std::string& s) {
    for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  };
  lower(addr);
  lower(hostname);
  // localhost names the loopback on every machine (a host named localhost.localdomain too).
  if (addr == "localhost" || addr.starts_with("localhost.")) return false;
  return addr == hostname || addr.starts_with(hostname + ".") || hostname.starts_with(addr + ".");
}

}  // namespace

// torch's gloo, without GLOO_SOCKET_IFNAME, binds the address the host's name resolves to; the
// other machines' workers then connect to 127.0.1.1 ("Connection refused"), the job fails or
// its replacements do, over and over, and nothing says why. A master address that is loopback
// here means every node is on this machine (127.0.0.1, localhost), unless it is this host's
// own name: the other machines resolve that one to its real address (MASTER_ADDR=$(hostname),
// the most common case of all, was taken for a job on one machine and never told).
std::string loopback_hostname_warning(const LaunchConfig& c, const std::string& hostname) {
  if (c.max_nodes < 2 || !c.python_workers || std::getenv("GLOO_SOCKET_IFNAME") != nullptr ||
      !resolves_to_loopback_only(hostname) ||
      (resolves_to_loopback_only(c.master_addr) && !names_this_host(c.master_addr, hostname))) {
    return "";
  }
  return "[dist-launch] warning: this host's name '" + hostname +
         "' resolves to loopback addresses only (/etc/hosts): torch's gloo binds there unless "
         "GLOO_SOCKET_IFNAME names an interface, and the other machines' workers cannot reach "
         "this one's; set GLOO_SOCKET_IFNAME (eth0, say) or map the name to this machine's "
         "address\n";
}

namespace {

// The launcher's options written after the training script are the script's, as with torchrun
// (a script may take options of the same names): said, since the job is then not the one meant.
std::string options_after_the_script_warning(const std::vector<std::string>& script_and_args) {
  static const std::vector<std::string> kLaunchers = {
      "nproc-per-node", "nnodes",       "node-rank",   "master-addr", "master-port",
      "rdzv-endpoint",  "rdzv-backend", "rdzv-id",     "standalone",  "max-restarts",
      "restart-policy", "warm-restart", "hang-timeout"};
  std::vector<std::string> found;
  for (std::size_t i = 1; i < script_and_args.size(); ++i) {
    const std::string& arg = script_and_args[i];
    if (arg == "--") break;
    if (!arg.starts_with("--")) continue;
    std::string name =
        arg.substr(2, arg.find('=') == std::string::npos ? std::string::npos : arg.find('=') - 2);
    std::replace(name.begin(), name.end(), '_', '-');
    if (std::find(kLaunchers.begin(), kLaunchers.end(), name) != kLaunchers.end() &&
        std::find(found.begin(), found.end(), "--" + name) == found.end()) {
      found.push_back("--" + name);
    }
  }
  if (found.empty()) return "";
  std::string names;
  for (const auto& f : found) names += (names.empty() ? "" : ", ") + f;
  return "[dist-launch] warning: " + names + " after the training script '" + script_and_args[0] +
         "' " + (found.size() > 1 ? "go" : "goes") +
         " to the script, not to dist-launch (its options go before the script; `" +
         script_and_args[0] + " -- ...` passes them on without this warning)\n";
}

}  // namespace

CliOutcome config_from_options(const RawOptions& raw, std::ostream& err) {
  if (raw.script_and_args.empty()) {
    throw UsageError(
        "no training script given (dist-launch [options] SCRIPT [args...]; see dist-launch "
        "--help)");
  }
  err << options_after_the_script_warning(raw.script_and_args);
  check_compatibility_options(raw, err);
  RawOptions r = raw;
  // Inside Slurm, what the command line leaves out comes from the job step.
  const auto slurm = r.standalone || r.hosts.given() ? std::nullopt : slurm_job_from_environment();
  if (slurm) {
    if (is_extra_slurm_task(*slurm, r, err)) return {true, kExitOk, {}};
    fill_from_slurm(*slurm, r);
  }
  CliOutcome outcome;
  LaunchConfig& c = outcome.config;
  read_job_shape(r, c);
  read_output_options(r, c, err);
  const std::vector<std::string> etcd_keys = read_lifecycle_options(r, c, err);
  default_keep_alive(c);
  if (r.hosts.given()) {  // the job over ssh (hosts.cc): each host checks the rest for itself
    apply_token_options(r.token, c);  // none given: the job generates one
    outcome.hosts_job = hosts_job_config(r, c);
    return outcome;
  }
  choose_rendezvous(r, etcd_keys, err, c);
  if (slurm) require_slurm_step(*slurm, r, c);
  if (r.standalone) {
    c.master_addr = "127.0.0.1";
    c.master_port.reset();
    c.rdzv_backend = RendezvousBackend::kC10d;
    if (c.run_id == "none") c.run_id = random_run_id();
  }
  check_free_port(c);
  apply_token_options(r.token, c);
  set_worker_command(r, c);
  apply_warm_options(r.warm, r.was_given("--preload"), c, err);
  // Devices, placement, the prefix template and etcd's options are checked again by the agent;
  // checking here turns what this node cannot give into a usage error before anything starts.
  agent::check(c);
  default_omp_threads(c, err);
  warn_loopback_hostname(c, err);
  publish_an_address_for_a_name_that_does_not_resolve(c, err);
  return outcome;
}

}  // namespace dist::launcher
