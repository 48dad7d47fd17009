#include "recovery/regroup.h"

#include <spdlog/spdlog.h>

#include "dist/store/errors.h"

namespace dist::agent {

void Regroup::begin() {
  began_ = std::chrono::steady_clock::now();
  joining_ = true;  // STOPPING waits for it: it may join the next round
  spdlog::warn("in-place: {}: this node's workers keep running while the nodes form the next round",
               cause_);
  p_.steps.launch(join_survivors(*p_.now.round), [this](Join j) { on_joined(std::move(j)); });
}

Task<Regroup::Join> Regroup::join_survivors(Round from) {
  Join j;
  try {
    j.verdict = co_await p_.rounds.decide(from);
    if (j.verdict->action == Verdict::kReshape) {
      spdlog::info("round {} ended ({}): joining round {} while this node's workers run",
                   from.round, j.verdict->reason, from.round + 1);
      j.round = co_await p_.rounds.join_keeping_workers(from);
    }
  } catch (const store::StoreError& e) {
    if (e.code() == store::StoreErrc::kCancelled) throw;  // leaving: nothing to decide
    j.why = e.what();
  } catch (const std::exception& e) {  // the job over meanwhile included: ROUND_ENDED says so
    j.why = e.what();
  }
  co_return j;
}

void Regroup::on_joined(Join j) {
  joining_ = false;
  if (p_.now.state == State::kStopping) return abandon(j);
  if (p_.now.state != State::kRegrouping) return;
  if (!j.why.empty()) return failed("the surviving nodes could not regroup: " + j.why);
  if (j.verdict->action != Verdict::kReshape) {  // said again (and logged) in ROUND_ENDED
    return failed("round " + std::to_string(p_.now.round->round) + " ended (" + j.verdict->reason +
                  ") and the job's verdict is not a new round of " + "the surviving nodes");
  }
  p_.telemetry->verdict(p_.now.round->round, *j.verdict);
  const Round previous = *p_.now.round;
  const Round& to = *j.round;
  const std::string why = cannot_regroup(previous, to, *j.verdict);
  p_.now.round = to;
  p_.now.restart_count = to.restarts;
  p_.telemetry->round_joined(to);
  round_changed_();
  if (!why.empty()) {  // the others are in the new round too: it ends for all of them
    end_joined_round();
    return failed(why);
  }
  ranks_ = p_.group->regroup(to);
  spdlog::info("round {}: node {} of {}, global ranks {}..{} of {} (were {}..{} of {})", to.round,
               to.node_rank, to.num_nodes, to.rank_offset,
               to.rank_offset + p_.config.nproc_per_node - 1, to.world_size, previous.rank_offset,
               previous.rank_offset + p_.config.nproc_per_node - 1, previous.world_size);
  from_round_ = previous.round;
  p_.watch();
  p_.steps.launch(tell_workers(previous.rank_offset, *p_.now.round),
                  [this](Told t) { on_told(t); });
}

// The group stopped while the join was under way: a round it joined is this node's now, and ends
// (announced: the others, in it too, stop as well), so that ROUND_ENDED decides that round, not
// the one already decided.
void Regroup::abandon(const Join& j) {
  if (!j.round) return p_.feed(Input::kRegroupFailed);
  const bool finished = p_.now.stop_reason == StopReason::kAllSucceeded && j.round->continues &&
                        j.round->restarts == p_.now.round->restarts;
  p_.now.round = *j.round;
  p_.now.restart_count = j.round->restarts;
  round_changed_();
  if (finished) return finish();
  end_joined_round();
}

void Regroup::workers_succeeded() {
  const bool regrouped = p_.now.state == State::kRegrouping && !joining_;
  p_.feed(Input::kWorkersSucceeded);
  if (regrouped && p_.now.state == State::kStopping) finish();
}

// This node's workers all finished while it regrouped: the job is done, in the round joined for
// the regroup. Its newcomers are told (nothing is left for their workers to join), so that every
// node of it passes its exit barrier and the job is not restarted. STOPPING waits for it.
void Regroup::finish() {
  joining_ = true;
  const Round& round = *p_.now.round;
  spdlog::info(
      "in-place: this node's workers finished the job during the regroup: round {} ends here",
      round.round);
  g_.store.emplace(p_.io, p_.config.run_id, p_.config.secret, p_.rounds.workers_store(round),
                   round.restarts);
  p_.steps.launch(tell_finished(round.round), [this](Finish f) { on_finished(f); });
}

Task<Regroup::Finish> Regroup::tell_finished(int round) {
  Finish f;
  try {
    f.generation = co_await g_.store->mark_regroup_finished(round);
  } catch (const store::StoreError& e) {
    if (e.code() == store::StoreErrc::kCancelled) throw;
    f.why = "the workers' store cannot be used: " + std::string(e.what());
  }
  co_return f;
}

void Regroup::on_finished(const Finish& f) {
  joining_ = false;
  if (!f.why.empty()) {
    spdlog::warn("round {}: the newcomers could not be told the job finished: {}",
                 p_.now.round->round, f.why);
  }
  p_.telemetry->in_place_finished(p_.now.round->round, f.generation,
                                  "this node's workers finished during the regroup");
  if (p_.now.state == State::kStopping) p_.feed(Input::kRegroupFailed);  // reported: may end
}

// A round joined for a regroup that does not go on: announced failed (the others in it stop too),
// and STOPPING waits for the announcement, so that the verdict on it knows.
void Regroup::end_joined_round() {
  joining_ = true;
  p_.steps.launch(p_.rounds.announce_failure(*p_.now.round, p_.now.failures), [this] {
    joining_ = false;
    if (p_.now.state == State::kStopping) p_.feed(Input::kRegroupFailed);  // may end now
  });
}

// Why the workers cannot simply go on in round `to`; empty when they can. Nodes new to the job
// may be in it (their workers join as the regroup's generation), but every node of round `from`
// that the verdict counted alive must be: one that did not make it (slow, or gone since) left its
// workers in the old group.
std::string Regroup::cannot_regroup(const Round& from, const Round& to, const Verdict& v) const {
  if (to.returning != v.expect) {
    return "round " + std::to_string(to.round) + " has " + std::to_string(to.returning) +
           " of the " + std::to_string(v.expect) + " node(s) still running round " +
           std::to_string(from.round) + ": the group starts again with the nodes there are";
  }
  if (p_.rounds.workers_store(to) != p_.rounds.workers_store(from)) {
    return "round " + std::to_string(to.round) + "'s workers' store is not round " +
           std::to_string(from.round) + "'s: the workers cannot find each other there";
  }
  if (to.restarts != from.restarts) return "the job restarted meanwhile";
  return {};
}

// Each node places its workers; node 0 counts the generation, names it for the newcomers' agents
// (they start their workers as that generation) and publishes it; every node then asks its running
// workers to recover at their next unit (a newcomer fails no collective of theirs), and node 0
// waits for the group's word that it is whole again.
Task<Regroup::Told> Regroup::tell_workers(int old_rank_offset, Round to) {
  Told t;
  try {
    co_await g_.store->place_regrouped(to.round, old_rank_offset, to.rank_offset, to.node_rank);
    // With newcomers, the generation is published once their workers are ready (their imports
    // done), so that the running workers stall for the regroup alone; they train meanwhile.
    const bool newcomers = to.num_nodes > to.returning;
    if (to.node_rank == 0) {
      t.generation = co_await g_.store->next();
      const auto name = co_await g_.store->name_regroup_generation(to.round, *t.generation);
      if (name.finished) {  // a node's workers finished the job first: nothing to publish
        t.finished = true;
        co_return t;
      }
      if (newcomers) {
        t.outcome.why = co_await await_arrivals(*t.generation, to.rank_offset, to.world_size);
        if (!t.outcome.why.empty()) co_return t;  // a group restart: nothing to join
      }
      // The job's one recovery is the regroup's until the group's word: a worker failing
      // meanwhile on another node restarts the group instead of starting a replacement that this
      // regroup's workers would wait for in vain.
      const RecoveryClaim claim = co_await p_.rounds.claim_recovery(to, Recovery::kRegroup, 0, 0);
      if (!claim.replacements) {
        t.outcome.why =
            "another node's worker is being replaced in place in round " + std::to_string(to.round);
        co_return t;
      }
      std::string record = "regrouped round=" + std::to_string(to.round) +
                           " world=" + std::to_string(to.world_size) +
                           " nodes=" + std::to_string(to.num_nodes);
      co_await g_.store->publish(*t.generation, std::move(record));
    } else {
      const auto g = co_await g_.store->regroup_generation(to.round, p_.config.in_place_timeout);
      if (g && g->finished) {
        t.finished = true;
        co_return t;
      }
      if (g && newcomers) {
        co_await g_.store->mark_arrived(g->generation, to.rank_offset, p_.config.nproc_per_node);
      }
      // (Not `!g || !co_await ...`: GCC 12 runs a co_await whatever the left side says.)
      bool published = false;
      if (g)
        published = co_await g_.store->wait_published(g->generation, p_.config.in_place_timeout);
      if (!published) {
        t.outcome.why = "node 0 did not publish the regroup's generation within " +
                        seconds_text(p_.config.in_place_timeout);
        co_return t;
      }
    }
    t.published_at = std::chrono::steady_clock::now();
    if (p_.group) p_.group->ask_to_regroup();
    if (to.node_rank != 0) {
      t.outcome.recovered = true;
      co_return t;
    }
    t.outcome = co_await g_.store->wait_recovered(*t.generation, p_.config.in_place_timeout);
  } catch (const store::StoreError& e) {
    if (e.code() == store::StoreErrc::kCancelled) throw;
    t.outcome.why = "the workers' store cannot be used: " + std::string(e.what());
  }
  co_return t;
}

// Node 0: this node's workers are there; then every rank of the new world, the newcomers' workers
// included, at most arrival_timeout() (then the generation is published anyway). Returns why it
// must not be published (a newcomer's worker died first); empty when it may.
Task<std::string> Regroup::await_arrivals(int generation, int rank_offset, int world_size) {
  co_await g_.store->mark_arrived(generation, rank_offset, p_.config.nproc_per_node);
  const auto began = std::chrono::steady_clock::now();
  const Arrivals a = co_await g_.store->wait_arrived(generation, world_size,
                                                     arrival_timeout(p_.config.in_place_timeout));
  std::string why;
  if (a.failed_rank) {
    why = "worker " + std::to_string(*a.failed_rank) + " of the new world failed before it " +
          "joined generation " + std::to_string(generation);
  } else if (a.all) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - began);
    spdlog::info("generation {}: every worker of the new world is ready after {} ms: publishing it",
                 generation, waited.count());
  } else {
    spdlog::warn(
        "generation {}: not every worker of the new world was ready to join it within {}: "
        "publishing it anyway",
        generation, seconds_text(arrival_timeout(p_.config.in_place_timeout)));
  }
  co_return why;
}

void Regroup::on_told(const Told& t) {
  if (p_.now.state != State::kRegrouping) return;
  const Round& round = *p_.now.round;
  if (t.finished) {  // they end the same way here: WorkersSucceeded, then finish()
    spdlog::info(
        "in-place: a node's workers finished the job during the regroup in round {}: waiting for "
        "this node's workers to end",
        round.round);
    return;
  }
  if (!t.outcome.recovered) {
    end_joined_round();
    return failed("the regrouped workers did not recover: " + t.outcome.why);
  }
  // The workers stalled from the node's loss; with only newcomers, they trained on until asked.
  const auto stalled_from = lost_node_ ? began_ : t.published_at;
  const auto stall = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - stalled_from);
  std::string ranks;
  for (const auto& [from, to] : ranks_) {
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(from) + "->" + std::to_string(to);
  }
  const int new_nodes = round.num_nodes - round.returning;
  spdlog::info(
      "in-place: regrouped in round {} ({}): world {}, {} node(s) new, this node's ranks {}{} "
      "(the workers stalled {} ms)",
      round.round, cause_, round.world_size, new_nodes, ranks,
      t.generation ? ", generation " + std::to_string(*t.generation) : "", stall.count());
  p_.telemetry->in_place_regrouped({from_round_, round.round, t.generation, round.node_rank,
                                    round.world_size, ranks_, stall, t.outcome.record, new_nodes});
  if (round.node_rank == 0) {  // its claim, from the generation's publication
    p_.steps.fire_and_forget(p_.rounds.recovery_over(round), "ending the regroup's recovery");
  }
  p_.feed(Input::kRegrouped);
}

void Regroup::failed(const std::string& why) {
  spdlog::warn("{}: stopping the workers", why);
  p_.telemetry->in_place_fallback(p_.now.round->round, std::nullopt, why);
  p_.feed(Input::kRegroupFailed);
}

}  // namespace dist::agent
