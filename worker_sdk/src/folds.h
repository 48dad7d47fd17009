// Following an in-place recovery into the generation the agent folds a later failure into
// (worker_contract.h: a worker died while the group rebuilt itself): a rank whose set-up of
// generation g failed, or saw the generation counter pass g, joins the latest one.
// The set-up's store waits are sliced and ask the counter between slices; Gloo's own wait (its
// listening side of a pair, for the peer's connection) is watched by a thread that asks instead
// and ends it (gloo_group.cc: MeshWatch).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "dist/sdk/env.h"
#include "dist/sdk/init.h"
#include "dist/store/client.h"

namespace dist::sdk::detail {

// Whether this worker's recovery follows such generations: in place, over Gloo (whose set-up can
// be given up; NCCL's initialization cannot). Such a worker says so (fold_key) as it starts.
bool follows_folds(const WorkerEnv& env, Backend backend);

// A Gloo group's `superseded` for generation `env.generation` of an in-place job: whether the
// agent has counted a later generation. On a store connection of its own.
std::function<bool()> superseded_check(const WorkerEnv& env);

// How long a rank whose set-up failed without being superseded (a peer's socket closed: it died)
// waits for the agent to fold that failure into a later generation before it gives up with the
// error: the agent folds as soon as it reaps the worker, so seconds are plenty; a failure it does
// not fold (a group restart stops this rank anyway, or an error no death caused) is not held long.
inline constexpr std::chrono::seconds kFoldWait{10};

// The generation to join after generation `failed`'s set-up failed with `error`: the latest
// counted, once generation `failed` + 1 is published (within the job's --in-place-timeout when the
// set-up was superseded, else kFoldWait). nullopt: none came, it regroups the job (a node lost or
// joining, never folded), which this rank does not follow from a failed set-up, or the store
// cannot be used: then `error` stands.
std::optional<int> generation_to_follow(const WorkerEnv& env, store::StoreClient& store, int failed,
                                        const CollectiveError& error);

// "rank 3: generation 1's group did not form (what): joining generation 2".
void say_following(const WorkerEnv& env, int failed, int next, const std::string& why);

}  // namespace dist::sdk::detail
