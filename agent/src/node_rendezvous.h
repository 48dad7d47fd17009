// The agents' rendezvous through the store. A round is one run of the worker group: its nodes agree
// on who is in, each node's rank and first global rank, and the job-wide restart count. Blocking
// calls: the agent runs them on helper threads so that its own io thread, which may host the store,
// never blocks.
//
// Two ways to form round n (keys under rdzv/<run id>/rn/):
//   static  (--nnodes N --node-rank k), node_rendezvous.cc: round n is restart n; every node claims
//           node/<k> and the node whose join completes the `joined` count publishes offset/<k>,
//           world_size and `closed`.
//   elastic (--nnodes MIN:MAX, c10d), elastic_round.cc: nodes take tickets (`join`), write an
//           ephemeral node/<ticket> record, and the round closes at MAX nodes (first round), once
//           every survivor of the previous round is back with at least MIN in, or after
//           last_call_timeout with at least MIN. The closer publishes `assignment` (tickets in
//           node-rank order); a node left out joins round n+1 and wakes round n's nodes (scale up).
//           How an ended round continues (restart, reshape, fail) is decided once, in `verdict`.
//
// Then, in both, for a running round:
//   healthy            deleted by the first node whose workers fail
//   failures/<node>    that node's failures (JSON), written before healthy is deleted
//   stop/<node>        deleted by a node to end its own watch
//   done               count of nodes whose workers all succeeded (the exit barrier)
//   no_newcomers       elastic: deleted by a node that waits to join (ends the round: scale up)
//   heartbeat/<node>   wall-clock seconds, refreshed while the node's workers run (for status)
//   intact, lost       intact is deleted (and the node named in lost) by the node that saw the
//                      next node in the ring vanish
// and every node's liveness key (static: rdzv/<run id>/alive/<node>, elastic: its record), an
// ephemeral key that vanishes when the node's agent does. Each node watches the next one's.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dist/rendezvous/client.h"
#include "failure_report.h"

namespace dist::agent {

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

// What this node and every node of the job need from the rest of the job.
struct JobShape {
  int min_nodes = 1;
  int max_nodes = 1;
  int local_world_size = 1;
  std::string host;  // this node's address as the others see it (--local-addr, else hostname)
};

// One round as this node sees it.
struct Assignment {
  int round = 0;
  int node_rank = 0;
  int num_nodes = 1;
  int world_size = 0;
  int rank_offset = 0;  // global rank of this node's local rank 0
  int restarts = 0;     // job-wide restarts before this round (TORCHELASTIC_RESTART_COUNT)
  bool elastic = false;
  // Each node's liveness key exists exactly while that node's agent lives: alive_prefix followed
  // by the node's id (static: its node rank; elastic: its ticket, listed by node rank in the
  // members key, which only the nodes that need every id read).
  std::string alive_prefix;
  int successor_id = -1;    // the next node's id in the ring (-1: alone)
  std::string members_key;  // elastic: "<id>,<id>,..." by node rank
};

// What ended a watch: a failure somewhere, a node's agent gone, a node waiting to join, the store
// gone (the agent set kStoreLost), or our own stop.
struct WatchResult {
  enum Kind { kFailed, kNodeLost, kNewcomer, kStoreLost, kStopped } kind;
  int node = -1;  // for kNodeLost
};

// How the job goes on after an elastic round ended: decided by the first node to ask, then the
// same for every node.
struct Verdict {
  enum Action { kRestart, kReshape, kFail, kDone } action = kReshape;
  int expect = 0;    // the round's nodes still alive: the next round closes once they are back
  int restarts = 0;  // job-wide restarts after this round
  std::string reason;
};

class NodeRendezvous {
 public:
  NodeRendezvous(rendezvous::ClientOptions store, std::string run_id, JobShape shape);

  // Static: joins round n as node `node_rank` and waits for all max_nodes (until `timeout`);
  // throws RendezvousError naming the nodes seen and missing, or a node rank claimed twice.
  Assignment join_static(int round, int node_rank, std::chrono::milliseconds timeout);

  // Elastic: joins round n (a member of round n-1 passes its assignment there) or, if that one
  // closed without it, a later one; throws RendezvousError when no round forms within
  // join_timeout, JobOverError when the job ended meanwhile.
  Assignment join_elastic(int round, const Assignment* previous,
                          std::chrono::milliseconds join_timeout,
                          std::chrono::milliseconds last_call_timeout);
  // The first round an elastic node that is not coming back from a round should try.
  int current_round();

  // Elastic: how the job continues after round a.round ended (every node gets the same answer).
  Verdict decide(const Assignment& a, int max_restarts);
  // Elastic: every node of the round succeeded; late joiners learn the job is over.
  void mark_done(const Assignment& a);

  // Publishes this node's failures for round a and tells every node the round failed.
  void announce_failure(const Assignment& a, const std::vector<WorkerFailure>& failures);
  // Every node's published failures for round a.
  std::vector<WorkerFailure> failures(const Assignment& a);

  // Blocks until round a fails anywhere, another node's agent dies, a node waits to join, or
  // stop_watch() is called, writing this node's heartbeat/<node> (wall-clock seconds) every
  // `heartbeat`. Uses its own connection: call from one helper thread.
  WatchResult watch(const Assignment& a, std::chrono::seconds heartbeat);
  void stop_watch(const Assignment& a);

  // This node's workers all succeeded: waits until every node's did (true), or the round failed
  // or a node was lost (false), at most `timeout` (RendezvousError).
  bool exit_barrier(const Assignment& a, std::chrono::milliseconds timeout);

  // The agent hosting the store: before it exits it waits (bounded) for the other agents of round
  // a to leave.
  void wait_for_others_to_leave(const Assignment& a, std::chrono::milliseconds timeout);

 private:
  std::string key(const std::string& suffix) const { return prefix_ + suffix; }
  std::string round_key(int round, const std::string& suffix) const {
    return prefix_ + "r" + std::to_string(round) + "/" + suffix;
  }
  // Every node's liveness key, by node rank (elastic: one read of the member list).
  std::vector<std::string> liveness_keys(const Assignment& a);
  std::optional<std::string> successor_key(const Assignment& a) const;
  // `via`: the calling thread's own connection (the watch has one).
  void report_lost_successor(const Assignment& a, rendezvous::StoreClient& via);
  std::vector<int> lost_nodes(const Assignment& a);

  // Elastic rounds (elastic_round.cc).
  int take_ticket(int round, const Assignment* previous);
  void close_if_complete(int round);
  bool try_close(int round);
  std::optional<Assignment> await_assignment(int round, int ticket,
                                             std::chrono::steady_clock::time_point deadline,
                                             std::chrono::milliseconds last_call_timeout);
  std::optional<Verdict> verdict_of(int round);
  void throw_if_job_over(int round);

  rendezvous::ClientOptions options_;
  rendezvous::StoreClient client_;  // joins, announcements; holds this node's liveness key
  std::string prefix_;
  std::uint32_t nonce_;  // tells this agent's records from any other's
  JobShape shape_;
};

}  // namespace dist::agent
