#include "workers/worker_group.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include "dist/agent/signals.h"
#include "dist/contract/worker_contract.h"
#include "health/process_activity.h"
#include "health/telemetry_endpoints.h"
#include "output/log_line_prefix.h"
#include "output/log_pump.h"
#include "processes/process.h"
#include "warm/scratch.h"
#include "warm/snapshot_store.h"
#include "warm/warm_start.h"
#include "workers/failure_report.h"
#include "workers/worker_env.h"

extern char** environ;

namespace dist::agent {

namespace fs = std::filesystem;

namespace {

// After the last worker is reaped, how long its output may still take to drain (a descendant that
// kept the pipe open is not waited for longer).
constexpr std::chrono::milliseconds kOutputDrainTimeout{1000};

std::vector<std::string> current_environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  return env;
}

// TORCHELASTIC_SIGNALS_TO_HANDLE, as torchrun passes it on: "SIGTERM,SIGINT,...".
std::string signal_list(const std::vector<int>& signals) {
  std::string list;
  for (const int s : signals) list += (list.empty() ? "" : ",") + signal_name(s);
  return list;
}

// Whether a worker reaped while the group stops had failed on its own: its error file was
// written before the stop began (the stop's signal may then have ended it on its way out). An
// error written after (a SIGTERM handler's, a collective the stop broke) is the stop's doing; an
// error that says the stop's signal never counts. `f.time` is the file's modification time,
// `stop_began` the stop's marker's (stop_marker_time): the same file system's clock and
// granularity. A tie (a file system that stamps whole seconds) is not known to be after: an
// exit code says it failed.
bool failed_with_an_error(const WorkerFailure& f,
                          std::chrono::system_clock::time_point stop_began) {
  if (f.error_file.empty()) return false;
  for (const char* stopped : {"SignalException", "KeyboardInterrupt", "received signal"}) {
    if (f.message.find(stopped) != std::string::npos) return false;
  }
  return f.time < stop_began || (f.time == stop_began && f.exit_code > 0);
}

// When the stop began, as the file system that holds the workers' error files stamps it: the
// time of a marker written there (and removed) before any stop signal is sent; an error file
// written after it is never stamped before it. (A directory that takes no file holds no error
// file either: then the clock.)
std::chrono::system_clock::time_point stop_marker_time(const fs::path& directory) {
  const fs::path marker = directory / ".stop_began";
  const bool written_now = static_cast<bool>(std::ofstream(marker).flush());
  const auto stamped = written_now ? written_at(marker.string()) : std::nullopt;
  std::error_code ec;
  fs::remove(marker, ec);
  return stamped.value_or(std::chrono::system_clock::now());
}

// "0, 2 (SIGTERM), 3": the items, comma separated.
std::string comma_joined(const std::vector<std::string>& items) {
  std::string text;
  for (const auto& item : items) text += (text.empty() ? "" : ", ") + item;
  return text;
}

void log_failure(const WorkerFailure& f, const std::string& note) {
  spdlog::error(
      "worker {} (local rank {}, pid {}) failed: {}{}{}", f.worker.rank, f.worker.local_rank,
      f.worker.pid,
      f.exit_code < 0 ? signal_name(-f.exit_code) : "exit code " + std::to_string(f.exit_code),
      note.empty() ? "" : ", " + note, f.collateral ? " (its error reads as a lost peer's)" : "");
}

// The workers are a Python interpreter (python, python3, python3.11), started by dist-launch or
// named by --no-python: the progress hook is expected in them.
bool runs_python(const LaunchConfig& config) {
  if (config.python_workers) return true;
  if (config.worker_argv.empty()) return false;
  const std::string name = std::filesystem::path(config.worker_argv.front()).filename().string();
  return name.starts_with("python") &&
         name.find_first_not_of("0123456789.", std::string_view("python").size()) ==
             std::string::npos;
}

HangOptions hang_options(const LaunchConfig& config, const std::string& host) {
  HangOptions o;
  if (config.watchdogs.hang_timeout) {
    o.timeout.off = config.watchdogs.hang_timeout->count() == 0;
    o.timeout.fixed = *config.watchdogs.hang_timeout;
  }
  o.other_nodes = config.max_nodes > 1;
  o.python_workers = runs_python(config) && config.watchdogs.step_hook;
  o.host = host;
  return o;
}

// Whether every worker was reaped (or never started).
template <typename Workers>
bool all_exited(const Workers& workers) {
  return std::all_of(workers.begin(), workers.end(), [](const auto& w) { return w.exited; });
}

// A worker's generation as the events name it: only workers that are generations have one.
std::optional<int> named_generation(const WorkerGroup::Identity& identity, int generation) {
  if (!identity.generations) return std::nullopt;
  return generation;
}

}  // namespace

WorkerGroup::WorkerGroup(boost::asio::io_context& io, const LaunchConfig& config,
                         const RunDirectory& dir, const AgentId& agent_id, Janitor* janitor,
                         std::shared_ptr<Console> console, Telemetry& telemetry, Identity identity,
                         Events events)
    : io_(io),
      config_(config),
      dir_(dir),
      agent_id_(agent_id),
      janitor_(janitor),
      leftovers_(agent_id.id(), janitor ? janitor->pid() : -1),
      output_(io, config, config.role, std::move(console)),
      events_(std::move(events)),
      telemetry_(telemetry),
      watchdogs_(io, config.watchdogs, telemetry, hang_options(config, identity.host),
                 identity.generations, TelemetryEndpoints::show_heartbeats(config)),
      identity_(std::move(identity)),
      resources_(plan_worker_resources(config.nproc_per_node, config.devices, config.placement,
                                       config.omp_threads_defaulted)),
      kill_timer_(io),
      grace_timer_(io),
      drain_timer_(io),
      settle_timer_(io) {
  const auto gets_a_device = [](const WorkerResources& r) {
    return r.environment.contains("CUDA_VISIBLE_DEVICES") ||
           r.environment.contains("HIP_VISIBLE_DEVICES");
  };
  if (config_.devices.virtual_local_rank && !resources_.empty() &&
      !gets_a_device(resources_.front())) {
    spdlog::warn(
        "--virtual-local-rank: no CUDA or ROCm GPU found on this node; every worker is "
        "LOCAL_RANK=0, with no device of its own");
  }
  if (config_.warm.snapshots() || warm::WarmStart::applies(config_, config_.warm)) set_up_warm();
}

// The agent's shared-memory directory, the snapshot store, and the zygote, which starts importing
// now: while the nodes rendezvous.
void WorkerGroup::set_up_warm() {
  try {
    scratch_ = std::make_unique<warm::Scratch>(agent_id_.id());
  } catch (const std::exception& e) {
    if (config_.warm.snapshots()) throw std::runtime_error(std::string("snapshots: ") + e.what());
    spdlog::warn("--warm-restart: {}: Python workers start cold", e.what());
    return;
  }
  if (config_.warm.snapshots())
    snapshots_ = std::make_unique<warm::SnapshotStore>(
        config_.warm, *scratch_, config_.run_id, identity_.host + "/" + agent_id_.id(),
        config_.secret, identity_.host, config_.local_addr);
  if (!warm::WarmStart::applies(config_, config_.warm)) return;
  Variables shared;  // what every worker's environment has, whatever its rank
  shared[kAgentIdVariable] = agent_id_.value();
  if (config_.omp_threads_defaulted) shared["OMP_NUM_THREADS"] = "1";
  if (snapshots_) {
    for (const auto& [name, value] : snapshots_->environment()) shared[name] = value;
  }
  // The progress hook's module is loaded by the zygote (its sitecustomize finds no slot there);
  // each forked worker installs it once its environment and descriptors are its own.
  write_python_files_once();
  add_python_paths(shared, python_hook_, python_package_, current_environment());
  try {
    warm_ = std::make_unique<warm::WarmStart>(io_, config_, config_.warm, config_.placement,
                                              config_.nproc_per_node, *scratch_,
                                              merge_environment(current_environment(), shared));
  } catch (const std::exception& e) {
    spdlog::warn("--warm-restart: {}: Python workers start cold", e.what());
  }
}

// The progress hook (unless --no-step-hook) and the stand-in dist_launch package, once per job,
// for every worker: a --no-python worker may be `python3 train.py` too.
void WorkerGroup::write_python_files_once() {
  if (python_files_written_) return;
  python_files_written_ = true;
  try {
    const PythonFiles files = python_files(dir_.path(), config_.watchdogs.step_hook);
    python_hook_ = files.hook;
    python_package_ = files.package;
  } catch (const std::exception& e) {
    spdlog::warn(
        "Python workers get no progress hook and no dist_launch package (snapshot, elastic): {}",
        e.what());
  }
}

std::vector<pid_t> WorkerGroup::agent_helpers() const {
  std::vector<pid_t> pids;
  if (scratch_ && scratch_->guardian() > 0) pids.push_back(scratch_->guardian());
  if (warm_) {
    for (const pid_t pid : warm_->helpers()) pids.push_back(pid);
  }
  return pids;
}

WorkerGroup::~WorkerGroup() {
  output_.abandon();
  forward(SIGKILL);
  for (const auto& w : workers_) {
    if (w.exited || w.worker.pid <= 0)
      continue;  // never started: waitpid(-1) would wait for any child
    while (::waitpid(w.worker.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
}

void WorkerGroup::start(const Round& a, const store::Endpoint& store) {
  take_round(a, store);
  start_generation_ = 0;
  launch();
}

void WorkerGroup::start_joining(const Round& a, const store::Endpoint& store) {
  take_round(a, store);
  awaiting_generation_ = true;
  start_pending_ = true;  // stop() ends the wait, as it ends one for the zygote
  workers_.assign(static_cast<std::size_t>(config_.nproc_per_node), {});
  output_.begin_round();
  state_ = State::kRunning;
}

void WorkerGroup::start_generation(int generation) {
  if (!awaiting_generation_ || !start_pending_ || state_ != State::kRunning) return;
  awaiting_generation_ = false;
  start_pending_ = false;
  start_generation_ = generation;
  launch();
}

void WorkerGroup::take_round(const Round& a, const store::Endpoint& store) {
  awaiting_generation_ = false;
  round_ = a;
  started_round_ = a.round;
  store_ = store;
  if (snapshots_) snapshots_->use_store(store);
  host_label_ = a.elastic || a.num_nodes > 1
                    ? identity_.host + " (node " + std::to_string(a.node_rank) + ")"
                    : identity_.host;
}

nlohmann::ordered_json WorkerGroup::snapshot_status() const {
  return snapshots_ ? snapshots_->status() : nlohmann::ordered_json();
}

// Round_'s workers start now, or once what they need is ready: their ranks' snapshots fetched
// from the peers that hold replicas of them (--snapshot-replicas: a node that replaced a lost one),
// then the zygote's imports (--warm-restart). Meanwhile the group runs with no worker (a stop ends
// the wait); a start that fails then is reported through Events::start_failed.
void WorkerGroup::launch() {
  const int attempt = ++launches_;
  bool restoring = false;
  if (snapshots_) {
    snapshots_->begin_attempt(round_.rank_offset, config_.nproc_per_node);
    // A job's first round has nothing to restore: replicas live as long as their agents.
    const int other_nodes = round_.round > 0 || round_.restarts > 0 ? round_.num_nodes - 1 : 0;
    restoring = snapshots_->restore(round_.rank_offset, config_.nproc_per_node, other_nodes,
                                    [this, attempt, alive = std::weak_ptr<bool>(alive_)] {
                                      boost::asio::post(io_, [this, attempt, alive] {
                                        if (alive.lock() && attempt == launches_) after_restore();
                                      });
                                    });
  }
  const bool zygote = warm_ && warm_->readiness() == warm::WarmStart::Readiness::kPreparing;
  if (!restoring && !zygote) return start_now();
  start_pending_ = true;
  workers_.assign(static_cast<std::size_t>(config_.nproc_per_node), {});
  output_.begin_round();
  state_ = State::kRunning;
  if (!restoring) after_restore();
}

void WorkerGroup::after_restore() {
  if (!start_pending_ || state_ != State::kRunning) return;
  if (!warm_) return start_pending();
  spdlog::debug("round {}: waiting for the zygote's imports", round_.round);
  warm_->when_settled([this, attempt = launches_] {
    if (attempt == launches_) start_pending();
  });
}

void WorkerGroup::start_pending() {
  if (!start_pending_ || state_ != State::kRunning) return;
  start_pending_ = false;
  try {
    start_now();
  } catch (const std::exception& e) {
    events_.start_failed(e.what());
  }
}

// Every worker is forked before any exec is waited for: they start side by side.
void WorkerGroup::start_now() {
  const auto began = std::chrono::steady_clock::now();
  workers_.assign(static_cast<std::size_t>(config_.nproc_per_node), {});
  late_failures_.clear();
  stopped_.clear();
  settling_.clear();
  output_.begin_round(dir_.attempt(round_.round, 0).parent_path());
  write_python_files_once();
  state_ = State::kRunning;
  const std::vector<std::string> base_env = current_environment();
  const SpawnPlan plan = worker_plan();
  std::vector<SpawnedProcess> started;
  std::optional<std::runtime_error> failure;
  for (int local = 0; local < config_.nproc_per_node && !failure; ++local) {
    Member& w = workers_[static_cast<std::size_t>(local)];
    w = Member{Worker{round_.round, round_.rank_offset + local, local, -1,
                      named_generation(identity_, start_generation_)}};
    try {
      started.push_back(spawn(w, plan, base_env));
    } catch (const std::runtime_error& e) {
      failure.emplace(e);
    }
  }
  int forked = 0;  // from the zygote: nothing to confirm
  for (std::size_t i = 0; i < started.size(); ++i) {
    Member& w = workers_[i];
    try {
      if (started[i].status_fd < 0) ++forked;
      if (started[i].status_fd >= 0) confirm_started(started[i]);
    } catch (const std::exception& e) {
      w.exited = true;  // reaped, its pipes closed
      if (janitor_) janitor_->untrack(w.worker.pid);
      if (!failure) {
        failure.emplace("cannot start worker " + std::to_string(w.worker.rank) + " (local rank " +
                        std::to_string(w.worker.local_rank) + "): " + e.what());
      }
      continue;
    }
    attach_output(w, started[i]);
  }
  for (auto& unstarted : workers_) unstarted.exited = unstarted.exited || unstarted.worker.pid < 0;
  if (failure) throw *failure;  // the caller stops the ones that started
  spdlog::debug("started {} workers (round {})", workers_.size(), round_.round);
  if (forked > 0) {
    spdlog::info("round {}: {} of {} workers forked from the zygote in {:.1f} ms", round_.round,
                 forked, workers_.size(),
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began)
                     .count());
  }
}

// attempt_<round>/<local rank>/, and a replacement's generation_<g>/ inside it (the round the group
// started in: after a regroup its workers' error files are where they were told).
fs::path WorkerGroup::worker_dir(const Member& w) const {
  const fs::path dir = dir_.attempt(started_round_, w.worker.local_rank);
  const int generation = w.worker.generation.value_or(0);
  return generation == 0 ? dir : dir / ("generation_" + std::to_string(generation));
}

pid_t WorkerGroup::replace(int local_rank, int generation) {
  Member& w = workers_.at(static_cast<std::size_t>(local_rank));
  const int rank = w.worker.rank;
  w = Member{Worker{round_.round, rank, local_rank, -1, named_generation(identity_, generation)}};
  SpawnedProcess p = spawn(w, worker_plan(), current_environment());
  try {
    if (p.status_fd >= 0) {
      confirm_started(p);
    } else {  // forked from the zygote: nothing to confirm
      spdlog::info("the replacement of worker {} (local rank {}) was forked from the zygote", rank,
                   local_rank);
    }
  } catch (const std::exception& e) {
    w.exited = true;  // reaped, its pipes closed
    if (janitor_) janitor_->untrack(w.worker.pid);
    throw std::runtime_error("cannot start the replacement of worker " + std::to_string(rank) +
                             " (local rank " + std::to_string(local_rank) + "): " + e.what());
  }
  attach_output(w, p);
  return w.worker.pid;
}

std::vector<std::pair<int, int>> WorkerGroup::regroup(const Round& a) {
  round_ = a;
  host_label_ = identity_.host + " (node " + std::to_string(a.node_rank) + ")";
  std::vector<std::pair<int, int>> moved;
  for (auto& w : workers_) {
    const int rank = a.rank_offset + w.worker.local_rank;
    moved.emplace_back(std::exchange(w.worker.rank, rank), rank);
    w.worker.round = a.round;
  }
  // The running workers save under their new ranks: the writers must not evict those.
  if (snapshots_) snapshots_->list_ranks(a.rank_offset, config_.nproc_per_node);
  watchdogs_.regrouped(a.round, a.rank_offset);
  return moved;
}

std::vector<int> WorkerGroup::running_ranks() const {
  std::vector<int> ranks;
  for (const auto& w : workers_) {
    if (!w.exited) ranks.push_back(w.worker.rank);
  }
  return ranks;
}

// The workers' executable, found on PATH; their stdin the agent's (as torchrun's), but where the
// agent reads its own job from it (an agent that dist-launch --hosts started).
SpawnPlan WorkerGroup::worker_plan() const {
  const char* path = std::getenv("PATH");
  SpawnPlan plan = plan_spawn(config_.worker_argv.front(), path ? path : "");
  plan.keep_stdin = config_.launcher_fd != STDIN_FILENO;
  plan.merge_stderr = output_.merges_streams();
  return plan;
}

SpawnedProcess WorkerGroup::spawn(Member& w, const SpawnPlan& plan,
                                  const std::vector<std::string>& base_env) {
  const fs::path dir = worker_dir(w);
  // A directory made here is empty. One that could not be: its attempt's is missing (the first
  // worker's), or it is there, holding the error file of the worker this one replaces.
  if (::mkdir(dir.c_str(), 0777) != 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    fs::remove(dir / "error.json", ec);
  }

  WorkerIdentity id = make_identity(round_, w.worker.local_rank, store_, config_);
  id.error_file = (dir / "error.json").string();
  id.signals_to_handle = signal_list(config_.signals_to_handle);
  auto variables = torchrun_variables(id, config_.omp_threads_defaulted);
  const WorkerResources& resources = resources_[static_cast<std::size_t>(w.worker.local_rank)];
  for (const auto& [name, value] : resources.environment) variables[name] = value;
  variables[kAgentIdVariable] = agent_id_.value();  // marks all the worker starts
  // The SDK's Gloo group listens there (worker_sdk/src/local_address.h).
  if (!config_.local_addr.empty()) {
    variables[worker_contract::kLocalAddr] = config_.local_addr;
  }
  if (identity_.generations) {  // recovery.h's switch
    // torchrun's 1 tears a survivor down as soon as torch's watchdog sees the lost peer: the
    // in-place helper (dist_launch.elastic) chooses 0 for its NCCL groups, unless the user set it.
    variables.erase(worker_contract::kNcclAsyncErrorHandling);
    variables[worker_contract::kRestartPolicyVariable] = worker_contract::kInPlacePolicy;
    variables[worker_contract::kGenerationVariable] =
        std::to_string(w.worker.generation.value_or(0));
    variables[worker_contract::kInPlaceTimeoutVariable] =
        std::to_string(config_.in_place_timeout.count());
  }
  std::vector<int> inherited;  // the watchdogs' channels
  watchdogs_.prepare(w.worker.local_rank, dir, variables, inherited);
  add_python_paths(variables, python_hook_, python_package_, base_env);
  // A path, never the secret: a process's environment is readable by much of the machine.
  if (!identity_.token_file.empty()) {
    variables[worker_contract::kTokenFile] = identity_.token_file;
  }
  if (snapshots_) {
    for (const auto& [name, value] : snapshots_->environment()) variables[name] = value;
  }
  // (The user's own COLUMNS wins.)
  const bool columns_set = std::any_of(base_env.begin(), base_env.end(),
                                       [](const auto& e) { return e.starts_with("COLUMNS="); });
  if (const auto size = output_.terminal_size(w.worker); size && !columns_set) {
    variables["COLUMNS"] = std::to_string(size->first);
    variables["LINES"] = std::to_string(size->second);
  }
  auto env = merge_environment(base_env, variables);
  const WorkerPlacement& placement = resources.placement;
  const bool bound = placement.bind_cpus || placement.bind_memory;
  if (bound) spdlog::debug("local rank {}: {}", w.worker.local_rank, placement.describe());
  auto argv = substitute_local_rank(config_.worker_argv, w.worker.local_rank);
  SpawnedProcess p;
  if (warm_ && !bound) {
    if (auto forked =
            warm_->spawn(argv, env, inherited, w.worker.rank, plan.keep_stdin, plan.merge_stderr))
      p = *forked;
  }
  try {
    if (p.pid < 0) {
      p = start_process(plan, std::move(argv), std::move(env), bound ? &placement : nullptr,
                        inherited);
    }
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot start worker " + std::to_string(w.worker.rank) +
                             " (local rank " + std::to_string(w.worker.local_rank) +
                             "): " + e.what());
  }
  w.worker.pid = p.pid;
  if (janitor_) janitor_->track(p.pid);  // the worker's process group
  watchdogs_.started(w.worker);
  telemetry_.worker_started(w.worker);
  return p;
}

// Its output is pumped; the group is stopped only once both pipes closed (or the drain timed out).
void WorkerGroup::attach_output(Member& w, const SpawnedProcess& p) {
  w.open_pipes = p.stderr_fd >= 0 ? 2 : 1;
  const pid_t pid = w.worker.pid;
  output_.attach(w.worker, p, worker_dir(w), [this, pid] {
    for (auto& worker : workers_) {
      if (worker.worker.pid == pid) --worker.open_pipes;
    }
    maybe_stopped();
  });
}

// Every exit that has happened is collected before any is acted on: workers that died together
// (a crash and the peers it broke) are all recorded, and the earliest is the root cause. Every
// pid is reaped: the agent is a subreaper, so the workers' orphans are its children too (the
// leftovers of a stop).
void WorkerGroup::reap() {
  const auto reaped_at = std::chrono::system_clock::now();
  std::vector<WorkerFailure> failures;
  bool exited_ok = false;  // a worker exited 0 (reported only while running)
  int status = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
    if (warm_ && warm_->reaped(pid, status)) continue;  // the zygote, a standby
    for (auto& w : workers_) {
      if (w.worker.pid != pid || w.exited) continue;
      w.exited = true;
      if (janitor_) janitor_->untrack(pid);  // its group's id may be reused from now on
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      const std::string watchdog_reason = watchdogs_.reason(w.worker.local_rank);
      // (Succeeded: exited 0 by itself; a stop's SIGTERM that the script caught and left with 0
      // on is no success past a suspected hang.)
      watchdogs_.exited(w.worker.local_rank,
                        state_ == State::kRunning && code == 0 && watchdog_reason.empty());
      // A worker the stop ended is "stopped", not failed (the event log's "failed": false).
      bool failed = code != 0 || !watchdog_reason.empty();
      w.failed = failed;
      if (!failed) exited_ok = true;
      if (failed && state_ == State::kRunning) {
        // What it started (a DataLoader's workers) serves nobody now: SIGTERM, as a stop gives
        // it; in place, the group runs on and they would live until the job ends (the stop's
        // leftovers rule SIGKILLs them then). Its process group's id is held while any is left.
        ::killpg(pid, SIGTERM);
        failures.push_back(failure_of(w, code, reaped_at, watchdog_reason));
        log_failure(failures.back(), watchdog_reason);
      } else if (failed && state_ == State::kStopping) {
        WorkerFailure f = failure_of(w, code, reaped_at, watchdog_reason);
        failed = w.exited_before_stop || failed_with_an_error(f, stop_began_);
        if (failed) {
          f.ended_by_the_stop = code < 0 && !w.exited_before_stop;
          log_failure(f, w.exited_before_stop ? "before the stop reached it"
                         : f.ended_by_the_stop
                             ? "its error file written before the stop, whose signal then ended it"
                             : "its error file written before the stop");
          late_failures_.push_back(std::move(f));
        } else {
          stopped_.push_back(
              fmt::format("{} ({})", w.worker.rank,
                          code < 0 ? signal_name(-code) : "exit code " + std::to_string(code)));
        }
      }
      telemetry_.worker_exited(w.worker, code, failed, watchdog_reason);
    }
  }
  if (state_ == State::kStopping) return maybe_stopped();
  if (state_ != State::kRunning) return;
  if (!failures.empty() && snapshots_ && settling_.empty()) snapshots_->persist_now();
  settling_.insert(settling_.end(), std::make_move_iterator(failures.begin()),
                   std::make_move_iterator(failures.end()));
  if (!settling_.empty()) return settle();
  // Every worker exited 0: a failed one awaiting its replacement (in place) is no success, nor
  // is the exit of what it started (a child reparented here dies of the SIGTERM it got).
  const bool none_failed =
      std::none_of(workers_.begin(), workers_.end(), [](const Member& w) { return w.failed; });
  if (all_exited(workers_) && none_failed) return events_.succeeded();
  if (exited_ok && events_.one_succeeded) events_.one_succeeded();
}

bool WorkerGroup::others_exited(int local_rank) const {
  return std::all_of(workers_.begin(), workers_.end(), [&](const Member& w) {
    return w.exited || w.worker.local_rank == local_rank;
  });
}

WorkerFailure WorkerGroup::failure_of(const Member& w, int code,
                                      std::chrono::system_clock::time_point when,
                                      const std::string& watchdog_reason) const {
  WorkerFailure f;
  f.time = when;  // when its error file was written, when there is one
  f.host = host_label_;
  f.worker = w.worker;
  f.exit_code = code;
  f.error_file = (worker_dir(w) / "error.json").string();
  read_error_file(f);
  if (!fs::exists(f.error_file)) f.error_file.clear();
  f.collateral =
      watchdog_reason.empty() ? looks_collateral(f) : watchdogs_.collateral(w.worker.local_rank);
  if (!watchdog_reason.empty()) {  // the kill is the cause; what the worker wrote comes after
    f.message = f.message.empty() ? watchdog_reason : watchdog_reason + "; " + f.message;
  }
  return f;
}

// Workers that die together are one failure (every worker SIGKILLed at once, a kill of their
// process groups): the kernel ends them one after the other, and each exit is reaped as it comes.
// While another worker is on its way out (a SIGKILL pending, exiting), the failures wait for its
// exit, at most kDyingWait, before they are told; otherwise they are told at once.
void WorkerGroup::settle() {
  const auto now = std::chrono::steady_clock::now();
  if (!settle_deadline_) settle_deadline_ = now + kDyingWait;
  const bool another_dying = std::any_of(workers_.begin(), workers_.end(), [](const Member& w) {
    return !w.exited && on_its_way_out(w.worker.pid);
  });
  if (another_dying && now < *settle_deadline_) {
    if (settle_armed_) return;
    settle_armed_ = true;
    settle_timer_.expires_after(kDyingPoll);
    settle_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      settle_armed_ = false;
      if (state_ == State::kRunning) reap();
    });
    return;
  }
  settle_timer_.cancel();
  settle_armed_ = false;
  settle_deadline_.reset();
  events_.failed(std::exchange(settling_, {}));
}

void WorkerGroup::stop(int signal, bool already_sent) {
  if (state_ == State::kStopping) {
    if (signal != 0) {
      forward(SIGKILL);
      leftovers_.kill();
      maybe_stopped();
    }
    return;
  }
  if (start_pending_) {  // the workers waiting for the zygote never start
    start_pending_ = false;
    for (auto& w : workers_) w.exited = true;
  }
  state_ = State::kStopping;
  stop_began_ = stop_marker_time(dir_.path());
  if (!settling_.empty()) {  // stopped while waiting for a dying worker: failures before the stop
    late_failures_.insert(late_failures_.end(), std::make_move_iterator(settling_.begin()),
                          std::make_move_iterator(settling_.end()));
    settling_.clear();
  }
  settle_timer_.cancel();
  settle_armed_ = false;
  settle_deadline_.reset();
  watchdogs_.stopping();
  draining_ = false;
  deadline_armed_ = false;
  leftovers_.reset(/*grace=*/signal == 0);
  grace_timer_.cancel();
  grace_armed_ = false;
  leftovers_.spare(agent_helpers());
  for (auto& w : workers_) {
    if (w.exited) continue;
    // An exit not reaped yet was the worker's own, whatever comes now: its error counts.
    siginfo_t info{};
    w.exited_before_stop =
        ::waitid(P_PID, static_cast<id_t>(w.worker.pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == w.worker.pid;
    if (signal != 0 && !already_sent) signal_group(w.worker.pid, signal);
    // A worker held stopped (SIGSTOP, SIGTSTP) keeps the stop signal pending until continued,
    // and would wait out the shutdown timeout for its SIGKILL: continued, it takes the signal
    // now (as a shell's kill of a stopped job does).
    if (signal != 0 && signal != SIGKILL && signal != SIGSTOP && signal != SIGTSTP &&
        signal != SIGTTIN && signal != SIGTTOU) {
      signal_group(w.worker.pid, SIGCONT);  // (a stop of its own would be undone by it)
    }
  }
  if (signal == SIGKILL) leftovers_.kill();
  if (signal != 0 && signal != SIGKILL) arm_stop_deadline();
  maybe_stopped();
}

// SIGKILL for the workers and their leftovers --shutdown-timeout after the stop signal (after the
// leftovers' SIGTERM when the workers exited on their own).
void WorkerGroup::arm_stop_deadline() {
  if (deadline_armed_) return;
  deadline_armed_ = true;
  kill_timer_.expires_after(config_.shutdown_timeout);
  kill_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || state_ != State::kStopping) return;
    std::vector<std::string> running;
    for (const auto& w : workers_) {
      if (!w.exited) running.push_back(std::to_string(w.worker.rank));
    }
    spdlog::warn("{} still running {} ms after the stop signal: sending SIGKILL",
                 running.empty()      ? "processes the workers left"
                 : running.size() > 1 ? "the workers of ranks " + comma_joined(running)
                                      : "the worker of rank " + running[0],
                 config_.shutdown_timeout.count());
    forward(SIGKILL);
    leftovers_.kill();
    maybe_stopped();
  });
}

void WorkerGroup::forward(int signal) {
  for (const auto& w : workers_) {
    if (!w.exited) signal_group(w.worker.pid, signal);
  }
}

// Stopped once every worker is reaped and its pipes closed, or kOutputDrainTimeout after the last
// exit, whichever comes first.
void WorkerGroup::maybe_stopped() {
  if (state_ != State::kStopping || !all_exited(workers_)) return;
  if (!leftovers_.gone()) {  // each exit comes back here (SIGCHLD)
    if (!leftovers_.in_grace()) return arm_stop_deadline();
    if (grace_armed_) return;
    grace_armed_ = true;
    grace_timer_.expires_after(kLeftoverGrace);
    grace_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec || state_ != State::kStopping) return;
      leftovers_.grace_over();
      maybe_stopped();
    });
    return;
  }
  kill_timer_.cancel();
  grace_timer_.cancel();
  const bool drained = std::all_of(workers_.begin(), workers_.end(),
                                   [](const Member& w) { return w.open_pipes == 0; });
  if (!drained) {
    if (draining_) return;
    draining_ = true;
    drain_timer_.expires_after(kOutputDrainTimeout);
    drain_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec || state_ != State::kStopping) return;
      spdlog::debug("output still open {} ms after the last worker exited: not waiting for it",
                    kOutputDrainTimeout.count());
      state_ = State::kIdle;
      say_stopped();
      events_.stopped();
    });
    return;
  }
  drain_timer_.cancel();
  state_ = State::kIdle;
  say_stopped();
  events_.stopped();
}

// The workers the stop ended, one line: what each ended with ("stopped rank 0 (SIGTERM)"), as
// torchrun lists the ones it closed; they are not failures, and not in the failure report.
void WorkerGroup::say_stopped() {
  if (stopped_.empty()) return;
  spdlog::info("stopped rank{} {}", stopped_.size() > 1 ? "s" : "", comma_joined(stopped_));
  stopped_.clear();
}

}  // namespace dist::agent
