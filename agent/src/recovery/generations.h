// The agent's side of in-place recovery (--restart-policy in-place), over the workers' store with
// the keys of dist/contract/worker_contract.h: the next generation of the group counted (before
// the replacement starts: it is told its generation), its record published for the survivors, then
// the group's word that it recovered (written by the new root once every rank holds its state),
// waited for at most --in-place-timeout. Until that word the recovery is in progress, and any
// failure restarts the whole group. Once it recovered, the keys of the generations before it go
// (keys_before).
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/store/async_client.h"
#include "dist/store/endpoint.h"
#include "dist/store/task.h"

namespace dist::agent {

// From a failure to the group's recovery (--in-place-timeout, LifecycleConfig::in_place_timeout):
// what the survivors need (the generation, a new group, the state broadcast) is seconds even for
// large models; a group that says nothing for that long is not recovering (its workers may not
// use the SDK's recovery), and restarts.
// How long node 0 of a regroup waits for the newcomers' workers to be ready (their imports) before
// it publishes the generation anyway: less than the others wait for that publication.
inline std::chrono::milliseconds arrival_timeout(std::chrono::milliseconds in_place_timeout) {
  return in_place_timeout * 4 / 5;
}

// Whether every rank of a regroup's world is ready to join its generation.
struct Arrivals {
  bool all = false;                // every rank arrived (or failed: below) within the wait
  std::optional<int> failed_rank;  // a newcomer's worker that died first (mark_arrival_failed)
};

struct RecoveryOutcome {
  bool recovered = false;
  int generation = 0;  // the one that recovered (or not): a later one when failures were folded
  std::string record;  // the recovered key's value ("root=0 wall_ns=... step=320")
  std::string why;     // when not recovered
};

// What a regroup's generation key says: the generation the newcomers' workers join, or that the
// job's running workers finished first (there is nothing left to join).
struct RegroupName {
  int generation = 0;  // when not finished
  bool finished = false;
};

// The generation a recovery under way rebuilds the group as, and its record ("replaced=2
// survivors=0,1,3").
struct GenerationUnderWay {
  int generation = 0;
  std::string record;
};

class Generations {
 public:
  // The generations of `restart_count`'s group of job `run_id`, whose store is `store` (the
  // workers' store; `secret`: the job's token, empty when it has none). Connects on first use.
  Generations(boost::asio::io_context& io, const std::string& run_id, const std::string& secret,
              store::Endpoint store, int restart_count);
  ~Generations();
  Generations(const Generations&) = delete;
  Generations& operator=(const Generations&) = delete;

  // The next generation of this restart's group (the counter, job-wide: on several nodes it is
  // the claimant of the job's one recovery that adds to it). Throws store::StoreError.
  store::Task<int> next();
  // Folding a failure into a recovery under way (worker_contract.h): the generation
  // it rebuilds the group as, once published (its claimant counts, then publishes it), within
  // `timeout`; whether every rank of a world of `world_size` follows folds; and generation
  // `generation` marked superseded by `by` (false: its group said it recovered first). Throw
  // store::StoreError.
  store::Task<std::optional<GenerationUnderWay>> under_way(std::chrono::milliseconds timeout);
  store::Task<bool> all_follow_folds(int world_size);
  // Whether any of these ranks' workers said it is inside its training function (work/<rank>).
  store::Task<bool> any_at_work(std::vector<int> ranks);
  store::Task<bool> supersede(int generation, int by);
  // Publishes generation `generation` with `record` ("replaced=1 survivors=0"), then waits for
  // the group's recovery, at most `timeout` (and as long again for each later generation that
  // supersedes it: a failure folded into the recovery). A store that cannot be used is an outcome
  // (not recovered, why), not an error; close() ends the wait with StoreError kCancelled.
  store::Task<RecoveryOutcome> publish_and_wait(int generation, std::string record,
                                                std::chrono::milliseconds timeout);
  // A lost node's survivors regroup in round `round`: this node's workers, whose global ranks
  // started at `old_rank_offset`, now start at `new_rank_offset` on node `new_node_rank`.
  // Throws store::StoreError.
  store::Task<void> place_regrouped(int round, int old_rank_offset, int new_rank_offset,
                                    int new_node_rank);
  // Node 0 of a regroup in round `round`: its generation is `generation`, for the workers of
  // nodes new to the job (regroup_generation_key), unless a node said the job's workers finished
  // first; returns what the key says. Throws store::StoreError.
  store::Task<RegroupName> name_regroup_generation(int round, int generation);
  // A newcomer, or another node of the regroup: the generation of the regroup in round `round`,
  // once node 0 named it (or the job finished); nullopt when nothing came within `timeout`.
  // Throws store::StoreError.
  store::Task<std::optional<RegroupName>> regroup_generation(int round,
                                                             std::chrono::milliseconds timeout);
  // A node whose workers all finished while the job regrouped in round `round`: says so at the
  // regroup's generation key, or, when node 0 named a generation already, at its finished key
  // (unless that generation's group recovered: the newcomers trained), and returns that
  // generation. Throws store::StoreError.
  store::Task<std::optional<int>> mark_regroup_finished(int round);
  // Generation `generation`'s ranks [first_rank, first_rank + count) are ready to join it (this
  // node's running workers). Throws store::StoreError.
  store::Task<void> mark_arrived(int generation, int first_rank, int count);
  // A newcomer: those ranks' workers died before the running workers took them in. Throws
  // store::StoreError.
  store::Task<void> mark_arrival_failed(int generation, int first_rank, int count);
  // Whether every rank of generation `generation`'s world of `world_size` arrived within
  // `timeout` (mark_arrived; a newcomer's worker writes its own), and the first that failed
  // instead. Throws store::StoreError.
  store::Task<Arrivals> wait_arrived(int generation, int world_size,
                                     std::chrono::milliseconds timeout);
  // A newcomer's workers joined the regroup of round `round`: whether the job's running workers
  // finished without them (mark_regroup_finished) within `timeout`. Throws store::StoreError.
  store::Task<bool> wait_regroup_finished(int round, std::chrono::milliseconds timeout);
  // The steps of publish_and_wait, apart: a regroup asks its workers to recover in between.
  // Throws store::StoreError; wait_recovered makes a store that cannot be used an outcome.
  store::Task<void> publish(int generation, std::string record);
  store::Task<RecoveryOutcome> wait_recovered(int generation, std::chrono::milliseconds timeout);
  // Whether generation `generation` was published within `timeout`. Throws store::StoreError.
  store::Task<bool> wait_published(int generation, std::chrono::milliseconds timeout);
  void close();

 private:
  std::shared_ptr<store::AsyncStoreClient> client_;  // shared with the coroutine in flight
  std::string prefix_;
  std::string group_prefix_;  // the group's keys (worker_contract::group_prefix)
};

// The keys of the generations before `generation` (a record, its arrivals and word, under
// `prefix` gen/<h>; a process group's, under `group_prefix` gen_<h>/, with torch's "/" before it
// or without), among `keys`: once `generation` recovered, no rank reads them again.
std::vector<std::string> keys_before(const std::vector<std::string>& keys,
                                     const std::string& prefix, const std::string& group_prefix,
                                     int generation);

// What the in-place parts share of a round (recovery/in_place.h): its generations, over its
// workers' store (from RUNNING on), and the latest generation of this node's group.
struct RoundGenerations {
  std::optional<Generations> store;
  int latest = 0;
};

}  // namespace dist::agent
