// The agent's lifecycle as a pure function: where an input takes the agent from a state, given
// what the job's mode says. No I/O, no process: lifecycle/agent.cc feeds it its events and runs
// the entry action of the state it returns; agent/tests/unit/lifecycle/machine_test.cc walks it
// from tables.
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
// --restart-policy in-place adds one loop to RUNNING: one worker failed and restarts are left ->
// REPLACING (that worker alone is started again; the others run on and rebuild their group with
// it) -> RUNNING once the group says it recovered. A failure while REPLACING (or several at once
// in RUNNING), or a recovery that never comes, stops the group as any failure does: a group
// restart while restarts are left.
//               RUNNING --one worker failed (in-place)--> REPLACING --recovered--> RUNNING
//                                                             \--failed again--> STOPPING
// In-place and elastic, a lost node or a node waiting to join does not stop the running workers:
// REGROUPING takes the job's verdict on the round and joins the next one while they run, then
// tells them their ranks in the new world (a generation of their group, which a newcomer's
// workers join). Anything else -- another verdict, a round without every survivor, a failure
// meanwhile -- stops the group as a reshape always did: a new round from scratch.
//               RUNNING --a node lost or waiting (in-place, elastic)--> REGROUPING --regrouped-->
//               RUNNING; REGROUPING --cannot--> STOPPING
// Workers that all finish while their node regroups finished the job: STOPPING, as any success,
// and the round joined for the regroup is the one whose exit barrier the nodes pass, the
// newcomers' included (their workers, waiting to join, are stopped: kJobFinished).
#pragma once

#include <optional>
#include <string_view>

namespace dist::agent {

// The agent's exit code when the job could not be run (rendezvous, store, start).
inline constexpr int kExitAgentError = 1;

enum class State {
  kInit,
  kRendezvous,
  kRunning,
  kReplacing,
  kRegrouping,
  kStopping,
  kExitBarrier,
  kRoundEnded,
  kRestarting,
  kSucceeded,
  kFailed,
  kExit
};

// The state's name in the event log and the metrics (health/telemetry.h's kAgentStateNames).
std::string_view state_name(State state);

// Why the group is being stopped: decides where STOPPING leads once every worker is gone.
// kRoundEnded: elsewhere (a failure on another node, a lost node, a node waiting to join).
// kJobFinished: in place, the job's other workers finished before this node's joined them (a
// newcomer's), or before a failed worker's replacement could (or did) rejoin them: this node's
// are stopped, and the node succeeds with the others.
enum class StopReason {
  kAllSucceeded,
  kJobFinished,
  kWorkerFailed,
  kRoundEnded,
  kSignal,
  kStartFailed,
  kStoreLost
};

// What happened, reduced to what decides the next state.
enum class Input {
  kPrepared,             // the first round's preparations are done (stores, session)
  kJoined,               // the round formed: this node has its assignment
  kJoinedAtBarrier,      // static: a relaunched node joined its round at the exit barrier (the
                         // workers of its agent before this one had succeeded)
  kStartFailed,          // the workers could not start
  kWorkersFailed,        // a worker of this node failed
  kWorkersSucceeded,     // every worker of this node exited 0
  kRoundEndedElsewhere,  // the watch, or a newcomer's wait: a failure on another node
  kNodeLost,             // the watch: another node's agent is gone
  kNodeWaiting,          // the watch: a node waits to join the job
  kStoreLost,            // the watch lost the rendezvous store
  kGroupStopped,         // every worker is reaped and its output drained
  kWatchStopped,         // the round's watch has ended
  kBarrierEveryone,      // the exit barrier: every node succeeded
  kBarrierRoundEnded,    // the exit barrier: the round ended meanwhile
  kVerdictRestart,       // elastic: the job's verdict on an ended round
  kVerdictReshape,
  kVerdictFail,
  kFailuresCollected,    // FAILED: every node's failures are in
  kJobDone,              // a late elastic node found the job finished
  kRoundAborted,         // static: the round waited in was aborted (a relaunched node)
  kRendezvousError,      // a rendezvous step cannot be done
  kStopSignal,           // SIGTERM, SIGINT, ... (the first one)
  kRecovered,            // in-place: the group rebuilt itself with the replacement
  kRecoveryFailed,       // in-place: it did not within its time, or its store cannot be used;
                         // or another node's recovery is under way, or no restart is left
  kReplacementsCounted,  // in-place, several nodes: STOPPING has read the job's replacements
  kRegrouped,            // in-place, elastic: the survivors run on in the next round
  kRegroupFailed,        // in-place, elastic: they cannot (the verdict, the round, the store);
                         // in STOPPING: a regroup's join, left behind, has reported back
  kJobFinished,          // in-place: the job's other workers finished it before this node's
                         // joined them (a newcomer's), or a failed one's replacement could
};

// What the job's mode and this node's progress say, as the machine needs it.
struct Facts {
  bool several_nodes = false;  // rounds are formed with other nodes
  bool elastic = false;        // an ended round's fate is the job's verdict, not a local count
  bool restarts_left = false;  // static: --max-restarts not used up (in-place replacements too)
  bool in_place = false;       // --restart-policy in-place
  bool unjoined = false;       // a newcomer's workers not yet taken in by the running workers
  // RUNNING: the failures just reaped (one worker's or several) can be replaced in place: a
  // worker that kept its state remains, and a restart is left for each.
  bool replaceable = false;
  // REPLACING: the failures just reaped can be folded into this node's recovery under way (its
  // generation is out, every worker follows a later one, a worker that kept its state remains, a
  // restart is left for each).
  bool foldable = false;
  // In STOPPING: why it was entered, and what it still waits for.
  StopReason stop_reason = StopReason::kAllSucceeded;
  bool group_stopped = false;
  bool watching = false;  // the round's watch has not ended yet
  bool counting = false;  // in-place, several nodes: the job's replacements are being read
  bool joining = false;   // a regroup's join of the next round has not reported back yet
};

struct Transition {
  State to = State::kInit;
  // Entering STOPPING (or, already there, what it now leads to): why.
  std::optional<StopReason> stop;
  // Entering EXIT straight from here: the exit code, or 128 + the signal (signal_exit).
  std::optional<int> exit_code;
  bool signal_exit = false;
};

// Where `input` takes an agent in `state`. nullopt: nowhere, the input is dropped (a late result
// of a step that was abandoned, a watch that ended while the round goes on).
std::optional<Transition> next_state(State state, Input input, const Facts& facts);

// Where STOPPING leads once the group is stopped and the watch has ended.
Transition after_stopping(const Facts& facts);

// Where a round that did not succeed leads: elastic, the job's verdict; static, a restart while
// any is left.
State after_failed_round(const Facts& facts);

// What the workers are sent when the group stops for `reason`: nothing when they all succeeded,
// SIGKILL when they could not all start, the stop signal received (`signal_received`), else
// SIGTERM (--shutdown-timeout later: SIGKILL).
int stop_signal(StopReason reason, int signal_received);

}  // namespace dist::agent
