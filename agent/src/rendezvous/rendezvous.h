// The agents' rendezvous: how the nodes of a job agree, round after round, on who is in, each
// node's rank and first global rank, and the job-wide restart count; and how a running round ends.
// Every call is a coroutine over a RendezvousStore (store/store.h): nothing blocks, and
// close() cancels whatever is pending.
//
// A round is one run of the worker group. Two ways to form one (the keys are in schema.h):
//   static  (--nnodes N --node-rank k): round n is restart n. Every node claims its node rank;
//           the node whose join completes the count publishes every node's offset. A node rank
//           whose agent died may be claimed again by a relaunched agent: the round it held is
//           aborted and the job restarts with the new agent (one restart).
//   elastic (--nnodes MIN:MAX, c10d): nodes take tickets, and the round closes at MAX nodes, once
//           every survivor of the previous round is back with at least MIN in, or after
//           last_call_timeout with at least MIN (elastic_round.cc). How an ended round continues
//           (restart, reshape, fail) is decided once for the whole job (decide()).
// A running round ends when a node's workers fail, a node is lost (its liveness key vanished:
// each node watches the next one's, a ring), or (elastic) a node waits to join.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dist/agent/vocabulary.h"
#include "store/store.h"

namespace dist::agent {

// The rendezvous cannot go on; the message says why and what to do.
class RendezvousError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The job is over (another node decided so) before this node got into a round.
class JobOverError : public RendezvousError {
 public:
  JobOverError(const std::string& what, bool succeeded)
      : RendezvousError(what), succeeded_(succeeded) {}
  bool succeeded() const { return succeeded_; }

 private:
  bool succeeded_;
};

// Static: the round this node waited in was aborted (a relaunched node took over a dead node's
// rank): the job goes on in the next round, as after a failure.
class RoundAbortedError : public RendezvousError {
 public:
  using RendezvousError::RendezvousError;
};

// A round did not form within its timeout (static: every node; elastic: the minimum).
class RoundTimeoutError : public RendezvousError {
 public:
  using RendezvousError::RendezvousError;
};

// What this node and every node of the job need from the rest of the job.
struct JobShape {
  int min_nodes = 1;
  int max_nodes = 1;
  int local_world_size = 1;
  std::string host;  // this node's address as the others see it (--local-addr, else hostname)
  // --max-restarts: what a newcomer decides for a round whose nodes all vanished undecided.
  int max_restarts = 0;
  // This node's agent hosts the rendezvous store: a newcomer among newcomers, it is node 0, so
  // that losing another node never loses the node that coordinates recoveries and hosts the
  // workers' store while the store survives.
  bool hosts_store = false;
  // --restart-policy in-place (its --in-place-timeout; 0: not in place): a lost node's survivors,
  // too few to go on, keep their workers and wait this long in the next round for nodes to join
  // (a relaunched agent, a cluster manager's replacement) instead of restarting the group.
  std::chrono::milliseconds in_place_wait{0};
};

// What ended a watch: a failure somewhere, a node's agent gone, a node waiting to join, or our own
// stop (the watch was closed).
namespace schema {
struct JobView;
}

// How often the job view (schema::JobView) is made and read while a round runs.
inline constexpr std::chrono::seconds kJobViewInterval{5};

struct WatchResult {
  // kLauncherStop: a node left because dist-launch --hosts stops the job (its signal forwarded
  // to that host first); this one's is on its way.
  enum Kind { kFailed, kNodeLost, kNewcomer, kStopped, kLauncherStop } kind = kStopped;
  int node = -1;   // for kNodeLost: its node rank (-1: unknown)
  int signal = 0;  // for kLauncherStop: the signal the launcher forwards
};

// How a node's exit barrier ended. `passed`: every node still there succeeded, and the job is
// done. `lost` names the nodes whose agents were lost instead, before or at the barrier, with no
// failure of theirs said: their workers may have finished (a crash in a process group's
// teardown), and a job whose other nodes all finished is not run again for them (torchrun's
// nodes, too, leave their barrier with 0). Not passed: the round ended (a worker failed, a node
// acted on a newcomer or on the loss while its workers still ran). `left_early`: passed because
// the barrier timed out, the others still running (this node leaves with its success, as
// torchrun's agent does; they go on without taking it for lost).
struct BarrierEnd {
  bool passed = false;
  std::vector<int> lost;
  bool left_early = false;
  bool predecessor_left = false;  // left_early: a relaunched node's agent before it had left
};

// How the job goes on after an elastic round ended: decided by the first node to ask, then the
// same for every node.
struct Verdict {
  enum Action { kRestart, kReshape, kFail, kDone } action = kReshape;
  int expect = 0;    // the round's nodes still alive: the next round closes once they are back
  int restarts = 0;  // job-wide restarts after this round
  std::string reason;
};

// --restart-policy in-place: what holds the job's one recovery while it is under way. A worker
// replaced alone, or the group regrouping after a node was lost or joined (node 0 holds it from the
// regroup's generation until the group's word that it is whole).
enum class Recovery { kNone = 0, kReplacement = 1, kRegroup = 2 };

// A claim of that recovery: once claimed, the job's replacements so far (a replacement's claim
// counts itself); otherwise which kind of recovery another node has under way in this round (then
// the group must restart).
struct RecoveryClaim {
  std::optional<int> replacements;
  Recovery under_way = Recovery::kNone;
  std::string seen;  // refused: the job's recovery state it found, for take_over_recovery
  // Refused, nothing counted: the job's replacements so far, to which the claim's workers would
  // pass its budget (a group restart may still be left).
  std::optional<int> over_budget;
};

// "300 s", "2.5 s": a timeout as the log says it (the rounds' and the recoveries').
std::string seconds_text(std::chrono::milliseconds timeout);

struct RendezvousTimeouts {
  std::chrono::milliseconds rdzv{900'000};           // static: until every node joined
  std::chrono::milliseconds join{600'000};           // elastic: until a round forms
  std::chrono::milliseconds last_call{30'000};       // elastic: MIN reached, waiting for more
  std::chrono::milliseconds waiting_notice{30'000};  // how often a waiting node says for whom
};

class NodeRendezvous {
 public:
  // `session` holds this node's liveness key for as long as this object lives. `log` hears the
  // rendezvous's progress notices (who it waits for).
  NodeRendezvous(std::unique_ptr<RendezvousStore> session, JobShape shape,
                 RendezvousTimeouts timeouts, std::function<void(const std::string&)> log = {});
  ~NodeRendezvous();

  // Static: joins round `round` (or the job's latest, if later) as node `node_rank` and waits
  // for all max_nodes; throws RendezvousError naming the nodes seen and missing, or a node rank
  // claimed twice by live agents; RoundAbortedError; JobOverError. A relaunched node whose
  // predecessor was lost at its exit barrier, the round running on elsewhere, gets that round
  // with workers_succeeded: it waits at the barrier (exit_barrier counts it no second time).
  Task<Round> join_static(int round, int node_rank);

  // Elastic: joins round n (a member of round n-1 passes its Round) or, if that one closed
  // without it, a later one; throws RendezvousError when no round forms within the join timeout,
  // JobOverError when the job ended meanwhile. `worker_store`: the store this node would host for
  // the workers were it node rank 0 (none when the rendezvous store serves them).
  // `keeps_workers`: it joins while its workers run on (in-place, a regroup).
  Task<Round> join_elastic(int round, std::optional<Round> previous,
                           std::optional<store::Endpoint> worker_store = std::nullopt,
                           bool keeps_workers = false);
  // The first round an elastic node that is not coming back from a round should try.
  Task<int> current_round();

  // Elastic: how the job continues after round a.round ended (every node gets the same answer).
  Task<Verdict> decide(Round a, int max_restarts);
  // Every node of the round still there succeeded (its exit barrier passed): nodes that join
  // later (a relaunched or a waiting one) learn the job is over. False when, elastic, another
  // verdict on the round came first (the round ended after all).
  Task<bool> mark_done(Round a, const std::vector<int>& lost = {});
  // Static: the job failed for good; nodes still joining (a relaunched one) learn it at once.
  Task<void> mark_failed(Round a, std::string reason);

  // --restart-policy in-place: claims the job's one recovery for node a.node_rank in round
  // a.round: `workers` of it replaced while the others run (each counted with the replacements,
  // refused when the job's count would pass `budget`), or, node 0, the group's regroup (`workers`
  // 0). One recovery at a time, job-wide, by COMPARE_SET.
  Task<RecoveryClaim> claim_recovery(Round a, Recovery kind, int workers, int budget);
  // The replacement under way in round a (another node's, or this one's) that a refused claim
  // found (`seen`) becomes node a.node_rank's, counted as `workers` replacements more (failures
  // folded into it), within `budget`; refused (replacements unset) when the job's recovery is no
  // longer exactly that.
  Task<RecoveryClaim> take_over_recovery(Round a, std::string seen, int workers, int budget);
  // This node's recovery is over: another may be claimed.
  Task<void> recovery_over(Round a);
  // The job's replacements so far.
  Task<int> replacements();
  // Whether every node of round a but this one is at its exit barrier (its workers all succeeded).
  Task<bool> others_finished(Round a);

  // Publishes this node's failures for round a and tells every node the round failed.
  Task<void> announce_failure(Round a, std::vector<WorkerFailure> failures);
  // Every node's published failures for round a.
  Task<std::vector<WorkerFailure>> failures(Round a);
  // --restart-policy in-place: this node's workers replaced in place so far (the job's whole
  // history of them), published in round a; and every node's, read back, for the failure report
  // that every node prints the same.
  Task<void> publish_replacements(Round a, std::vector<InPlaceReplacement> replaced);
  Task<std::vector<InPlaceReplacement>> replaced(Round a);

  // Until round a fails anywhere, another node's agent dies, a node waits to join, or
  // stop_watch() is called, writing this node's heartbeat (wall-clock seconds) every `heartbeat`,
  // and with it, in the same request, what `progress` returns (schema::NodeProgress, encoded).
  // Runs on a session of its own: may run while this object's other calls do.
  // Every kJobViewInterval, `on_view` hears the job view (schema.h's JobView): node 0 makes it
  // from every node's progress and writes it, the others read it.
  Task<WatchResult> watch(Round a, std::chrono::seconds heartbeat,
                          std::function<std::string()> progress = {},
                          std::function<void(schema::JobView)> on_view = {});
  void stop_watch();

  // This node's workers all succeeded: passed once every node still there did (BarrierEnd).
  // After `timeout`, passed and left early when `may_leave`; otherwise (this node hosts the
  // job's store) it says so and waits on.
  Task<BarrierEnd> exit_barrier(Round a, std::chrono::milliseconds timeout, bool may_leave);

  // The agent hosting the store: before it exits it waits (bounded) for the other agents of round
  // a to leave.
  Task<void> wait_for_others_to_leave(Round a, std::chrono::milliseconds timeout);

  // Cancels every pending call (they throw StoreError kCancelled) and ends the sessions: this
  // node's liveness key goes.
  void close();
  std::string describe() const;

 private:
  friend class ElasticRendezvous;  // the elastic rounds, over Impl's state (rendezvous_impl.h)
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dist::agent
