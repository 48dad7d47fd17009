// --restart-policy in-place: the workers that did not fail keep running. A failed worker, or
// several reaped together, are started again alone (REPLACING) as the next generation of their
// group: the agent claims the job's one recovery (RoundSource::claim_recovery), counts the
// generation and starts the replacements, publishes the generation's record for the survivors,
// whose collectives failed, and waits for the group's word that it rebuilt itself
// (recovery/generations.h, worker_contract.h). Each replacement counts against --max-restarts,
// and a worker that kept its state must remain. A worker failing while a replacement is under way
// (on another node, or on this one: REPLACING again) is folded into it: its agent takes the
// recovery over and publishes the generation after, which replaces both, and supersedes the one
// under way (worker_contract.h), when every rank's worker can follow that (the SDK's, over Gloo)
// and one that kept its state remains.
// Every worker failing at once (or more than the restarts left), another failure meanwhile that
// cannot be folded, a recovery that fails or never comes: the group stops, a group restart while
// restarts are left (said as inplace_fallback). Elastic jobs
// also keep their workers across a lost node or a newcomer (recovery/regroup.h), and a newcomer's
// workers join the running ones (recovery/joining.h). A worker that fails once every other worker
// of the job has finished (a crash in its teardown, the commonest) has nobody to rejoin: it is not
// replaced, or its replacement is stopped once the last of the others finishes, and the job ends
// done.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "recovery/generations.h"
#include "recovery/joining.h"
#include "recovery/recovery_policy.h"
#include "recovery/regroup.h"

namespace dist::agent {

class InPlace final : public RecoveryPolicy {
 public:
  explicit InPlace(RecoveryParts parts)
      : p_(std::move(parts)),
        regroup_(p_, g_, [this] { publish_replacements(); }),
        joining_(p_, g_) {}

  void add_facts(Facts& facts) const override;
  int replacements() const override { return replacements_; }
  bool in_generations() const override { return true; }
  const std::vector<InPlaceReplacement>& replaced() const override { return replaced_; }

  void start_workers() override;
  void watching() override { joining_.watching(); }
  void replace() override;
  void regroup() override { regroup_.begin(); }
  void stopping() override;

  void workers_failed(bool stops) override;
  void workers_succeeded() override { regroup_.workers_succeeded(); }
  void worker_succeeded() override;
  void node_lost(int node) override;
  void node_waiting(bool said) override;

  void close() override;

 private:
  // The claim of the job's one recovery (nullopt: another node's is under way, of that kind) and
  // the generation its replacement starts.
  struct Claim {
    std::optional<int> replacements;
    Recovery under_way = Recovery::kNone;
    int generation = 0;
    std::string why;  // the workers' store could not count the generation (its host is gone)
    std::vector<WorkerFailure> failures;  // this node's failed workers it replaces
    int counted = 0;                      // the replacements it counts: theirs
    // Refused: they would pass the job's restart budget (its replacements so far).
    std::optional<int> over_budget;
    // Folded into a replacement under way: the generation it supersedes, and the ranks the new
    // one replaces (that one's and this node's failed workers).
    std::optional<GenerationUnderWay> supersedes;
    std::vector<int> replaced;
    std::string not_folded;   // why a replacement under way was not folded into
    bool all_follow = false;  // every rank's worker follows a later generation (fold/<rank>)
    std::string seen;         // refused: the job's recovery state found (RecoveryClaim::seen)
  };

  int restarts_used() const { return p_.now.restart_count + replacements_; }
  // The most replacements the job may count (--max-restarts less its group restarts).
  int budget() const { return p_.config.max_restarts - p_.now.restart_count; }
  void explain_fallback(bool recovering);
  // The workers this node replaced, for every node's failure report (several nodes).
  void publish_replacements();
  Task<void> publish_while_changed();
  Task<Claim> claim_replacement(std::vector<WorkerFailure> failures);
  Task<void> fold_into_recovery(Claim& c, Round round, std::vector<int> failed);
  // The failures just reaped, in RUNNING and in REPLACING (Facts::replaceable, Facts::foldable).
  bool replaceable() const;
  // REPLACING again: this node's workers failed during its own recovery, folded into it.
  bool foldable() const;
  void fold_own_failure(std::vector<WorkerFailure> failures);
  // `during_own`: a failure during this node's own recovery (fold_own_failure).
  void on_claimed(const Claim& c, bool during_own);
  void give_up_replacing(const std::string& why, const std::vector<WorkerFailure>& failures);
  std::string recovery_text(const std::vector<WorkerFailure>& failures) const;
  void start_replacement();
  void on_recovered(const RecoveryOutcome& o, int recovery);
  // REPLACING: every other worker of the job has finished (this node's exited 0, every other
  // node at its exit barrier), `when` says since when: the job ends done.
  void end_if_others_finished(const std::string& when, std::function<void()> otherwise);
  void end_as_done(const std::string& when);
  void end_unless_at_work(const std::string& when);
  bool peers_may_have_finished() const;  // this node's others exited, in a world of several
  bool peers_check_ = false;             // that check is under way

  RecoveryParts p_;
  RoundGenerations g_;
  Regroup regroup_;
  Joining joining_;
  bool counting_ = false;              // several nodes: STOPPING reads the job's replacements
  int replacements_ = 0;               // all rounds
  std::vector<int> replacing_ranks_;   // the workers REPLACING replaces, folded ones too
  std::vector<WorkerFailure> queued_;  // failed while a claim was in flight: claimed after it
  int claiming_ = 0;                   // the workers of the claim in flight, if any
  bool generation_claimed_ = false;    // and whether its generation is known yet
  bool replacing_ = false;             // REPLACING, from its first failure to its end
  bool folding_ = false;               // a failure of this node's being folded into it
  int recovery_ = 0;                   // counts this node's recoveries (REPLACING from RUNNING)
  Claim claim_;                        // REPLACING's claim
  std::vector<InPlaceReplacement> replaced_;
  bool publishing_ = false;     // a write of replaced_ is under way
  bool publish_again_ = false;  // and replaced_ or the round changed since it began
  // When the failures that began the recovery under way were reaped (one folded into it later
  // does not move it: the survivors have not trained since the first), and the first's rank.
  std::chrono::steady_clock::time_point failed_at_;
  int first_failed_rank_ = -1;
};

}  // namespace dist::agent
