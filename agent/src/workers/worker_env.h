// The environment each worker gets: torchrun's variables on top of the agent's own environment.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dist/agent/config.h"
#include "dist/agent/vocabulary.h"
#include "dist/store/endpoint.h"
#include "processes/process.h"
#include "rendezvous/rendezvous.h"

namespace dist::agent {

struct WorkerIdentity {
  Worker worker;       // its round and ranks (its process is not started yet)
  int group_rank = 0;  // node rank
  int local_world_size = 1;
  int world_size = 1;
  int group_world_size = 1;  // nodes
  std::string role = "default";
  store::Endpoint master;  // MASTER_ADDR and MASTER_PORT: the workers' store
  int restart_count = 0;
  int max_restarts = 0;
  std::string run_id;
  std::string error_file;
  std::string signals_to_handle;  // TORCHELASTIC_SIGNALS_TO_HANDLE; empty: not set
};

// What local rank `local_rank` of round `a` is told, its store being `store`.
WorkerIdentity make_identity(const Round& a, int local_rank, const store::Endpoint& store,
                             const JobConfig& job);

// torchrun's variables for one worker. OMP_NUM_THREADS=1 is added when `default_omp_threads`.
Variables torchrun_variables(const WorkerIdentity& id, bool default_omp_threads);

// `base` (KEY=VALUE strings, e.g. environ) with `overrides` applied;
// TORCH_NCCL_ASYNC_ERROR_HANDLING keeps a value the user set.
std::vector<std::string> merge_environment(const std::vector<std::string>& base,
                                           const Variables& overrides);

// "${local_rank}" replaced in each argument.
std::vector<std::string> substitute_local_rank(const std::vector<std::string>& args,
                                               int local_rank);

}  // namespace dist::agent
