// The agent's lifecycle, one state machine:
//
//   INIT -> RENDEZVOUS -> RUNNING --all exited 0--------------------------------> SUCCEEDED -> EXIT
//                           |  \--a worker failed / a stop signal--> STOPPING --+-> RESTARTING ->
//                           RUNNING |                                                   +-> FAILED
//                           -> EXIT
//                           \--SIGUSR1/2: forwarded, keeps RUNNING               \-> EXIT (signal)
//
// Everything happens on one thread driving one io_context: the hosted store, SIGCHLD (failures are
// seen when they happen, not polled), the handled signals, the shutdown timer and the log pumps.
#include "dist/agent/agent.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include "dist/rendezvous/errors.h"
#include "dist/rendezvous/server.h"
#include "failure_report.h"
#include "log_pump.h"
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
        host_(hostname()) {
    for (int s : config_.signals_to_handle) handled_signals_.add(s);
  }

  ~Agent() {
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
    kRestarting,
    kSucceeded,
    kFailed,
    kExit
  };
  // Why the group is being stopped: decides where STOPPING leads once every worker is gone.
  enum class StopReason { kAllSucceeded, kWorkerFailed, kSignal, kStartFailed };

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
        if (!host_store() || !prepare_run_dir()) return transition(State::kExit);
        watch_signals();
        return transition(State::kRunning);
      case State::kRunning:
        if (!start_workers()) stop_workers(StopReason::kStartFailed, SIGKILL);
        return;
      case State::kStopping:
        return;  // entered through stop_workers(), left through on_group_stopped()
      case State::kRestarting:
        ++restart_count_;
        spdlog::warn("restarting the worker group (restart {} of {})", restart_count_,
                     config_.max_restarts);
        failures_.clear();
        clear_worker_keys();
        return transition(State::kRunning);
      case State::kSucceeded:
        spdlog::info("all {} workers succeeded", workers_.size());
        exit_code_ = 0;
        return transition(State::kExit);
      case State::kFailed:
        std::fputs(format_report(config_.script_name, failures_).c_str(), stderr);
        std::fflush(stderr);
        exit_code_ = exit_code_of(failures_[root_cause_index(failures_)]);
        return transition(State::kExit);
      case State::kExit:
        if (store_) store_->stop();
        handled_signals_.cancel();
        child_exits_.cancel();
        shutdown_timer_.cancel();
        drain_timer_.cancel();
        io_.stop();  // a grandchild may still hold a worker's pipe open: do not wait for it
        return;
    }
  }

  // STOPPING is over (every worker reaped, output drained): decide what comes next.
  void on_group_stopped() {
    switch (stop_reason_) {
      case StopReason::kAllSucceeded:
        return transition(State::kSucceeded);
      case StopReason::kWorkerFailed:
        return transition(restart_count_ < config_.max_restarts ? State::kRestarting
                                                                : State::kFailed);
      case StopReason::kSignal:
        spdlog::warn("stopped by {}", signal_name(stop_signal_));
        exit_code_ = 128 + stop_signal_;
        return transition(State::kExit);
      case StopReason::kStartFailed:
        exit_code_ = kExitAgentError;
        return transition(State::kExit);
    }
  }

  // ------------------------------------------------------------------------------------------
  // RENDEZVOUS (single node): host the store on a socket this process holds before any worker.

  bool host_store() {
    const std::uint16_t port = config_.master_port.value_or(0);
    try {
      store_.emplace(io_, rendezvous::StoreServer::bind(io_, bind_address(), port));
    } catch (const rendezvous::StoreError& e) {
      spdlog::error("cannot host the rendezvous store: {}", e.what());
      exit_code_ = kExitAgentError;
      return false;
    }
    store_->start();
    store_port_ = store_->local_endpoint().port();
    spdlog::debug("store listening on {}:{}", config_.master_addr, store_port_);
    return true;
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
      w.rank = config_.node_rank * config_.nproc_per_node + local;
      const fs::path dir =
          run_dir_ / ("attempt_" + std::to_string(restart_count_)) / std::to_string(local);
      std::error_code ec;
      fs::create_directories(dir, ec);
      fs::remove(dir / "error.json", ec);

      WorkerIdentity id;
      id.local_rank = local;
      id.rank = w.rank;
      id.group_rank = config_.node_rank;
      id.local_world_size = config_.nproc_per_node;
      id.world_size = config_.nproc_per_node * config_.max_nodes;
      id.group_world_size = config_.max_nodes;
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
      pump_output(w, p.stdout_fd, STDOUT_FILENO, redirected.stdout_stream,
                  write_logs ? dir / "stdout.log" : fs::path());
      pump_output(w, p.stderr_fd, STDERR_FILENO, redirected.stderr_stream,
                  write_logs ? dir / "stderr.log" : fs::path());
    }
    spdlog::debug("started {} workers (attempt {})", workers_.size(), restart_count_);
    return true;
  }

  void pump_output(Worker& w, int pipe_fd, int console_fd, bool redirected, const fs::path& file) {
    LogPump::Sink sink;
    const bool shown =
        config_.local_ranks_filter.empty() || config_.local_ranks_filter.contains(w.local_rank);
    sink.console_fd = redirected || !shown ? -1 : console_fd;
    if (!file.empty()) {
      sink.file_fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    }
    sink.prefix = "[" + config_.role + std::to_string(w.local_rank) + "]:";
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
    if (failed) return stop_workers(StopReason::kWorkerFailed, SIGTERM);
    if (std::all_of(workers_.begin(), workers_.end(), [](const Worker& x) { return x.exited; })) {
      stop_workers(StopReason::kAllSucceeded, 0);  // nothing to signal: wait for the output
    }
  }

  void record_failure(const Worker& w, int code, std::chrono::system_clock::time_point reaped_at) {
    WorkerFailure f;
    f.time = reaped_at;  // the error file's own timestamp, when there is one, is more precise
    f.host = host_;
    f.rank = w.rank;
    f.local_rank = w.local_rank;
    f.exit_code = code;
    f.pid = w.pid;
    f.error_file = (run_dir_ / ("attempt_" + std::to_string(restart_count_)) /
                    std::to_string(w.local_rank) / "error.json")
                       .string();
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
    const std::size_t n = store_->erase_keys([](std::string_view) { return true; });
    spdlog::debug("cleared {} keys of the previous attempt", n);
  }

  const LaunchConfig& config_;
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

  State state_ = State::kInit;
  std::vector<Worker> workers_;
  int restart_count_ = 0;
  std::vector<WorkerFailure> failures_;
  StopReason stop_reason_ = StopReason::kAllSucceeded;
  int stop_signal_ = 0;
  int exit_code_ = 0;
};

int run_agent(const LaunchConfig& config) {
  Agent agent(config);
  return agent.run();
}

}  // namespace dist::agent
