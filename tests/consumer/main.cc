// Uses the installed SDK as an outside project would: a store, a one-rank Gloo group, collectives.
#include <cstdio>
#include <vector>

#include "dist/sdk/env.h"
#include "dist/sdk/process_group.h"
#include "dist/sdk/sampler.h"
#include "dist/store/server.h"

int main() {
  dist::store::StoreServerThread store;
  dist::sdk::WorkerEnv env = dist::sdk::WorkerEnv::single_process();
  env.master_port = store.port();
  auto group = dist::sdk::make_gloo_group(dist::sdk::connect_store(env), env.rank, env.world_size);
  std::vector<float> values{1.0f, 2.0f, 3.0f};
  group->all_reduce(std::span<float>(values), dist::sdk::ReduceOp::kSum);
  dist::sdk::DistributedSampler sampler({10, 1, 0, true, 0, false});
  std::printf("consumer: %s group of %d, sum[2]=%.1f, %zu samples, nccl backend %s\n",
              group->backend().c_str(), group->size(), values[2], sampler.indices().size(),
              dist::sdk::nccl_available() ? "built" : "not built");
  return values[2] == 3.0f && sampler.indices().size() == 10 ? 0 : 1;
}
