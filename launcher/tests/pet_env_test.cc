// The Kubeflow training operator configures dist-launch through PET_* variables alone: its three
// sets (v1 master/worker, v1 elastic policy, Trainer v2) give the intended job, and an empty value
// is an error naming the variable, never a silent default.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>

#include "dist/launcher/cli.h"

namespace dist::launcher {
namespace {

class PetEnvironment : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const auto& name : set_) ::unsetenv(name.c_str());
  }
  void set(const std::map<std::string, std::string>& vars) {
    for (const auto& [name, value] : vars) {
      ::setenv(name.c_str(), value.c_str(), 1);
      set_.push_back(name);
    }
  }
  CliOutcome parse(std::vector<std::string> args = {}) {
    args.insert(args.end(), {"--no-python", "/bin/true"});
    std::ostringstream out;
    return parse_command_line(args, out, err_);
  }
  std::vector<std::string> set_;
  std::ostringstream err_;
};

TEST_F(PetEnvironment, V1MasterWorkerIsAStaticJob) {
  set({{"PET_NNODES", "3"},
       {"PET_NODE_RANK", "2"},
       {"PET_MASTER_ADDR", "job-master-0"},
       {"PET_MASTER_PORT", "23456"},
       {"PET_NPROC_PER_NODE", "2"},
       // The operator's own torch.distributed variables are the workers' business, not the agent's.
       {"MASTER_ADDR", "job-master-0"},
       {"WORLD_SIZE", "3"},
       {"RANK", "2"}});
  const auto o = parse();
  ASSERT_FALSE(o.exit_now) << err_.str();
  EXPECT_FALSE(o.config.elastic);
  EXPECT_EQ(o.config.max_nodes, 3);
  EXPECT_EQ(o.config.node_rank, 2);
  EXPECT_EQ(o.config.nproc_per_node, 2);
  EXPECT_EQ(o.config.master_addr, "job-master-0");
  EXPECT_EQ(o.config.master_port, 23456);
}

TEST_F(PetEnvironment, V1ElasticPolicyIsADynamicJob) {
  set({{"PET_RDZV_ENDPOINT", "job-worker-0:29400"},
       {"PET_RDZV_BACKEND", "c10d"},
       {"PET_NNODES", "2:3"},
       {"PET_MAX_RESTARTS", "3"},
       {"PET_RDZV_CONF", "join_timeout=60,last_call_timeout=2"}});
  const auto o = parse();
  ASSERT_FALSE(o.exit_now) << err_.str();
  EXPECT_TRUE(o.config.elastic);
  EXPECT_EQ(o.config.min_nodes, 2);
  EXPECT_EQ(o.config.max_nodes, 3);
  EXPECT_EQ(o.config.master_addr, "job-worker-0");
  EXPECT_EQ(o.config.master_port, 29400);
  EXPECT_EQ(o.config.max_restarts, 3);
  EXPECT_EQ(o.config.join_timeout, std::chrono::seconds(60));
}

TEST_F(PetEnvironment, TrainerV2WithAutoWorkersPerNode) {
  set({{"PET_NNODES", "2"},
       {"PET_NPROC_PER_NODE", "auto"},
       {"PET_NODE_RANK", "1"},
       {"PET_MASTER_ADDR", "trainjob-node-0-0.trainjob"},
       {"PET_MASTER_PORT", "29400"}});
  const auto o = parse();
  ASSERT_FALSE(o.exit_now) << err_.str();
  EXPECT_EQ(o.config.max_nodes, 2);
  EXPECT_EQ(o.config.node_rank, 1);
  EXPECT_GE(o.config.nproc_per_node, 1);  // the GPUs, else the CPUs
  EXPECT_EQ(o.config.master_addr, "trainjob-node-0-0.trainjob");
}

TEST_F(PetEnvironment, AnEmptyValueIsAnErrorNamingTheVariable) {
  const std::pair<const char*, const char*> cases[] = {
      {"PET_STANDALONE", "give --standalone"},  // the operator's standalone: true
      {"PET_NNODES", "give it a value or unset it (--nnodes)"},
      {"PET_MASTER_ADDR", "(--master-addr)"},
      {"PET_NODE_RANK", "(--node-rank)"},
      {"PET_RDZV_BACKEND", "(--rdzv-backend)"},
      {"PET_MODULE", "set it to 1 or 0"},
  };
  for (const auto& [name, advice] : cases) {
    SCOPED_TRACE(name);
    ::setenv(name, "", 1);
    err_.str("");
    const auto o = parse();
    ::unsetenv(name);
    EXPECT_TRUE(o.exit_now);
    EXPECT_EQ(o.exit_code, kExitUsage);
    EXPECT_NE(err_.str().find(std::string(name) + " is set but empty"), std::string::npos)
        << err_.str();
    EXPECT_NE(err_.str().find(advice), std::string::npos) << err_.str();
  }
}

TEST_F(PetEnvironment, AnEmptyValueTheCommandLineOverridesIsNotRead) {
  set({{"PET_STANDALONE", ""}, {"PET_NNODES", ""}});
  const auto o = parse({"--standalone", "--nnodes", "1"});
  ASSERT_FALSE(o.exit_now) << err_.str();
  EXPECT_EQ(o.config.max_nodes, 1);
  EXPECT_EQ(o.config.rdzv_backend,
            dist::agent::RendezvousBackend::kC10d);  // standalone: its own store
}

TEST_F(PetEnvironment, FlagsTakeOneOrZero) {
  set({{"PET_STANDALONE", "1"}});
  const auto on = parse();
  ASSERT_FALSE(on.exit_now) << err_.str();
  EXPECT_NE(on.config.run_id, "none") << "standalone draws a random run id";
  set({{"PET_STANDALONE", "0"}});
  const auto off = parse();
  ASSERT_FALSE(off.exit_now) << err_.str();
  EXPECT_EQ(off.config.run_id, "none");
}

// dist-launch's own options come from PET_<NAME> too (PET_NO_STEP_HOOK was ignored).
TEST_F(PetEnvironment, DistLaunchsOwnOptionsComeFromTheirVariablesToo) {
  set({{"PET_NO_STEP_HOOK", "1"}, {"PET_HANG_TIMEOUT", "45"}, {"PET_EVENT_LOG", "/tmp/e.jsonl"}});
  const auto o = parse();
  ASSERT_FALSE(o.exit_now) << err_.str();
  EXPECT_FALSE(o.config.watchdogs.step_hook);
  EXPECT_EQ(o.config.watchdogs.hang_timeout, std::chrono::milliseconds(45000));
  EXPECT_EQ(o.config.telemetry.event_log, "/tmp/e.jsonl");
}

}  // namespace
}  // namespace dist::launcher
