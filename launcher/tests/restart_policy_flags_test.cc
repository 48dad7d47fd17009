// --restart-policy / PET_RESTART_POLICY as the command line and the environment give it: every
// kind of job takes either policy; a policy that is not one is a usage error. --in-place-timeout:
// 300 s unless given, in seconds (a fraction too), never zero.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include "dist/launcher/cli.h"

namespace {

using dist::agent::RestartPolicy;

dist::launcher::CliOutcome parse(std::vector<std::string> args, std::string* errors = nullptr) {
  std::ostringstream out, err;
  args.insert(args.end(), {"--no-python", "/bin/true"});
  auto outcome = dist::launcher::parse_command_line(args, out, err);
  if (errors) *errors = err.str();
  return outcome;
}

TEST(RestartPolicyFlag, GroupByDefaultInPlaceWhenAsked) {
  ::unsetenv("PET_RESTART_POLICY");
  const auto plain = parse({});
  ASSERT_FALSE(plain.exit_now);
  EXPECT_EQ(plain.config.restart_policy, RestartPolicy::kGroup);
  for (const char* spelling : {"--restart-policy", "--restart_policy"}) {
    SCOPED_TRACE(spelling);
    const auto o = parse({spelling, "in-place", "--max-restarts", "2", "--nproc-per-node", "2"});
    ASSERT_FALSE(o.exit_now);
    EXPECT_EQ(o.config.restart_policy, RestartPolicy::kInPlace);
    EXPECT_EQ(o.config.max_restarts, 2);
  }
  const auto static_nodes = parse({"--restart-policy", "in-place", "--nnodes", "2", "--node-rank",
                                   "1", "--master-port", "29500"});
  ASSERT_FALSE(static_nodes.exit_now);
  EXPECT_EQ(static_nodes.config.restart_policy, RestartPolicy::kInPlace);
  // Elastic rendezvous too, over c10d and etcd-v3 (its members are only text here).
  for (const std::vector<std::string>& elastic :
       {std::vector<std::string>{"--nnodes", "1:2", "--rdzv-endpoint", "localhost:29400"},
        std::vector<std::string>{"--nnodes", "2", "--rdzv-backend", "etcd-v3", "--rdzv-endpoint",
                                 "e1:2379,e2:2379,e3:2379"}}) {
    SCOPED_TRACE(elastic[1]);
    std::vector<std::string> args = {"--restart-policy", "in-place"};
    args.insert(args.end(), elastic.begin(), elastic.end());
    std::string error;
    const auto o = parse(args, &error);
    ASSERT_FALSE(o.exit_now) << error;
    EXPECT_TRUE(o.config.elastic);
    EXPECT_EQ(o.config.restart_policy, RestartPolicy::kInPlace);
  }
  const auto standalone = parse({"--standalone", "--restart-policy", "in-place"});
  ASSERT_FALSE(standalone.exit_now);
  EXPECT_EQ(standalone.config.restart_policy, RestartPolicy::kInPlace);
  EXPECT_EQ(parse({"--restart-policy", "group"}).config.restart_policy, RestartPolicy::kGroup);
}

TEST(RestartPolicyFlag, PetRestartPolicyAsTheOperatorSetsIt) {
  ::setenv("PET_RESTART_POLICY", "in-place", 1);
  const auto from_env = parse({});
  const auto flag_wins = parse({"--restart-policy", "group"});
  ::setenv("PET_RESTART_POLICY", "", 1);
  std::string error;
  const auto empty = parse({}, &error);
  ::unsetenv("PET_RESTART_POLICY");
  ASSERT_FALSE(from_env.exit_now);
  EXPECT_EQ(from_env.config.restart_policy, RestartPolicy::kInPlace);
  EXPECT_EQ(flag_wins.config.restart_policy, RestartPolicy::kGroup);
  EXPECT_EQ(empty.exit_code, dist::launcher::kExitUsage) << error;
  EXPECT_NE(error.find("PET_RESTART_POLICY"), std::string::npos) << error;
}

TEST(RestartPolicyFlag, WhatCannotBeHonouredIsOneLineAndExit2) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--restart-policy", "inplace"}, "--restart-policy takes group or in-place, got 'inplace'"},
      {{"--restart-policy", ""}, "--restart-policy takes group or in-place, got ''"},
  };
  // (Nothing binds a port while the command line is read: the fixed ones are only text here.)
  for (const auto& [args, message] : cases) {
    SCOPED_TRACE(args[1]);
    std::string error;
    const auto o = parse(args, &error);
    EXPECT_EQ(o.exit_code, dist::launcher::kExitUsage) << error;
    EXPECT_NE(error.find(message), std::string::npos) << error;
    EXPECT_EQ(std::count(error.begin(), error.end(), '\n'), 1) << error;
  }
}

TEST(InPlaceTimeoutFlag, FiveMinutesUnlessGivenInSecondsAndFractions) {
  ::unsetenv("PET_IN_PLACE_TIMEOUT");
  EXPECT_EQ(parse({}).config.in_place_timeout, std::chrono::milliseconds(300'000));
  for (const char* spelling : {"--in-place-timeout", "--in_place_timeout"}) {
    SCOPED_TRACE(spelling);
    const auto o = parse({"--restart-policy", "in-place", spelling, "2.5"});
    ASSERT_FALSE(o.exit_now);
    EXPECT_EQ(o.config.in_place_timeout, std::chrono::milliseconds(2'500));
  }
  ::setenv("PET_IN_PLACE_TIMEOUT", "45", 1);
  const auto from_env = parse({});
  ::unsetenv("PET_IN_PLACE_TIMEOUT");
  EXPECT_EQ(from_env.config.in_place_timeout, std::chrono::milliseconds(45'000));
  for (const char* bad : {"0", "-1", "soon", ""}) {
    SCOPED_TRACE(bad);
    std::string error;
    const auto o = parse({"--in-place-timeout", bad}, &error);
    EXPECT_EQ(o.exit_code, dist::launcher::kExitUsage) << error;
    EXPECT_NE(error.find("--in-place-timeout must be a positive number of seconds, got '" +
                         std::string(bad) + "'"),
              std::string::npos)
        << error;
    EXPECT_EQ(std::count(error.begin(), error.end(), '\n'), 1) << error;
  }
  std::string error;  // the workers get whole milliseconds: none of them is not a timeout
  EXPECT_EQ(parse({"--in-place-timeout", "0.0004"}, &error).exit_code, dist::launcher::kExitUsage);
  EXPECT_NE(error.find("--in-place-timeout must be at least 0.001 seconds, got '0.0004'"),
            std::string::npos)
      << error;
}

}  // namespace
