// The worker's view of dist-launch's environment, and the way to the agent's store.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "dist/sdk/env.h"
#include "dist/store/server.h"

namespace dist::sdk {
namespace {

const char* const kVariables[] = {"RANK",
                                  "LOCAL_RANK",
                                  "WORLD_SIZE",
                                  "LOCAL_WORLD_SIZE",
                                  "MASTER_ADDR",
                                  "MASTER_PORT",
                                  "TORCHELASTIC_RESTART_COUNT",
                                  "TORCHELASTIC_RUN_ID",
                                  "DIST_LAUNCH_RESTART_POLICY",
                                  "DIST_LAUNCH_GENERATION",
                                  "DIST_LAUNCH_IN_PLACE_TIMEOUT_MS"};

// Sets exactly `vars` (clearing the others) for one test, and restores nothing: each test sets
// what it needs.
void set_environment(const std::map<std::string, std::string>& vars) {
  for (const char* name : kVariables) ::unsetenv(name);
  for (const auto& [name, value] : vars) ::setenv(name.c_str(), value.c_str(), 1);
}

std::map<std::string, std::string> launched(std::uint16_t port) {
  return {{"RANK", "3"},
          {"LOCAL_RANK", "1"},
          {"WORLD_SIZE", "4"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", std::to_string(port)},
          {"TORCHELASTIC_RESTART_COUNT", "2"},
          {"TORCHELASTIC_RUN_ID", "job7"}};
}

TEST(WorkerEnv, ReadsWhatDistLaunchSets) {
  set_environment(launched(29500));
  const WorkerEnv env = WorkerEnv::from_environment();
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_EQ(env.restart_count, 2);
  EXPECT_EQ(env.run_id, "job7");
  EXPECT_TRUE(WorkerEnv::launched_by_dist_launch());
}

TEST(WorkerEnv, ReadsTheInPlacePolicyAndTheGeneration) {
  auto vars = launched(29500);
  set_environment(vars);
  EXPECT_FALSE(WorkerEnv::from_environment().in_place);
  EXPECT_EQ(WorkerEnv::from_environment().generation, 0);
  vars["DIST_LAUNCH_RESTART_POLICY"] = "in-place";
  vars["DIST_LAUNCH_GENERATION"] = "3";
  set_environment(vars);
  EXPECT_TRUE(WorkerEnv::from_environment().in_place);
  EXPECT_EQ(WorkerEnv::from_environment().generation, 3);
  vars["DIST_LAUNCH_RESTART_POLICY"] = "group";
  vars["DIST_LAUNCH_GENERATION"] = "-1";
  set_environment(vars);
  try {
    WorkerEnv::from_environment();
    FAIL() << "must throw";
  } catch (const EnvironmentError& e) {
    EXPECT_NE(std::string(e.what()).find("DIST_LAUNCH_GENERATION='-1'"), std::string::npos)
        << e.what();
  }
}

// dist-launch --in-place-timeout: how long a generation's group may take (5 minutes without it).
TEST(WorkerEnv, ReadsTheInPlaceTimeout) {
  auto vars = launched(29500);
  set_environment(vars);
  EXPECT_EQ(WorkerEnv::from_environment().in_place_timeout, std::chrono::minutes(5));
  vars["DIST_LAUNCH_IN_PLACE_TIMEOUT_MS"] = "2500";
  set_environment(vars);
  EXPECT_EQ(WorkerEnv::from_environment().in_place_timeout, std::chrono::milliseconds(2500));
  vars["DIST_LAUNCH_IN_PLACE_TIMEOUT_MS"] = "0";
  set_environment(vars);
  try {
    WorkerEnv::from_environment();
    FAIL() << "must throw";
  } catch (const EnvironmentError& e) {
    EXPECT_NE(std::string(e.what()).find("DIST_LAUNCH_IN_PLACE_TIMEOUT_MS='0'"), std::string::npos)
        << e.what();
  }
}

TEST(WorkerEnv, MissingOrMalformedVariablesAreNamed) {
  struct Case {
    const char* name;
    std::string variable;
    std::optional<std::string> value;  // nullopt: unset
    std::string message;
  };
  const Case cases[] = {
      {"no RANK", "RANK", std::nullopt, "RANK is not set"},
      {"RANK past WORLD_SIZE", "RANK", "4", "RANK='4' is not an integer in [0, 3]"},
      {"word for a number", "WORLD_SIZE", "four", "WORLD_SIZE='four'"},
      {"port out of range", "MASTER_PORT", "70000", "MASTER_PORT='70000'"},
      {"no master", "MASTER_ADDR", std::nullopt, "MASTER_ADDR is not set"},
      {"local rank too big", "LOCAL_RANK", "2", "LOCAL_RANK='2'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto vars = launched(29500);
    if (c.value) {
      vars[c.variable] = *c.value;
    } else {
      vars.erase(c.variable);
    }
    set_environment(vars);
    try {
      WorkerEnv::from_environment();
      FAIL() << "must throw";
    } catch (const EnvironmentError& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("dist-launch"), std::string::npos) << e.what();
    }
  }
}

TEST(WorkerEnv, SingleProcessIsRankZeroOfOne) {
  set_environment({});
  EXPECT_FALSE(WorkerEnv::launched_by_dist_launch());
  store::StoreServerThread store;
  WorkerEnv env = WorkerEnv::single_process();
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  env.master_port = store.port();
  auto client = connect_store(env, std::chrono::seconds(5));
  EXPECT_EQ(client.add("steps", 1), 1);
}

TEST(WorkerEnv, ConnectsToTheStoreNamedByTheEnvironment) {
  store::StoreServerThread store;
  set_environment(launched(store.port()));
  auto client = connect_store(WorkerEnv::from_environment(), std::chrono::seconds(5));
  client.set("hello", "from rank 3");
  EXPECT_EQ(client.get("hello"), "from rank 3");
}

}  // namespace
}  // namespace dist::sdk

#include "dist/sdk/init.h"

namespace dist::sdk {
namespace {

TEST(Init, AloneAProcessIsRankZeroOfOneWithItsOwnStore) {
  set_environment({});
  Distributed d = init();
  ASSERT_NE(d.group, nullptr);
  EXPECT_NE(d.own_store, nullptr);
  EXPECT_EQ(d.group->rank(), 0);
  EXPECT_EQ(d.group->size(), 1);
  std::vector<double> v{2.5};
  d.group->all_reduce(std::span<double>(v), ReduceOp::kAvg);
  EXPECT_EQ(v[0], 2.5);
}

TEST(Init, UnderALauncherItJoinsTheStoreItNames) {
  store::StoreServerThread store;
  auto vars = launched(store.port());
  vars["RANK"] = "0";
  vars["LOCAL_RANK"] = "0";
  vars["WORLD_SIZE"] = "1";
  vars["LOCAL_WORLD_SIZE"] = "1";
  set_environment(vars);
  Distributed d = init();
  EXPECT_EQ(d.own_store, nullptr);
  EXPECT_EQ(d.env.restart_count, 2);
  EXPECT_EQ(d.env.run_id, "job7");
  auto c = connect_store(d.env);
  bool attempt_keys = false;
  for (const auto& key : c.list_keys()) attempt_keys |= key.find("sdk/job7/attempt_2/") == 0;
  EXPECT_TRUE(attempt_keys) << "the group's keys live under this attempt's prefix";
}

}  // namespace
}  // namespace dist::sdk
