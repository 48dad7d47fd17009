#include "dist/sdk/env.h"

#include <cstdlib>
#include <string>

#include "dist/contract/worker_contract.h"
#include "dist/store/token.h"

namespace dist::sdk {
namespace {

namespace contract = worker_contract;

constexpr const char* kHint =
    "; start workers with dist-launch (or use WorkerEnv::single_process() to run one alone)";

std::string require(const char* name) {
  const char* value = std::getenv(name);
  if (!value || !*value) throw EnvironmentError(std::string(name) + " is not set" + kHint);
  return value;
}

long long parse_integer(const char* name, const std::string& text, long long min, long long max) {
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || v < min || v > max) {
    throw EnvironmentError(std::string(name) + "='" + text + "' is not an integer in [" +
                           std::to_string(min) + ", " + std::to_string(max) + "]" + kHint);
  }
  return v;
}

int integer(const char* name, long long min, long long max = 1 << 30) {
  return static_cast<int>(parse_integer(name, require(name), min, max));
}

}  // namespace

bool WorkerEnv::launched_by_dist_launch() {
  return std::getenv(contract::kRank) != nullptr && std::getenv(contract::kWorldSize) != nullptr;
}

WorkerEnv WorkerEnv::from_environment() {
  WorkerEnv env;
  env.world_size = integer(contract::kWorldSize, 1);
  env.rank = integer(contract::kRank, 0, env.world_size - 1);
  env.local_world_size = integer(contract::kLocalWorldSize, 1, env.world_size);
  env.local_rank = integer(contract::kLocalRank, 0, env.local_world_size - 1);
  env.master_addr = require(contract::kMasterAddr);
  env.master_port = static_cast<std::uint16_t>(integer(contract::kMasterPort, 1, 65535));
  const char* restart = std::getenv(contract::kRestartCount);
  env.restart_count =
      restart ? static_cast<int>(parse_integer(contract::kRestartCount, restart, 0, 1 << 30)) : 0;
  const char* run_id = std::getenv(contract::kRunId);
  if (run_id && *run_id) env.run_id = run_id;
  const char* token_file = std::getenv(contract::kTokenFile);
  if (token_file && *token_file) env.token_file = token_file;
  const char* policy = std::getenv(contract::kRestartPolicyVariable);
  env.in_place = policy && std::string(policy) == contract::kInPlacePolicy;
  if (const char* generation = std::getenv(contract::kGenerationVariable)) {
    env.generation =
        static_cast<int>(parse_integer(contract::kGenerationVariable, generation, 0, 1 << 30));
  }
  if (const char* timeout = std::getenv(contract::kInPlaceTimeoutVariable)) {
    env.in_place_timeout = std::chrono::milliseconds(
        parse_integer(contract::kInPlaceTimeoutVariable, timeout, 1, 1'000'000'000'000LL));
  }
  return env;
}

WorkerEnv WorkerEnv::single_process() {
  return WorkerEnv{};
}

store::StoreClient connect_store(const WorkerEnv& env, std::chrono::milliseconds timeout) {
  store::ClientOptions options;
  options.host = env.master_addr;
  options.port = env.master_port;
  options.connect_timeout = timeout;
  if (!env.token_file.empty()) {
    try {
      options.secret = store::read_secret_file(env.token_file);
    } catch (const store::StoreError& e) {
      throw EnvironmentError(std::string(store::kTokenFileVariable) + ": " + e.what());
    }
  }
  return store::StoreClient::connect(options);
}

}  // namespace dist::sdk
