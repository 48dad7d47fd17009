#include "workers/worker_env.h"

#include <string_view>

#include "dist/contract/worker_contract.h"

namespace dist::agent {

WorkerIdentity make_identity(const Round& a, int local_rank, const store::Endpoint& store,
                             const JobConfig& config) {
  WorkerIdentity id;
  id.worker.round = a.round;
  id.worker.rank = a.rank_offset + local_rank;
  id.worker.local_rank = local_rank;
  id.group_rank = a.node_rank;
  id.local_world_size = config.nproc_per_node;
  id.world_size = a.world_size;
  id.group_world_size = a.num_nodes;
  id.role = config.role;
  id.master = store;
  id.restart_count = a.restarts;
  id.max_restarts = config.max_restarts;
  id.run_id = config.run_id;
  return id;
}

Variables torchrun_variables(const WorkerIdentity& id, bool default_omp_threads) {
  namespace contract = worker_contract;
  Variables v = {
      {contract::kRank, std::to_string(id.worker.rank)},
      {contract::kLocalRank, std::to_string(id.worker.local_rank)},
      {contract::kGroupRank, std::to_string(id.group_rank)},
      {contract::kRoleRank, std::to_string(id.worker.rank)},
      {contract::kRoleName, id.role},
      {contract::kLocalWorldSize, std::to_string(id.local_world_size)},
      {contract::kWorldSize, std::to_string(id.world_size)},
      {contract::kGroupWorldSize, std::to_string(id.group_world_size)},
      {contract::kRoleWorldSize, std::to_string(id.world_size)},
      {contract::kMasterAddr, id.master.host},
      {contract::kMasterPort, std::to_string(id.master.port)},
      {contract::kRestartCount, std::to_string(id.restart_count)},
      {contract::kMaxRestarts, std::to_string(id.max_restarts)},
      {contract::kRunId, id.run_id},
      {contract::kUseAgentStore, "True"},
      {contract::kErrorFile, id.error_file},
      {contract::kNcclAsyncErrorHandling, "1"},
  };
  if (default_omp_threads) v["OMP_NUM_THREADS"] = "1";
  // torchrun 2.x exports it to its workers: torch's own launchers inside them (start_processes)
  // install their handlers for these signals.
  if (!id.signals_to_handle.empty()) v[contract::kSignalsToHandle] = id.signals_to_handle;
  return v;
}

std::vector<std::string> merge_environment(const std::vector<std::string>& base,
                                           const Variables& overrides) {
  static constexpr std::string_view kUsersChoice = worker_contract::kNcclAsyncErrorHandling;
  std::vector<std::string> env;
  env.reserve(base.size() + overrides.size());
  bool user_set_nccl_handling = false;
  for (const auto& entry : base) {
    const std::string_view name = std::string_view(entry).substr(0, entry.find('='));
    if (name == kUsersChoice) {
      user_set_nccl_handling = true;  // the user's choice wins
      env.push_back(entry);
      continue;
    }
    if (overrides.find(name) == overrides.end()) env.push_back(entry);
  }
  for (const auto& [name, value] : overrides) {
    if (user_set_nccl_handling && name == kUsersChoice) continue;
    env.push_back(name + "=" + value);
  }
  return env;
}

std::vector<std::string> substitute_local_rank(const std::vector<std::string>& args,
                                               int local_rank) {
  static const std::string kPattern = "${local_rank}";
  std::vector<std::string> out;
  out.reserve(args.size());
  for (std::string arg : args) {
    for (std::size_t pos = arg.find(kPattern); pos != std::string::npos;
         pos = arg.find(kPattern, pos)) {
      const std::string value = std::to_string(local_rank);
      arg.replace(pos, kPattern.size(), value);
      pos += value.size();
    }
    out.push_back(std::move(arg));
  }
  return out;
}

}  // namespace dist::agent
