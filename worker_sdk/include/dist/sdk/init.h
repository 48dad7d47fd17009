// One call to join the job: dist::sdk::init() reads what dist-launch set, connects to the agent's
// store and builds the process group, with store keys fresh for this restart attempt.
//
//   auto dist = dist::sdk::init();                 // Gloo; init(Backend::kNccl) on GPUs
//   dist.group->all_reduce(std::span<float>(grads), dist::sdk::ReduceOp::kAvg);
//
// Run without dist-launch (no RANK / WORLD_SIZE in the environment), the process is rank 0 of a
// world of 1 and hosts a private store itself, so the same program runs alone unchanged.
#pragma once

#include <chrono>
#include <memory>
#include <optional>

#include "dist/sdk/env.h"
#include "dist/sdk/process_group.h"
#include "dist/store/server.h"

namespace dist::sdk {

enum class Backend { kGloo, kNccl };

struct Distributed {
  WorkerEnv env;
  std::unique_ptr<ProcessGroup> group;
  std::unique_ptr<store::StoreServerThread> own_store;  // only when run alone
};

// Throws EnvironmentError (bad launcher environment), store::StoreError (store unreachable)
// or CollectiveError (the group could not form).
Distributed init(Backend backend = Backend::kGloo);

// The group of `env`'s restart attempt and generation, on a store connection of its own: its keys
// under sdk/<run id>/attempt_<restart>/ (generation g > 0: .../gen_<g>/). In-place jobs' NCCL
// groups throw CollectiveError on a failure instead of exiting, so that the group can be rebuilt.
// The process ignores SIGPIPE from here on (unless the program handles it, as Python does for
// torch workers): a write to a dead peer fails, naming the peer, instead of killing the survivor
// with no word of why (exit 141). Programs the worker starts inherit the ignored SIGPIPE (exec
// keeps it); one that relies on dying of it (a producer piped into `head`) restores it.
// `timeout` bounds forming the group (connecting to the store: connect_store's default).
std::unique_ptr<ProcessGroup> join_group(const WorkerEnv& env, Backend backend,
                                         std::chrono::milliseconds timeout);

}  // namespace dist::sdk
