// The agent's lifecycle, one state machine on one io_context:
//
//   INIT -> RENDEZVOUS -> RUNNING --all workers exited 0--> STOPPING -> [EXIT_BARRIER] -> SUCCEEDED
//               ^           |--a worker failed, the round ended elsewhere--> STOPPING --+
//               |           |--a stop signal, the store lost--> STOPPING -> EXIT       |
//               |           \--SIGUSR1/2: forwarded, stays RUNNING                     |
//               |                                                                      v
//               +--- RESTARTING <--restart-- (static: restarts left? / elastic: ROUND_ENDED)
//               +------------------reshape--------------------------/        \--fail--> FAILED
//   SUCCEEDED, FAILED -> EXIT
//
// transition() is the one place a state is entered; it runs the state's entry action. Everything
// else arrives as a typed event (namespace event, below) through on(): from the worker group
// (failed, succeeded, stopped), the signals (signalfd, with the sender's pid), and the coroutines
// that talk to the rendezvous store (joined, round ended elsewhere, barrier, verdict, failures).
// Nothing blocks the thread: the hosted store, the workers' output and every store call share it.
// A stop signal works in every state: pending store calls are cancelled (their sessions closed)
// and the agent leaves through EXIT, cleaning up as it always does.
#include "dist/agent/agent.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <optional>
#include <variant>

#include "dist/agent/console.h"
#include "dist/agent/rendezvous.h"
#include "dist/agent/signal_origin.h"
#include "dist/rendezvous/errors.h"
#include "dist/rendezvous/token.h"
#include "etcd_store.h"
#include "failure_report.h"
#include "janitor.h"
#include "job_processes.h"
#include "launcher_channel.h"
#include "process.h"
#include "run_directory.h"
#include "signal_watcher.h"
#include "store_host.h"
#include "tcp_store.h"
#include "telemetry.h"
#include "worker_group.h"

namespace dist::agent {
namespace asio = boost::asio;

namespace {

constexpr int kExitAgentError = 1;
constexpr std::uint16_t kDefaultMasterPort = 29500;  // torchrun's, for multi-node static jobs
constexpr std::chrono::milliseconds kLeaveTimeout{std::chrono::seconds(30)};  // the store's host

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

bool is_forward_only(int signal) {
  return signal == SIGUSR1 || signal == SIGUSR2;
}

bool is_loopback_name(const std::string& host) {
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  return host == "localhost" || (!ec && address.is_loopback());
}

template <typename... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <typename... F>
Overloaded(F...) -> Overloaded<F...>;

}  // namespace

// What happens to the agent, as typed events.
namespace event {
struct Prepared {};  // the rendezvous session is open (several nodes)
struct Joined {
  Assignment assignment;
};
struct WorkersFailed {
  std::vector<WorkerFailure> failures;
};
struct WorkersSucceeded {};
struct GroupStopped {};
struct RoundEnded {  // the watch saw the round end elsewhere, or lost the store
  WatchResult result;
  std::string store_lost;
};
struct WatchStopped {};
struct BarrierDone {
  bool everyone = false;
};
struct VerdictReached {
  Verdict verdict;
};
struct FailuresCollected {
  std::vector<WorkerFailure> all;
};
struct OthersLeft {};
struct RendezvousFailed {  // a rendezvous step could not be done
  enum Kind { kError, kJobOver, kJobDone, kRoundAborted, kCancelled } kind = kError;
  std::string why;
};
struct SignalReceived {
  int signal = 0;
  pid_t sender = 0;
  int code = 0;  // si_code
};
}  // namespace event

using Event =
    std::variant<event::Prepared, event::Joined, event::WorkersFailed, event::WorkersSucceeded,
                 event::GroupStopped, event::RoundEnded, event::WatchStopped, event::BarrierDone,
                 event::VerdictReached, event::FailuresCollected, event::OthersLeft,
                 event::RendezvousFailed, event::SignalReceived>;

class Agent {
 public:
  Agent(const LaunchConfig& config, const AgentId& agent_id, Janitor* janitor)
      : config_(config),
        agent_id_(agent_id),
        janitor_(janitor),
        signals_(io_, watched_signals(config)),
        host_(config.local_addr.empty() ? hostname() : config.local_addr) {}

  ~Agent() { shut_down(); }
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  int run() {
    transition(State::kRendezvous);
    if (state_ != State::kExit) io_.run();
    shut_down();
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
  static_assert(kAgentStateNames.size() == static_cast<std::size_t>(State::kExit) + 1);
  // Why the group is being stopped: decides where STOPPING leads once every worker is gone.
  // kRoundEnded: elsewhere (a failure on another node, a lost node, a node waiting to join).
  enum class StopReason {
    kAllSucceeded,
    kWorkerFailed,
    kRoundEnded,
    kSignal,
    kStartFailed,
    kStoreLost
  };

  static std::vector<int> watched_signals(const LaunchConfig& config) {
    std::vector<int> s = config.signals_to_handle;
    s.push_back(SIGCHLD);
    return s;
  }

  // ------------------------------------------------------------------------------------------
  // Transitions: each state's entry action, in one place.

  void transition(State next) {
    state_ = next;
    if (telemetry_) telemetry_->state(kAgentStateNames[static_cast<std::size_t>(next)]);
    switch (next) {
      case State::kInit:
        return;
      case State::kRendezvous:
        if (!prepared_) return prepare();  // continues on Prepared
        return begin_round();              // continues on Joined
      case State::kRunning:
        return start_workers();
      case State::kStopping:
        group_->stop(stop_signal_, std::exchange(signal_already_sent_, false));
        return;  // continues on GroupStopped
      case State::kExitBarrier:
        return launch(exit_barrier(), [](bool everyone) { return event::BarrierDone{everyone}; });
      case State::kRoundEnded:  // elastic: the job's one verdict, whichever node asks first
        return launch(rdzv_->decide(assignment_, config_.max_restarts),
                      [](Verdict v) { return event::VerdictReached{std::move(v)}; });
      case State::kRestarting:
        if (!config_.elastic) ++restart_count_;  // elastic: the verdict counted it, job-wide
        telemetry_->restarting(restart_count_);
        spdlog::warn("restarting the worker group (restart {} of {})", restart_count_,
                     config_.max_restarts);
        failures_.clear();
        // A restart attempt starts with a clean store: PyTorch 2.5+ workers expect a fresh one.
        // (Elastic: every round's workers get a new store, hosted by its node rank 0.)
        if (store_host_ && !config_.elastic) {
          spdlog::debug("cleared {} keys of the previous attempt",
                        store_host_->clear_worker_keys());
        }
        return transition(State::kRendezvous);
      case State::kSucceeded:
        if (config_.nproc_per_node == 1) {
          spdlog::info("the worker of this node succeeded");
        } else {
          spdlog::info("all {} workers of this node succeeded", config_.nproc_per_node);
        }
        exit_code_ = 0;
        return transition(State::kExit);
      case State::kFailed:
        if (!multi_node()) return report();
        return launch(collect_failures(), [](std::vector<WorkerFailure> all) {
          return event::FailuresCollected{std::move(all)};
        });
      case State::kExit:
        warn_incomplete_logs();
        return begin_exit();
    }
  }

  // ------------------------------------------------------------------------------------------
  // Events.

  void on(Event e) {
    std::visit(Overloaded{
                   [&](event::Prepared&) {
                     if (state_ != State::kRendezvous) return;
                     prepared_ = true;
                     begin_round();
                   },
                   [&](event::Joined& j) {
                     if (state_ != State::kRendezvous) return;
                     assignment_ = std::move(j.assignment);
                     joined_ = true;
                     restart_count_ = assignment_.restarts;
                     telemetry_->round_joined(assignment_);
                     spdlog::info("round {}: node {} of {}, global ranks {}..{} of {}",
                                  assignment_.round, assignment_.node_rank, assignment_.num_nodes,
                                  assignment_.rank_offset,
                                  assignment_.rank_offset + config_.nproc_per_node - 1,
                                  assignment_.world_size);
                     transition(State::kRunning);
                   },
                   [&](event::WorkersFailed& f) {
                     if (state_ != State::kRunning) return;
                     failures_ = std::move(f.failures);
                     if (multi_node()) {  // every node stops its workers and hears what failed here
                       fire_and_forget(rdzv_->announce_failure(assignment_, failures_),
                                       "announcing the failure");
                     }
                     stop(StopReason::kWorkerFailed, SIGTERM);
                   },
                   [&](event::WorkersSucceeded&) {
                     if (state_ == State::kRunning) stop(StopReason::kAllSucceeded, 0);
                   },
                   [&](event::GroupStopped&) {
                     if (state_ != State::kStopping) return;
                     group_stopped_ = true;
                     if (watching_) return rdzv_->stop_watch();  // continues on WatchStopped
                     after_stopping();
                   },
                   [&](event::RoundEnded& r) { on_round_ended(r.result, r.store_lost); },
                   [&](event::WatchStopped&) {
                     watching_ = false;
                     if (state_ == State::kStopping && group_stopped_) after_stopping();
                   },
                   [&](event::BarrierDone& b) {
                     if (state_ != State::kExitBarrier) return;
                     if (b.everyone) return transition(State::kSucceeded);
                     spdlog::warn(
                         "the round ended on another node while this one waited at the exit "
                         "barrier");
                     transition(after_failed_round());
                   },
                   [&](event::VerdictReached& v) { on_verdict(v.verdict); },
                   [&](event::FailuresCollected& c) {
                     if (state_ != State::kFailed) return;
                     if (!c.all.empty()) failures_ = std::move(c.all);
                     report();
                   },
                   [&](event::OthersLeft&) {
                     if (state_ == State::kExit) finish();
                   },
                   [&](event::RendezvousFailed& f) { on_rendezvous_failed(f); },
                   [&](event::SignalReceived& s) { on_signal(s.signal, s.sender, s.code); },
               },
               e);
  }

  // STOPPING is over (every worker reaped, output drained, the watch ended): what comes next.
  void after_stopping() {
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
      case StopReason::kStoreLost:
        exit_code_ = kExitAgentError;
        return transition(State::kExit);
    }
  }

  // Where a round that did not succeed leads.
  State after_failed_round() const {
    if (config_.elastic) return State::kRoundEnded;  // the job's verdict decides
    return restart_count_ < config_.max_restarts ? State::kRestarting : State::kFailed;
  }

  void on_round_ended(const WatchResult& r, const std::string& store_lost) {
    watching_ = false;
    if (!store_lost.empty()) {
      spdlog::error("lost the rendezvous store: {}", store_lost);
      failure_reason_ = "lost the rendezvous store at " + rdzv_->describe();
      if (state_ == State::kStopping) stop_reason_ = StopReason::kStoreLost;
      if (state_ == State::kRunning) return stop(StopReason::kStoreLost, SIGTERM);
    }
    if (state_ == State::kStopping && group_stopped_) return after_stopping();
    if (state_ != State::kRunning) return;
    switch (r.kind) {
      case WatchResult::kFailed:
        spdlog::warn("a worker on another node failed");
        break;
      case WatchResult::kNodeLost:
        spdlog::error("node {}'s agent is gone (its connection to the store closed)", r.node);
        telemetry_->node_lost(assignment_.round, r.node);
        break;
      case WatchResult::kNewcomer:
        spdlog::info("a new node is waiting to join: stopping the workers for a new round");
        telemetry_->node_joined(assignment_.round);
        break;
      case WatchResult::kStopped:
        return;
    }
    stop(StopReason::kRoundEnded, SIGTERM);
  }

  void on_verdict(const Verdict& v) {
    if (state_ != State::kRoundEnded) return;
    telemetry_->verdict(assignment_.round, v);
    switch (v.action) {
      case Verdict::kRestart:
        spdlog::warn("round {} ended: {}", assignment_.round, v.reason);
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

  void on_rendezvous_failed(const event::RendezvousFailed& f) {
    using Kind = event::RendezvousFailed::Kind;
    if (f.kind == Kind::kCancelled || state_ == State::kExit) return;  // said when cancelled
    switch (f.kind) {
      case Kind::kJobDone:
        spdlog::warn("{}: nothing to do", f.why);
        exit_code_ = 0;
        return transition(State::kExit);
      case Kind::kRoundAborted:
        spdlog::warn("{}", f.why);
        if (!config_.elastic && state_ == State::kRendezvous) {
          const State next = after_failed_round();
          if (next == State::kFailed) failure_reason_ = f.why;
          return transition(next);
        }
        break;
      default:
        break;
    }
    spdlog::error("{}", f.kind == Kind::kJobOver ? f.why : "rendezvous failed: " + f.why);
    exit_code_ = kExitAgentError;
    transition(State::kExit);
  }

  void on_signal(int signal, pid_t sender, int code) {
    if (signal == SIGCHLD) {
      if (group_) group_->reap();
      return;
    }
    if (is_forward_only(signal)) {
      spdlog::info("forwarding {} to the workers", signal_name(signal));
      if (group_) group_->forward(signal);
      return;
    }
    // Slurm signals every process of the step itself: the workers have this one already.
    const bool workers_have_it = sent_by_slurm_step(code, sender);
    if (state_ == State::kStopping && stop_signal_received_) {
      spdlog::warn("{} again: killing the workers now", signal_name(signal));
      return group_->stop(SIGKILL);
    }
    stop_signal_received_ = true;
    if (state_ == State::kRunning) {
      spdlog::warn("{} received{}: stopping the workers (grace period {} ms)", signal_name(signal),
                   workers_have_it ? " from Slurm, which signalled the workers too" : "",
                   config_.shutdown_timeout.count());
      signal_already_sent_ = workers_have_it;
      return stop(StopReason::kSignal, signal);
    }
    if (state_ == State::kStopping) {  // already stopping for another reason: leave afterwards
      spdlog::warn("{} received: leaving once the workers are stopped", signal_name(signal));
      stop_reason_ = StopReason::kSignal;
      stop_signal_ = signal;
      return group_->stop(signal, workers_have_it);
    }
    // No worker runs: whatever is pending (a rendezvous, a barrier, a verdict) is cancelled.
    spdlog::warn("{} received: leaving the job", signal_name(signal));
    stop_reason_ = StopReason::kSignal;
    stop_signal_ = signal;
    exit_code_ = 128 + signal;
    if (state_ == State::kExit) return finish();
    transition(State::kExit);
  }

  void stop(StopReason reason, int signal) {
    stop_reason_ = reason;
    stop_signal_ = signal;
    group_stopped_ = false;
    transition(State::kStopping);
  }

  // ------------------------------------------------------------------------------------------
  // RENDEZVOUS

  bool multi_node() const { return config_.max_nodes > 1 || config_.elastic; }

  // Once: the run directory, the signals, the store this node hosts, then (several nodes) the
  // rendezvous session.
  void prepare() {
    try {
      run_dir_.emplace(config_, host_);
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
      exit_code_ = kExitAgentError;
      return transition(State::kExit);
    }
    if (config_.writes_log_files()) spdlog::info("worker logs in {}", run_dir_->path().string());
    if (!provide_token_file()) {
      exit_code_ = kExitAgentError;
      return transition(State::kExit);
    }
    signals_.start([this](SignalWatcher::Received r) {
      on(event::SignalReceived{r.signal, r.sender, r.code});
    });
    if (config_.launcher_fd >= 0) {
      try {
        launcher_.emplace(io_, config_.launcher_fd);
      } catch (const std::exception& e) {
        spdlog::error("{}", e.what());
        exit_code_ = kExitAgentError;
        return transition(State::kExit);
      }
      launcher_->start([this](int signal) { on(event::SignalReceived{signal, 0, SI_USER}); });
    }
    try {
      telemetry_.emplace(io_, config_, host_);  // the event log, metrics and health check
      telemetry_->job_started();
      group_.emplace(
          io_, config_, *run_dir_, agent_id_, janitor_, console_, *telemetry_,
          WorkerGroup::Events{
              [this](std::vector<WorkerFailure> f) { on(event::WorkersFailed{std::move(f)}); },
              [this] { on(event::WorkersSucceeded{}); }, [this] { on(event::GroupStopped{}); },
              [this](std::string why) {  // a start that waited for the zygote (--warm-restart)
                spdlog::error("{}", why);
                stop(StopReason::kStartFailed, SIGKILL);
              }});
      telemetry_->set_progress_source(
          [this] { return group_ ? group_->progress() : std::vector<WorkerProgress>{}; });
    } catch (const std::exception& e) {  // devices, placement, ports or files this node cannot give
      spdlog::error("{}", e.what());
      exit_code_ = kExitAgentError;
      return transition(State::kExit);
    }
    if (!multi_node() || !config_.elastic) {
      if (!host_static_store()) return transition(State::kExit);
      if (!multi_node()) return on(event::Prepared{});
    }
    launch(open_rendezvous(), [] { return event::Prepared{}; });
  }

  // Single node, and static node rank 0: this agent hosts the store, on loopback when the
  // workers are all here, else on every address of the machine.
  bool host_static_store() {
    // Node 0 hosts, unless someone else does (is_host=0: dist-launch --hosts); the others connect.
    if (multi_node() && (config_.node_rank != 0 || config_.is_host == false)) {
      store_port_ = config_.master_port.value_or(kDefaultMasterPort);
      return true;
    }
    const bool local = !multi_node() && is_loopback_name(config_.master_addr);
    const std::uint16_t port = config_.master_port.value_or(multi_node() ? kDefaultMasterPort : 0);
    return serve_store(local ? "127.0.0.1" : "", port);
  }

  bool serve_store(const std::string& address, std::uint16_t port) {
    rendezvous::ServerOptions options;
    if (multi_node()) options.keepalive = liveness();  // agents that vanish are dropped
    try {
      store_host_.emplace(io_, address, port, with_token(options));
    } catch (const rendezvous::StoreError& e) {
      spdlog::error("cannot host the rendezvous store: {}", e.what());
      exit_code_ = kExitAgentError;
      return false;
    }
    store_port_ = store_host_->port();
    spdlog::debug("store listening on {}", store_host_->bound_address());
    return true;
  }

  // Elastic: the agent on the endpoint's machine hosts the store (is_host=1 insists, is_host=0
  // never does); when the endpoint is not this machine, or its port is taken (another agent, or
  // an external dist-rendezvous), this agent is a client. Then, several nodes: the session.
  Task<void> open_rendezvous() {
    if (config_.elastic && !etcd()) {
      store_port_ = config_.master_port.value_or(kDefaultMasterPort);
      // (No co_await inside && or ?: : GCC 12 evaluates it whatever the left side says.)
      bool host = config_.is_host.value_or(false);
      if (!config_.is_host.has_value()) host = co_await names_this_machine(config_.master_addr);
      if (host) {
        rendezvous::ServerOptions options;
        options.keepalive = liveness();
        try {
          store_host_.emplace(io_, "", store_port_, with_token(options));
          store_port_ = store_host_->port();  // port 0: the free one it got
          spdlog::info("hosting the rendezvous store for {}:{} on {}", config_.master_addr,
                       store_port_, store_host_->bound_address());
        } catch (const rendezvous::StoreError& e) {
          if (config_.is_host == true) {
            throw RendezvousError(std::string("cannot host the rendezvous store (--rdzv-conf "
                                              "is_host=1): ") +
                                  e.what());
          }
          spdlog::debug("not hosting the store ({}): joining {}:{}", e.what(), config_.master_addr,
                        store_port_);
        }
      }
    }
    if (store_port_ == 0 && !store_host_ && !etcd()) {
      throw RendezvousError("--rdzv-endpoint " + config_.master_addr +
                            ":0 asks for a free port, which only the agent that hosts the store "
                            "can pick, and this one does not host it (the endpoint is not this "
                            "machine, or is_host=0): give the store's real port");
    }
    RendezvousTimeouts timeouts;
    timeouts.rdzv = config_.rdzv_timeout;
    timeouts.join = config_.join_timeout;
    timeouts.last_call = config_.last_call_timeout;
    const JobShape shape{config_.min_nodes, config_.max_nodes, config_.nproc_per_node, host_,
                         config_.max_restarts};
    const auto notice = [](const std::string& text) { spdlog::info("{}", text); };
    if (etcd()) {
      rdzv_.emplace(make_etcd_store(io_, etcd_options(), config_.run_id), shape, timeouts, notice);
      co_return;
    }
    rendezvous::ClientOptions options;
    options.host = config_.master_addr;
    options.port = store_port_;
    options.connect_timeout = config_.elastic ? config_.join_timeout : config_.rdzv_timeout;
    options.secret = config_.secret;
    const rendezvous::Keepalive keepalive = liveness();
    options.keepalive_idle_seconds = keepalive.idle_seconds;
    options.keepalive_interval_seconds = keepalive.interval_seconds;
    options.keepalive_probes = keepalive.probes;
    options.on_retry = [](const std::string& why) { spdlog::warn("{}", why); };
    auto session =
        std::make_unique<TcpRendezvousStore>(io_.get_executor(), options, config_.run_id);
    {
      struct Opening {  // cancelled through it while it connects, whatever ends the connect
        TcpRendezvousStore*& slot;
        ~Opening() { slot = nullptr; }
      } opening{opening_ = session.get()};
      co_await session->open();
    }
    rdzv_.emplace(std::move(session), shape, timeouts, notice);
  }

  bool etcd() const { return config_.rdzv_backend == "etcd-v3"; }

  // A store this agent hosts asks for the job's token, when there is one.
  rendezvous::ServerOptions with_token(rendezvous::ServerOptions options) const {
    options.secret = config_.secret;
    options.unauthenticated = config_.unauthenticated;
    return options;
  }

  // Where the workers find the token (DIST_LAUNCH_TOKEN_FILE): the file given, or one written
  // here, mode 0600, in the run directory (a generated token, or one read from stdin). False,
  // said, when it cannot be written.
  bool provide_token_file() {
    token_file_ = config_.token_file;
    if (config_.secret.empty() || !token_file_.empty()) return true;
    const std::string path = (run_dir_->path() / "token").string();
    try {
      rendezvous::write_secret_file(path, config_.secret);
    } catch (const rendezvous::StoreError& e) {
      spdlog::error("{}", e.what());
      return false;
    }
    token_file_ = written_token_file_ = path;
    return true;
  }

  // A vanished node's lease expires after keep_alive_interval * (keep_alive_max_attempt - 1)
  // seconds, at least 2 (etcd's own minimum is about 1.5 election timeouts).
  EtcdOptions etcd_options() const {
    const int ttl =
        std::max(2, config_.keep_alive_interval_seconds * (config_.keep_alive_max_attempt - 1));
    return dist::agent::etcd_options(config_.etcd_endpoints, config_.etcd_conf,
                                     std::chrono::seconds(ttl));
  }

  // TCP keepalive on the agents' store connections, both ends: a peer that went silent is dropped
  // after about keep_alive_interval * keep_alive_max_attempt seconds (the first probe after one
  // interval of silence, then max_attempt - 1 more).
  rendezvous::Keepalive liveness() const {
    return {config_.keep_alive_interval_seconds, config_.keep_alive_interval_seconds,
            std::max(1, config_.keep_alive_max_attempt - 1)};
  }

  void begin_round() {
    if (!multi_node()) {
      Assignment a;
      a.round = a.restarts = restart_count_;
      a.world_size = config_.nproc_per_node;
      return on(event::Joined{a});
    }
    launch(join(), [](Assignment a) { return event::Joined{std::move(a)}; });
  }

  Task<Assignment> join() {
    if (!config_.elastic) co_return co_await rdzv_->join_static(restart_count_, config_.node_rank);
    std::optional<Assignment> previous;  // the round this node comes back from
    if (joined_) previous = assignment_;
    int round = 0;
    if (previous) {
      round = previous->round + 1;
    } else {
      round = co_await rdzv_->current_round();
    }
    // The store this node hosts for the round's workers, should it be node rank 0. As torch's
    // rendezvous does, every round's workers get a fresh store of their own: the rendezvous store
    // may outlive the job (etcd, a dist-rendezvous daemon, another job's agent), and torch keys
    // the workers' entries by restart count only, so that two jobs, or two rounds of one job
    // (a reshaped round does not advance the restart count), would read each other's there.
    worker_store_.reset();
    worker_store_.emplace(io_, "", 0, with_token(rendezvous::ServerOptions{}));
    const bool v6 = host_.find(':') != std::string::npos;
    std::string worker_store =
        (v6 ? "[" + host_ + "]" : host_) + ":" + std::to_string(worker_store_->port());
    Assignment joined =
        co_await rdzv_->join_elastic(round, std::move(previous), std::move(worker_store));
    if (!config_.secret.empty()) co_await introduce_to_worker_store(joined);
    co_return joined;
  }

  // The agents never use the round's workers' store, so it learns this host from one
  // authentication here, and admits this node's PyTorch workers (--unauthenticated known-hosts).
  Task<void> introduce_to_worker_store(Assignment a) {
    rendezvous::ClientOptions options;
    options.host = a.worker_store_host;
    options.port = a.worker_store_port;
    options.connect_timeout = config_.join_timeout;
    options.secret = config_.secret;
    rendezvous::AsyncStoreClient client(io_.get_executor(), options);
    co_await client.open();
    client.close();
  }

  // ------------------------------------------------------------------------------------------
  // RUNNING

  void start_workers() {
    RoundSpec spec;
    spec.round = assignment_.round;
    spec.node_rank = assignment_.node_rank;
    spec.num_nodes = assignment_.num_nodes;
    spec.world_size = assignment_.world_size;
    spec.rank_offset = assignment_.rank_offset;
    spec.restart_count = restart_count_;
    spec.master_addr = config_.master_addr;
    spec.master_port = store_port_;
    spec.token_file = token_file_;
    if (!assignment_.worker_store_host.empty()) {  // elastic: the round's node rank 0's store
      spec.master_addr = assignment_.worker_store_host;
      spec.master_port = assignment_.worker_store_port;
    }
    spec.host_label =
        multi_node() ? host_ + " (node " + std::to_string(assignment_.node_rank) + ")" : host_;
    try {
      group_->start(spec);
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
      return stop(StopReason::kStartFailed, SIGKILL);
    }
    if (!multi_node()) return;
    watching_ = true;
    launch(watch_round(), [](WatchOutcome o) -> Event {
      if (o.result.kind == WatchResult::kStopped && o.store_lost.empty()) {
        return event::WatchStopped{};
      }
      return event::RoundEnded{o.result, std::move(o.store_lost)};
    });
  }

  // The round's watch; the store lost while watching is an outcome too, not an error.
  struct WatchOutcome {
    WatchResult result;
    std::string store_lost;  // why, when the store went away
  };
  Task<WatchOutcome> watch_round() {
    WatchOutcome o;
    try {
      o.result = co_await rdzv_->watch(assignment_,
                                       std::chrono::seconds(config_.keep_alive_interval_seconds));
    } catch (const rendezvous::StoreError& e) {
      o.store_lost = e.what();
    }
    co_return o;
  }

  // Elastic: once every node succeeded, nodes still waiting to join learn the job is over.
  Task<bool> exit_barrier() {
    const bool everyone = co_await rdzv_->exit_barrier(assignment_, config_.exit_barrier_timeout);
    if (everyone && config_.elastic) co_await rdzv_->mark_done(assignment_);
    co_return everyone;
  }

  // Every node's failures for the report; static: nodes still joining (a relaunched one) learn
  // that the job failed. A store that is gone leaves this node's own failures to report.
  Task<std::vector<WorkerFailure>> collect_failures() {
    std::vector<WorkerFailure> all;
    try {
      if (!config_.elastic) co_await rdzv_->mark_failed(assignment_, failure_summary());
      all = co_await rdzv_->failures(assignment_);
    } catch (const rendezvous::StoreError& e) {
      if (e.code() == rendezvous::StoreErrc::kCancelled) throw;
      spdlog::warn("cannot read the other nodes' failures: {}", e.what());
    }
    co_return all;
  }

  // ------------------------------------------------------------------------------------------
  // FAILED and EXIT

  std::string failure_summary() const {
    if (!failure_reason_.empty()) return failure_reason_;
    if (failures_.empty()) return "round " + std::to_string(assignment_.round) + " failed";
    const auto& root = failures_[root_cause_index(failures_)];
    return "worker " + std::to_string(root.rank) + " on " + root.host + " failed";
  }

  void report() {
    if (failures_.empty()) {  // the job failed without a worker failing (nodes lost)
      spdlog::error("the job failed: {}", failure_reason_.empty()
                                              ? "round " + std::to_string(assignment_.round) +
                                                    " failed on another node, which left no "
                                                    "failure record"
                                              : failure_reason_);
      exit_code_ = kExitAgentError;
      return transition(State::kExit);
    }
    if (config_.print_failure_report) {
      console_->write(ConsoleStream::kStderr, format_report(config_.script_name, failures_));
    }
    exit_code_ = exit_code_of(failures_[root_cause_index(failures_)]);
    transition(State::kExit);
  }

  void warn_incomplete_logs() {
    if (!group_) return;
    for (const LogFileError& e : group_->incomplete_logs()) {
      spdlog::warn("worker logs are incomplete: {} holds the first {} bytes only ({})", e.path,
                   e.bytes_written, e.error);
    }
  }

  void begin_exit() {
    // The agent that serves the store stays until the other agents have left (bounded), so that
    // they can finish their exit barrier and report. Stopped by a signal, it leaves at once: the
    // job cannot go on without its store, and the other agents stop when it closes.
    if (!multi_node() || !rdzv_ || !joined_ || !store_host_) return finish();
    if (stop_reason_ == StopReason::kSignal) {
      spdlog::warn("this agent hosts the job's store: the other nodes stop with it");
      return finish();
    }
    launch(rdzv_->wait_for_others_to_leave(assignment_, kLeaveTimeout),
           [] { return event::OthersLeft{}; });
  }

  void finish() {
    if (finished_) return;
    finished_ = true;
    record_job_end();
    if (run_dir_) {
      const bool keep = !failures_.empty() || config_.writes_log_files();
      if (const auto said = run_dir_->finish(keep); !said.empty()) spdlog::info("{}", said);
    }
    io_.stop();
  }

  void record_job_end() {
    if (!telemetry_) return;
    if (exit_code_ == 0) return telemetry_->job_ended(0, "succeeded", "");
    if (stop_reason_ == StopReason::kSignal) {
      return telemetry_->job_ended(exit_code_, "stopped",
                                   "stopped by " + signal_name(stop_signal_));
    }
    telemetry_->job_ended(exit_code_, "failed", failure_summary());
  }

  // Cancels and releases everything, then lets the cancelled coroutines unwind while the objects
  // they use still exist.
  void shut_down() {
    if (shut_down_) return;
    shut_down_ = true;
    if (opening_) opening_->close();
    if (rdzv_) rdzv_->close();
    group_.reset();  // SIGKILLs and reaps whatever still runs
    if (store_host_) store_host_->stop();
    if (worker_store_) worker_store_->stop();
    if (!written_token_file_.empty()) {
      std::error_code ignored;
      std::filesystem::remove(written_token_file_, ignored);
    }
    signals_.cancel();
    if (launcher_) launcher_->cancel();
    io_.restart();
    while (io_.poll() > 0) {
    }
  }

  // ------------------------------------------------------------------------------------------
  // Coroutines, turned into events.

  // Runs `task` on the io_context; its result becomes an event through `to_event`, a failure a
  // RendezvousFailed.
  template <typename T, typename ToEvent>
  void launch(Task<T> task, ToEvent to_event) {
    asio::co_spawn(io_, std::move(task), [this, to_event](std::exception_ptr e, T value) {
      if (e) return on(failure_event(e));
      on(to_event(std::move(value)));
    });
  }
  template <typename ToEvent>
  void launch(Task<void> task, ToEvent to_event) {
    asio::co_spawn(io_, std::move(task), [this, to_event](std::exception_ptr e) {
      if (e) return on(failure_event(e));
      on(to_event());
    });
  }

  // A call whose outcome changes nothing here: a failure is worth a line, no more.
  void fire_and_forget(Task<void> task, std::string what) {
    asio::co_spawn(io_, std::move(task), [what = std::move(what)](std::exception_ptr e) {
      if (!e) return;
      try {
        std::rethrow_exception(e);
      } catch (const rendezvous::StoreError& error) {
        if (error.code() != rendezvous::StoreErrc::kCancelled) {
          spdlog::warn("{}: {}", what, error.what());
        }
      } catch (const std::exception& error) {
        spdlog::warn("{}: {}", what, error.what());
      }
    });
  }

  static event::RendezvousFailed failure_event(std::exception_ptr e) {
    using Kind = event::RendezvousFailed::Kind;
    try {
      std::rethrow_exception(e);
    } catch (const JobOverError& error) {
      return {error.succeeded() ? Kind::kJobDone : Kind::kJobOver, error.what()};
    } catch (const RoundAbortedError& error) {
      return {Kind::kRoundAborted, error.what()};
    } catch (const rendezvous::StoreError& error) {
      if (error.code() == rendezvous::StoreErrc::kCancelled) return {Kind::kCancelled, ""};
      return {Kind::kError, error.what()};
    } catch (const std::exception& error) {
      return {Kind::kError, error.what()};
    }
  }

  // ------------------------------------------------------------------------------------------

  const LaunchConfig& config_;
  std::shared_ptr<Console> console_ = Console::process();  // never blocks (console.h)
  const AgentId& agent_id_;
  Janitor* janitor_;     // null when it could not start
  asio::io_context io_;  // first: destroyed last, after everything that uses it
  SignalWatcher signals_;
  std::optional<LauncherChannel> launcher_;  // started by dist-launch --hosts
  std::string host_;
  std::optional<RunDirectory> run_dir_;
  std::string token_file_;                 // the workers' DIST_LAUNCH_TOKEN_FILE (empty: no token)
  std::string written_token_file_;         // when this agent wrote it: removed at the end
  std::optional<StoreHost> store_host_;    // the job's store, when this agent hosts it
  std::optional<StoreHost> worker_store_;  // elastic: this round's store for the workers
  std::uint16_t store_port_ = 0;
  std::optional<Telemetry> telemetry_;  // from prepare() on
  std::optional<WorkerGroup> group_;
  std::optional<NodeRendezvous> rdzv_;     // several nodes only
  TcpRendezvousStore* opening_ = nullptr;  // the session being connected

  State state_ = State::kInit;
  Assignment assignment_;
  bool prepared_ = false;
  bool joined_ = false;    // assignment_ holds a round this node was part of
  bool watching_ = false;  // the round's watch has not reported back yet
  bool group_stopped_ = false;
  bool stop_signal_received_ = false;
  bool signal_already_sent_ = false;  // the stop signal reached the workers from elsewhere (Slurm)
  bool finished_ = false;
  bool shut_down_ = false;
  int restart_count_ = 0;
  std::vector<WorkerFailure> failures_;
  std::string failure_reason_;  // why the job failed when no worker did
  StopReason stop_reason_ = StopReason::kAllSucceeded;
  int stop_signal_ = 0;
  int exit_code_ = 0;
};

// No descendant outlives the job (job_processes.h): the agent is a subreaper, and its janitor,
// started before the agent allocates much or starts a thread, cleans up if the agent is killed.
int run_agent(const LaunchConfig& config) {
  const AgentId agent_id = AgentId::generate();
  spdlog::debug("agent id {}: every process of this job has {}={} in its environment",
                agent_id.id(), kAgentIdVariable, agent_id.value());
  if (!become_subreaper()) {
    spdlog::warn(
        "cannot become a child subreaper ({}): processes the workers start may outlive "
        "the job",
        std::strerror(errno));
  }
  std::optional<Janitor> janitor;
  try {
    janitor.emplace(agent_id.id());
  } catch (const std::exception& e) {
    spdlog::warn("{}: processes the workers start may outlive a SIGKILL of this agent", e.what());
  }
  int exit_code;
  {
    Agent agent(config, agent_id, janitor ? &*janitor : nullptr);
    exit_code = agent.run();
  }
  if (has_children()) {  // STOPPING ends with none; whatever path missed it, nothing stays
    for (const ProcessRef& p : job_processes(agent_id.id(), janitor ? janitor->pid() : -1)) {
      signal_process(p, SIGKILL);
    }
  }
  return exit_code;  // ~Janitor dismisses it
}

}  // namespace dist::agent
