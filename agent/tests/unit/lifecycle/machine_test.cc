// The agent's state machine from tables: every transition lifecycle/machine.h promises, and the
// inputs it drops, with no process, socket or store.
#include "lifecycle/machine.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace dist::agent {
namespace {

// Shorthands for the facts of a case.
Facts one_node() {
  return {};
}
Facts static_nodes(bool restarts_left) {
  Facts f;
  f.several_nodes = true;
  f.restarts_left = restarts_left;
  return f;
}
Facts elastic() {
  Facts f;
  f.several_nodes = f.elastic = true;
  return f;
}
// --restart-policy in-place on one node: the failures reaped replaceable (a worker with its state
// outlives them, a restart is left for each) or not, restarts left or not.
Facts in_place(bool replaceable = true, bool restarts_left = true) {
  Facts f;
  f.in_place = true;
  f.replaceable = replaceable;
  f.restarts_left = restarts_left;
  return f;
}
Facts foldable(Facts f) {
  f.foldable = true;
  return f;
}
Facts counting(Facts f) {
  f.several_nodes = f.counting = true;
  return f;
}
Facts unjoined(Facts f) {
  f.several_nodes = f.elastic = f.unjoined = true;
  return f;
}
Facts joining(Facts f) {
  f.joining = true;
  return f;
}
// In STOPPING: why, the group reaped or not, the watch still running or not.
Facts stopped(Facts f, StopReason reason, bool group_stopped = true, bool watching = false) {
  f.stop_reason = reason;
  f.group_stopped = group_stopped;
  f.watching = watching;
  return f;
}

struct Case {
  std::string name;
  State from;
  Input input;
  Facts facts;
  std::optional<State> to;  // nullopt: the input is dropped
  std::optional<StopReason> stop = std::nullopt;
  std::optional<int> exit_code = std::nullopt;
  bool signal_exit = false;
};

void check(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const auto t = next_state(c.from, c.input, c.facts);
    ASSERT_EQ(t.has_value(), c.to.has_value())
        << (t ? "went to " + std::string(state_name(t->to)) : "dropped");
    if (!t) continue;
    EXPECT_EQ(state_name(t->to), state_name(*c.to));
    EXPECT_EQ(t->stop, c.stop);
    EXPECT_EQ(t->exit_code, c.exit_code);
    EXPECT_EQ(t->signal_exit, c.signal_exit);
  }
}

TEST(StateMachineTransitions, ARoundFormsAndItsWorkersRun) {
  check({
      {"prepared: the round itself next", State::kRendezvous, Input::kPrepared, one_node(),
       State::kRendezvous},
      {"joined: the workers start", State::kRendezvous, Input::kJoined, static_nodes(true),
       State::kRunning},
      {"joined at the barrier: a relaunched node whose workers had succeeded waits there",
       State::kRendezvous, Input::kJoinedAtBarrier, static_nodes(true), State::kExitBarrier},
      {"a worker failed", State::kRunning, Input::kWorkersFailed, one_node(), State::kStopping,
       StopReason::kWorkerFailed},
      {"all succeeded", State::kRunning, Input::kWorkersSucceeded, one_node(), State::kStopping,
       StopReason::kAllSucceeded},
      {"the workers could not start", State::kRunning, Input::kStartFailed, one_node(),
       State::kStopping, StopReason::kStartFailed},
      {"the round ended on another node", State::kRunning, Input::kRoundEndedElsewhere, elastic(),
       State::kStopping, StopReason::kRoundEnded},
      {"the store is gone", State::kRunning, Input::kStoreLost, static_nodes(true),
       State::kStopping, StopReason::kStoreLost},
      {"SIGTERM", State::kRunning, Input::kStopSignal, one_node(), State::kStopping,
       StopReason::kSignal},
  });
}

TEST(StateMachineTransitions, StoppingEndsOnceTheGroupIsReapedAndTheWatchHasEnded) {
  const Facts failed_static = static_nodes(true);
  check({
      {"group reaped, watch still running", State::kStopping, Input::kGroupStopped,
       stopped(failed_static, StopReason::kWorkerFailed, true, true), std::nullopt},
      {"watch ended, group still running", State::kStopping, Input::kWatchStopped,
       stopped(failed_static, StopReason::kWorkerFailed, false, false), std::nullopt},
      {"both: a static restart", State::kStopping, Input::kWatchStopped,
       stopped(failed_static, StopReason::kWorkerFailed), State::kRestarting},
      {"both, no restart left: failed", State::kStopping, Input::kGroupStopped,
       stopped(static_nodes(false), StopReason::kWorkerFailed), State::kFailed},
      {"elastic: the job's verdict", State::kStopping, Input::kGroupStopped,
       stopped(elastic(), StopReason::kRoundEnded), State::kRoundEnded},
      {"one node succeeded", State::kStopping, Input::kGroupStopped,
       stopped(one_node(), StopReason::kAllSucceeded), State::kSucceeded},
      {"several nodes: the exit barrier first", State::kStopping, Input::kGroupStopped,
       stopped(static_nodes(false), StopReason::kAllSucceeded), State::kExitBarrier},
      {"stopped by a signal: 128 + signal", State::kStopping, Input::kGroupStopped,
       stopped(one_node(), StopReason::kSignal), State::kExit, std::nullopt, std::nullopt, true},
      {"could not start: 1", State::kStopping, Input::kGroupStopped,
       stopped(one_node(), StopReason::kStartFailed), State::kExit, std::nullopt, 1},
      {"a watch that ended on its own counts as ended", State::kStopping,
       Input::kRoundEndedElsewhere, stopped(elastic(), StopReason::kWorkerFailed),
       State::kRoundEnded},
  });
}

TEST(StateMachineTransitions, WhatArrivesWhileStoppingChangesWhereItLeads) {
  check({
      {"a signal: leave once stopped", State::kStopping, Input::kStopSignal,
       stopped(static_nodes(true), StopReason::kWorkerFailed, false), State::kStopping,
       StopReason::kSignal},
      {"the store lost, group still running", State::kStopping, Input::kStoreLost,
       stopped(static_nodes(true), StopReason::kWorkerFailed, false), State::kStopping,
       StopReason::kStoreLost},
      {"the store lost, group reaped: no restart without a store", State::kStopping,
       Input::kStoreLost, stopped(static_nodes(true), StopReason::kWorkerFailed), State::kExit,
       std::nullopt, 1},
      {"a signal once the group is reaped, the watch still running: leave now", State::kStopping,
       Input::kStopSignal, stopped(static_nodes(true), StopReason::kWorkerFailed, true, true),
       State::kExit, StopReason::kSignal, std::nullopt, true},
      {"a signal while the job's replacements are counted: leave now", State::kStopping,
       Input::kStopSignal, stopped(counting(in_place()), StopReason::kWorkerFailed), State::kExit,
       StopReason::kSignal, std::nullopt, true},
  });
}

// A stop that stays in the job waits for the watch, the count of the job's replacements and a
// regroup's join; one that leaves waits for its workers alone (their store calls are cancelled as
// it exits: a store that does not answer would hold it for the store's timeout).
TEST(StateMachineTransitions, AStopThatLeavesWaitsForItsWorkersAlone) {
  const Facts counted = counting(in_place());
  const Facts regrouping = joining(elastic());
  check({
      {"failed, replacements being counted: wait", State::kStopping, Input::kGroupStopped,
       stopped(counted, StopReason::kWorkerFailed), std::nullopt},
      {"failed, a join under way: wait", State::kStopping, Input::kGroupStopped,
       stopped(regrouping, StopReason::kRoundEnded), std::nullopt},
      {"signal, watch running: leave", State::kStopping, Input::kGroupStopped,
       stopped(static_nodes(true), StopReason::kSignal, true, true), State::kExit, std::nullopt,
       std::nullopt, true},
      {"signal, replacements being counted: leave", State::kStopping, Input::kGroupStopped,
       stopped(counted, StopReason::kSignal), State::kExit, std::nullopt, std::nullopt, true},
      {"signal, a join under way: leave", State::kStopping, Input::kGroupStopped,
       stopped(regrouping, StopReason::kSignal), State::kExit, std::nullopt, std::nullopt, true},
      {"store lost, watch running: leave, 1", State::kStopping, Input::kGroupStopped,
       stopped(static_nodes(true), StopReason::kStoreLost, true, true), State::kExit, std::nullopt,
       1},
      {"could not start, replacements being counted: leave, 1", State::kStopping,
       Input::kGroupStopped, stopped(counted, StopReason::kStartFailed), State::kExit, std::nullopt,
       1},
      {"signal, workers still running: wait for them", State::kStopping, Input::kWatchStopped,
       stopped(counted, StopReason::kSignal, false), std::nullopt},
  });
}

TEST(StateMachineTransitions, BarrierVerdictAndReport) {
  check({
      {"everyone succeeded", State::kExitBarrier, Input::kBarrierEveryone, static_nodes(false),
       State::kSucceeded},
      {"the round ended at the barrier: static restart", State::kExitBarrier,
       Input::kBarrierRoundEnded, static_nodes(true), State::kRestarting},
      {"the round ended at the barrier: elastic verdict", State::kExitBarrier,
       Input::kBarrierRoundEnded, elastic(), State::kRoundEnded},
      {"verdict restart", State::kRoundEnded, Input::kVerdictRestart, elastic(),
       State::kRestarting},
      {"verdict reshape: a new round, not a restart", State::kRoundEnded, Input::kVerdictReshape,
       elastic(), State::kRendezvous},
      {"verdict fail", State::kRoundEnded, Input::kVerdictFail, elastic(), State::kFailed},
      {"every node's failures in: report and leave", State::kFailed, Input::kFailuresCollected,
       static_nodes(false), State::kExit},
  });
}

TEST(StateMachineTransitions, RendezvousFailuresAndSignalsOutsideTheRound) {
  check({
      {"a late node finds the job done", State::kRendezvous, Input::kJobDone, elastic(),
       State::kExit, std::nullopt, 0},
      {"static round aborted: restart", State::kRendezvous, Input::kRoundAborted,
       static_nodes(true), State::kRestarting},
      {"static round aborted, none left", State::kRendezvous, Input::kRoundAborted,
       static_nodes(false), State::kFailed},
      {"aborted elsewhere than joining: an error", State::kRunning, Input::kRoundAborted,
       static_nodes(true), State::kExit, std::nullopt, 1},
      {"rendezvous error", State::kExitBarrier, Input::kRendezvousError, static_nodes(true),
       State::kExit, std::nullopt, 1},
      {"SIGTERM while joining", State::kRendezvous, Input::kStopSignal, static_nodes(true),
       State::kExit, StopReason::kSignal, std::nullopt, true},
      {"SIGTERM at the barrier", State::kExitBarrier, Input::kStopSignal, static_nodes(true),
       State::kExit, StopReason::kSignal, std::nullopt, true},
      {"SIGTERM while leaving: still 128 + signal", State::kExit, Input::kStopSignal, elastic(),
       State::kExit, StopReason::kSignal, std::nullopt, true},
      {"SIGTERM once the workers succeeded (a last read under way): the job's success",
       State::kSucceeded, Input::kStopSignal, static_nodes(true), State::kExit, std::nullopt, 0},
  });
}

TEST(StateMachineTransitions, LateResultsOfAbandonedStepsAreDropped) {
  check({
      {"a failure after the round stopped", State::kRendezvous, Input::kWorkersFailed,
       static_nodes(true), std::nullopt},
      {"a verdict while running", State::kRunning, Input::kVerdictRestart, elastic(), std::nullopt},
      {"a join while stopping", State::kStopping, Input::kJoined, elastic(), std::nullopt},
      {"a barrier result after the round ended", State::kRoundEnded, Input::kBarrierEveryone,
       elastic(), std::nullopt},
      {"an error while leaving", State::kExit, Input::kRendezvousError, elastic(), std::nullopt},

      {"the watch stopped while running (our own stop)", State::kRunning, Input::kWatchStopped,
       elastic(), std::nullopt},
  });
}

TEST(StateMachineTransitions, InPlaceOneFailedWorkerIsReplacedWhileTheOthersRun) {
  check({
      {"one failure: replaced alone", State::kRunning, Input::kWorkersFailed, in_place(),
       State::kReplacing},
      {"a newcomer's worker failed before the running workers took it in: the group restarts",
       State::kRunning, Input::kWorkersFailed, unjoined(in_place()), State::kStopping,
       StopReason::kWorkerFailed},
      {"the group says it recovered: running again, whole", State::kReplacing, Input::kRecovered,
       in_place(), State::kRunning},
      {"the group policy: every failure stops the group", State::kRunning, Input::kWorkersFailed,
       one_node(), State::kStopping, StopReason::kWorkerFailed},
      {"every worker failed at once, or more than restarts are left for: the group restarts",
       State::kRunning, Input::kWorkersFailed, in_place(false), State::kStopping,
       StopReason::kWorkerFailed},
      {"no restart left: stop (then FAILED)", State::kRunning, Input::kWorkersFailed,
       in_place(true, false), State::kStopping, StopReason::kWorkerFailed},
      {"a failure during the recovery: the group restarts", State::kReplacing,
       Input::kWorkersFailed, in_place(), State::kStopping, StopReason::kWorkerFailed},
      {"a failure folded into the recovery: replacing again", State::kReplacing,
       Input::kWorkersFailed, foldable(in_place()), State::kReplacing},
      {"a failure to fold, no restart left: stop", State::kReplacing, Input::kWorkersFailed,
       foldable(in_place(true, false)), State::kStopping, StopReason::kWorkerFailed},
      {"no recovery in time: the group restarts", State::kReplacing, Input::kRecoveryFailed,
       in_place(), State::kStopping, StopReason::kWorkerFailed},
      {"the replacement could not start", State::kReplacing, Input::kStartFailed, in_place(),
       State::kStopping, StopReason::kStartFailed},
      {"everyone finished meanwhile", State::kReplacing, Input::kWorkersSucceeded, in_place(),
       State::kStopping, StopReason::kAllSucceeded},
      {"SIGTERM while replacing: the workers are stopped", State::kReplacing, Input::kStopSignal,
       in_place(), State::kStopping, StopReason::kSignal},
      {"a late recovery after the group stopped", State::kStopping, Input::kRecovered,
       stopped(in_place(), StopReason::kWorkerFailed, false), std::nullopt},
      {"a late recovery failure while running", State::kRunning, Input::kRecoveryFailed, in_place(),
       std::nullopt},
      {"STOPPING after a failed recovery: restart", State::kStopping, Input::kGroupStopped,
       stopped(in_place(), StopReason::kWorkerFailed), State::kRestarting},
      {"several nodes: STOPPING waits for the job's replacements", State::kStopping,
       Input::kGroupStopped, counting(stopped(in_place(), StopReason::kRoundEnded)), std::nullopt},
      {"counted, none left: failed", State::kStopping, Input::kReplacementsCounted,
       stopped(in_place(true, false), StopReason::kRoundEnded), State::kFailed},
      {"counted, some left: restart", State::kStopping, Input::kReplacementsCounted,
       stopped(in_place(), StopReason::kWorkerFailed), State::kRestarting},
  });
}

TEST(StateMachineTransitions, InPlaceElasticALostNodesSurvivorsRegroupWhileTheirWorkersRun) {
  Facts f = elastic();
  f.in_place = f.restarts_left = true;
  Facts static_in_place = static_nodes(true);
  static_in_place.in_place = true;
  check({
      {"a node lost: regroup, the workers run on", State::kRunning, Input::kNodeLost, f,
       State::kRegrouping},
      {"regrouped: running again, in the next round", State::kRegrouping, Input::kRegrouped, f,
       State::kRunning},
      {"the group policy: a lost node ends the round", State::kRunning, Input::kNodeLost, elastic(),
       State::kStopping, StopReason::kRoundEnded},
      {"static nodes: no smaller world, the round ends", State::kRunning, Input::kNodeLost,
       static_in_place, State::kStopping, StopReason::kRoundEnded},
      {"cannot regroup (verdict, newcomer, store): the round ends", State::kRegrouping,
       Input::kRegroupFailed, f, State::kStopping, StopReason::kRoundEnded},
      {"another node lost meanwhile: the round ends", State::kRegrouping, Input::kNodeLost, f,
       State::kStopping, StopReason::kRoundEnded},
      {"a worker failed meanwhile: the group restarts", State::kRegrouping, Input::kWorkersFailed,
       f, State::kStopping, StopReason::kWorkerFailed},
      {"a failure elsewhere in the new round", State::kRegrouping, Input::kRoundEndedElsewhere, f,
       State::kStopping, StopReason::kRoundEnded},
      {"SIGTERM while regrouping: the workers are stopped", State::kRegrouping, Input::kStopSignal,
       f, State::kStopping, StopReason::kSignal},
      {"the store lost while regrouping", State::kRegrouping, Input::kStoreLost, f,
       State::kStopping, StopReason::kStoreLost},
      {"a node lost while replacing: the round ends", State::kReplacing, Input::kNodeLost, f,
       State::kStopping, StopReason::kRoundEnded},
      {"a node lost while stopping: the watch has ended", State::kStopping, Input::kNodeLost,
       stopped(f, StopReason::kWorkerFailed), State::kRoundEnded},
      {"a late regroup after the group stopped", State::kStopping, Input::kRegrouped,
       stopped(f, StopReason::kRoundEnded, false), std::nullopt},
      {"STOPPING waits for a regroup's join left behind", State::kStopping, Input::kGroupStopped,
       joining(stopped(f, StopReason::kWorkerFailed)), std::nullopt},
      {"the join reported back: the round ends", State::kStopping, Input::kRegroupFailed,
       stopped(f, StopReason::kWorkerFailed), State::kRoundEnded},
      {"stopped by a signal: leaves without waiting for the join", State::kStopping,
       Input::kGroupStopped, joining(stopped(f, StopReason::kSignal)), State::kExit, std::nullopt,
       std::nullopt, true},
  });
}

TEST(StateMachineTransitions, InPlaceElasticANodeWaitingToJoinIsTakenInWhileTheWorkersRun) {
  Facts f = elastic();
  f.in_place = f.restarts_left = true;
  check({
      {"a node waits to join: regroup, the workers run on", State::kRunning, Input::kNodeWaiting, f,
       State::kRegrouping},
      {"the group policy: the round ends for a new one", State::kRunning, Input::kNodeWaiting,
       elastic(), State::kStopping, StopReason::kRoundEnded},
      {"a newcomer while replacing: the round ends", State::kReplacing, Input::kNodeWaiting, f,
       State::kStopping, StopReason::kRoundEnded},
      {"another newcomer while regrouping: the round ends", State::kRegrouping, Input::kNodeWaiting,
       f, State::kStopping, StopReason::kRoundEnded},
      {"a newcomer while stopping: the watch has ended", State::kStopping, Input::kNodeWaiting,
       stopped(f, StopReason::kRoundEnded), State::kRoundEnded},
      {"the newcomer could not join the running workers: the round ends", State::kRunning,
       Input::kRoundEndedElsewhere, f, State::kStopping, StopReason::kRoundEnded},
  });
}

// The job's workers finish while the nodes regroup: a success, whose exit barrier is passed once
// the regroup's join has reported back (the round joined is the one the job ends in); a newcomer
// with nothing left to join stops its workers and succeeds with the others.
TEST(StateMachineTransitions, InPlaceElasticWorkersFinishingDuringARegroupEndTheJobDone) {
  Facts f = elastic();
  f.in_place = f.restarts_left = true;
  check({
      {"the workers finish while regrouping: a success", State::kRegrouping,
       Input::kWorkersSucceeded, f, State::kStopping, StopReason::kAllSucceeded},
      {"stopped, the join still under way: it is waited for", State::kStopping,
       Input::kGroupStopped, joining(stopped(f, StopReason::kAllSucceeded)), std::nullopt},
      {"the join reported back (the newcomers told): the exit barrier", State::kStopping,
       Input::kRegroupFailed, stopped(f, StopReason::kAllSucceeded), State::kExitBarrier},
      {"a newcomer: the running workers finished before its own joined", State::kRunning,
       Input::kJobFinished, f, State::kStopping, StopReason::kJobFinished},
      {"its workers stopped: the exit barrier, as a success", State::kStopping,
       Input::kGroupStopped, stopped(f, StopReason::kJobFinished), State::kExitBarrier},
      {"one node alone: no barrier", State::kStopping, Input::kGroupStopped,
       stopped(one_node(), StopReason::kJobFinished), State::kSucceeded},
  });
}

// A static two-node job, walked through the machine: a failure, a restart, then success.
TEST(StateMachineTransitions, AStaticJobFailsRestartsAndSucceeds) {
  State s = State::kRendezvous;
  Facts f = static_nodes(true);
  const auto step = [&](Input input) {
    const auto t = next_state(s, input, f);
    EXPECT_TRUE(t.has_value()) << state_name(s);
    if (!t) return;
    if (t->stop) f.stop_reason = *t->stop;
    s = t->to;
  };
  step(Input::kJoined);
  EXPECT_EQ(s, State::kRunning);
  step(Input::kWorkersFailed);
  EXPECT_EQ(s, State::kStopping);
  f.group_stopped = true;
  step(Input::kWatchStopped);
  EXPECT_EQ(s, State::kRestarting);
  // (RESTARTING's entry action counts the restart and enters RENDEZVOUS.)
  s = State::kRendezvous;
  f = static_nodes(false);
  step(Input::kJoined);
  step(Input::kWorkersSucceeded);
  f.group_stopped = true;
  step(Input::kGroupStopped);
  EXPECT_EQ(s, State::kExitBarrier);
  step(Input::kBarrierEveryone);
  EXPECT_EQ(s, State::kSucceeded);
}

TEST(StateMachineTransitions, EveryStateHasItsTelemetryName) {
  EXPECT_EQ(state_name(State::kInit), "init");
  EXPECT_EQ(state_name(State::kReplacing), "replacing");
  EXPECT_EQ(state_name(State::kRegrouping), "regrouping");
  EXPECT_EQ(state_name(State::kExitBarrier), "exit_barrier");
  EXPECT_EQ(state_name(State::kExit), "exit");
}

}  // namespace
}  // namespace dist::agent
