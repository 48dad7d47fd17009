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
// closed) and the agent leaves through EXIT, cleaning up as it always does. Under
// --restart-policy in-place one failed worker is replaced alone (REPLACING) while the others run
// on and rebuild their group with it (workers/generations.h); and in an elastic job a lost node's
// survivors regroup in the next round without stopping their workers (REGROUPING).
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
#include "dist/agent/signals.h"
#include "dist/rendezvous/errors.h"
#include "dist/rendezvous/token.h"
#include "health/telemetry.h"
#include "lifecycle/launcher_channel.h"
#include "lifecycle/machine.h"
#include "lifecycle/signal_watcher.h"
#include "processes/janitor.h"
#include "processes/job_processes.h"
#include "processes/process.h"
#include "rendezvous/round_source.h"
#include "workers/failure_report.h"
#include "workers/generations.h"
#include "workers/run_directory.h"
#include "workers/worker_group.h"

namespace dist::agent {
namespace asio = boost::asio;

namespace {

template <typename... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <typename... F>
Overloaded(F...) -> Overloaded<F...>;

}  // namespace

// In-place: the claim of the job's one recovery (nullopt: another node's is under way, of that
// kind) and the generation its replacement starts.
struct ReplacementClaim {
  std::optional<int> replacements;
  Recovery under_way = Recovery::kNone;
  int generation = 0;
  std::string why;  // the workers' store could not count the generation (its host is gone)
};

// In-place, elastic: how the survivors of a lost node got into the next round (or why not).
struct RegroupJoin {
  std::optional<Verdict> verdict;   // the job's verdict on the round the node was lost from
  std::optional<Assignment> round;  // the next round, when the verdict was a reshape
  std::string why;                  // the rendezvous could not be done
};
// A newcomer to a running in-place job: the generation its workers join as, or the word that the
// running workers finished the job first (or why neither came).
struct NamedGeneration {
  std::optional<RegroupName> name;
  std::string why;
};
// And what became of telling the workers their places there.
struct RegroupTold {
  std::optional<int> generation;  // node 0 publishes it
  RecoveryOutcome outcome;        // node 0: the group's word; the others: recovered once placed
  std::chrono::steady_clock::time_point published_at;  // when the workers were asked to regroup
  bool finished = false;  // a node's workers finished the job before a generation was named
};
// The workers finished the job while their node regrouped: how the round's newcomers were told.
struct RegroupFinish {
  std::optional<int> generation;  // the one named already (its finished key was set)
  std::string why;                // the workers' store could not be used
};

// What happens to the agent, as typed events.
namespace event {
struct Prepared {};  // the stores and the rendezvous session are ready
struct Joined {
  Assignment assignment;
};
struct WorkersFailed {
  std::vector<WorkerFailure> failures;
};
struct StartFailed {  // a start that waited for the --warm-restart zygote
  std::string why;
};
struct WorkersSucceeded {};
struct GroupStopped {};
struct WatchEnded {  // the round's watch: ended elsewhere, stopped, or the store lost
  WatchOutcome outcome;
};
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
struct ReplacementClaimed {  // in-place: the job's one recovery is this node's, or not
  ReplacementClaim claim;
};
struct Recovered {  // in-place: the group's word after a replacement, or why none came
  RecoveryOutcome outcome;
};
struct ReplacementsCounted {  // in-place, several nodes: the job's replacements, read in STOPPING
  int replacements = 0;
};
struct RegroupJoined {  // in-place, elastic: a lost node's survivors in the next round, or not
  RegroupJoin join;
};
struct RegroupDone {  // and their workers told where they are now
  RegroupTold told;
};
struct RoundAbandoned {};  // a round joined for a regroup that does not go on: announced failed
struct RegroupFinished {   // a regroup whose workers finished the job: its newcomers told
  RegroupFinish finish;
};
struct GenerationNamed {  // a newcomer to a running in-place job: the generation it joins
  NamedGeneration named;
};
struct JobFinishedMeanwhile {  // and the running workers finished before its workers joined them
  int round = 0;
  bool finished = false;  // (false: the wait ended without it)
};
struct TakenIn {  // or node 0 published the generation its workers joined: they are in
  int round = 0;
  bool published = false;  // (false: the wait ended without it)
};
}  // namespace event

using Event = std::variant<
    event::Prepared, event::Joined, event::WorkersFailed, event::StartFailed,
    event::WorkersSucceeded, event::GroupStopped, event::WatchEnded, event::BarrierDone,
    event::VerdictReached, event::FailuresCollected, event::OthersLeft, event::RendezvousFailed,
    event::SignalReceived, event::ReplacementClaimed, event::Recovered, event::ReplacementsCounted,
    event::RegroupJoined, event::RegroupDone, event::RoundAbandoned, event::RegroupFinished,
    event::GenerationNamed, event::JobFinishedMeanwhile, event::TakenIn>;

class Agent {
 public:
  Agent(const LaunchConfig& config, const AgentId& agent_id, Janitor* janitor)
      : config_(config),
        agent_id_(agent_id),
        janitor_(janitor),
        signals_(io_, watched_signals(config)),
        host_(config.local_addr.empty() ? this_host() : config.local_addr),
        rounds_(make_round_source(io_, config, host_,
                                  [](const std::string& text) { spdlog::info("{}", text); })) {}

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
  static std::vector<int> watched_signals(const LaunchConfig& config) {
    std::vector<int> s = config.signals_to_handle;
    s.push_back(SIGCHLD);
    return s;
  }

  Facts facts() const {
    Facts f;
    f.several_nodes = rounds_->several_nodes();
    f.elastic = rounds_->elastic();
    f.restarts_left = restarts_used() < config_.max_restarts;
    f.in_place = config_.restart_policy == RestartPolicy::kInPlace;
    f.one_failure = failures_.size() == 1;
    f.unjoined = unjoined_;
    f.stop_reason = stopping_.reason;
    f.group_stopped = stopping_.group_stopped;
    f.watching = watching_;
    f.counting = counting_;
    f.joining = regroup_joining_;
    return f;
  }

  // Group restarts and in-place replacements: both count against --max-restarts.
  int restarts_used() const { return restart_count_ + replacements_; }

  // What the workers are sent when the group stops: nothing when they all succeeded, SIGKILL when
  // they could not all start, the stop signal received, else SIGTERM (--shutdown-timeout later:
  // SIGKILL).
  int stop_signal() const {
    switch (stopping_.reason) {
      case StopReason::kAllSucceeded:
        return 0;
      case StopReason::kJobFinished:  // the workers wait to join running workers that are gone
        return SIGTERM;
      case StopReason::kStartFailed:
        return SIGKILL;
      case StopReason::kSignal:
        return stopping_.signal;
      case StopReason::kWorkerFailed:
      case StopReason::kRoundEnded:
      case StopReason::kStoreLost:
        break;
    }
    return SIGTERM;
  }

  // Feeds `input` to the machine and follows where it leads.
  void feed(Input input) {
    if (const auto t = next_state(state_, input, facts())) enter(*t);
  }

  void enter(const Transition& t) {
    if (t.stop) stopping_.reason = *t.stop;
    if (t.signal_exit && state_ == State::kStopping) {
      spdlog::warn("stopped by {}", signal_name(stopping_.signal));
    }
    if (t.signal_exit) exit_code_ = 128 + stopping_.signal;
    if (t.exit_code) exit_code_ = *t.exit_code;
    if (t.to != state_ || t.to == State::kRendezvous) transition(t.to);
  }

  // ------------------------------------------------------------------------------------------
  // Entry actions, in one place.

  void transition(State next) {
    const State previous = std::exchange(state_, next);
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
        return replace_worker();  // continues on ReplacementClaimed, then Recovered
      case State::kRegrouping:
        return regroup();  // continues on RegroupJoined, then RegroupDone
      case State::kStopping:
        if (generations_) generations_->close();  // a recovery's wait ends here
        if (finish_watch_) finish_watch_->close();
        if (publish_watch_) publish_watch_->close();
        count_replacements();
        stopping_.group_stopped = false;
        group_->stop(stop_signal(), std::exchange(stopping_.signal_already_sent, false));
        return;  // continues on GroupStopped (and WatchEnded)
      case State::kExitBarrier:
        return launch(rounds_->exit_barrier(*round_),
                      [](bool everyone) { return event::BarrierDone{everyone}; });
      case State::kRoundEnded:  // elastic: the job's one verdict, whichever node asks first
        return launch(rounds_->decide(*round_),
                      [](Verdict v) { return event::VerdictReached{std::move(v)}; });
      case State::kRestarting:
        return restart();
      case State::kSucceeded:
        if (stopping_.reason == StopReason::kJobFinished) {
          spdlog::info("the job finished before this node's workers joined it");
        } else if (config_.nproc_per_node == 1) {
          spdlog::info("the worker of this node succeeded");
        } else {
          spdlog::info("all {} workers of this node succeeded", config_.nproc_per_node);
        }
        exit_code_ = 0;
        return transition(State::kExit);
      case State::kFailed:
        if (!rounds_->several_nodes()) return report(failures_);
        return launch(rounds_->collect_failures(round_.value_or(Assignment{}), failure_summary()),
                      [](std::vector<WorkerFailure> all) {
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
    std::visit(
        Overloaded{
            [&](event::Prepared&) {
              if (state_ != State::kRendezvous) return;
              prepared_ = true;
              feed(Input::kPrepared);
            },
            [&](event::Joined& j) { on_joined(std::move(j.assignment)); },
            [&](event::WorkersFailed& f) { on_workers_failed(std::move(f.failures)); },
            [&](event::StartFailed& f) {
              if (state_ != State::kRunning) return;
              spdlog::error("{}", f.why);
              feed(Input::kStartFailed);
            },
            [&](event::WorkersSucceeded&) { on_workers_succeeded(); },
            [&](event::GroupStopped&) {
              if (state_ != State::kStopping) return;
              stopping_.group_stopped = true;
              add_late_failures();
              if (watching_) rounds_->stop_watch();  // continues on WatchEnded
              feed(Input::kGroupStopped);
            },
            [&](event::WatchEnded& w) { on_watch_ended(w.outcome); },
            [&](event::BarrierDone& b) {
              if (state_ == State::kExitBarrier && !b.everyone) {
                spdlog::warn(
                    "the round ended on another node while this one waited at the exit "
                    "barrier");
              }
              feed(b.everyone ? Input::kBarrierEveryone : Input::kBarrierRoundEnded);
            },
            [&](event::VerdictReached& v) { on_verdict(v.verdict); },
            [&](event::FailuresCollected& c) {
              if (state_ != State::kFailed) return;
              report(c.all.empty() ? failures_ : std::move(c.all));
            },
            [&](event::OthersLeft&) {
              if (state_ == State::kExit) finish();
            },
            [&](event::RendezvousFailed& f) { on_rendezvous_failed(f); },
            [&](event::SignalReceived& s) { on_signal(s.signal, s.sender, s.code); },
            [&](event::ReplacementClaimed& c) { on_replacement_claimed(c.claim); },
            [&](event::Recovered& r) { on_recovered(r.outcome); },
            [&](event::ReplacementsCounted& c) {
              if (state_ != State::kStopping || !counting_) return;
              counting_ = false;
              replacements_ = c.replacements;
              feed(Input::kReplacementsCounted);
            },
            [&](event::RegroupJoined& j) { on_regroup_joined(std::move(j.join)); },
            [&](event::RegroupDone& d) { on_regroup_done(d.told); },
            [&](event::RoundAbandoned&) {
              regroup_joining_ = false;
              if (state_ == State::kStopping) feed(Input::kRegroupFailed);  // may end now
            },
            [&](event::RegroupFinished& f) { on_regroup_finished(f.finish); },
            [&](event::GenerationNamed& n) { on_generation_named(n.named); },
            [&](event::JobFinishedMeanwhile& f) {
              if (!f.finished || state_ != State::kRunning || !round_ || round_->round != f.round) {
                return;
              }
              job_finished_before_joining(f.round, generation_);
            },
            [&](event::TakenIn& t) {
              if (t.published && round_ && round_->round == t.round) unjoined_ = false;
            },
        },
        e);
  }

  void on_joined(Assignment a) {
    if (state_ != State::kRendezvous) return;
    restart_count_ = a.restarts;
    telemetry_->round_joined(a);
    spdlog::info("round {}: node {} of {}, global ranks {}..{} of {}", a.round, a.node_rank,
                 a.num_nodes, a.rank_offset, a.rank_offset + config_.nproc_per_node - 1,
                 a.world_size);
    round_ = std::move(a);
    feed(Input::kJoined);
  }

  void on_workers_failed(std::vector<WorkerFailure> failures) {
    if (state_ != State::kRunning && state_ != State::kReplacing && state_ != State::kRegrouping) {
      return;
    }
    const bool recovering = state_ == State::kReplacing;
    failures_ = std::move(failures);
    failed_at_ = std::chrono::steady_clock::now();
    const auto t = next_state(state_, Input::kWorkersFailed, facts());
    if (!t) return;
    const bool stops = t->to == State::kStopping;
    if (stops && unjoined_ && generation_ > 0) say_arrival_failed();
    if (stops && config_.restart_policy == RestartPolicy::kInPlace) explain_fallback(recovering);
    if (stops && rounds_->several_nodes()) {  // every node stops its workers, hears what failed
      fire_and_forget(rounds_->announce_failure(*round_, failures_), "announcing the failure");
    }
    enter(*t);
  }

  // In-place, yet the group stops: why, in the log and the event log.
  void explain_fallback(bool recovering) {
    std::string why;
    if (recovering) {
      why = "worker " + std::to_string(failures_.front().rank) +
            " failed during the in-place recovery of worker " + std::to_string(replacing_rank_) +
            (generation_claimed_ ? " (generation " + std::to_string(generation_) + ")" : "");
    } else if (unjoined_) {
      why = "worker " + std::to_string(failures_.front().rank) +
            " failed before the running workers took it in as generation " +
            std::to_string(generation_);
    } else if (failures_.size() > 1) {
      why = std::to_string(failures_.size()) + " workers failed at once";
    } else {
      why = "worker " + std::to_string(failures_.front().rank) + " failed";
    }
    const bool left = restarts_used() < config_.max_restarts;
    why += left ? ": restarting the whole group"
                : ": no restart left (--max-restarts " + std::to_string(config_.max_restarts) +
                      ", " + std::to_string(replacements_) + " used in place)";
    spdlog::warn("{}", why);
    telemetry_->in_place_fallback(
        round_->round,
        recovering && generation_claimed_ ? std::optional<int>(generation_) : std::nullopt, why);
  }

  void on_recovered(const RecoveryOutcome& o) {
    if (state_ != State::kReplacing) return;
    const InPlaceReplacement& r = replaced_.back();
    if (!o.recovered) {
      const std::string why = "the in-place recovery of generation " +
                              std::to_string(r.generation) + " failed: " + o.why +
                              ": restarting the whole group";
      spdlog::error("{}", why);
      telemetry_->in_place_fallback(round_->round, r.generation, why);
      return feed(Input::kRecoveryFailed);
    }
    const auto stall = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - failed_at_);
    spdlog::info("generation {}: the group is whole again, {} ms after worker {} failed ({})",
                 r.generation, stall.count(), r.failure.rank, o.record);
    telemetry_->in_place_recovered(round_->round, r.generation, r.failure.rank, stall, o.record);
    fire_and_forget(rounds_->recovery_over(*round_), "ending the in-place recovery");
    feed(Input::kRecovered);
  }

  // Workers that failed on their own while the group was stopping (a root cause a few
  // milliseconds after the failure it caused): the round's failures, told to the other nodes too.
  void add_late_failures() {
    std::vector<WorkerFailure> late = group_->take_late_failures();
    if (late.empty()) return;
    failures_.insert(failures_.end(), std::make_move_iterator(late.begin()),
                     std::make_move_iterator(late.end()));
    if (rounds_->several_nodes() && round_) {
      fire_and_forget(rounds_->announce_failure(*round_, failures_), "announcing the failure");
    }
  }

  void on_watch_ended(const WatchOutcome& o) {
    watching_ = false;
    if (!o.store_lost.empty()) {
      spdlog::error("lost the rendezvous store: {}", o.store_lost);
      failure_reason_ = "lost the rendezvous store at " + rounds_->describe();
      return feed(Input::kStoreLost);
    }
    if (o.result.kind == WatchResult::kStopped) return feed(Input::kWatchStopped);
    if (o.result.kind == WatchResult::kLauncherStop) {
      // Another host's agent had the launcher's signal first and left: this one stops as the
      // signal it is about to get would have it (and takes that signal, when it comes, as said).
      spdlog::info("the launcher stops the job ({}), another host's agent has left already",
                   signal_name(o.result.signal));
      stopping_.launcher_signal = o.result.signal;
      return on_signal(o.result.signal, 0, SI_USER);
    }
    if (o.result.kind == WatchResult::kNewcomer && state_ == State::kRunning && group_) {
      // Workers that exited as the newcomer came are reaped first (their SIGCHLD may be queued
      // behind this event): when they all finished, this node goes to its exit barrier, where a
      // newcomer alone ends nothing, rather than ending the round for it.
      group_->reap();
      if (state_ == State::kStopping) return;
    }
    if (state_ == State::kRunning || state_ == State::kReplacing || state_ == State::kRegrouping) {
      switch (o.result.kind) {
        case WatchResult::kFailed:
          spdlog::warn("a worker on another node failed");
          break;
        case WatchResult::kNodeLost:
          spdlog::error("node {}'s agent is gone (its connection to the store closed)",
                        o.result.node);
          telemetry_->node_lost(round_->round, o.result.node);
          break;
        case WatchResult::kNewcomer:
          if (config_.restart_policy != RestartPolicy::kInPlace) {
            spdlog::info("a new node is waiting to join: stopping the workers for a new round");
          }
          telemetry_->node_joined(round_->round);
          break;
        case WatchResult::kStopped:
        case WatchResult::kLauncherStop:
          break;
      }
    }
    if (o.result.kind == WatchResult::kNodeLost) {
      regroup_cause_ = "node " + std::to_string(o.result.node) + " was lost";
      regroup_lost_node_ = true;
      return feed(Input::kNodeLost);
    }
    if (o.result.kind == WatchResult::kNewcomer) {
      regroup_cause_ = "a node is waiting to join";
      regroup_lost_node_ = false;
      return feed(Input::kNodeWaiting);
    }
    feed(Input::kRoundEndedElsewhere);
  }

  void on_verdict(const Verdict& v) {
    if (state_ != State::kRoundEnded) return;
    telemetry_->verdict(round_->round, v);
    switch (v.action) {
      case Verdict::kRestart:
        spdlog::warn("round {} ended: {}", round_->round, v.reason);
        restart_count_ = v.restarts;
        return feed(Input::kVerdictRestart);
      case Verdict::kReshape:
        spdlog::warn(
            "round {} ended ({}): a new round with the nodes that are there (not a restart)",
            round_->round, v.reason);
        failures_.clear();
        return feed(Input::kVerdictReshape);
      case Verdict::kFail:
      case Verdict::kDone:  // cannot follow a round that failed here; treated as a failure
        if (v.action == Verdict::kFail) {
          spdlog::warn("round {} ended: {}: the job fails", round_->round, v.reason);
        }
        failure_reason_ = v.reason;
        return feed(Input::kVerdictFail);
    }
  }

  void on_rendezvous_failed(const event::RendezvousFailed& f) {
    using Kind = event::RendezvousFailed::Kind;
    if (f.kind == Kind::kCancelled || state_ == State::kExit) return;  // said when cancelled
    switch (f.kind) {
      case Kind::kJobDone:
        spdlog::warn("{}: nothing to do", f.why);
        return feed(Input::kJobDone);
      case Kind::kRoundAborted: {
        spdlog::warn("{}", f.why);
        const auto t = next_state(state_, Input::kRoundAborted, facts());
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
    if (state_ == State::kStopping && stopping_.signal_received) {
      spdlog::warn("{} again: killing the workers now", signal_name(signal));
      return group_->stop(SIGKILL);
    }
    stopping_.signal_received = true;
    const State before = state_;
    stopping_.signal = signal;
    if (before == State::kRunning || before == State::kReplacing || before == State::kRegrouping) {
      spdlog::warn("{} received{}: stopping the workers (grace period {} ms)", signal_name(signal),
                   workers_have_it ? " from Slurm, which signalled the workers too" : "",
                   config_.shutdown_timeout.count());
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
  // RENDEZVOUS and RESTARTING

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
    launch(rounds_->prepare(), [] { return event::Prepared{}; });
  }

  void prepare_node() {
    run_dir_.emplace(config_, host_);
    if (config_.writes_log_files()) spdlog::info("worker logs in {}", run_dir_->path().string());
    provide_token_file();
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
    telemetry_.emplace(io_, config_, host_);  // the event log, metrics and health check
    telemetry_->job_started();
    group_.emplace(
        io_, config_, *run_dir_, agent_id_, janitor_, console_, *telemetry_,
        WorkerGroup::Identity{host_, token_file_},
        WorkerGroup::Events{
            [this](std::vector<WorkerFailure> f) { on(event::WorkersFailed{std::move(f)}); },
            [this] { on(event::WorkersSucceeded{}); }, [this] { on(event::GroupStopped{}); },
            [this](std::string why) { on(event::StartFailed{std::move(why)}); }});
    telemetry_->set_progress_source(
        [this] { return group_ ? group_->progress() : std::vector<WorkerProgress>{}; });
    // Published beside this node's heartbeat, for `dist-launch status`.
    rounds_->set_progress_source([this] { return telemetry_->node_progress(); });
    // The job as node 0 reads it (several nodes): stragglers job-wide, hangs across nodes.
    rounds_->set_job_view_sink([this](schema::JobView view) {
      if (group_) group_->job_view(view);
    });
  }

  // Where the workers find the token (DIST_LAUNCH_TOKEN_FILE): the file given, or one written
  // here, mode 0600, in the run directory (a generated token, or one read from stdin).
  void provide_token_file() {
    token_file_ = config_.token_file;
    if (config_.secret.empty() || !token_file_.empty()) return;
    const std::string path = (run_dir_->path() / "token").string();
    rendezvous::write_secret_file(path, config_.secret);
    token_file_ = written_token_file_ = path;
  }

  void begin_round() {
    launch(rounds_->join(restart_count_, round_),
           [](Assignment a) { return event::Joined{std::move(a)}; });
  }

  void restart() {
    if (!rounds_->elastic()) ++restart_count_;  // elastic: the verdict counted it, job-wide
    telemetry_->restarting(restart_count_);
    spdlog::warn("restarting the worker group (restart {} of {})", restarts_used(),
                 config_.max_restarts);
    failures_.clear();
    rounds_->restart();
    transition(State::kRendezvous);
  }

  // ------------------------------------------------------------------------------------------
  // RUNNING

  void start_workers() {
    generation_ = 0;
    const bool in_place = config_.restart_policy == RestartPolicy::kInPlace;
    // In place, a round that continues the job's running workers (they regrouped with this node
    // in it): this node's workers join them, as the generation node 0 names.
    const bool joins = in_place && round_->continues;
    unjoined_ = joins;
    if (in_place) {
      generations_.emplace(io_, config_, rounds_->workers_store(*round_), round_->restarts);
    }
    try {
      if (joins) {
        group_->start_joining(*round_, rounds_->workers_store(*round_));
      } else {
        group_->start(*round_, rounds_->workers_store(*round_));
      }
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
      return feed(Input::kStartFailed);
    }
    if (!rounds_->several_nodes()) return;
    watching_ = true;
    launch(rounds_->watch(*round_), [](WatchOutcome o) { return event::WatchEnded{std::move(o)}; });
    if (!joins) return;
    spdlog::info(
        "round {} continues the job's running workers: this node's workers join them as the "
        "generation node 0 names",
        round_->round);
    launch(named_generation(round_->round),
           [](NamedGeneration n) { return event::GenerationNamed{std::move(n)}; });
  }

  Task<NamedGeneration> named_generation(int round) {
    NamedGeneration n;
    try {
      n.name = co_await generations_->regroup_generation(round, kInPlaceRecoveryTimeout);
      if (!n.name) {
        n.why = "node 0 did not name the generation to join within " +
                std::to_string(kInPlaceRecoveryTimeout.count() / 1000) + " s";
      }
    } catch (const rendezvous::StoreError& e) {
      if (e.code() == rendezvous::StoreErrc::kCancelled) throw;
      n.why = "the workers' store cannot be used: " + std::string(e.what());
    }
    co_return n;
  }

  void on_generation_named(const NamedGeneration& n) {
    if (state_ != State::kRunning) return;  // (the round ended first: the wait was closed)
    if (n.name && n.name->finished) return job_finished_before_joining(round_->round, 0);
    if (!n.name) {  // the others' regroup did not go on: the round starts over with all
      const std::string why = "this node cannot join the running workers (" + n.why +
                              "): ending round " + std::to_string(round_->round);
      spdlog::warn("{}", why);
      telemetry_->in_place_fallback(round_->round, std::nullopt, why);
      fire_and_forget(rounds_->announce_failure(*round_, {}), "announcing the failure");
      return feed(Input::kRoundEndedElsewhere);
    }
    generation_ = n.name->generation;
    try {
      group_->start_generation(generation_);
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
      return feed(Input::kStartFailed);
    }
    spdlog::info("round {}: this node's workers joined the running workers as generation {}",
                 round_->round, generation_);
    telemetry_->in_place_joined(round_->round, generation_, group_->running_ranks());
    // The running workers may finish the job before they regroup: their nodes then say so, and
    // these workers, waiting for them, are stopped. A client of its own: the wait holds it.
    finish_watch_.emplace(io_, config_, rounds_->workers_store(*round_), round_->restarts);
    launch(finished_meanwhile(round_->round), [](event::JobFinishedMeanwhile f) { return f; });
    // Until node 0 publishes that generation, a failed worker of this node has no group to be
    // replaced into (facts().unjoined). Another client: that wait holds it too.
    publish_watch_.emplace(io_, config_, rounds_->workers_store(*round_), round_->restarts);
    launch(taken_in(round_->round, generation_), [](event::TakenIn t) { return t; });
  }

  Task<event::TakenIn> taken_in(int round, int generation) {
    event::TakenIn t{round, false};
    try {
      t.published = co_await publish_watch_->wait_published(generation, kInPlaceRecoveryTimeout);
    } catch (const rendezvous::StoreError& e) {
      if (e.code() == rendezvous::StoreErrc::kCancelled) throw;
      spdlog::debug("round {}: waiting for generation {}'s publication: {}", round, generation,
                    e.what());
    }
    co_return t;
  }

  // A newcomer's worker died before the running workers took it in: node 0, which waits for
  // every worker of the new world to arrive (kArrivalTimeout), hears it at once and publishes
  // nothing. A client of its own, which STOPPING leaves open.
  void say_arrival_failed() {
    arrival_failed_.emplace(io_, config_, rounds_->workers_store(*round_), round_->restarts);
    fire_and_forget(arrival_failed_->mark_arrival_failed(generation_, round_->rank_offset,
                                                         config_.nproc_per_node),
                    "telling node 0 that this node's workers failed before they joined");
  }

  Task<event::JobFinishedMeanwhile> finished_meanwhile(int round) {
    event::JobFinishedMeanwhile f{round, false};
    try {
      f.finished = co_await finish_watch_->wait_regroup_finished(round, kInPlaceRecoveryTimeout);
    } catch (const rendezvous::StoreError& e) {
      if (e.code() == rendezvous::StoreErrc::kCancelled) throw;
      spdlog::debug("round {}: watching for the job's end during the regroup: {}", round, e.what());
    }
    co_return f;
  }

  // A newcomer whose workers have nothing left to join (`generation`: 0 when none was started):
  // they stop, and the node passes the round's exit barrier with the others.
  void job_finished_before_joining(int round, int generation) {
    spdlog::info(
        "round {}: the job's running workers finished the job before this node's workers joined "
        "them{}",
        round, generation > 0 ? ": stopping them" : "; none is started");
    telemetry_->in_place_finished(round, generation > 0 ? std::optional(generation) : std::nullopt,
                                  "the running workers finished before this node's joined them");
    feed(Input::kJobFinished);
  }

  // ------------------------------------------------------------------------------------------
  // REPLACING (--restart-policy in-place): the failed worker alone is started again as the next
  // generation's replacement; the survivors, whose collectives failed, wait for that generation's
  // record, rebuild their group with it and give it their state; the group's new root then says
  // it recovered (Recovered). It counts against --max-restarts.

  // In-place, several nodes, a round that failed: every node decides restart or fail from the
  // same count, the job's replacements, read before STOPPING ends.
  void count_replacements() {
    const bool failed = stopping_.reason == StopReason::kWorkerFailed ||
                        stopping_.reason == StopReason::kRoundEnded;
    if (config_.restart_policy != RestartPolicy::kInPlace || !rounds_->several_nodes() || !failed) {
      return;
    }
    counting_ = true;
    launch(rounds_->replacements(), [](int n) { return event::ReplacementsCounted{n}; });
  }

  void replace_worker() {
    replacing_rank_ = failures_.front().rank;
    generation_claimed_ = false;
    launch(claim_replacement(),
           [](ReplacementClaim c) { return event::ReplacementClaimed{std::move(c)}; });
  }

  // The job's one recovery (several nodes: in the job's store), then the generation.
  Task<ReplacementClaim> claim_replacement() {
    ReplacementClaim c;
    const RecoveryClaim claim = co_await rounds_->claim_recovery(*round_, Recovery::kReplacement);
    c.replacements = claim.replacements;
    c.under_way = claim.under_way;
    if (!c.replacements) co_return c;
    try {
      c.generation = co_await generations_->next();
    } catch (const rendezvous::StoreError& e) {
      if (e.code() == rendezvous::StoreErrc::kCancelled) throw;
      c.why = e.what();
    }
    co_return c;
  }

  void on_replacement_claimed(const ReplacementClaim& c) {
    if (state_ != State::kReplacing) return;
    if (!c.replacements) {
      return give_up_replacing("worker " + std::to_string(failures_.front().rank) +
                               (c.under_way == Recovery::kRegroup
                                    ? " failed while the group regroups in place"
                                    : " failed while another node's worker is being replaced "
                                      "in place"));
    }
    if (!c.why.empty()) {  // e.g. the node that hosted the workers' store was lost with it
      return give_up_replacing("worker " + std::to_string(failures_.front().rank) +
                               " failed and its group's generation cannot be counted in the "
                               "workers' store (" +
                               c.why + ")");
    }
    replacements_ = *c.replacements;
    if (restarts_used() > config_.max_restarts) {
      return give_up_replacing(
          "worker " + std::to_string(failures_.front().rank) + " failed: no restart left (" +
          "--max-restarts " + std::to_string(config_.max_restarts) + ", " +
          std::to_string(replacements_ - 1) + " used in place by the job's nodes)");
    }
    generation_ = c.generation;
    generation_claimed_ = true;
    start_replacement();
  }

  // In-place after all: the group stops (a restart while restarts are left), everywhere.
  void give_up_replacing(const std::string& why) {
    const bool left = restarts_used() < config_.max_restarts;
    spdlog::warn("{}{}", why, left ? ": restarting the whole group" : "");
    telemetry_->in_place_fallback(round_->round, std::nullopt, why);
    if (rounds_->several_nodes()) {
      fire_and_forget(rounds_->announce_failure(*round_, failures_), "announcing the failure");
    }
    feed(Input::kRecoveryFailed);
  }

  void start_replacement() {
    const WorkerFailure& failed = failures_.front();
    const int failed_generation = group_->generation_of(failed.local_rank);
    InPlaceReplacement r{failed, generation_, -1, {}};
    for (int rank = 0; rank < round_->world_size; ++rank) {
      if (rank != failed.rank) r.survivors.push_back(rank);
    }
    try {
      r.new_pid = group_->replace(failed.local_rank, generation_);
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
      return feed(Input::kStartFailed);
    }
    std::string survivors;
    for (const int rank : r.survivors) {
      survivors += (survivors.empty() ? "" : ",") + std::to_string(rank);
    }
    spdlog::warn(
        "worker {} (local rank {}) replaced in place by pid {}: generation {} (restart {} of {}); "
        "ranks {} keep running",
        failed.rank, failed.local_rank, r.new_pid, generation_, restarts_used(),
        config_.max_restarts, survivors.empty() ? "none" : survivors);
    if (config_.print_failure_report) {
      console_->write(ConsoleStream::kStderr, format_replacement(config_.script_name, r));
    }
    telemetry_->in_place_restart(
        {round_->round, generation_,
         WorkerRef{round_->round, failed.rank, failed.local_rank, failed.pid, failed_generation},
         failed.exit_code, r.new_pid, r.survivors, restarts_used()});
    replaced_.push_back(std::move(r));
    launch(generations_->publish_and_wait(
               generation_, "replaced=" + std::to_string(failed.rank) + " survivors=" + survivors,
               kInPlaceRecoveryTimeout),
           [](RecoveryOutcome o) { return event::Recovered{std::move(o)}; });
  }

  // ------------------------------------------------------------------------------------------
  // REGROUPING (--restart-policy in-place, elastic): a node was lost and this one's workers run on,
  // their collectives failed and waiting in their recovery. The job's verdict on the round, then
  // the next round with the survivors alone (the rendezvous's reshape, while the workers wait);
  // then each node writes its workers' new first rank, and the new node 0 publishes the
  // generation that tells them (worker_contract.h) and waits for the group's word that it is
  // whole again. A verdict other than a reshape, a round with a node that was not in the last
  // one, a workers' store that moved, or a failure meanwhile: the group stops, as a lost node
  // always stopped it, and the job goes on from a new round.

  void regroup() {
    regroup_began_ = std::chrono::steady_clock::now();
    regroup_joining_ = true;  // STOPPING waits for it: it may join the next round
    spdlog::warn(
        "in-place: {}: this node's workers keep running while the nodes form the next round",
        regroup_cause_);
    launch(join_survivors(*round_),
           [](RegroupJoin j) { return event::RegroupJoined{std::move(j)}; });
  }

  Task<RegroupJoin> join_survivors(Assignment from) {
    RegroupJoin j;
    try {
      j.verdict = co_await rounds_->decide(from);
      if (j.verdict->action == Verdict::kReshape) {
        j.round = co_await rounds_->join_keeping_workers(from);
      }
    } catch (const rendezvous::StoreError& e) {
      if (e.code() == rendezvous::StoreErrc::kCancelled) throw;  // leaving: nothing to decide
      j.why = e.what();
    } catch (const std::exception& e) {  // the job over meanwhile included: ROUND_ENDED says so
      j.why = e.what();
    }
    co_return j;
  }

  void on_regroup_joined(RegroupJoin j) {
    regroup_joining_ = false;
    if (state_ == State::kStopping) return abandon_regroup(j);
    if (state_ != State::kRegrouping) return;
    if (!j.why.empty()) return regroup_failed("the surviving nodes could not regroup: " + j.why);
    if (j.verdict->action != Verdict::kReshape) {  // said again (and logged) in ROUND_ENDED
      return regroup_failed("round " + std::to_string(round_->round) + " ended (" +
                            j.verdict->reason + ") and the job's verdict is not a new round of " +
                            "the surviving nodes");
    }
    telemetry_->verdict(round_->round, *j.verdict);
    const Assignment previous = *round_;
    const Assignment& to = *j.round;
    const std::string why = cannot_regroup(previous, to, *j.verdict);
    round_ = to;
    restart_count_ = to.restarts;
    telemetry_->round_joined(to);
    if (!why.empty()) {  // the others are in the new round too: it ends for all of them
      end_joined_round();
      return regroup_failed(why);
    }
    regrouped_ranks_ = group_->regroup(to);
    spdlog::info("round {}: node {} of {}, global ranks {}..{} of {} (were {}..{} of {})", to.round,
                 to.node_rank, to.num_nodes, to.rank_offset,
                 to.rank_offset + config_.nproc_per_node - 1, to.world_size, previous.rank_offset,
                 previous.rank_offset + config_.nproc_per_node - 1, previous.world_size);
    regrouped_from_ = previous.round;
    watching_ = true;
    launch(rounds_->watch(*round_), [](WatchOutcome o) { return event::WatchEnded{std::move(o)}; });
    launch(tell_workers(previous.rank_offset, *round_),
           [](RegroupTold t) { return event::RegroupDone{std::move(t)}; });
  }

  // The group stopped while the regroup's join was under way: a round it joined is this node's
  // now, and ends (announced: the others, in it too, stop as well), so that ROUND_ENDED decides
  // that round, not the one already decided.
  void abandon_regroup(const RegroupJoin& j) {
    if (!j.round) return feed(Input::kRegroupFailed);
    const bool finished = stopping_.reason == StopReason::kAllSucceeded && j.round->continues &&
                          j.round->restarts == round_->restarts;
    round_ = *j.round;
    restart_count_ = j.round->restarts;
    if (finished) return finish_regroup();
    end_joined_round();
  }

  // This node's workers all finished while it regrouped: the job is done, in the round joined for
  // the regroup. Its newcomers are told (nothing is left for their workers to join), so that every
  // node of it passes its exit barrier and the job is not restarted. STOPPING waits for it.
  void on_workers_succeeded() {
    const bool regrouped = state_ == State::kRegrouping && !regroup_joining_;
    feed(Input::kWorkersSucceeded);
    if (regrouped && state_ == State::kStopping) finish_regroup();
  }

  void finish_regroup() {
    regroup_joining_ = true;
    spdlog::info(
        "in-place: this node's workers finished the job during the regroup: round {} ends here",
        round_->round);
    generations_.emplace(io_, config_, rounds_->workers_store(*round_), round_->restarts);
    launch(tell_regroup_finished(round_->round),
           [](RegroupFinish f) { return event::RegroupFinished{std::move(f)}; });
  }

  Task<RegroupFinish> tell_regroup_finished(int round) {
    RegroupFinish f;
    try {
      f.generation = co_await generations_->mark_regroup_finished(round);
    } catch (const rendezvous::StoreError& e) {
      if (e.code() == rendezvous::StoreErrc::kCancelled) throw;
      f.why = "the workers' store cannot be used: " + std::string(e.what());
    }
    co_return f;
  }

  void on_regroup_finished(const RegroupFinish& f) {
    regroup_joining_ = false;
    if (!f.why.empty()) {
      spdlog::warn("round {}: the newcomers could not be told the job finished: {}", round_->round,
                   f.why);
    }
    telemetry_->in_place_finished(round_->round, f.generation,
                                  "this node's workers finished during the regroup");
    if (state_ == State::kStopping) feed(Input::kRegroupFailed);  // the join reported: may end
  }

  // A round joined for a regroup that does not go on: announced failed (the others in it stop
  // too), and STOPPING waits for the announcement, so that the verdict on it knows.
  void end_joined_round() {
    regroup_joining_ = true;
    launch(rounds_->announce_failure(*round_, failures_), [] { return event::RoundAbandoned{}; });
  }

  // Why the workers cannot simply go on in round `to`; empty when they can. Nodes new to the job
  // may be in it (their workers join as the regroup's generation), but every node of round
  // `from` that the verdict counted alive must be: one that did not make it (slow, or gone since)
  // left its workers in the old group.
  std::string cannot_regroup(const Assignment& from, const Assignment& to, const Verdict& v) const {
    if (to.returning != v.expect) {
      return "round " + std::to_string(to.round) + " has " + std::to_string(to.returning) +
             " of the " + std::to_string(v.expect) + " node(s) still running round " +
             std::to_string(from.round) + ": the group starts again with the nodes there are";
    }
    if (rounds_->workers_store(to) != rounds_->workers_store(from)) {
      return "round " + std::to_string(to.round) + "'s workers' store is not round " +
             std::to_string(from.round) + "'s: the workers cannot find each other there";
    }
    if (to.restarts != from.restarts) return "the job restarted meanwhile";
    return {};
  }

  // Each node places its workers; node 0 counts the generation, names it for the newcomers'
  // agents (they start their workers as that generation) and publishes it; every node then asks
  // its running workers to recover at their next unit (a newcomer fails no collective of theirs),
  // and node 0 waits for the group's word that it is whole again.
  Task<RegroupTold> tell_workers(int old_rank_offset, Assignment to) {
    RegroupTold t;
    try {
      co_await generations_->place_regrouped(to.round, old_rank_offset, to.rank_offset,
                                             to.node_rank);
      // With newcomers, the generation is published once their workers are ready (their imports
      // done), so that the running workers stall for the regroup alone; they train meanwhile.
      const bool newcomers = to.num_nodes > to.returning;
      if (to.node_rank == 0) {
        t.generation = co_await generations_->next();
        const auto name = co_await generations_->name_regroup_generation(to.round, *t.generation);
        if (name.finished) {  // a node's workers finished the job first: nothing to publish
          t.finished = true;
          co_return t;
        }
        if (newcomers) {
          t.outcome.why = co_await await_arrivals(*t.generation, to.rank_offset, to.world_size);
          if (!t.outcome.why.empty()) co_return t;  // a group restart: nothing to join
        }
        // The job's one recovery is the regroup's until the group's word: a worker failing
        // meanwhile on another node restarts the group instead of starting a replacement that
        // this regroup's workers would wait for in vain.
        const RecoveryClaim claim = co_await rounds_->claim_recovery(to, Recovery::kRegroup);
        if (!claim.replacements) {
          t.outcome.why = "another node's worker is being replaced in place in round " +
                          std::to_string(to.round);
          co_return t;
        }
        std::string record = "regrouped round=" + std::to_string(to.round) +
                             " world=" + std::to_string(to.world_size) +
                             " nodes=" + std::to_string(to.num_nodes);
        co_await generations_->publish(*t.generation, std::move(record));
      } else {
        const auto g = co_await generations_->regroup_generation(to.round, kInPlaceRecoveryTimeout);
        if (g && g->finished) {
          t.finished = true;
          co_return t;
        }
        if (g && newcomers) {
          co_await generations_->mark_arrived(g->generation, to.rank_offset,
                                              config_.nproc_per_node);
        }
        // (Not `!g || !co_await ...`: GCC 12 runs a co_await whatever the left side says.)
        bool published = false;
        if (g) {
          published = co_await generations_->wait_published(g->generation, kInPlaceRecoveryTimeout);
        }
        if (!published) {
          t.outcome.why = "node 0 did not publish the regroup's generation within " +
                          std::to_string(kInPlaceRecoveryTimeout.count() / 1000) + " s";
          co_return t;
        }
      }
      t.published_at = std::chrono::steady_clock::now();
      if (group_) group_->ask_to_regroup();
      if (to.node_rank != 0) {
        t.outcome.recovered = true;
        co_return t;
      }
      t.outcome = co_await generations_->wait_recovered(*t.generation, kInPlaceRecoveryTimeout);
    } catch (const rendezvous::StoreError& e) {
      if (e.code() == rendezvous::StoreErrc::kCancelled) throw;
      t.outcome.why = "the workers' store cannot be used: " + std::string(e.what());
    }
    co_return t;
  }

  // Node 0: this node's workers are there; then every rank of the new world, the newcomers'
  // workers included, at most kArrivalTimeout (then the generation is published anyway). Returns
  // why it must not be published (a newcomer's worker died first); empty when it may.
  Task<std::string> await_arrivals(int generation, int rank_offset, int world_size) {
    co_await generations_->mark_arrived(generation, rank_offset, config_.nproc_per_node);
    const auto began = std::chrono::steady_clock::now();
    const Arrivals a = co_await generations_->wait_arrived(generation, world_size, kArrivalTimeout);
    std::string why;
    if (a.failed_rank) {
      why = "worker " + std::to_string(*a.failed_rank) + " of the new world failed before it " +
            "joined generation " + std::to_string(generation);
    } else if (a.all) {
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - began);
      spdlog::info(
          "generation {}: every worker of the new world is ready after {} ms: publishing it",
          generation, waited.count());
    } else {
      spdlog::warn(
          "generation {}: not every worker of the new world was ready to join it within {} s: "
          "publishing it anyway",
          generation, kArrivalTimeout.count() / 1000);
    }
    co_return why;
  }

  void on_regroup_done(const RegroupTold& t) {
    if (state_ != State::kRegrouping) return;
    if (t.finished) {  // they end the same way here: WorkersSucceeded, then finish_regroup()
      spdlog::info(
          "in-place: a node's workers finished the job during the regroup in round {}: waiting "
          "for this node's workers to end",
          round_->round);
      return;
    }
    if (!t.outcome.recovered) {
      end_joined_round();
      return regroup_failed("the regrouped workers did not recover: " + t.outcome.why);
    }
    // The workers stalled from the node's loss; with only newcomers, they trained on until asked.
    const auto stalled_from = regroup_lost_node_ ? regroup_began_ : t.published_at;
    const auto stall = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - stalled_from);
    std::string ranks;
    for (const auto& [from, to] : regrouped_ranks_) {
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(from) + "->" + std::to_string(to);
    }
    const int new_nodes = round_->num_nodes - round_->returning;
    spdlog::info(
        "in-place: regrouped in round {} ({}): world {}, {} node(s) new, this node's ranks {}{} "
        "(the workers stalled {} ms)",
        round_->round, regroup_cause_, round_->world_size, new_nodes, ranks,
        t.generation ? ", generation " + std::to_string(*t.generation) : "", stall.count());
    telemetry_->in_place_regrouped({regrouped_from_, round_->round, t.generation, round_->node_rank,
                                    round_->world_size, regrouped_ranks_, stall, t.outcome.record,
                                    new_nodes});
    if (round_->node_rank == 0) {  // its claim, from the generation's publication
      fire_and_forget(rounds_->recovery_over(*round_), "ending the regroup's recovery");
    }
    feed(Input::kRegrouped);
  }

  void regroup_failed(const std::string& why) {
    spdlog::warn("{}: stopping the workers", why);
    telemetry_->in_place_fallback(round_->round, std::nullopt, why);
    feed(Input::kRegroupFailed);
  }

  // ------------------------------------------------------------------------------------------
  // FAILED and EXIT

  std::string failure_summary() const {
    if (!failure_reason_.empty()) return failure_reason_;
    if (failures_.empty()) return "round " + std::to_string(round_ ? round_->round : 0) + " failed";
    const auto& root = failures_[root_cause_index(failures_)];
    return "worker " + std::to_string(root.rank) + " on " + root.host + " failed";
  }

  void report(std::vector<WorkerFailure> all) {
    failures_ = std::move(all);
    if (failures_.empty()) {  // the job failed without a worker failing (nodes lost)
      spdlog::error("the job failed: {}",
                    failure_reason_.empty()
                        ? "round " + std::to_string(round_ ? round_->round : 0) +
                              " failed on another node, which left no failure record"
                        : failure_reason_);
      exit_code_ = kExitAgentError;
    } else {
      if (config_.print_failure_report) {
        console_->write(ConsoleStream::kStderr,
                        format_report(config_.script_name, failures_, replaced_));
      }
      exit_code_ = exit_code_of(failures_[root_cause_index(failures_)]);
    }
    feed(Input::kFailuresCollected);
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
    if (!round_ || !rounds_->hosts_others()) return finish();
    if (stopping_.reason == StopReason::kSignal) {
      spdlog::warn("this agent hosts the job's store: the other nodes stop with it");
      return finish();
    }
    launch(rounds_->wait_for_others(*round_), [] { return event::OthersLeft{}; });
  }

  void finish() {
    if (finished_) return;
    finished_ = true;
    // No process of the job is left (a zygote or a standby would be a child): the janitor has
    // nothing to clean, and exits while this agent writes its report and tears down.
    if (janitor_ && !has_children()) janitor_->dismiss();
    record_job_end();
    if (telemetry_) {
      for (const auto& line : telemetry_->straggler_summary()) spdlog::warn("{}", line);
    }
    if (run_dir_) {
      const bool keep = !failures_.empty() || config_.writes_log_files() ||
                        (telemetry_ && telemetry_->saw_hung_workers());
      if (const auto said = run_dir_->finish(keep); !said.empty()) spdlog::info("{}", said);
    }
    io_.stop();
  }

  void record_job_end() {
    if (!telemetry_) return;
    if (exit_code_ == 0) return telemetry_->job_ended(0, "succeeded", "");
    if (stopping_.reason == StopReason::kSignal) {
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
    if (generations_) generations_->close();
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

  // While STOPPING: why, with which signal, and what is done.
  struct Stopping {
    StopReason reason = StopReason::kAllSucceeded;
    int signal = 0;  // the stop signal received (kSignal)
    bool group_stopped = false;
    bool signal_received = false;      // a stop signal came: a second one kills at once
    bool signal_already_sent = false;  // the stop signal reached the workers from Slurm
    int launcher_signal = 0;  // the launcher's stop, read from the store before its signal came
  };

  const LaunchConfig& config_;
  std::shared_ptr<Console> console_ = Console::process();  // never blocks (console.h)
  const AgentId& agent_id_;
  Janitor* janitor_;     // null when it could not start
  asio::io_context io_;  // first: destroyed last, after everything that uses it
  SignalWatcher signals_;
  std::optional<LauncherChannel> launcher_;  // started by dist-launch --hosts
  std::string host_;
  std::unique_ptr<RoundSource> rounds_;
  std::optional<RunDirectory> run_dir_;
  std::string token_file_;              // the workers' DIST_LAUNCH_TOKEN_FILE (empty: no token)
  std::string written_token_file_;      // when this agent wrote it: removed at the end
  std::optional<Telemetry> telemetry_;  // from prepare() on
  std::optional<WorkerGroup> group_;
  std::optional<Generations> generations_;     // in-place: this round's, from RUNNING on
  std::optional<Generations> finish_watch_;    // a newcomer's: the job finishing before it joins
  std::optional<Generations> publish_watch_;   // a newcomer's: its generation published
  std::optional<Generations> arrival_failed_;  // a newcomer's: its workers died before that

  State state_ = State::kInit;
  bool prepared_ = false;
  std::optional<Assignment> round_;  // the round this node is in, or was in last
  bool watching_ = false;            // the round's watch has not reported back yet
  bool counting_ = false;            // in-place, several nodes: STOPPING reads the replacements
  Stopping stopping_;
  int restart_count_ = 0;            // group restarts (the workers' TORCHELASTIC_RESTART_COUNT)
  int replacements_ = 0;             // in-place replacements, all rounds
  int generation_ = 0;               // in-place: this round's group's latest generation
  int replacing_rank_ = -1;          // in-place: the worker REPLACING replaces
  bool generation_claimed_ = false;  // and whether its generation is known yet
  std::vector<InPlaceReplacement> replaced_;
  std::string regroup_cause_;       // why the last regroup began ("node 1 was lost")
  bool regroup_lost_node_ = false;  // and whether a node was lost (its workers stalled at once)
  bool regroup_joining_ = false;    // REGROUPING's join has not reported back
  bool unjoined_ = false;           // a newcomer's workers, not yet taken in by the running workers
  // REGROUPING: since when, from which round, and this node's workers' old and new ranks.
  std::chrono::steady_clock::time_point regroup_began_;
  int regrouped_from_ = 0;
  std::vector<std::pair<int, int>> regrouped_ranks_;
  std::chrono::steady_clock::time_point failed_at_;  // when the last failures were reaped
  std::vector<WorkerFailure> failures_;
  std::string failure_reason_;  // why the job failed when no worker did
  int exit_code_ = 0;
  bool finished_ = false;
  bool shut_down_ = false;
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
  // STOPPING ends with no descendant; whatever path missed one, nothing stays.
  const auto kill_leftovers = [&] {
    if (!has_children()) return;
    for (const ProcessRef& p : job_processes(agent_id.id(), janitor ? janitor->pid() : -1)) {
      signal_process(p, SIGKILL);
    }
  };
  int exit_code;
  {
    Agent agent(config, agent_id, janitor ? &*janitor : nullptr);
    exit_code = agent.run();  // every worker and helper stopped and reaped
    kill_leftovers();
    // Nothing is left for the janitor to clean: it exits while this agent tears down (its run
    // directory, store and console), and is reaped last.
    if (janitor) janitor->dismiss();
  }
  kill_leftovers();
  return exit_code;  // ~Janitor reaps it
}

}  // namespace dist::agent
