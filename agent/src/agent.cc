// The agent's lifecycle, one state machine:
//
//   INIT -> RENDEZVOUS -> RUNNING --all workers exited 0--> STOPPING -> [EXIT_BARRIER] -> SUCCEEDED
//               ^           |--a worker failed, or the round ended elsewhere--> STOPPING --+
//               |           |--a stop signal--> STOPPING -> EXIT                           |
//               |           \--SIGUSR1/2: forwarded, stays RUNNING                         |
//               |                                                                          v
//               +--- RESTARTING <--restart-- (static: restarts left? / elastic: ROUND_ENDED)
//               +------------------reshape--------------------------/        \--fail--> FAILED
//   SUCCEEDED, FAILED -> EXIT
//
// Everything happens on one thread driving one io_context: the hosted store, SIGCHLD (failures are
// seen when they happen, not polled), the handled signals, the shutdown timer and the log pumps.
// With several nodes, RENDEZVOUS joins a round through the store (node_rendezvous.h). Static: round
// n is restart n on every node. Elastic: after a round ends, ROUND_ENDED gets the job's one
// verdict: restart (a worker failed: counts against --max-restarts), reshape (a node was lost or
// one waits to join: a new round with whoever is there, not a restart) or fail. A watcher thread
// waits for the round to end elsewhere; blocking store calls run on a helper thread and come back
// as events.
#include "dist/agent/agent.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include "blocking_calls.h"
#include "dist/agent/console.h"
#include "dist/agent/log_line_prefix.h"
#include "dist/rendezvous/errors.h"
#include "dist/rendezvous/server.h"
#include "failure_report.h"
#include "log_pump.h"
#include "node_rendezvous.h"
#include "process.h"
#include "worker_env.h"

extern char** environ;

namespace dist::agent {
namespace asio = boost::asio;
namespace fs = std::filesystem;

namespace {

// After the last worker is reaped, how long its output may still take to drain (a grandchild that
// kept the pipe open is not waited for longer).
constexpr std::chrono::milliseconds kOutputDrainTimeout{1000};
constexpr int kExitAgentError = 1;
constexpr std::uint16_t kDefaultMasterPort = 29500;  // torchrun's, for multi-node static jobs
constexpr std::chrono::milliseconds kLeaveTimeout{std::chrono::seconds(30)};  // the store's host

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

std::vector<std::string> current_environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  return env;
}

bool is_forward_only(int signal) {
  return signal == SIGUSR1 || signal == SIGUSR2;
}

}  // namespace

class Agent {
 public:
  explicit Agent(const LaunchConfig& config)
      : config_(config),
        child_exits_(io_, SIGCHLD),
        handled_signals_(io_),
        shutdown_timer_(io_),
        drain_timer_(io_),
        host_(config.local_addr.empty() ? hostname() : config.local_addr) {
    for (int s : config_.signals_to_handle) handled_signals_.add(s);
  }

  ~Agent() {
    if (watch_thread_.joinable()) watch_thread_.join();
    if (temporary_run_dir_) {  // error files of a run without --log-dir
      std::error_code ec;
      fs::remove_all(run_dir_, ec);
    }
  }
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  int run() {
    transition(State::kRendezvous);
    if (state_ != State::kExit) io_.run();
    return exit_code_;
  }

 private:
  enum class State {
    kInit,
    kRendezvous,
    kRunning,
    kStopping,
    kExitBarrier,
    kRoundEnded,
    kRestarting,
    kSucceeded,
    kFailed,
    kExit
  };
  // Why the group is being stopped: decides where STOPPING leads once every worker is gone.
  // kRoundEnded: elsewhere (a failure on another node, a lost node, a node waiting to join).
  enum class StopReason { kAllSucceeded, kWorkerFailed, kRoundEnded, kSignal, kStartFailed };

  struct Worker {
    int local_rank = 0;
    int rank = 0;
    pid_t pid = -1;
    bool exited = false;
    int open_pipes = 0;
  };

  // ------------------------------------------------------------------------------------------
  // Transitions: each state's entry action, in one place.

  void transition(State next) {
    state_ = next;
    switch (next) {
      case State::kInit:
        break;
      case State::kRendezvous:
        if (!prepared_) {
          if (!host_store() || !prepare_run_dir()) return transition(State::kExit);
          watch_signals();
          prepared_ = true;
        }
        if (!multi_node()) {
          assignment_ = single_node_assignment();
          joined_ = true;
          return transition(State::kRunning);
        }
        return join_round();  // continues in on_joined()
      case State::kRunning:
        if (!start_workers()) return stop_workers(StopReason::kStartFailed, SIGKILL);
        if (multi_node()) start_watch();
        return;
      case State::kStopping:
        return;  // entered through stop_workers(), left through on_group_stopped()
      case State::kExitBarrier:
        return run_exit_barrier();  // continues in on_exit_barrier()
      case State::kRoundEnded:
        return decide_verdict();  // continues in on_verdict()
      case State::kRestarting:
        if (!config_.elastic) ++restart_count_;  // elastic: the verdict counted it, job-wide
        spdlog::warn("restarting the worker group (restart {} of {})", restart_count_,
                     config_.max_restarts);
        failures_.clear();
        if (store_ && !config_.elastic) clear_worker_keys();  // elastic: the round's closer does
        return transition(State::kRendezvous);
      case State::kSucceeded:
        spdlog::info("all {} workers succeeded", assignment_.world_size);
        exit_code_ = 0;
        return transition(State::kExit);
      case State::kFailed:
        if (multi_node()) return collect_failures();  // every node's, then report()
        return report();
      case State::kExit:
        warn_incomplete_logs();
        return begin_exit();
    }
  }

  // STOPPING is over (every worker reaped, output drained): decide what comes next.
  void on_group_stopped() {
    if (watching_) {  // the round's watch must end before the round does
      return calls_.run([this, a = assignment_] {
        try_call([&] { rdzv_->stop_watch(a); });
      });  // on_watch() calls back here
    }
    switch (stop_reason_) {
      case StopReason::kAllSucceeded:
        return transition(multi_node() ? State::kExitBarrier : State::kSucceeded);
      case StopReason::kWorkerFailed:
      case StopReason::kRoundEnded:
        return transition(after_failed_round());
      case StopReason::kSignal:
        spdlog::warn("stopped by {}", signal_name(stop_signal_));
        exit_code_ = 128 + stop_signal_;
        return transition(State::kExit);
      case StopReason::kStartFailed:
        exit_code_ = kExitAgentError;
        return transition(State::kExit);
    }
  }

  // Where a round that did not succeed leads.
  State after_failed_round() const {
    if (config_.elastic) return State::kRoundEnded;  // the job's verdict decides
    return restart_count_ < config_.max_restarts ? State::kRestarting : State::kFailed;
  }

  void report() {
    if (failures_.empty()) {  // the job failed without a worker failing (nodes lost)
      spdlog::error("the job failed: {}", failure_reason_);
      exit_code_ = kExitAgentError;
      return transition(State::kExit);
    }
    console_->write(ConsoleStream::kStderr, format_report(config_.script_name, failures_));
    exit_code_ = exit_code_of(failures_[root_cause_index(failures_)]);
    transition(State::kExit);
  }

  void warn_incomplete_logs() {
    for (const LogFileError& e : incomplete_logs_) {
      spdlog::warn("worker logs are incomplete: {} holds the first {} bytes only ({})", e.path,
                   e.bytes_written, e.error);
    }
  }

  void begin_exit() {
    if (!multi_node() || !rdzv_ || !joined_) return finish_exit();
    // The agent that serves the store stays until the other agents have left (bounded), so that
    // they can finish their exit barrier and report. Stopped by a signal, it leaves at once: the
    // job cannot go on without its store, and the other agents stop when it closes.
    const bool hosting = store_.has_value();
    if (hosting && stop_reason_ == StopReason::kSignal) {
      spdlog::warn("this agent hosts the job's store: the other nodes stop with it");
      return finish_exit();
    }
    calls_.run([this, a = assignment_, hosting] {
      if (watching_) try_call([&] { rdzv_->stop_watch(a); });
      if (hosting) try_call([&] { rdzv_->wait_for_others_to_leave(a, kLeaveTimeout); });
      asio::post(io_, [this] { finish_exit(); });
    });
  }

  void finish_exit() {
    if (store_) store_->stop();
    handled_signals_.cancel();
    child_exits_.cancel();
    shutdown_timer_.cancel();
    drain_timer_.cancel();
    io_.stop();  // a grandchild may still hold a worker's pipe open: do not wait for it
  }

  // Runs a store call on the helper thread; a failure of the store itself ends the job.
  template <typename F>
  void try_call(F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      spdlog::error("rendezvous store unreachable: {}", e.what());
    }
  }

  // ------------------------------------------------------------------------------------------
  // RENDEZVOUS with other nodes, and the round's watch.

  bool multi_node() const { return config_.max_nodes > 1 || config_.elastic; }

  Assignment single_node_assignment() const {
    Assignment a;
    a.round = restart_count_;
    a.restarts = restart_count_;
    a.num_nodes = 1;
    a.world_size = config_.nproc_per_node;
    return a;
  }

  void join_round() {
    std::optional<Assignment> previous;  // elastic: the round this node comes back from
    if (joined_) previous = assignment_;
    calls_.run([this, previous = std::move(previous), static_round = restart_count_] {
      try {
        if (!rdzv_) {
          rendezvous::ClientOptions options;
          options.host = config_.master_addr;
          options.port = store_port_;
          options.connect_timeout = config_.elastic ? config_.join_timeout : config_.rdzv_timeout;
          const rendezvous::Keepalive keepalive = liveness();
          options.keepalive_idle_seconds = keepalive.idle_seconds;
          options.keepalive_interval_seconds = keepalive.interval_seconds;
          options.keepalive_probes = keepalive.probes;
          JobShape shape{config_.min_nodes, config_.max_nodes, config_.nproc_per_node, host_};
          rdzv_ = std::make_unique<NodeRendezvous>(options, config_.run_id, std::move(shape));
        }
        Assignment a;
        if (!config_.elastic) {
          a = rdzv_->join_static(static_round, config_.node_rank, config_.rdzv_timeout);
        } else {
          const int round = previous ? previous->round + 1 : rdzv_->current_round();
          a = rdzv_->join_elastic(round, previous ? &*previous : nullptr, config_.join_timeout,
                                  config_.last_call_timeout);
        }
        asio::post(io_, [this, a = std::move(a)]() mutable { on_joined(std::move(a)); });
      } catch (const JobOverError& e) {
        asio::post(io_, [this, what = std::string(e.what()), ok = e.succeeded()] {
          on_job_over(ok, what);
        });
      } catch (const std::exception& e) {
        asio::post(io_, [this, what = std::string(e.what())] { on_rendezvous_failed(what); });
      }
    });
  }

  void on_joined(Assignment a) {
    if (state_ != State::kRendezvous) return;  // stopped meanwhile
    assignment_ = std::move(a);
    joined_ = true;
    restart_count_ = assignment_.restarts;
    spdlog::info("round {}: node {} of {}, global ranks {}..{} of {}", assignment_.round,
                 assignment_.node_rank, assignment_.num_nodes, assignment_.rank_offset,
                 assignment_.rank_offset + config_.nproc_per_node - 1, assignment_.world_size);
    transition(State::kRunning);
  }

  void on_rendezvous_failed(const std::string& what) {
    if (state_ == State::kExit) return;
    spdlog::error("rendezvous failed: {}", what);
    exit_code_ = kExitAgentError;
    transition(State::kExit);
  }

  // Elastic: the job ended (another node decided) before this node got into a round.
  void on_job_over(bool succeeded, const std::string& what) {
    if (state_ == State::kExit) return;
    if (succeeded) {
      spdlog::warn("{}: nothing to do", what);
      exit_code_ = 0;
    } else {
      spdlog::error("{}", what);
      exit_code_ = kExitAgentError;
    }
    transition(State::kExit);
  }

  void start_watch() {
    if (watch_thread_.joinable()) watch_thread_.join();  // the previous round's, already done
    watching_ = true;
    watch_thread_ = std::thread([this, a = assignment_] {
      WatchResult r{WatchResult::kStopped, -1};
      try {
        r = rdzv_->watch(a, std::chrono::seconds(config_.keep_alive_interval_seconds));
      } catch (const std::exception& e) {
        spdlog::error("lost the rendezvous store: {}", e.what());
        r = {WatchResult::kStoreLost, -1};
      }
      asio::post(io_, [this, r] { on_watch(r); });
    });
  }

  void on_watch(WatchResult r) {
    watching_ = false;
    if (state_ == State::kRunning && r.kind != WatchResult::kStopped) {
      switch (r.kind) {
        case WatchResult::kFailed:
          spdlog::warn("a worker on another node failed");
          break;
        case WatchResult::kNodeLost:
          spdlog::error("node {}'s agent is gone (its connection to the store closed)", r.node);
          break;
        case WatchResult::kNewcomer:
          spdlog::info("a new node is waiting to join: stopping the workers for a new round");
          break;
        case WatchResult::kStoreLost:  // said when it happened
        case WatchResult::kStopped:
          break;
      }
      return stop_workers(StopReason::kRoundEnded, SIGTERM);
    }
    if (state_ == State::kStopping) maybe_group_stopped();  // was waiting for the watch to end
  }

  void run_exit_barrier() {
    calls_.run([this, a = assignment_] {
      try {
        const bool everyone = rdzv_->exit_barrier(a, config_.exit_barrier_timeout);
        if (everyone && a.elastic) rdzv_->mark_done(a);  // for nodes still waiting to join
        asio::post(io_, [this, everyone] { on_exit_barrier(everyone, ""); });
      } catch (const std::exception& e) {
        asio::post(io_, [this, what = std::string(e.what())] { on_exit_barrier(false, what); });
      }
    });
  }

  void on_exit_barrier(bool everyone, const std::string& error) {
    if (state_ != State::kExitBarrier) return;
    if (!error.empty()) return on_rendezvous_failed(error);
    if (everyone) return transition(State::kSucceeded);
    spdlog::warn("the round ended on another node while this one waited at the exit barrier");
    transition(after_failed_round());
  }

  // ROUND_ENDED (elastic): one verdict for the whole job, whichever node asks first.
  void decide_verdict() {
    calls_.run([this, a = assignment_] {
      try {
        const Verdict v = rdzv_->decide(a, config_.max_restarts);
        asio::post(io_, [this, v] { on_verdict(v); });
      } catch (const std::exception& e) {
        asio::post(io_, [this, what = std::string(e.what())] { on_rendezvous_failed(what); });
      }
    });
  }

  void on_verdict(const Verdict& v) {
    if (state_ != State::kRoundEnded) return;
    switch (v.action) {
      case Verdict::kRestart:
        restart_count_ = v.restarts;
        return transition(State::kRestarting);
      case Verdict::kReshape:
        spdlog::warn(
            "round {} ended ({}): a new round with the nodes that are there (not a "
            "restart)",
            assignment_.round, v.reason);
        failures_.clear();
        return transition(State::kRendezvous);
      case Verdict::kFail:
      case Verdict::kDone:  // cannot follow a round that failed here; treated as a failure
        failure_reason_ = v.reason;
        return transition(State::kFailed);
    }
  }

  // The job failed: every node reports every node's failures, with one root cause and exit code.
  void collect_failures() {
    calls_.run([this, a = assignment_] {
      std::vector<WorkerFailure> all;
      try_call([&] { all = rdzv_->failures(a); });
      asio::post(io_, [this, all = std::move(all)]() mutable {
        if (!all.empty()) failures_ = std::move(all);
        if (failures_.empty() && failure_reason_.empty()) {
          failure_reason_ = "round " + std::to_string(assignment_.round) +
                            " failed on another node, which left no failure record";
        }
        report();
      });
    });
  }

  // ------------------------------------------------------------------------------------------
  // RENDEZVOUS (single node): host the store on a socket this process holds before any worker.

  bool host_store() {
    if (config_.elastic) return host_elastic_store();
    if (multi_node() && config_.node_rank != 0) {  // node 0 hosts; the others connect to it
      store_port_ = config_.master_port.value_or(kDefaultMasterPort);
      return true;
    }
    const std::uint16_t port = config_.master_port.value_or(multi_node() ? kDefaultMasterPort : 0);
    try {
      serve_store(bind_address(), port);
    } catch (const rendezvous::StoreError& e) {
      spdlog::error("cannot host the rendezvous store: {}", e.what());
      exit_code_ = kExitAgentError;
      return false;
    }
    return true;
  }

  // Elastic: the agent on the endpoint's machine hosts the store (is_host=1 insists, is_host=0
  // never does); when the address is not ours, or the port is taken (another agent, or an
  // external dist-rendezvous), this agent is a client.
  bool host_elastic_store() {
    store_port_ = config_.master_port.value_or(kDefaultMasterPort);
    if (config_.is_host == false) return true;
    std::string error;
    try {
      serve_store(resolve(config_.master_addr), store_port_);
      spdlog::info("hosting the rendezvous store on {}:{}", config_.master_addr, store_port_);
      return true;
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (config_.is_host == true) {
      spdlog::error("cannot host the rendezvous store (--rdzv-conf is_host=1): {}", error);
      exit_code_ = kExitAgentError;
      return false;
    }
    spdlog::debug("not hosting the store ({}): joining {}:{}", error, config_.master_addr,
                  store_port_);
    return true;
  }

  void serve_store(const std::string& address, std::uint16_t port) {
    rendezvous::ServerOptions options;
    if (multi_node()) options.keepalive = liveness();  // agents that vanish are dropped
    store_.emplace(io_, rendezvous::StoreServer::bind(io_, address, port), options);
    store_->start();
    store_port_ = store_->local_endpoint().port();
    spdlog::debug("store listening on {}:{}", address, store_port_);
  }

  // TCP keepalive on the agents' store connections, both ends: a peer that went silent is dropped
  // after about keep_alive_interval * keep_alive_max_attempt seconds (the first probe after one
  // interval of silence, then max_attempt - 1 more).
  rendezvous::Keepalive liveness() const {
    return {config_.keep_alive_interval_seconds, config_.keep_alive_interval_seconds,
            std::max(1, config_.keep_alive_max_attempt - 1)};
  }

  // The endpoint's host as an address to bind (a name resolves to its first IPv4 address).
  std::string resolve(const std::string& host) {
    boost::system::error_code ec;
    asio::ip::make_address(host, ec);
    if (!ec) return host;
    asio::ip::tcp::resolver resolver(io_);
    const auto results = resolver.resolve(asio::ip::tcp::v4(), host, "", ec);
    if (ec || results.empty()) {
      throw rendezvous::StoreError(rendezvous::StoreErrc::kInvalidArgument,
                                   "cannot resolve '" + host + "': " + ec.message());
    }
    return results.begin()->endpoint().address().to_string();
  }

  std::string bind_address() const {
    boost::system::error_code ec;
    const auto address = asio::ip::make_address(config_.master_addr, ec);
    if (!ec && address.is_loopback()) return config_.master_addr;
    return "0.0.0.0";
  }

  bool prepare_run_dir() {
    std::error_code ec;
    if (!config_.log_dir.empty()) {
      run_dir_ = fs::path(config_.log_dir) / config_.run_id;
      if (config_.elastic) {  // node ranks change from round to round
        run_dir_ /= "node_" + host_ + "_" + std::to_string(::getpid());
      } else if (multi_node()) {
        run_dir_ /= "node_" + std::to_string(config_.node_rank);
      }
    } else {
      std::string pattern = (fs::temp_directory_path() / "dist-launch-XXXXXX").string();
      if (!::mkdtemp(pattern.data())) {
        spdlog::error("cannot create a temporary directory for worker error files: {}",
                      std::strerror(errno));
        exit_code_ = kExitAgentError;
        return false;
      }
      run_dir_ = pattern;
      temporary_run_dir_ = true;
    }
    fs::create_directories(run_dir_, ec);
    if (ec) {
      spdlog::error("cannot create log directory {}: {}", run_dir_.string(), ec.message());
      exit_code_ = kExitAgentError;
      return false;
    }
    if (config_.writes_log_files()) {
      spdlog::info("worker logs in {}", run_dir_.string());
    }
    return true;
  }

  // ------------------------------------------------------------------------------------------
  // RUNNING

  bool start_workers() {
    workers_.assign(static_cast<std::size_t>(config_.nproc_per_node), {});
    const std::vector<std::string> base_env = current_environment();
    const bool write_logs = config_.writes_log_files();
    for (int local = 0; local < config_.nproc_per_node; ++local) {
      Worker& w = workers_[static_cast<std::size_t>(local)];
      w.local_rank = local;
      w.rank = assignment_.rank_offset + local;
      const fs::path dir = attempt_dir(local);
      std::error_code ec;
      fs::create_directories(dir, ec);
      fs::remove(dir / "error.json", ec);

      WorkerIdentity id;
      id.local_rank = local;
      id.rank = w.rank;
      id.group_rank = assignment_.node_rank;
      id.local_world_size = config_.nproc_per_node;
      id.world_size = assignment_.world_size;
      id.group_world_size = assignment_.num_nodes;
      id.role = config_.role;
      id.master_addr = config_.master_addr;
      id.master_port = store_port_;
      id.restart_count = restart_count_;
      id.max_restarts = config_.max_restarts;
      id.run_id = config_.run_id;
      id.error_file = (dir / "error.json").string();
      const auto env =
          merge_environment(base_env, torchrun_variables(id, config_.omp_threads_defaulted));
      const auto argv = substitute_local_rank(config_.worker_argv, local);

      SpawnedProcess p;
      try {
        p = spawn_worker(argv, env);
      } catch (const std::exception& e) {
        spdlog::error("cannot start worker {} (local rank {}): {}", w.rank, local, e.what());
        return false;
      }
      w.pid = p.pid;
      w.open_pipes = 2;
      const StreamSelection redirected = config_.redirects_for(local);
      pump_output(w, p.stdout_fd, ConsoleStream::kStdout, redirected.stdout_stream,
                  write_logs ? dir / "stdout.log" : fs::path());
      pump_output(w, p.stderr_fd, ConsoleStream::kStderr, redirected.stderr_stream,
                  write_logs ? dir / "stderr.log" : fs::path());
    }
    spdlog::debug("started {} workers (round {})", workers_.size(), assignment_.round);
    return true;
  }

  // A worker's log and error-file directory: attempt_<round> (static: round n is restart n).
  fs::path attempt_dir(int local_rank) const {
    return run_dir_ / ("attempt_" + std::to_string(assignment_.round)) / std::to_string(local_rank);
  }

  void pump_output(Worker& w, int pipe_fd, ConsoleStream stream, bool redirected,
                   const fs::path& file) {
    LogPump::Sink sink;
    const bool shown =
        config_.local_ranks_filter.empty() || config_.local_ranks_filter.contains(w.local_rank);
    if (!redirected && shown) sink.console = console_;
    sink.stream = stream;
    sink.file_path = file.string();
    sink.on_file_error = [this](const LogFileError& e) { incomplete_logs_.push_back(e); };
    sink.prefix = default_log_line_prefix(config_.role, w.local_rank);
    const pid_t pid = w.pid;
    LogPump::start(io_, pipe_fd, std::move(sink), [this, pid] {
      for (auto& worker : workers_) {
        if (worker.pid == pid) --worker.open_pipes;
      }
      maybe_group_stopped();
    });
  }

  void watch_signals() {
    watch_children();
    watch_handled_signals();
  }
  void watch_children() {
    child_exits_.async_wait([this](const boost::system::error_code& ec, int) {
      if (ec) return;
      reap_children();
      if (state_ != State::kExit) watch_children();
    });
  }
  void watch_handled_signals() {
    handled_signals_.async_wait([this](const boost::system::error_code& ec, int signal) {
      if (!ec) on_signal(signal);
    });
  }

  // Every exit that has happened is collected before any is acted on: workers that died together
  // (a crash and the peers it broke) are all recorded, and the earliest is the root cause.
  void reap_children() {
    const auto reaped_at = std::chrono::system_clock::now();
    bool failed = false;
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      for (auto& w : workers_) {
        if (w.pid != pid || w.exited) continue;
        w.exited = true;
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
        if (state_ == State::kRunning && code != 0) {
          record_failure(w, code, reaped_at);
          failed = true;
        }
      }
    }
    if (state_ != State::kRunning) return maybe_group_stopped();
    if (failed) {
      if (multi_node()) {  // every node stops its workers and hears what failed here
        calls_.run([this, a = assignment_, failures = failures_] {
          try_call([&] { rdzv_->announce_failure(a, failures); });
        });
      }
      return stop_workers(StopReason::kWorkerFailed, SIGTERM);
    }
    if (std::all_of(workers_.begin(), workers_.end(), [](const Worker& x) { return x.exited; })) {
      stop_workers(StopReason::kAllSucceeded, 0);  // nothing to signal: wait for the output
    }
  }

  void record_failure(const Worker& w, int code, std::chrono::system_clock::time_point reaped_at) {
    WorkerFailure f;
    f.time = reaped_at;  // the error file's own timestamp, when there is one, is more precise
    f.host = multi_node() ? host_ + " (node " + std::to_string(assignment_.node_rank) + ")" : host_;
    f.rank = w.rank;
    f.local_rank = w.local_rank;
    f.exit_code = code;
    f.pid = w.pid;
    f.error_file = (attempt_dir(w.local_rank) / "error.json").string();
    read_error_file(f);
    if (!fs::exists(f.error_file)) f.error_file.clear();
    spdlog::error("worker {} (local rank {}, pid {}) failed: {}", w.rank, w.local_rank, f.pid,
                  code < 0 ? signal_name(-code) : "exit code " + std::to_string(code));
    failures_.push_back(std::move(f));
  }

  // ------------------------------------------------------------------------------------------
  // STOPPING: signal every worker's group, SIGKILL after the grace period, wait for all.

  void stop_workers(StopReason reason, int signal) {
    state_ = State::kStopping;
    stop_reason_ = reason;
    for (const auto& w : workers_) {
      if (!w.exited && signal != 0) signal_group(w.pid, signal);
    }
    if (signal != SIGKILL && signal != 0) {
      shutdown_timer_.expires_after(config_.shutdown_timeout);
      shutdown_timer_.async_wait([this](const boost::system::error_code& ec) {
        if (ec || state_ != State::kStopping) return;
        spdlog::warn("workers still running {} ms after the stop signal: sending SIGKILL",
                     config_.shutdown_timeout.count());
        for (const auto& w : workers_) {
          if (!w.exited) signal_group(w.pid, SIGKILL);
        }
      });
    }
    maybe_group_stopped();
  }

  void maybe_group_stopped() {
    if (state_ != State::kStopping) return;
    if (!std::all_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.exited; })) {
      return;
    }
    shutdown_timer_.cancel();
    const bool drained = std::all_of(workers_.begin(), workers_.end(),
                                     [](const Worker& w) { return w.open_pipes == 0; });
    if (!drained && !drain_timer_armed_) {
      drain_timer_armed_ = true;
      drain_timer_.expires_after(kOutputDrainTimeout);
      drain_timer_.async_wait([this](const boost::system::error_code& ec) {
        if (!ec && state_ == State::kStopping) leave_stopping();
      });
      return;
    }
    if (drained) leave_stopping();
  }

  void leave_stopping() {
    drain_timer_.cancel();
    drain_timer_armed_ = false;
    on_group_stopped();
  }

  // ------------------------------------------------------------------------------------------
  // Signals sent to the agent.

  void on_signal(int signal) {
    watch_handled_signals();
    if (is_forward_only(signal)) {
      spdlog::info("forwarding {} to the workers", signal_name(signal));
      for (const auto& w : workers_) {
        if (!w.exited) signal_group(w.pid, signal);
      }
      return;
    }
    if (state_ == State::kRendezvous) {
      // No worker exists yet; the helper thread may be blocked in a rendezvous wait.
      spdlog::warn("{} received during rendezvous: exiting", signal_name(signal));
      spdlog::default_logger()->flush();
      std::_Exit(128 + signal);
    }
    if (state_ == State::kStopping && stop_signal_ != 0) {
      spdlog::warn("{} again: killing the workers now", signal_name(signal));
      for (const auto& w : workers_) {
        if (!w.exited) signal_group(w.pid, SIGKILL);
      }
      return;
    }
    spdlog::warn("{} received: stopping the workers (grace period {} ms)", signal_name(signal),
                 config_.shutdown_timeout.count());
    stop_signal_ = signal;
    stop_workers(StopReason::kSignal, signal);
  }

  // A restart attempt starts with a clean store: PyTorch 2.5+ workers expect a fresh one.
  void clear_worker_keys() {
    // Everything the workers wrote; the agents' own rendezvous keys (rdzv/) stay.
    const std::size_t n =
        store_->erase_keys([](std::string_view key) { return !key.starts_with("rdzv/"); });
    spdlog::debug("cleared {} keys of the previous attempt", n);
  }

  const LaunchConfig& config_;
  std::shared_ptr<Console> console_ = Console::process();
  std::vector<LogFileError> incomplete_logs_;  // log files given up on (ENOSPC, EIO)
  asio::io_context io_;
  std::optional<rendezvous::StoreServer> store_;
  std::uint16_t store_port_ = 0;
  asio::signal_set child_exits_;
  asio::signal_set handled_signals_;
  asio::steady_timer shutdown_timer_;
  asio::steady_timer drain_timer_;
  bool drain_timer_armed_ = false;
  std::string host_;
  fs::path run_dir_;
  bool temporary_run_dir_ = false;

  std::unique_ptr<NodeRendezvous> rdzv_;  // several nodes only; used on calls_' thread
  Assignment assignment_;
  bool joined_ = false;    // assignment_ holds a round this node was part of
  bool prepared_ = false;  // store hosted, run directory made, signals watched
  bool watching_ = false;  // the round's watch thread has not reported back yet
  std::thread watch_thread_;
  BlockingCalls calls_;  // last but one: joined before the members its calls use

  State state_ = State::kInit;
  std::vector<Worker> workers_;
  int restart_count_ = 0;
  std::vector<WorkerFailure> failures_;
  std::string failure_reason_;  // why the job failed when no worker did (elastic verdicts)
  StopReason stop_reason_ = StopReason::kAllSucceeded;
  int stop_signal_ = 0;
  int exit_code_ = 0;
};

int run_agent(const LaunchConfig& config) {
  Agent agent(config);
  return agent.run();
}

}  // namespace dist::agent
