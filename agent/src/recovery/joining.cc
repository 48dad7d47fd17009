#include "recovery/joining.h"

#include <spdlog/spdlog.h>

#include "dist/store/errors.h"

namespace dist::agent {

void Joining::watching() {
  if (!unjoined_) return;
  const Round& round = *p_.now.round;
  spdlog::info(
      "round {} continues the job's running workers: this node's workers join them as the "
      "generation node 0 names",
      round.round);
  p_.steps.launch(named_generation(round.round), [this](Named n) { on_generation_named(n); });
}

Task<Joining::Named> Joining::named_generation(int round) {
  Named n;
  try {
    n.name = co_await g_.store->regroup_generation(round, p_.config.in_place_timeout);
    if (!n.name) {
      n.why = "node 0 did not name the generation to join within " +
              seconds_text(p_.config.in_place_timeout);
    }
  } catch (const store::StoreError& e) {
    if (e.code() == store::StoreErrc::kCancelled) throw;
    n.why = "the workers' store cannot be used: " + std::string(e.what());
  }
  co_return n;
}

void Joining::on_generation_named(const Named& n) {
  if (p_.now.state != State::kRunning) return;  // (the round ended first: the wait was closed)
  const Round& round = *p_.now.round;
  if (n.name && n.name->finished) return job_finished_before_joining(round.round, 0);
  if (!n.name) {  // the others' regroup did not go on: the round starts over with all
    const std::string why = "this node cannot join the running workers (" + n.why +
                            "): ending round " + std::to_string(round.round);
    spdlog::warn("{}", why);
    p_.telemetry->in_place_fallback(round.round, std::nullopt, why);
    p_.steps.fire_and_forget(p_.rounds.announce_failure(round, {}), "announcing the failure");
    return p_.feed(Input::kRoundEndedElsewhere);
  }
  g_.latest = n.name->generation;
  try {
    p_.group->start_generation(g_.latest);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return p_.feed(Input::kStartFailed);
  }
  spdlog::info("round {}: this node's workers joined the running workers as generation {}",
               round.round, g_.latest);
  p_.telemetry->in_place_joined(round.round, g_.latest, p_.group->running_ranks());
  // The running workers may finish the job before they regroup: their nodes then say so, and
  // these workers, waiting for them, are stopped. A client of its own: the wait holds it.
  const store::Endpoint store = p_.rounds.workers_store(round);
  finish_watch_.emplace(p_.io, p_.config.run_id, p_.config.secret, store, round.restarts);
  p_.steps.launch(finished_meanwhile(round.round),
                  [this, r = round.round](bool finished) { on_finished_meanwhile(r, finished); });
  // Until node 0 publishes that generation, a failed worker of this node has no group to be
  // replaced into (Facts::unjoined). Another client: that wait holds it too.
  publish_watch_.emplace(p_.io, p_.config.run_id, p_.config.secret, store, round.restarts);
  p_.steps.launch(taken_in(round.round, g_.latest), [this, r = round.round](bool published) {
    if (published && p_.now.round && p_.now.round->round == r) unjoined_ = false;
  });
}

Task<bool> Joining::taken_in(int round, int generation) {
  bool published = false;
  try {
    published = co_await publish_watch_->wait_published(generation, p_.config.in_place_timeout);
  } catch (const store::StoreError& e) {
    if (e.code() == store::StoreErrc::kCancelled) throw;
    spdlog::debug("round {}: waiting for generation {}'s publication: {}", round, generation,
                  e.what());
  }
  co_return published;
}

// A client of its own, which STOPPING leaves open.
void Joining::say_arrival_failed() {
  const Round& round = *p_.now.round;
  arrival_failed_.emplace(p_.io, p_.config.run_id, p_.config.secret, p_.rounds.workers_store(round),
                          round.restarts);
  p_.steps.fire_and_forget(
      arrival_failed_->mark_arrival_failed(g_.latest, round.rank_offset, p_.config.nproc_per_node),
      "telling node 0 that this node's workers failed before they joined");
}

Task<bool> Joining::finished_meanwhile(int round) {
  bool finished = false;
  try {
    finished = co_await finish_watch_->wait_regroup_finished(round, p_.config.in_place_timeout);
  } catch (const store::StoreError& e) {
    if (e.code() == store::StoreErrc::kCancelled) throw;
    spdlog::debug("round {}: watching for the job's end during the regroup: {}", round, e.what());
  }
  co_return finished;
}

void Joining::on_finished_meanwhile(int round, bool finished) {
  if (!finished || p_.now.state != State::kRunning || !p_.now.round ||
      p_.now.round->round != round) {
    return;
  }
  job_finished_before_joining(round, g_.latest);
}

// A newcomer whose workers have nothing left to join (`generation`: 0 when none was started):
// they stop, and the node passes the round's exit barrier with the others.
void Joining::job_finished_before_joining(int round, int generation) {
  spdlog::info(
      "round {}: the job's running workers finished the job before this node's workers joined "
      "them{}",
      round, generation > 0 ? ": stopping them" : "; none is started");
  p_.telemetry->in_place_finished(round, generation > 0 ? std::optional(generation) : std::nullopt,
                                  "the running workers finished before this node's joined them");
  p_.feed(Input::kJobFinished);
}

void Joining::close() {
  if (finish_watch_) finish_watch_->close();
  if (publish_watch_) publish_watch_->close();
}

}  // namespace dist::agent
