// The agent: one state machine (lifecycle/machine.h) on one io_context, over a RoundSource that
// hides how rounds form (one node, static, elastic: rendezvous/round_source.h).
//
// What happens to the agent arrives as a typed event (namespace event) through on(): from the
// worker group (failed, succeeded, stopped, a start that waited for the zygote failed), the
// signals (signalfd, with the sender's pid), and the coroutines that talk to the rendezvous store
// (joined, round ended elsewhere, barrier, verdict, failures). Each handler records what the event
// says, asks next_state() where it leads, and enter() runs the entry action of the state it
// returns. Nothing blocks the thread: the hosted store, the workers' output and every store call
// share it. A stop signal works in every state: pending store calls are cancelled (their sessions
// closed) and the agent leaves through EXIT, cleaning up as it always does. What a failure or a
// change of nodes does to the workers is the recovery policy's (recovery/recovery_policy.h, chosen
// once from --restart-policy): the group restarts, or, in place, one failed worker is replaced
// alone (REPLACING) and a lost node's survivors regroup in the next round (REGROUPING).
#include "lifecycle/agent_driver.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <variant>

#include "dist/agent/console.h"
#include "dist/agent/signals.h"
#include "dist/contract/worker_contract.h"
#include "health/telemetry_endpoints.h"  // and telemetry.h
#include "lifecycle/events.h"
#include "lifecycle/launcher_channel.h"
#include "lifecycle/machine.h"
#include "lifecycle/signal_watcher.h"
#include "lifecycle/steps.h"
#include "processes/janitor.h"
#include "processes/process.h"
#include "recovery/recovery_policy.h"
#include "rendezvous/rendezvous_detail.h"
#include "rendezvous/round_source.h"
#include "workers/failure_report.h"
#include "workers/run_directory.h"
#include "workers/worker_group.h"

namespace dist::agent {

namespace {

std::vector<int> watched_signals(const LaunchConfig& config) {
  std::vector<int> s = take_handled_signals(config.signals_to_handle);
  s.push_back(SIGCHLD);
  return s;
}

// While STOPPING: the stop signal received, and what is done (why: AgentRecord::stop_reason).
struct Stopping {
  int signal = 0;  // the stop signal received (kSignal)
  bool group_stopped = false;
  bool signal_received = false;      // a stop signal came: a second one kills at once
  StopSignal first;                  // (that one: the same passed on is no second one)
  bool signal_already_sent = false;  // the stop signal reached the workers from Slurm
  int launcher_signal = 0;  // the launcher's stop, read from the store before its signal came
};

}  // namespace

class Agent {
 public:
  Agent(const LaunchConfig& config, const AgentId& agent_id, Janitor* janitor)
      : config_(config),
        agent_id_(agent_id),
        janitor_(janitor),
        signals_(io_, watched_signals(config)),
        host_(config.local_addr.empty() ? this_host() : config.local_addr),
        rounds_(make_round_source(
            io_, config, config, host_, [](const std::string& text) { spdlog::info("{}", text); },
            config.restart_policy == RestartPolicy::kInPlace ? config.in_place_timeout
                                                             : std::chrono::milliseconds(0))),
        steps_(io_, [this](std::exception_ptr e) { on(failure_event(e)); }),
        policy_(make_recovery_policy({io_, config_, *rounds_, steps_, now_, group_, telemetry_,
                                      console_, [this](Input input) { feed(input); },
                                      [this] { watch(); }})) {}

  ~Agent() { shut_down(); }
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  int run() {
    transition(State::kRendezvous);
    if (now_.state != State::kExit) io_.run();
    shut_down();
    return exit_code_;
  }
  // Whether this node, cut off from the job's store, rejoins the job once it answers again.
  bool rejoins() const { return rejoins_ && exit_code_ == kExitAgentError; }

 private:
  Facts facts() const {
    Facts f;
    f.several_nodes = rounds_->several_nodes();
    f.elastic = rounds_->elastic();
    f.restarts_left = restarts_used() < config_.max_restarts;
    f.stop_reason = now_.stop_reason;
    f.group_stopped = stopping_.group_stopped;
    f.watching = watching_;
    policy_->add_facts(f);
    return f;
  }

  // Group restarts and in-place replacements: both count against --max-restarts.
  int restarts_used() const { return now_.restart_count + policy_->replacements(); }

  // Feeds `input` to the machine and follows where it leads.
  void feed(Input input) {
    if (const auto t = next_state(now_.state, input, facts())) enter(*t);
  }

  void enter(const Transition& t) {
    if (t.stop) now_.stop_reason = *t.stop;
    if (t.signal_exit && now_.state == State::kStopping) {
      spdlog::warn("stopped by {}", signal_name(stopping_.signal));
    }
    if (t.signal_exit) exit_code_ = 128 + stopping_.signal;
    if (t.exit_code) exit_code_ = *t.exit_code;
    // (RENDEZVOUS again: the round itself; REPLACING again: a failure folded into the recovery.)
    if (t.to != now_.state || t.to == State::kRendezvous || t.to == State::kReplacing) {
      transition(t.to);
    }
  }

  // ------------------------------------------------------------------------------------------
  // Entry actions, in one place.

  void transition(State next) {
    const State previous = std::exchange(now_.state, next);
    if (telemetry_) telemetry_->state(state_name(next));
    switch (next) {
      case State::kInit:
        return;
      case State::kRendezvous:
        if (!prepared_) return prepare();  // continues on Prepared
        return begin_round();              // continues on Joined
      case State::kRunning:
        if (previous == State::kReplacing || previous == State::kRegrouping) return;  // runs on
        return start_workers();
      case State::kReplacing:
        return policy_->replace();  // continues as the policy feeds the machine
      case State::kRegrouping:
        return policy_->regroup();
      case State::kStopping:
        policy_->stopping();  // a recovery's wait ends here
        stopping_.group_stopped = false;
        group_->stop(stop_signal(now_.stop_reason, stopping_.signal),
                     std::exchange(stopping_.signal_already_sent, false));
        return;  // continues on GroupStopped (and WatchEnded)
      case State::kExitBarrier:
        if (config_.max_nodes > 1) {  // (a one-node rendezvous passes it at once)
          spdlog::info(
              "this node's workers are done: waiting for the other nodes at the exit barrier (at "
              "most {} s, --exit-barrier-timeout)",
              std::chrono::duration_cast<std::chrono::seconds>(config_.exit_barrier_timeout)
                  .count());
        }
        return steps_.launch(rounds_->exit_barrier(*now_.round),
                             [this](BarrierEnd end) { on(event::BarrierDone{std::move(end)}); });
      case State::kRoundEnded:  // elastic: the job's one verdict, whichever node asks first
        return steps_.launch(rounds_->decide(*now_.round),
                             [this](Verdict v) { on(event::VerdictReached{std::move(v)}); });
      case State::kRestarting:
        return restart();
      case State::kSucceeded:
        if (now_.stop_reason == StopReason::kJobFinished) {
          spdlog::info("the job finished: its other workers succeeded");
        } else if (config_.nproc_per_node == 1) {
          spdlog::info("the worker of this node succeeded");
        } else {
          spdlog::info("all {} workers of this node succeeded", config_.nproc_per_node);
        }
        exit_code_ = 0;
        if (config_.restart_policy == RestartPolicy::kInPlace && rounds_->several_nodes() &&
            now_.round) {
          // Every node's workers are done: the job's replacements, which job_end counts on every
          // node alike (as a failed job's report reads them).
          return steps_.launch(rounds_->job_replacements(), [this](int replaced) {
            if (now_.state != State::kSucceeded) return;  // (left already)
            telemetry_->job_replacements(
                std::max(replaced, static_cast<int>(policy_->replaced().size())));
            transition(State::kExit);
          });
        }
        return transition(State::kExit);
      case State::kFailed:
        if (!rounds_->several_nodes()) return report(now_.failures);
        return steps_.launch(
            rounds_->collect_failures(now_.round.value_or(Round{}), failure_summary()),
            [this](CollectedFailures all) { on(event::FailuresCollected{std::move(all)}); });
      case State::kExit:
        if (group_) group_->warn_incomplete_logs();
        return begin_exit();
    }
  }

  // ------------------------------------------------------------------------------------------
  // Events.

  void on(Event e) {
    std::visit(Overloaded{
                   [&](event::Prepared&) {
                     if (now_.state != State::kRendezvous) return;
                     prepared_ = true;
                     feed(Input::kPrepared);
                   },
                   [&](event::Joined& j) { on_joined(std::move(j.round)); },
                   [&](event::WorkersFailed& f) { on_workers_failed(std::move(f.failures)); },
                   [&](event::StartFailed& f) {
                     if (now_.state != State::kRunning) return;
                     spdlog::error("{}", f.why);
                     feed(Input::kStartFailed);
                   },
                   [&](event::WorkersSucceeded&) { policy_->workers_succeeded(); },
                   [&](event::GroupStopped&) {
                     if (now_.state != State::kStopping) return;
                     stopping_.group_stopped = true;
                     add_late_failures();
                     if (watching_) rounds_->stop_watch();  // continues on WatchEnded
                     feed(Input::kGroupStopped);
                   },
                   [&](event::WatchEnded& w) { on_watch_ended(w.outcome); },
                   [&](event::BarrierDone& b) { on_barrier_done(b.end); },
                   [&](event::VerdictReached& v) { on_verdict(v.verdict); },
                   [&](event::FailuresCollected& c) {
                     if (now_.state != State::kFailed) return;
                     if (c.all.failures.empty()) c.all.failures = now_.failures;
                     report(std::move(c.all.failures), std::move(c.all.replaced));
                   },
                   [&](event::OthersLeft&) {
                     if (now_.state == State::kExit) finish();
                   },
                   [&](event::RendezvousFailed& f) { on_rendezvous_failed(f); },
                   [&](event::SignalReceived& s) { on_signal(s.signal, s.sender, s.code); },
               },
               e);
  }

  void on_barrier_done(const BarrierEnd& end) {
    const bool waiting = now_.state == State::kExitBarrier;  // (if not, the machine ignores it)
    if (waiting && !end.passed) {
      spdlog::warn("the round ended on another node while this one waited at the exit barrier");
    }
    if (waiting && end.predecessor_left) {
      spdlog::warn(
          "the agent before this one had already left the exit barrier (not every node finished "
          "within --exit-barrier-timeout): this node's workers succeeded, so it leaves with 0, "
          "and the others run on");
    } else if (waiting && end.left_early) {
      spdlog::warn(
          "not every node finished within {} s (--exit-barrier-timeout): this node's workers "
          "succeeded, so it leaves with 0, and the others run on (as torchrun's agents do)",
          std::chrono::duration_cast<std::chrono::seconds>(config_.exit_barrier_timeout).count());
    }
    if (waiting && end.passed && !end.lost.empty()) {
      spdlog::warn(
          "node(s) {} lost at the exit barrier (the agent gone, no failure of its workers said): "
          "every other node succeeded, so the job is done and is not run again; a relaunched "
          "agent of it learns so and exits 0",
          detail::node_list(end.lost));
    }
    feed(end.passed ? Input::kBarrierEveryone : Input::kBarrierRoundEnded);
  }

  void on_joined(Round a) {
    if (now_.state != State::kRendezvous) return;
    now_.restart_count = a.restarts;
    telemetry_->round_joined(a);
    spdlog::info("round {}: node {} of {}, global ranks {}..{} of {}", a.round, a.node_rank,
                 a.num_nodes, a.rank_offset, a.rank_offset + config_.nproc_per_node - 1,
                 a.world_size);
    if (a.workers_succeeded) {
      spdlog::warn(
          "round {}: this node's workers had succeeded before its agent was relaunched (the agent "
          "before it was lost at the exit barrier while other nodes still ran): it takes that "
          "agent's place at the barrier and runs no worker",
          a.round);
    }
    const Input joined = a.workers_succeeded ? Input::kJoinedAtBarrier : Input::kJoined;
    now_.round = std::move(a);
    feed(joined);
  }

  void on_workers_failed(std::vector<WorkerFailure> failures) {
    const State s = now_.state;
    if (s != State::kRunning && s != State::kReplacing && s != State::kRegrouping) return;
    now_.failures = std::move(failures);
    const auto t = next_state(s, Input::kWorkersFailed, facts());
    const bool stops = t && t->to == State::kStopping;
    policy_->workers_failed(stops);  // in place, a group that stops after all: why
    if (!t) return;
    if (stops && rounds_->several_nodes()) {  // every node stops its workers, hears what failed
      steps_.fire_and_forget(rounds_->announce_failure(*now_.round, now_.failures),
                             "announcing the failure");
    }
    enter(*t);
  }

  // Workers that failed on their own while the group was stopping (a root cause a few
  // milliseconds after the failure it caused): the round's failures, told to the other nodes too.
  void add_late_failures() {
    std::vector<WorkerFailure> late = group_->take_late_failures();
    if (late.empty()) return;
    now_.failures.insert(now_.failures.end(), std::make_move_iterator(late.begin()),
                         std::make_move_iterator(late.end()));
    if (rounds_->several_nodes() && now_.round) {
      steps_.fire_and_forget(rounds_->announce_failure(*now_.round, now_.failures),
                             "announcing the failure");
    }
  }

  void on_watch_ended(const WatchOutcome& o) {
    watching_ = false;
    if (!o.store_lost.empty()) {
      // (Leaving already, for a signal or a failed start: the job ends as that says, not as the
      // store's loss would, which leaving may well have caused.)
      if (now_.state == State::kExit) return;
      // (Timed out, or the network unreachable as it timed out (this host's own link down): no
      // answer for the keepalive's length, this host cut off from the store's or that host down.
      // A refusal or a reset: the store's agent is gone.)
      const auto says = [&](const char* what) {
        return o.store_lost.find(what) != std::string::npos;
      };
      // Over etcd: no member answered for unavailable_timeout, the last for no route or a
      // connect that timed out (not members that answer without a leader: a quorum lost, which
      // no wait of this node's mends).
      const bool etcd = config_.rdzv_backend == RendezvousBackend::kEtcdV3;
      const bool unanswered =
          etcd ? says("Network is unreachable") || says("No route to host") ||
                     says("connect timed out")
               : says("Connection timed out") || says("unreachable") || says("No route");
      // Cut off, this node rejoins the job once the store answers again (run_agent), where the
      // others can take it in: the next round of an elastic job (as a newcomer), a static job's
      // restart (its node rank's place). Over etcd its new agent waits join_timeout for the
      // members (ElasticRounds::prepare). (A cut shorter than unavailable_timeout but longer than
      // the lease is seen below: this node taken for lost.)
      // Not the store's host (its own store is what it lost), nor a node whose workers succeeded
      // (it would join a round of the job anew).
      rejoins_ = unanswered && !rounds_->hosts_others() && !workers_succeeded() &&
                 (rounds_->elastic() || restarts_used() < config_.max_restarts);
      spdlog::error(
          "lost the rendezvous store: {}{}{}", o.store_lost,
          !unanswered ? std::string("; this node's workers stop")
          : etcd
              ? std::string(" (no etcd member answered: this host was cut off from them, or "
                            "their hosts went down); this node's workers stop")
              : fmt::format(" (no answer for about {} s: this host was cut off from the "
                            "store's, or that host went down); this node's workers stop",
                            config_.keep_alive_interval_seconds * config_.keep_alive_max_attempt),
          rejoins_ ? rejoin_text() : std::string());
      failure_reason_ = "lost the rendezvous store at " + rounds_->describe();
      return feed(Input::kStoreLost);
    }
    // This node itself taken for lost: its lease ended while this host was cut off from etcd
    // (shorter than unavailable_timeout, or it would have lost the store above) or while this
    // agent was stopped; its session is gone, and the job went on without it. An elastic job
    // takes it back as a newcomer: its workers stop and it rejoins (the store answers already).
    if (o.result.kind == WatchResult::kNodeLost && now_.round &&
        o.result.node == now_.round->node_rank && now_.state != State::kExit) {
      rejoins_ = rounds_->elastic() && !rounds_->hosts_others() && !workers_succeeded();
      failure_reason_ = node_lost_text(o.result.node);
      spdlog::error("{}; this node's workers stop{}", failure_reason_,
                    rejoins_ ? rejoin_text() : std::string());
      return feed(Input::kStoreLost);
    }
    if (o.result.kind == WatchResult::kStopped) return feed(Input::kWatchStopped);
    if (o.result.kind == WatchResult::kLauncherStop) {
      // The launcher's stop, taken already (its signal came first, on the launcher's channel):
      // the same stop, not a second one that kills the workers.
      if (stopping_.signal_received && stopping_.signal == o.result.signal) return;
      // Another host's agent had the launcher's signal first and left: this one stops as the
      // signal it is about to get would have it (and takes that signal, when it comes, as said).
      spdlog::info("the launcher stops the job ({}), another host's agent has left already",
                   signal_name(o.result.signal));
      stopping_.launcher_signal = o.result.signal;
      return on_signal(o.result.signal, 0, SI_USER);
    }
    if (o.result.kind == WatchResult::kNewcomer && now_.state == State::kRunning && group_) {
      // Workers that exited as the newcomer came are reaped first (their SIGCHLD may be queued
      // behind this event): when they all finished, this node goes to its exit barrier, where a
      // newcomer alone ends nothing, rather than ending the round for it.
      group_->reap();
      if (now_.state == State::kStopping) return;
    }
    const State s = now_.state;
    const bool said = s == State::kRunning || s == State::kReplacing || s == State::kRegrouping;
    if (said && o.result.kind == WatchResult::kFailed) {
      spdlog::warn("a worker on another node failed");
    } else if (said && o.result.kind == WatchResult::kNodeLost) {
      spdlog::error("{}", node_lost_text(o.result.node));
      telemetry_->node_lost(now_.round->round, o.result.node);
    }
    if (o.result.kind == WatchResult::kNodeLost) {
      // (The job may fail of it, no worker having failed: the report says this, not a failure
      // record another node never wrote.)
      round_lost_ = {now_.round ? now_.round->round : 0, node_lost_text(o.result.node)};
      policy_->node_lost(o.result.node);
      return feed(Input::kNodeLost);
    }
    if (o.result.kind == WatchResult::kNewcomer) {
      policy_->node_waiting(said);
      if (said) telemetry_->node_joined(now_.round->round);
      return feed(Input::kNodeWaiting);
    }
    feed(Input::kRoundEndedElsewhere);
  }

  // This node's workers all succeeded (or its job finished): it has no job to rejoin.
  bool workers_succeeded() const {
    return now_.state == State::kStopping && (now_.stop_reason == StopReason::kAllSucceeded ||
                                              now_.stop_reason == StopReason::kJobFinished);
  }

  // How long a node cut off from the store waits for it to answer again, to rejoin the job: as
  // long as a node joining it for the first time would.
  std::chrono::seconds rejoin_within() const {
    return std::chrono::duration_cast<std::chrono::seconds>(
        rounds_->elastic() ? config_.join_timeout : config_.rdzv_timeout);
  }
  std::string rejoin_text() const {
    return fmt::format(
        ", and it rejoins the job when the store answers again (for up to {} s, --rdzv-conf {})",
        rejoin_within().count(), rounds_->elastic() ? "join_timeout" : "timeout");
  }

  // Its agent died (the kernel closed its connection: at once), or its host went down or was cut
  // off from this one for longer than the keepalive: which, the store cannot tell.
  std::string node_lost_text(int node) const {
    // This node itself: its session outlived by the job (it was cut off, or stopped, longer than
    // that allows), seen once the store answered again.
    if (now_.round && node == now_.round->node_rank) {
      const bool etcd = config_.rdzv_backend == RendezvousBackend::kEtcdV3;
      return fmt::format(
          "this node (node {}) was taken for lost: {} ended while this host was cut off from the "
          "{} (or this agent stopped) for longer than it allows; the other nodes no longer count "
          "on it",
          node, etcd ? "its lease in etcd" : "its connection to the store",
          etcd ? "etcd members" : "store");
    }
    const std::string who = node >= 0 ? "node " + std::to_string(node) + "'s agent" : "an agent";
    if (config_.rdzv_backend == RendezvousBackend::kEtcdV3) {
      return who +
             " is gone: its lease in etcd expired (the agent died, or its host went down or "
             "was cut off from etcd for longer than the lease)";
    }
    // The keepalive that ended it is the store's: this agent's own where it hosts the store.
    const std::string keepalive =
        rounds_->hosts_others()
            ? fmt::format("the keepalive, about {} s",
                          config_.keep_alive_interval_seconds * config_.keep_alive_max_attempt)
            : "the store's keepalive";
    return who +
           " is gone: its connection to the store ended (the agent died, or its host went "
           "down or was cut off for longer than " +
           keepalive + ")";
  }
  // The node the current round lost, if it did: why the job failed if it fails of it.
  std::string lost_this_round() const {
    return round_lost_.first == round_number() ? round_lost_.second : std::string();
  }

  void on_verdict(const Verdict& v) {
    if (now_.state != State::kRoundEnded) return;
    const int round = now_.round->round;
    telemetry_->verdict(round, v);
    switch (v.action) {
      case Verdict::kRestart:
        spdlog::warn("round {} ended: {}", round, v.reason);
        now_.restart_count = v.restarts;
        return feed(Input::kVerdictRestart);
      case Verdict::kReshape:
        spdlog::warn(
            "round {} ended ({}): a new round with the nodes that are there (not a restart)", round,
            v.reason);
        now_.failures.clear();
        return feed(Input::kVerdictReshape);
      case Verdict::kFail:
      case Verdict::kDone:  // cannot follow a round that failed here; treated as a failure
        if (v.action == Verdict::kFail) {
          spdlog::warn("round {} ended: {}: the job fails", round, v.reason);
        }
        failure_reason_ = v.reason;
        return feed(Input::kVerdictFail);
    }
  }

  void on_rendezvous_failed(const event::RendezvousFailed& f) {
    using Kind = event::RendezvousFailed::Kind;
    if (f.kind == Kind::kCancelled || now_.state == State::kExit) return;  // said when cancelled
    switch (f.kind) {
      case Kind::kJobDone:
        spdlog::warn("{}: nothing to do", f.why);
        return feed(Input::kJobDone);
      case Kind::kRoundAborted: {
        spdlog::warn("{}", f.why);
        const auto t = next_state(now_.state, Input::kRoundAborted, facts());
        if (t && t->to == State::kFailed) failure_reason_ = f.why;
        if (t) enter(*t);
        return;
      }
      case Kind::kJobOver:
        spdlog::error("{}", f.why);
        return feed(Input::kRendezvousError);
      default:
        spdlog::error("rendezvous failed: {}", f.why);
        return feed(Input::kRendezvousError);
    }
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
    const StopSignal received{signal, sender, code, std::chrono::steady_clock::now()};
    if (now_.state == State::kStopping && stopping_.signal_received) {
      if (is_passed_on(stopping_.first, received)) {
        spdlog::info(
            "{} again from {}: the same stop passed on, not a second one", signal_name(signal),
            sender > 0 ? "process " + std::to_string(sender) : std::string("the terminal"));
        return;
      }
      spdlog::warn("{} again: killing the workers now", signal_name(signal));
      return group_->stop(SIGKILL);
    }
    stopping_.signal_received = true;
    stopping_.first = received;
    console_->hurry();  // told to stop: a slow reader of the console is not waited for at exit
    const State before = now_.state;
    stopping_.signal = signal;
    if (before == State::kRunning || before == State::kReplacing || before == State::kRegrouping) {
      spdlog::warn(
          "{} received{}: stopping the workers (grace period {} ms; a second {} kills them at "
          "once)",
          signal_name(signal),
          workers_have_it ? " from Slurm, which signalled the workers too" : "",
          config_.shutdown_timeout.count(), signal_name(signal));
      stopping_.signal_already_sent = workers_have_it;
    } else if (before == State::kStopping) {  // stopping for another reason: leave afterwards
      spdlog::warn("{} received: leaving once the workers are stopped", signal_name(signal));
      group_->stop(signal, workers_have_it);
    } else if (before != State::kExit) {  // no worker runs: what is pending is cancelled
      spdlog::warn("{} received: leaving the job", signal_name(signal));
    }
    feed(Input::kStopSignal);
    if (before == State::kExit) finish();  // leaving already (waiting for the others): now
  }

  // ------------------------------------------------------------------------------------------
  // RENDEZVOUS, RESTARTING and RUNNING

  // Once: the run directory, the token file, the signals, the launcher's channel, telemetry and
  // the worker group; then the stores and the rendezvous session.
  void prepare() {
    try {
      prepare_node();
    } catch (const std::exception& e) {  // devices, placement, ports or files this node cannot give
      spdlog::error("{}", e.what());
      exit_code_ = kExitAgentError;
      return transition(State::kExit);
    }
    steps_.launch(rounds_->prepare(), [this] { on(event::Prepared{}); });
  }

  void prepare_node() {
    run_dir_.emplace(config_, config_, host_);
    if (config_.writes_log_files()) spdlog::info("worker logs in {}", run_dir_->path().string());
    const std::string token_file = provide_token_file(config_, *run_dir_, written_token_file_);
    // Should this agent be SIGKILLed, its janitor tidies the temporary directory as finish() would
    // (empty trees were left in /dev/shm, and a token written there).
    if (janitor_ && run_dir_->temporary()) {
      janitor_->tidy_on_death(run_dir_->root().string(), written_token_file_);
    }
    signals_.start([this](SignalWatcher::Received r) {
      on(event::SignalReceived{r.signal, r.sender, r.code});
    });
    if (config_.launcher_fd >= 0) {
      launcher_.emplace(io_, config_.launcher_fd);
      launcher_->start([this](int signal) {
        // Its stop, known from the store already, is no second signal (which kills at once).
        if (std::exchange(stopping_.launcher_signal, 0) == signal) return;
        on(event::SignalReceived{signal, 0, SI_USER});
      });
    }
    telemetry_.emplace(config_, host_);  // the events; served by endpoints_ (metrics, health)
    // First: a port the endpoints cannot bind ends a job that began. (A rejoining node's job
    // began with its first agent: one job_start and one job_end in its event log, a rejoin
    // between.)
    if (!config_.rejoining) telemetry_->job_started();
    endpoints_.emplace(io_, config_, host_, *telemetry_);
    group_.emplace(
        io_, config_, *run_dir_, agent_id_, janitor_, console_, *telemetry_,
        WorkerGroup::Identity{host_, token_file, policy_->in_generations()},
        WorkerGroup::Events{
            [this](std::vector<WorkerFailure> f) { on(event::WorkersFailed{std::move(f)}); },
            [this] { on(event::WorkersSucceeded{}); }, [this] { on(event::GroupStopped{}); },
            [this](std::string why) { on(event::StartFailed{std::move(why)}); },
            [this] { policy_->worker_succeeded(); }});
    telemetry_->set_progress_source(
        [this] { return group_ ? group_->progress() : std::vector<WorkerProgress>{}; });
    endpoints_->set_snapshot_source(
        [this] { return group_ ? group_->snapshot_status() : nlohmann::ordered_json(); });
    rounds_->set_progress_source([this] { return telemetry_->node_progress(); });  // for status
    // The job as node 0 reads it (several nodes): stragglers job-wide, hangs across nodes.
    rounds_->set_job_view_sink([this](schema::JobView view) {
      if (group_) group_->job_view(view);
    });
  }

  void begin_round() {
    steps_.launch(rounds_->join(now_.restart_count, now_.round),
                  [this](Round a) { on(event::Joined{std::move(a)}); });
  }

  void restart() {
    if (!rounds_->elastic()) ++now_.restart_count;  // elastic: the verdict counted it, job-wide
    telemetry_->restarting(now_.restart_count);
    spdlog::warn("restarting the worker group (restart {} of {})", restarts_used(),
                 config_.max_restarts);
    now_.failures.clear();
    rounds_->restart();
    transition(State::kRendezvous);
  }

  void start_workers() {
    try {
      policy_->start_workers();  // in place, a newcomer's workers may wait to join running ones
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
      return feed(Input::kStartFailed);
    }
    if (!rounds_->several_nodes()) return;
    watch();
    policy_->watching();
  }

  // The round's watch (several nodes): until the round ends elsewhere or stop_watch().
  void watch() {
    watching_ = true;
    steps_.launch(rounds_->watch(*now_.round),
                  [this](WatchOutcome o) { on(event::WatchEnded{std::move(o)}); });
  }

  // ------------------------------------------------------------------------------------------
  // FAILED and EXIT

  std::string failure_summary() const {
    if (!failure_reason_.empty()) return failure_reason_;
    const std::vector<WorkerFailure>& failures = now_.failures;
    if (failures.empty()) {
      const std::string lost = lost_this_round();
      return !lost.empty() ? lost : "round " + std::to_string(round_number()) + " failed";
    }
    const auto& root = failures[root_cause_index(failures)];
    return "worker " + std::to_string(root.worker.rank) + " on " + root.host + " failed";
  }
  int round_number() const { return now_.round ? now_.round->round : 0; }

  // The job failed: the report (every node's failures, and the workers every node replaced in
  // place before: `elsewhere`, those this one read from the others), and the exit code.
  void report(std::vector<WorkerFailure> all,
              const std::vector<InPlaceReplacement>& elsewhere = {}) {
    now_.failures = std::move(all);
    const std::vector<InPlaceReplacement> replaced =
        merge_replacements(policy_->replaced(), elsewhere);
    telemetry_->job_replacements(static_cast<int>(replaced.size()));
    const std::vector<WorkerFailure>& failures = now_.failures;
    if (failures.empty()) {  // the job failed without a worker failing (nodes lost)
      const std::string why = !failure_reason_.empty() ? failure_reason_ : lost_this_round();
      spdlog::error("the job failed: {}",
                    !why.empty() ? why
                                 : "round " + std::to_string(round_number()) +
                                       " failed on another node, which left no failure record");
      exit_code_ = kExitAgentError;
    } else {
      if (config_.print_failure_report) {
        console_->say(ConsoleStream::kStderr,
                      format_report(config_.script_name, failures, replaced));
      }
      const std::size_t root = root_cause_index(failures);
      // As torchrun's @record does for whoever started it (a scheduler, an outer launcher).
      if (const char* file = std::getenv(worker_contract::kErrorFile); file && *file) {
        try {
          if (!copy_root_cause_error_file(failures[root], file)) {
            spdlog::debug("the root cause left no error file for TORCHELASTIC_ERROR_FILE={}", file);
          }
        } catch (const std::exception& e) {
          spdlog::warn("TORCHELASTIC_ERROR_FILE: {}", e.what());
        }
      }
      exit_code_ = exit_code_of(failures[root]);
    }
    feed(Input::kFailuresCollected);
  }

  void begin_exit() {
    // The agent that serves the store stays until the other agents have left (bounded), so that
    // they can finish their exit barrier and report. Stopped by a signal, it leaves at once: the
    // job cannot go on without its store, and the other agents stop when it closes.
    if (!now_.round || !rounds_->hosts_others()) return finish();
    if (now_.stop_reason == StopReason::kSignal) {
      spdlog::warn("this agent hosts the job's store: the other nodes stop with it");
      return finish();
    }
    steps_.launch(rounds_->wait_for_others(*now_.round), [this] { on(event::OthersLeft{}); });
  }

  void finish() {
    if (finished_) return;
    finished_ = true;
    // No process of the job is left (a zygote or a standby would be a child): the janitor has
    // nothing to clean, and exits while this agent writes its report and tears down.
    if (janitor_ && !has_children() && !rejoins()) janitor_->dismiss();  // (a next agent's too)
    record_job_end();
    if (run_dir_) {
      // A hang's report, even one only suspected, names the stacks in it: they stay (a look
      // said in passing, "no step ...: not a hang", leaves nothing behind).
      const bool hang_said = telemetry_ && (telemetry_->record().hung_workers > 0 ||
                                            telemetry_->record().hangs_acted > 0 ||
                                            telemetry_->record().hangs_warned > 0);
      const bool keep = !now_.failures.empty() || config_.writes_log_files() || hang_said;
      const auto said = run_dir_->finish(keep, hang_said ? "the stacks a hang report named" : "");
      if (!said.empty()) spdlog::info("{}", said);
    }
    io_.stop();
  }

  void record_job_end() {  // and the stragglers seen, one line each
    if (!telemetry_) return;
    for (const auto& line : telemetry_->straggler_summary()) spdlog::warn("{}", line);
    if (rejoins()) return telemetry_->rejoining(failure_reason_, rejoin_within());
    if (exit_code_ == 0) return telemetry_->job_ended(0, "succeeded", "");
    if (now_.stop_reason == StopReason::kSignal) {
      return telemetry_->job_ended(exit_code_, "stopped",
                                   "stopped by " + signal_name(stopping_.signal));
    }
    telemetry_->job_ended(exit_code_, "failed", failure_summary());
  }

  // Cancels and releases everything, then lets the cancelled coroutines unwind while the objects
  // they use still exist.
  void shut_down() {
    if (shut_down_) return;
    shut_down_ = true;
    rounds_->close();
    policy_->close();
    group_.reset();  // SIGKILLs and reaps whatever still runs
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

  const LaunchConfig& config_;
  std::shared_ptr<Console> console_ = Console::process();  // never blocks (console.h)
  const AgentId& agent_id_;
  Janitor* janitor_;            // null when it could not start
  boost::asio::io_context io_;  // first: destroyed last, after everything that uses it
  SignalWatcher signals_;
  std::optional<LauncherChannel> launcher_;  // started by dist-launch --hosts
  std::string host_;
  std::unique_ptr<RoundSource> rounds_;
  Steps steps_;  // store calls and waits, theirs and the policy's, turned into events
  std::optional<RunDirectory> run_dir_;
  std::string written_token_file_;      // when this agent wrote the token file: removed at the end
  std::optional<Telemetry> telemetry_;  // from prepare() on
  std::optional<TelemetryEndpoints> endpoints_;
  std::optional<WorkerGroup> group_;
  AgentRecord now_;  // the state, the round, the restarts, the failures: shared with policy_
  std::unique_ptr<RecoveryPolicy> policy_;  // --restart-policy, chosen once
  bool prepared_ = false;
  bool watching_ = false;  // the round's watch has not reported back yet
  Stopping stopping_;
  std::string failure_reason_;                      // why the job failed when no worker did
  std::pair<int, std::string> round_lost_{-1, ""};  // a round, and the node it lost
  int exit_code_ = 0;
  bool rejoins_ = false;  // cut off from the store where the job can take it back: rejoins()
  bool finished_ = false;
  bool shut_down_ = false;
};

AgentEnd drive_agent(const LaunchConfig& config, const AgentId& agent_id, Janitor* janitor,
                     const std::function<void(const AgentEnd&)>& stopped) {
  Agent agent(config, agent_id, janitor);
  AgentEnd end;
  end.exit_code = agent.run();  // every worker and helper stopped and reaped
  end.rejoins = agent.rejoins();
  stopped(end);
  return end;
}

}  // namespace dist::agent
