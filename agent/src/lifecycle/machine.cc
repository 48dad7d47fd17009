#include "lifecycle/machine.h"

#include <signal.h>

#include "health/telemetry.h"

namespace dist::agent {
namespace {

Transition to(State state) {
  return {state, std::nullopt, std::nullopt, false};
}
Transition stopping(StopReason reason) {
  return {State::kStopping, reason, std::nullopt, false};
}
Transition exit_with(int code) {
  return {State::kExit, std::nullopt, code, false};
}

// STOPPING is over once the group is stopped. An agent that stays in the job (to restart, to
// fail, to wait at the exit barrier) waits too for the watch (several nodes) to end, for the
// job's in-place replacements (several nodes) to be counted, and for a regroup's join to report
// back (it may have joined the next round: that round is the one to end). One that leaves (a
// signal, the store lost, a start that failed) waits for none of them: their pending store calls
// are cancelled as it exits, and a store that does not answer (its host stopped, a partition)
// would otherwise hold a signalled agent for the store's timeout.
std::optional<Transition> once_stopped(const Facts& facts) {
  const bool leaving = facts.stop_reason == StopReason::kSignal ||
                       facts.stop_reason == StopReason::kStoreLost ||
                       facts.stop_reason == StopReason::kStartFailed;
  if (!facts.group_stopped) return std::nullopt;
  if (!leaving && (facts.watching || facts.counting || facts.joining)) return std::nullopt;
  return after_stopping(facts);
}

std::optional<Transition> from_running(Input input, const Facts& facts) {
  switch (input) {
    case Input::kStartFailed:
      return stopping(StopReason::kStartFailed);
    case Input::kWorkersFailed:
      // A newcomer's worker that the running workers have not taken in has no group to be
      // replaced into: the job starts again with every node.
      if (facts.in_place && facts.replaceable && facts.restarts_left && !facts.unjoined) {
        return to(State::kReplacing);
      }
      return stopping(StopReason::kWorkerFailed);
    case Input::kWorkersSucceeded:
      return stopping(StopReason::kAllSucceeded);
    case Input::kJobFinished:
      return stopping(StopReason::kJobFinished);
    case Input::kNodeLost:
    case Input::kNodeWaiting:
      if (facts.in_place && facts.elastic) return to(State::kRegrouping);
      return stopping(StopReason::kRoundEnded);
    case Input::kRoundEndedElsewhere:
      return stopping(StopReason::kRoundEnded);
    case Input::kStoreLost:
      return stopping(StopReason::kStoreLost);
    case Input::kStopSignal:
      return stopping(StopReason::kSignal);
    default:
      return std::nullopt;
  }
}

// While failed workers are replaced, the others run: what stops RUNNING stops this too, and a
// failure now (or a recovery that does not come) is the whole group's, unless it can be folded into
// the recovery (REPLACING again: a replacement more for each).
std::optional<Transition> from_replacing(Input input, const Facts& facts) {
  switch (input) {
    case Input::kRecovered:
      return to(State::kRunning);
    case Input::kWorkersFailed:
      if (facts.foldable && facts.restarts_left) {
        return to(State::kReplacing);
      }
      return stopping(StopReason::kWorkerFailed);
    case Input::kRecoveryFailed:
      return stopping(StopReason::kWorkerFailed);
    case Input::kNodeLost:
    case Input::kNodeWaiting:
      return stopping(StopReason::kRoundEnded);
    default:
      return from_running(input, facts);
  }
}

// While the survivors of a lost node regroup, their workers run (waiting in their recovery): a
// worker failing, another node lost or the round ending stop them as in RUNNING, and so does a
// regroup that cannot be done.
std::optional<Transition> from_regrouping(Input input, const Facts& facts) {
  switch (input) {
    case Input::kRegrouped:
      return to(State::kRunning);
    case Input::kRegroupFailed:
    case Input::kNodeLost:
    case Input::kNodeWaiting:
      return stopping(StopReason::kRoundEnded);
    case Input::kWorkersFailed:
      return stopping(StopReason::kWorkerFailed);
    default:
      return from_running(input, facts);
  }
}

std::optional<Transition> from_stopping(Input input, Facts facts) {
  switch (input) {
    case Input::kGroupStopped:
    case Input::kWatchStopped:
    case Input::kReplacementsCounted:
    case Input::kRoundEndedElsewhere:  // the watch ended on its own meanwhile
    case Input::kNodeLost:
    case Input::kNodeWaiting:
    case Input::kRegroupFailed:
      return once_stopped(facts);
    case Input::kStoreLost: {  // the store went while stopping: nothing after this can use it
      facts.stop_reason = StopReason::kStoreLost;
      if (auto done = once_stopped(facts)) return done;
      return stopping(StopReason::kStoreLost);
    }
    case Input::kStopSignal: {  // stopping for another reason: leave once stopped (now, if so)
      facts.stop_reason = StopReason::kSignal;
      if (auto done = once_stopped(facts)) {
        done->stop = StopReason::kSignal;  // (the job ends stopped by it, not failed)
        return done;
      }
      return stopping(StopReason::kSignal);
    }
    default:
      return std::nullopt;
  }
}

std::optional<Transition> from_rendezvous_failure(State state, Input input, const Facts& facts) {
  if (state == State::kExit) return std::nullopt;
  switch (input) {
    case Input::kJobDone:
      return exit_with(0);
    case Input::kRoundAborted:
      if (!facts.elastic && state == State::kRendezvous) return to(after_failed_round(facts));
      return exit_with(kExitAgentError);
    default:
      return exit_with(kExitAgentError);
  }
}

}  // namespace

std::string_view state_name(State state) {
  static_assert(kAgentStateNames.size() == static_cast<std::size_t>(State::kExit) + 1);
  return kAgentStateNames[static_cast<std::size_t>(state)];
}

State after_failed_round(const Facts& facts) {
  if (facts.elastic) return State::kRoundEnded;
  return facts.restarts_left ? State::kRestarting : State::kFailed;
}

Transition after_stopping(const Facts& facts) {
  switch (facts.stop_reason) {
    case StopReason::kAllSucceeded:
    case StopReason::kJobFinished:
      return to(facts.several_nodes ? State::kExitBarrier : State::kSucceeded);
    case StopReason::kWorkerFailed:
    case StopReason::kRoundEnded:
      return to(after_failed_round(facts));
    case StopReason::kSignal:
      return {State::kExit, std::nullopt, std::nullopt, true};
    case StopReason::kStartFailed:
    case StopReason::kStoreLost:
      return exit_with(kExitAgentError);
  }
  return exit_with(kExitAgentError);
}

int stop_signal(StopReason reason, int signal_received) {
  switch (reason) {
    case StopReason::kAllSucceeded:
      return 0;
    case StopReason::kJobFinished:  // the workers wait to join running workers that are gone
      return SIGTERM;
    case StopReason::kStartFailed:
      return SIGKILL;
    case StopReason::kSignal:
      return signal_received;
    case StopReason::kWorkerFailed:
    case StopReason::kRoundEnded:
    case StopReason::kStoreLost:
      break;
  }
  return SIGTERM;
}

std::optional<Transition> next_state(State state, Input input, const Facts& facts) {
  switch (input) {
    case Input::kJobDone:
    case Input::kRoundAborted:
    case Input::kRendezvousError:
      return from_rendezvous_failure(state, input, facts);
    case Input::kStopSignal:  // (leaving already: still 128 + signal, and at once)
      if (state == State::kRunning || state == State::kReplacing || state == State::kRegrouping ||
          state == State::kStopping) {
        break;
      }
      // The workers succeeded (a last read of the store may be under way): the job's success.
      if (state == State::kSucceeded) return exit_with(0);
      return Transition{State::kExit, StopReason::kSignal, std::nullopt, true};
    default:
      break;
  }
  switch (state) {
    case State::kRendezvous:
      if (input == Input::kPrepared) return to(State::kRendezvous);  // now the round itself
      if (input == Input::kJoined) return to(State::kRunning);
      if (input == Input::kJoinedAtBarrier) return to(State::kExitBarrier);
      return std::nullopt;
    case State::kRunning:
      return from_running(input, facts);
    case State::kReplacing:
      return from_replacing(input, facts);
    case State::kRegrouping:
      return from_regrouping(input, facts);
    case State::kStopping:
      return from_stopping(input, facts);
    case State::kExitBarrier:
      if (input == Input::kBarrierEveryone) return to(State::kSucceeded);
      if (input == Input::kBarrierRoundEnded) return to(after_failed_round(facts));
      return std::nullopt;
    case State::kRoundEnded:
      if (input == Input::kVerdictRestart) return to(State::kRestarting);
      if (input == Input::kVerdictReshape) return to(State::kRendezvous);
      if (input == Input::kVerdictFail) return to(State::kFailed);
      return std::nullopt;
    case State::kFailed:
      if (input == Input::kFailuresCollected) return to(State::kExit);
      return std::nullopt;
    case State::kInit:
    case State::kRestarting:
    case State::kSucceeded:
    case State::kExit:
      return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace dist::agent
