#include "recovery/in_place.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <sstream>

#include "dist/store/errors.h"
#include "output/valid_text.h"

namespace dist::agent {
namespace {

// Why a failure is not folded into the recovery under way.
constexpr const char* kNotEveryWorkerFollows =
    "not every worker can follow a later generation (they do over Gloo, with the SDK's "
    "InPlaceRecovery or dist_launch.elastic)";
constexpr const char* kNoStateLeft = "no worker that kept its state would be left";

// How long a claim that found another node's replacement under way waits for that generation's
// record (its claimant counts it, then publishes it: moments), to fold into it.
constexpr std::chrono::seconds kUnderWayWait{5};
constexpr std::chrono::milliseconds kUnderWayPoll{100};

// `ranks` and `more`, in order, each once.
std::vector<int> with_ranks(std::vector<int> ranks, const std::vector<int>& more) {
  ranks.insert(ranks.end(), more.begin(), more.end());
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

// The ranks a generation's record replaced ("replaced=2,5 survivors=..."), with `more`.
std::vector<int> replaced_ranks(const std::string& record, const std::vector<int>& more) {
  std::vector<int> ranks;
  const auto at = record.find("replaced=");
  if (at != std::string::npos) {
    std::istringstream list(record.substr(at + 9, record.find(' ', at) - at - 9));
    for (std::string text; std::getline(list, text, ',');) {
      int rank = -1;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), rank);
      if (ec == std::errc() && end == text.data() + text.size()) ranks.push_back(rank);
    }
  }
  return with_ranks(std::move(ranks), more);
}

std::string comma_list(const std::vector<int>& ranks) {
  std::string text;
  for (const int rank : ranks) text += (text.empty() ? "" : ",") + std::to_string(rank);
  return text;
}

// The failed workers' ranks, in order.
std::vector<int> ranks_of(const std::vector<WorkerFailure>& failures) {
  std::vector<int> ranks;
  for (const WorkerFailure& f : failures) ranks.push_back(f.worker.rank);
  return with_ranks(std::move(ranks), {});
}

// `ranks` but those in `less`.
std::vector<int> without(std::vector<int> ranks, const std::vector<int>& less) {
  std::erase_if(ranks,
                [&](int rank) { return std::find(less.begin(), less.end(), rank) != less.end(); });
  return ranks;
}

// "worker 3", "workers 1,2": as the log names them.
std::string workers_text(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "worker " : "workers ") + comma_list(ranks);
}

// What the other nodes' reports show of a replacement: its message and traceback cut (a worker's
// may be megabytes; the record is written again at each replacement and round); whole in this
// node's own report and log.
constexpr std::size_t kStoredTextBytes = 16 * 1024;

std::string cut_for_the_store(std::string text) {
  if (text.size() <= kStoredTextBytes) return text;
  return std::string(utf8_prefix(text, kStoredTextBytes)) + "... (" + std::to_string(text.size()) +
         " bytes: whole in its node's log)";
}

std::vector<InPlaceReplacement> for_the_store(std::vector<InPlaceReplacement> replaced) {
  for (InPlaceReplacement& r : replaced) {
    r.failure.message = cut_for_the_store(std::move(r.failure.message));
    r.failure.traceback = cut_for_the_store(std::move(r.failure.traceback));
  }
  return replaced;
}

}  // namespace

void InPlace::add_facts(Facts& facts) const {
  facts.in_place = true;
  facts.unjoined = joining_.unjoined();
  facts.counting = counting_;
  facts.joining = regroup_.joining();
  facts.replaceable = replaceable();
  facts.foldable = foldable();
}

void InPlace::start_workers() {
  g_.latest = 0;
  const Round& round = *p_.now.round;
  if (!replaced_.empty()) publish_replacements();  // (the round before's keys are gone)
  // A round that continues the job's running workers (they regrouped with this node in it): this
  // node's workers join them, as the generation node 0 names.
  const bool joins = joining_.begin(round);
  const store::Endpoint store = p_.rounds.workers_store(round);
  g_.store.emplace(p_.io, p_.config.run_id, p_.config.secret, store, round.restarts);
  if (joins) return p_.group->start_joining(round, store);
  p_.group->start(round, store);
}

// Several nodes, a round that failed: every node decides restart or fail from the same count, the
// job's replacements, read before STOPPING ends.
void InPlace::stopping() {
  replacing_ = folding_ = false;
  queued_.clear();
  claiming_ = 0;
  if (g_.store) g_.store->close();  // a recovery's wait ends here
  joining_.close();
  const bool failed = p_.now.stop_reason == StopReason::kWorkerFailed ||
                      p_.now.stop_reason == StopReason::kRoundEnded;
  if (!p_.rounds.several_nodes() || !failed) return;
  counting_ = true;
  p_.steps.launch(p_.rounds.replacements(), [this](int n) {
    if (p_.now.state != State::kStopping || !counting_) return;
    counting_ = false;
    replacements_ = n;
    p_.feed(Input::kReplacementsCounted);
  });
}

// The workers this node replaced, for every node's failure report (several nodes): the whole
// list each time, in the round running now, one write at a time (a later list never overwritten
// by an earlier one that arrives after it: etcd's requests go to any member). A write that fails
// leaves them out of the other nodes' reports only.
void InPlace::publish_replacements() {
  if (!p_.rounds.several_nodes() || replaced_.empty() || !p_.now.round) return;
  publish_again_ = true;
  if (publishing_) return;
  publishing_ = true;
  p_.steps.fire_and_forget(publish_while_changed(), "publishing the workers replaced in place");
}

Task<void> InPlace::publish_while_changed() {
  try {
    while (publish_again_ && p_.now.round) {
      publish_again_ = false;
      co_await p_.rounds.publish_replacements(*p_.now.round, for_the_store(replaced_));
    }
  } catch (...) {
    publishing_ = false;
    throw;
  }
  publishing_ = false;
}

void InPlace::workers_failed(bool stops) {
  if (!replacing_ && !p_.now.failures.empty()) {
    failed_at_ = std::chrono::steady_clock::now();
    first_failed_rank_ = p_.now.failures.front().worker.rank;
  }
  if (!stops) return;
  if (joining_.unjoined() && g_.latest > 0) joining_.say_arrival_failed();
  explain_fallback(p_.now.state == State::kReplacing);
}

void InPlace::node_lost(int node) {
  regroup_.found("node " + std::to_string(node) + " was lost", true);
}

void InPlace::node_waiting(bool) {
  regroup_.found("a node is waiting to join", false);
}

void InPlace::close() {
  if (g_.store) g_.store->close();
}

// In place, yet the group stops: why, in the log and the event log.
void InPlace::explain_fallback(bool recovering) {
  const std::vector<WorkerFailure>& failures = p_.now.failures;
  std::string why;
  const int failed = static_cast<int>(failures.size());
  const int max_restarts = p_.config.max_restarts;
  const bool left = restarts_used() < max_restarts;
  if (recovering) {
    why = workers_text(ranks_of(failures)) + " failed during the in-place recovery of " +
          recovery_text(failures) +
          (generation_claimed_ ? " (generation " + std::to_string(g_.latest) + ")" : "");
  } else if (joining_.unjoined()) {
    why = workers_text(ranks_of(failures)) +
          " failed before the running workers took it in as generation " +
          std::to_string(g_.latest);
  } else if (failed > 1) {
    why = std::to_string(failed) + " workers failed at once";
    if (failed >= p_.now.round->world_size) {
      why += ", every worker of the group (none kept its state to recover from)";
    } else if (left && p_.now.state == State::kRunning) {  // (a regroup replaces nobody)
      why += ", more than the restarts left for replacing them (" +
             std::to_string(max_restarts - restarts_used()) + ")";
    }
  } else {
    why = "worker " + std::to_string(failures.front().worker.rank) + " failed";
    if (p_.now.round->world_size == 1) why += ", the only worker of the group";
  }
  why += left ? ": restarting the whole group"
              : ": no restart left (--max-restarts " + std::to_string(max_restarts) + ", " +
                    std::to_string(replacements_) + " used in place)";
  spdlog::warn("{}", why);
  p_.telemetry->in_place_fallback(
      p_.now.round->round,
      recovering && generation_claimed_ ? std::optional<int>(g_.latest) : std::nullopt, why);
}

// ------------------------------------------------------------------------------------------
// REPLACING: the failed workers alone (one, or several reaped together) are started again as the
// next generation's replacements; the survivors, whose collectives failed, wait for that
// generation's record, rebuild their group with it and give it their state; the group's new root
// then says it recovered.

void InPlace::replace() {
  if (replacing_) {  // failures during this node's recovery, folded into it
    replacing_ranks_ = with_ranks(replacing_ranks_, ranks_of(p_.now.failures));
    if (generation_claimed_) return fold_own_failure(p_.now.failures);
    // A claim is in flight: they are claimed once it is done, from its generation on.
    spdlog::info(
        "{} failed while this node's in-place recovery of {} is being claimed: folded "
        "into it once its generation is out",
        workers_text(ranks_of(p_.now.failures)), recovery_text(p_.now.failures));
    queued_.insert(queued_.end(), p_.now.failures.begin(), p_.now.failures.end());
    return;
  }
  replacing_ = true;
  ++recovery_;  // (outcomes of an earlier recovery's waits are not this one's)
  replacing_ranks_ = ranks_of(p_.now.failures);
  queued_.clear();
  claiming_ = static_cast<int>(p_.now.failures.size());
  generation_claimed_ = false;
  peers_check_ = false;
  const auto claim = [this, failures = p_.now.failures] {
    p_.steps.launch(claim_replacement(failures), [this](Claim c) { on_claimed(c, false); });
  };
  if (!peers_may_have_finished()) return claim();
  end_if_others_finished("after every other worker of the job had finished", claim);
}

// A worker of this node exited 0. While a replacement waits for its group, the last of its peers
// finishing leaves it nobody to join (a survivor that was still tearing down when the failed
// worker crashed): the job is done.
void InPlace::worker_succeeded() {
  if (p_.now.state != State::kReplacing || peers_check_ || !peers_may_have_finished()) return;
  end_if_others_finished(
      "and every other worker of the job has finished since: its replacement is stopped", {});
}

// A world of one has no peer to have finished: its failure is recovered (or fails) as any other.
bool InPlace::peers_may_have_finished() const {
  return p_.now.round->world_size > 1 &&
         p_.group->others_exited(p_.now.failures.front().worker.local_rank);
}

// This node's other workers have all finished: the other nodes' too? Then the job is done (said
// with `when`); else `otherwise` runs, if any.
void InPlace::end_if_others_finished(const std::string& when, std::function<void()> otherwise) {
  peers_check_ = true;
  p_.steps.launch(p_.rounds.others_finished(*p_.now.round),
                  [this, when, otherwise = std::move(otherwise)](bool finished) {
                    if (p_.now.state != State::kReplacing) return;
                    peers_check_ = false;
                    if (finished) return end_unless_at_work(when);
                    if (otherwise) otherwise();
                  });
}

// Every other worker finished: the job is done, unless a failed worker had said it was still
// inside its training function (work/<rank>: dist_launch.elastic's run() had not returned). Then
// what it was doing (its part of the result, a final checkpoint) is lost, not done: the group
// restarts (or, with no restart left, the job fails), as torchrun's would.
void InPlace::end_unless_at_work(const std::string& when) {
  p_.steps.launch(g_.store->any_at_work(ranks_of(p_.now.failures)), [this, when](bool at_work) {
    if (p_.now.state != State::kReplacing) return;
    if (!at_work) return end_as_done(when);
    const bool left = restarts_used() < p_.config.max_restarts;
    const std::string why =
        workers_text(ranks_of(p_.now.failures)) +
        " failed inside its training function (dist_launch.elastic's run had not returned), and "
        "every other worker of the job has finished: its work is not done, and nobody is left "
        "to recover it from in place" +
        (left
             ? ": restarting the whole group"
             : ": no restart left (--max-restarts " + std::to_string(p_.config.max_restarts) + ")");
    spdlog::error("{}", why);
    p_.telemetry->in_place_fallback(p_.now.round->round, std::nullopt, why);
    p_.feed(Input::kRecoveryFailed);
  });
}

// The failed worker had nobody left to rejoin: what the job set out to do, its other workers
// did. Said with the failure; no replacement, no group restart (which would train it all again).
void InPlace::end_as_done(const std::string& when) {
  const WorkerFailure& failed = p_.now.failures.front();
  if (p_.rounds.several_nodes()) {  // the job's recovery, if this node's (else a no-op)
    p_.steps.fire_and_forget(p_.rounds.recovery_over(*p_.now.round), "ending the recovery");
  }
  const std::string why = "worker " + std::to_string(failed.worker.rank) + " (local rank " +
                          std::to_string(failed.worker.local_rank) + ") failed " + when +
                          ": nothing is left to recover in place, and the job is done";
  spdlog::warn("{}", why);
  p_.telemetry->in_place_job_done(p_.now.round->round, failed.worker.rank, why);
  p_.feed(Input::kJobFinished);
}

// The job's one recovery (several nodes: in the job's store), or another node's replacement
// under way folded into, then the generation.
Task<InPlace::Claim> InPlace::claim_replacement(std::vector<WorkerFailure> failures) {
  Claim c;
  const Round round = *p_.now.round;
  const std::vector<int> failed = ranks_of(failures);
  c.failures = std::move(failures);
  c.replaced = failed;
  c.counted = static_cast<int>(failed.size());
  const RecoveryClaim claim =
      co_await p_.rounds.claim_recovery(round, Recovery::kReplacement, c.counted, budget());
  c.replacements = claim.replacements;
  c.under_way = claim.under_way;
  c.seen = claim.seen;
  c.over_budget = claim.over_budget;
  // (A recovery of this node's own refuses the claim of a failure during it: folded the same way.)
  if (!c.replacements && c.under_way == Recovery::kReplacement &&
      (p_.rounds.several_nodes() || folding_)) {
    co_await fold_into_recovery(c, round, failed);
  }
  if (!c.replacements) co_return c;
  try {
    c.generation = co_await g_.store->next();
    // (Read once per recovery, for a failure of this node's that may come during it: foldable. A
    // read that fails only leaves that out.)
    try {
      const bool all_follow = co_await g_.store->all_follow_folds(round.world_size);
      c.all_follow = all_follow;
    } catch (const store::StoreError& e) {
      if (e.code() == store::StoreErrc::kCancelled) throw;
    }
    if (c.supersedes && c.generation != c.supersedes->generation + 1) {
      c.why = "generation " + std::to_string(c.generation) + " was counted after generation " +
              std::to_string(c.supersedes->generation) + ", not right after it";
    } else if (c.supersedes) {
      const bool superseded = co_await g_.store->supersede(c.supersedes->generation, c.generation);
      if (!superseded) {
        // Its group said it recovered first: the claim is this node's now, for a replacement of
        // its own workers alone (the ranks of that generation kept their state).
        c.supersedes.reset();
        c.replaced = failed;
      }
    }
  } catch (const store::StoreError& e) {
    if (e.code() == store::StoreErrc::kCancelled) throw;
    c.why = e.what();
  }
  co_return c;
}

// Another node's worker is being replaced, and this node's failed meanwhile (its group's set-up
// waited for it, or will fail on it): one generation more replaces both, when every rank's worker
// follows a generation that supersedes the one it builds, and a rank that kept its state remains.
// A recovery that has just ended (its claim not let go yet) is claimed again instead. Else c stays
// refused, with why in c.not_folded.
Task<void> InPlace::fold_into_recovery(Claim& c, Round round, std::vector<int> failed) {
  try {
    if (!co_await g_.store->all_follow_folds(round.world_size)) {
      c.not_folded = kNotEveryWorkerFollows;
      co_return;
    }
    const auto deadline = std::chrono::steady_clock::now() + kUnderWayWait;
    while (true) {
      const std::optional<GenerationUnderWay> under_way =
          co_await g_.store->under_way(kUnderWayPoll);
      if (under_way) {
        std::vector<int> replaced = replaced_ranks(under_way->record, failed);
        if (static_cast<int>(replaced.size()) >= round.world_size) {
          c.not_folded = kNoStateLeft;
          co_return;
        }
        // Exactly the claim that refused this one: not one claimed since (whose generation
        // may not be the one read).
        const RecoveryClaim taken =
            co_await p_.rounds.take_over_recovery(round, c.seen, c.counted, budget());
        c.replacements = taken.replacements;
        c.over_budget = taken.over_budget;
        if (c.over_budget) co_return;
        if (c.replacements) {
          c.supersedes = *under_way;
          c.replaced = std::move(replaced);
          co_return;
        }
      }
      // Its generation recovered (the claim is let go next), is not out yet, or the claim changed
      // hands: claim again.
      const RecoveryClaim again =
          co_await p_.rounds.claim_recovery(round, Recovery::kReplacement, c.counted, budget());
      c.replacements = again.replacements;
      c.under_way = again.under_way;
      c.seen = again.seen;
      c.over_budget = again.over_budget;
      if (c.replacements || c.over_budget || c.under_way != Recovery::kReplacement) co_return;
      if (std::chrono::steady_clock::now() > deadline) {
        c.not_folded =
            "the recovery under way could not be folded into within " + seconds_text(kUnderWayWait);
        co_return;
      }
    }
  } catch (const store::StoreError& e) {
    if (e.code() == store::StoreErrc::kCancelled) throw;
    c.not_folded = e.what();
  }
}

void InPlace::on_claimed(const Claim& c, bool during_own) {
  if (p_.now.state != State::kReplacing) return;
  claiming_ = 0;
  const std::string worker = workers_text(ranks_of(c.failures));
  if (!c.not_folded.empty()) {
    spdlog::info("{} failed during {} in-place recovery, which it is not folded into: {}", worker,
                 during_own ? "this node's" : "another node's", c.not_folded);
  }
  if (c.over_budget) {  // (uncounted: the group restarts while a restart is left)
    replacements_ = *c.over_budget;
    return give_up_replacing(
        worker + " failed: " +
            (c.counted > 1 ? "not enough restarts left to replace them" : "no restart left") +
            " (--max-restarts " + std::to_string(p_.config.max_restarts) + ", " +
            std::to_string(replacements_) + " used in place by the job's nodes)",
        c.failures);
  }
  if (!c.replacements) {
    const std::string while_ =
        during_own ? " failed during the in-place recovery of " + recovery_text(c.failures) +
                         (c.not_folded.empty() ? "" : " (" + c.not_folded + ")")
        : c.under_way == Recovery::kRegroup
            ? " failed while the group regroups in place"
            : " failed while another node's worker is being replaced in place";
    return give_up_replacing(worker + while_, c.failures);
  }
  if (!c.why.empty()) {  // e.g. the node that hosted the workers' store was lost with it
    return give_up_replacing(worker +
                                 " failed and its group's generation cannot be counted in the "
                                 "workers' store (" +
                                 c.why + ")",
                             c.failures);
  }
  replacements_ = *c.replacements;
  // Failures reaped while it was claimed: folded into its generation once it is out, if they can
  // be (else the group restarts now, before a replacement is started for nothing).
  if (!queued_.empty()) {
    const auto all = with_ranks(c.replaced, ranks_of(queued_));
    const std::string why = !c.all_follow ? kNotEveryWorkerFollows
                            : static_cast<int>(all.size()) >= p_.now.round->world_size
                                ? std::string(kNoStateLeft)
                                : "";
    if (!why.empty()) {
      return give_up_replacing(workers_text(ranks_of(queued_)) +
                                   " failed during the in-place recovery of " + worker + " (" +
                                   why + ")",
                               queued_);
    }
  }
  g_.latest = c.generation;
  generation_claimed_ = true;
  claim_ = c;
  start_replacement();
  if (p_.now.state == State::kReplacing && !queued_.empty()) {
    fold_own_failure(std::exchange(queued_, {}));
  }
}

// The workers this node's recovery replaces but `failures` (the replacement of one of them, when
// no other).
std::string InPlace::recovery_text(const std::vector<WorkerFailure>& failures) const {
  const std::vector<int> others = without(replacing_ranks_, ranks_of(failures));
  return workers_text(others.empty() ? replacing_ranks_ : others);
}

// RUNNING, and workers of this node failed: replaced in place when a worker that kept its state
// remains (a world of one has none) and a restart is left for each.
bool InPlace::replaceable() const {
  const int failed = static_cast<int>(p_.now.failures.size());
  return failed > 0 && failed < p_.now.round->world_size &&
         restarts_used() + failed <= p_.config.max_restarts;
}

// REPLACING, and other workers of this node failed: folded into the recovery when every rank's
// worker follows a later generation, a worker that kept its state remains, and a restart is left
// for each. (While a claim is in flight, whether every worker follows is not known yet: the
// failures wait for it, and its fold says.)
bool InPlace::foldable() const {
  const int failed = static_cast<int>(p_.now.failures.size());
  if (!replacing_ || failed == 0 || (generation_claimed_ && !claim_.all_follow)) return false;
  std::vector<int> replaced = with_ranks(replacing_ranks_, ranks_of(p_.now.failures));
  if (generation_claimed_) replaced = with_ranks(std::move(replaced), claim_.replaced);
  // (The claim in flight and the failures queued behind it are not counted yet.)
  const int pending = generation_claimed_ ? 0 : claiming_ + static_cast<int>(queued_.size());
  return static_cast<int>(replaced.size()) < p_.now.round->world_size &&
         restarts_used() + pending + failed <= p_.config.max_restarts;
}

// Claimed as any failure is (claim_replacement: this node's own recovery refuses the claim, and
// the failure is folded into the generation under way, whoever holds it now); the wait for that
// generation follows to the one folded into, and until the fold is counted its outcome is left to
// the fold's own wait (on_recovered).
void InPlace::fold_own_failure(std::vector<WorkerFailure> failures) {
  generation_claimed_ = false;
  folding_ = true;
  claiming_ = static_cast<int>(failures.size());
  p_.steps.launch(claim_replacement(std::move(failures)), [this](Claim c) {
    if (p_.now.state != State::kReplacing) return;
    folding_ = false;
    on_claimed(c, true);
  });
}

// In-place after all: the group stops (a restart while restarts are left), everywhere.
void InPlace::give_up_replacing(const std::string& why,
                                const std::vector<WorkerFailure>& failures) {
  const bool left = restarts_used() < p_.config.max_restarts;
  spdlog::warn("{}{}", why, left ? ": restarting the whole group" : "");
  p_.telemetry->in_place_fallback(p_.now.round->round, std::nullopt, why);
  if (p_.rounds.several_nodes()) {
    p_.steps.fire_and_forget(p_.rounds.announce_failure(*p_.now.round, failures),
                             "announcing the failure");
  }
  p_.feed(Input::kRecoveryFailed);
}

// Each failed worker of this node started again as the generation's replacement (one line, one
// report and one inplace_restart event each), then the generation's record, for the survivors.
void InPlace::start_replacement() {
  const Round& round = *p_.now.round;
  const int generation = g_.latest;
  const std::vector<int>& replaced = claim_.replaced;
  std::vector<int> survivors;
  for (int rank = 0; rank < round.world_size; ++rank) {
    if (std::find(replaced.begin(), replaced.end(), rank) == replaced.end()) {
      survivors.push_back(rank);
    }
  }
  const std::string kept = survivors.empty() ? "no rank keeps running"
                           : survivors.size() == 1
                               ? "rank " + comma_list(survivors) + " keeps running"
                               : "ranks " + comma_list(survivors) + " keep running";
  const std::optional<GenerationUnderWay>& folded = claim_.supersedes;
  const std::string into =
      folded ? ", folded into the recovery under way (generation " +
                   std::to_string(folded->generation) + ", which it supersedes: rank" +
                   (replaced.size() == 1 ? " " : "s ") + comma_list(replaced) + " replaced)"
      : replaced.size() > 1 ? " with ranks " + comma_list(replaced)
                            : "";
  int restart = restarts_used() - claim_.counted;  // before this claim's
  for (const WorkerFailure& failed : claim_.failures) {
    ++restart;
    InPlaceReplacement r{failed, generation, -1, survivors};
    try {
      r.new_pid = p_.group->replace(failed.worker.local_rank, generation);
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
      return p_.feed(Input::kStartFailed);
    }
    spdlog::warn(
        "worker {} (local rank {}) replaced in place by pid {}: generation {} (restart {} of "
        "{}){}; {}",
        failed.worker.rank, failed.worker.local_rank, r.new_pid, generation, restart,
        p_.config.max_restarts, into, kept);
    if (p_.config.print_failure_report) {
      p_.console->say(ConsoleStream::kStderr, format_replacement(p_.config.script_name, r));
    }
    // The failed worker as it ran: its round (a regroup's too) and the generation it started as.
    p_.telemetry->in_place_restart(
        {round.round, generation, failed.worker, failed.exit_code, r.new_pid, r.survivors, restart,
         folded ? std::optional<int>(folded->generation) : std::nullopt});
    replaced_.push_back(std::move(r));
  }
  publish_replacements();
  std::string record = "replaced=" + comma_list(replaced) + " survivors=" + comma_list(survivors);
  if (folded) record += " supersedes=" + std::to_string(folded->generation);
  p_.steps.launch(
      g_.store->publish_and_wait(generation, std::move(record), p_.config.in_place_timeout),
      [this, recovery = recovery_](RecoveryOutcome o) { on_recovered(o, recovery); });
}

void InPlace::on_recovered(const RecoveryOutcome& o, int recovery) {
  // (A wait for a generation a fold superseded ends with the latest's word, as the fold's own
  // does: whichever comes first. While the fold is counted, for an earlier generation, or from an
  // earlier recovery, neither decides.)
  if (p_.now.state != State::kReplacing || recovery != recovery_ || folding_ ||
      o.generation < g_.latest) {
    return;
  }
  const InPlaceReplacement& r = replaced_.back();
  const int round = p_.now.round->round;
  if (!o.recovered) {
    const bool left = restarts_used() < p_.config.max_restarts;
    const std::string why = "the in-place recovery of generation " + std::to_string(o.generation) +
                            " failed: " + o.why +
                            (left ? ": restarting the whole group"
                                  : ": no restart left (--max-restarts " +
                                        std::to_string(p_.config.max_restarts) + ")");
    spdlog::error("{}", why);
    p_.telemetry->in_place_fallback(round, o.generation, why);
    return p_.feed(Input::kRecoveryFailed);
  }
  g_.latest = o.generation;  // (a later one than this node's when a failure was folded in)
  replacing_ = false;
  const auto stall = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - failed_at_);
  spdlog::info("generation {}: the group is whole again, {} ms after worker {} failed ({})",
               o.generation, stall.count(), first_failed_rank_, o.record);
  p_.telemetry->in_place_recovered(round, o.generation, r.failure.worker.rank, stall, o.record);
  p_.steps.fire_and_forget(p_.rounds.recovery_over(*p_.now.round), "ending the in-place recovery");
  p_.feed(Input::kRecovered);
}

}  // namespace dist::agent
