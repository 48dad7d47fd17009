// REGROUPING (in place, elastic): a node was lost, or one waits to join, and this node's workers
// run on (after a loss, their collectives failed and they wait in their recovery). The job's
// verdict on the round, then the next round while the workers run (the rendezvous's reshape,
// RoundSource::join_keeping_workers); then each node writes its workers' new first rank, and the
// new node 0 names the generation for the newcomers' agents, publishes it once every rank of the
// new world is ready (worker_contract.h) and waits for the group's word that it is whole again. A
// verdict other than a reshape, a round without every survivor, a workers' store that moved, or
// a failure meanwhile: the group stops, as a lost node always stopped it, and the job goes on from
// a new round. Workers that all finish meanwhile finished the job: the round joined is the one it
// ends in, and its newcomers are told.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "recovery/generations.h"
#include "recovery/recovery_policy.h"

namespace dist::agent {

class Regroup {
 public:
  // `round_changed`: called once this node is in the next round (its records go there).
  Regroup(RecoveryParts& parts, RoundGenerations& round, std::function<void()> round_changed)
      : p_(parts), g_(round), round_changed_(std::move(round_changed)) {}

  // What the watch found, said in the log when the regroup begins ("node 1 was lost"), and
  // whether a node was lost (its workers stalled at once).
  void found(std::string cause, bool lost_node) {
    cause_ = std::move(cause);
    lost_node_ = lost_node;
  }
  // REGROUPING's entry action: continues on the join, then on the workers told.
  void begin();
  // The join of the next round has not reported back (STOPPING waits for it: Facts::joining).
  bool joining() const { return joining_; }
  // Every worker of this node exited 0: feeds the machine; when they finished during the regroup
  // (its round joined), that round ends here, its newcomers told.
  void workers_succeeded();

 private:
  // How the survivors got into the next round (or why not).
  struct Join {
    std::optional<Verdict> verdict;  // the job's verdict on the round the node was lost from
    std::optional<Round> round;      // the next round, when the verdict was a reshape
    std::string why;                 // the rendezvous could not be done
  };
  // What became of telling the workers their places there.
  struct Told {
    std::optional<int> generation;  // node 0 publishes it
    RecoveryOutcome outcome;        // node 0: the group's word; the others: recovered once placed
    std::chrono::steady_clock::time_point published_at;  // when the workers were asked
    bool finished = false;  // a node's workers finished the job before a generation was named
  };
  // How the round's newcomers were told that the workers finished the job.
  struct Finish {
    std::optional<int> generation;  // the one named already (its finished key was set)
    std::string why;                // the workers' store could not be used
  };

  Task<Join> join_survivors(Round from);
  void on_joined(Join j);
  void abandon(const Join& j);
  void finish();
  Task<Finish> tell_finished(int round);
  void on_finished(const Finish& f);
  void end_joined_round();
  std::string cannot_regroup(const Round& from, const Round& to, const Verdict& v) const;
  Task<Told> tell_workers(int old_rank_offset, Round to);
  Task<std::string> await_arrivals(int generation, int rank_offset, int world_size);
  void on_told(const Told& t);
  void failed(const std::string& why);

  RecoveryParts& p_;
  RoundGenerations& g_;
  std::function<void()> round_changed_;
  std::string cause_;
  bool lost_node_ = false;
  bool joining_ = false;  // the join has not reported back
  // Since when, from which round, and this node's workers' old and new ranks.
  std::chrono::steady_clock::time_point began_;
  int from_round_ = 0;
  std::vector<std::pair<int, int>> ranks_;
};

}  // namespace dist::agent
