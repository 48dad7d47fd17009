#include "worker_env.h"

#include <string_view>

namespace dist::agent {

Variables torchrun_variables(const WorkerIdentity& id, bool default_omp_threads) {
  Variables v = {
      {"RANK", std::to_string(id.rank)},
      {"LOCAL_RANK", std::to_string(id.local_rank)},
      {"GROUP_RANK", std::to_string(id.group_rank)},
      {"ROLE_RANK", std::to_string(id.rank)},
      {"ROLE_NAME", id.role},
      {"LOCAL_WORLD_SIZE", std::to_string(id.local_world_size)},
      {"WORLD_SIZE", std::to_string(id.world_size)},
      {"GROUP_WORLD_SIZE", std::to_string(id.group_world_size)},
      {"ROLE_WORLD_SIZE", std::to_string(id.world_size)},
      {"MASTER_ADDR", id.master_addr},
      {"MASTER_PORT", std::to_string(id.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(id.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(id.max_restarts)},
      {"TORCHELASTIC_RUN_ID", id.run_id},
      {"TORCHELASTIC_USE_AGENT_STORE", "True"},
      {"TORCHELASTIC_ERROR_FILE", id.error_file},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
  };
  if (default_omp_threads) v["OMP_NUM_THREADS"] = "1";
  return v;
}

std::vector<std::string> merge_environment(const std::vector<std::string>& base,
                                           const Variables& overrides) {
  static constexpr std::string_view kUsersChoice = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
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
