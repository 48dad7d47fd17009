// Following an in-place recovery into the generation the agent folds a later failure into
// (worker_contract.h: a worker of another node died while the group rebuilt itself): a rank whose
// set-up of generation g failed, or saw the generation counter pass g, joins the latest one.
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

// The generation to join after generation `failed`'s set-up failed: the latest counted, once
// generation `failed` + 1 is published, within `timeout`. nullopt: none came, or it regroups the
// job (a node lost or joining, never folded), which this rank does not follow from a failed
// set-up.
std::optional<int> generation_after(store::StoreClient& store, const std::string& prefix,
                                    int failed, std::chrono::milliseconds timeout);

// "rank 3: generation 1's group did not form (what): joining generation 2".
void say_following(const WorkerEnv& env, int failed, int next, const std::string& why);

}  // namespace dist::sdk::detail
