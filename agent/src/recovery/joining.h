// In place, a node new to a running job: its round `continues` the job's running workers (they
// regroup with this node in it), which this node's workers join as the generation node 0 names
// (regroup_generation_key). Until node 0 publishes that generation they are not taken in: a
// failure of one of them restarts the job with every node (Facts::unjoined). The running workers
// may finish the job before they regroup: their nodes say so, and these workers, waiting to join
// them, are stopped (Input::kJobFinished).
#pragma once

#include <optional>
#include <string>

#include "recovery/generations.h"
#include "recovery/recovery_policy.h"

namespace dist::agent {

class Joining {
 public:
  Joining(RecoveryParts& parts, RoundGenerations& round) : p_(parts), g_(round) {}

  // RUNNING, before the workers start: whether they join running ones (start_joining).
  bool begin(const Round& round) { return unjoined_ = round.continues; }
  // The round's watch runs: a joining node waits for the generation node 0 names.
  void watching();
  // Not yet taken in by the running workers.
  bool unjoined() const { return unjoined_; }
  // One of them failed before that, and the group stops: node 0, which waits for every worker of
  // the new world to arrive, hears it at once and publishes nothing.
  void say_arrival_failed();
  // STOPPING: the waits for the job's end and for the publication end.
  void close();

 private:
  // A newcomer: the generation its workers join as, or the word that the running workers
  // finished the job first (or why neither came).
  struct Named {
    std::optional<RegroupName> name;
    std::string why;
  };
  Task<Named> named_generation(int round);
  void on_generation_named(const Named& n);
  // Whether the running workers finished before this node's joined them, within the wait.
  Task<bool> finished_meanwhile(int round);
  void on_finished_meanwhile(int round, bool finished);
  // Whether node 0 published the generation this node's workers joined, within the wait.
  Task<bool> taken_in(int round, int generation);
  void job_finished_before_joining(int round, int generation);

  RecoveryParts& p_;
  RoundGenerations& g_;
  bool unjoined_ = false;                      // this node's workers, not yet taken in
  std::optional<Generations> finish_watch_;    // the job finishing before they join
  std::optional<Generations> publish_watch_;   // their generation published
  std::optional<Generations> arrival_failed_;  // they died before that
};

}  // namespace dist::agent
