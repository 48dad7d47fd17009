#include "folds.h"

#include <unistd.h>

#include <algorithm>

#include "dist/contract/worker_contract.h"
#include "dist/store/errors.h"

namespace dist::sdk::detail {

namespace contract = worker_contract;

bool follows_folds(const WorkerEnv& env, Backend backend) {
  return env.in_place && backend == Backend::kGloo;
}

std::function<bool()> superseded_check(const WorkerEnv& env) {
  const std::string counter =
      contract::generation_counter_key(contract::generation_prefix(env.run_id, env.restart_count));
  auto store = std::make_shared<std::optional<store::StoreClient>>();
  return [env, counter, store] {
    if (!*store) store->emplace(connect_store(env));  // on the first slice that timed out
    return (*store)->add(counter, 0) > env.generation;
  };
}

std::optional<int> generation_to_follow(const WorkerEnv& env, store::StoreClient& store, int failed,
                                        const CollectiveError& error) {
  const std::string prefix = contract::generation_prefix(env.run_id, env.restart_count);
  const bool superseded = dynamic_cast<const GroupSuperseded*>(&error) != nullptr;
  const int next = failed + 1;
  try {
    store.wait({contract::generation_key(prefix, next)},
               superseded ? env.in_place_timeout : std::chrono::milliseconds(kFoldWait));
    const int latest =
        std::max(next, static_cast<int>(store.add(contract::generation_counter_key(prefix), 0)));
    for (int g = next; g <= latest; ++g) {
      const auto record = store.try_get(contract::generation_key(prefix, g));
      if (record && record->starts_with("regrouped")) return std::nullopt;
    }
    return latest;
  } catch (const store::StoreError&) {
    return std::nullopt;
  }
}

void say_following(const WorkerEnv& env, int failed, int next, const std::string& why) {
  const std::string line = "dist-sdk: rank " + std::to_string(env.rank) + ": generation " +
                           std::to_string(failed) + "'s group did not form (" + why +
                           "): joining generation " + std::to_string(next) +
                           ", into which the agent folded the failure\n";
  [[maybe_unused]] const auto written = ::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace dist::sdk::detail
