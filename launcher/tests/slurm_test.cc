// Slurm's environment fills what the command line leaves out: the job step's shape, one agent per
// node, a clear error outside a step; and the signals slurmstepd sends to the whole step.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <sstream>

#include "dist/agent/signals.h"
#include "dist/launcher/cli.h"
#include "dist/launcher/slurm.h"

namespace dist::launcher {
namespace {

TEST(Slurm, FirstHostOfANodeList) {
  const std::pair<const char*, const char*> cases[] = {
      {"node1", "node1"},
      {"gpu[07-09,12],cpu1", "gpu07"},
      {"a[3,5]", "a3"},
      {"rack1-node[001-128]", "rack1-node001"},
      {"x[10-11]-ib", "x10-ib"},
      {"solo,other[1-2]", "solo"},
      {"127.0.0.[2-3]", "127.0.0.2"},
  };
  for (const auto& [list, first] : cases) EXPECT_EQ(first_host(list), first) << list;
}

TEST(Slurm, ThePortDependsOnTheJobAndTheStep) {
  EXPECT_EQ(slurm_port("123456", "0"), slurm_port("123456", "0"));
  EXPECT_NE(slurm_port("123456", "0"), slurm_port("123457", "0"));
  EXPECT_NE(slurm_port("123456", ""), slurm_port("123456", "0"));
  std::set<int> ports;  // the steps of one job may run at once on the same nodes
  for (int step = 0; step < 200; ++step) ports.insert(slurm_port("77", std::to_string(step)));
  EXPECT_EQ(ports.size(), 200u);
  for (const char* id : {"1", "99999", "7777777"}) {
    for (const char* step : {"", "0", "12766"}) {
      EXPECT_GE(slurm_port(id, step), 20000);
      EXPECT_LT(slurm_port(id, step), 32768) << "outside the ephemeral ports";
    }
  }
}

// What srun gives a task of step 3 running on the second and third nodes of a 3-node job (as Slurm
// 22.05 sets it: SLURM_NNODES and SLURM_NODEID are the step's, SLURM_NODELIST the job's).
class SlurmEnvironment : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const auto& [name, value] : kStep) ::setenv(name, value, 1);
  }
  void TearDown() override {
    for (const auto& [name, value] : kStep) ::unsetenv(name);
  }
  // The batch script of the same job: no step, the job's shape, on its first node.
  void become_batch_script() {
    for (const char* name :
         {"SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES"}) {
      ::unsetenv(name);
    }
    ::setenv("SLURM_NNODES", "3", 1);
    ::setenv("SLURM_NODEID", "0", 1);
    ::setenv("SLURMD_NODENAME", "trn04", 1);
  }
  CliOutcome parse(std::vector<std::string> args) {
    args.insert(args.end(), {"--no-python", "/bin/true"});
    std::ostringstream out;
    return parse_command_line(args, out, err_);
  }
  static constexpr std::pair<const char*, const char*> kStep[] = {
      {"SLURM_JOB_ID", "4242"},
      {"SLURM_JOBID", "4242"},
      {"SLURM_STEP_ID", "3"},
      {"SLURM_STEPID", "3"},
      {"SLURM_JOB_NODELIST", "trn[04-06]"},
      {"SLURM_NODELIST", "trn[04-06]"},
      {"SLURM_JOB_NUM_NODES", "3"},
      {"SLURM_STEP_NODELIST", "trn[05-06]"},
      {"SLURM_STEP_NUM_NODES", "2"},
      {"SLURM_NNODES", "2"},
      {"SLURM_NODEID", "1"},
      {"SLURM_LOCALID", "0"},
      {"SLURMD_NODENAME", "trn06"},
  };
  std::ostringstream err_;
};

TEST_F(SlurmEnvironment, TheStepGivesTheShapeMasterPortRunIdAndHostName) {
  const auto o = parse({});
  ASSERT_FALSE(o.exit_now) << err_.str();
  EXPECT_EQ(o.config.max_nodes, 2);
  EXPECT_EQ(o.config.node_rank, 1);
  EXPECT_EQ(o.config.master_addr, "trn05") << "the step's first node, not the job's";
  EXPECT_EQ(o.config.master_port, slurm_port("4242", "3"));
  EXPECT_EQ(o.config.run_id, "slurm-4242.3");
  EXPECT_EQ(o.config.local_addr, "trn06");
}

TEST_F(SlurmEnvironment, WithoutTheStepsNodeListTheJobsIsUsed) {
  ::unsetenv("SLURM_STEP_NODELIST");
  ::unsetenv("SLURM_STEP_NUM_NODES");
  const auto o = parse({});
  ASSERT_FALSE(o.exit_now) << err_.str();
  EXPECT_EQ(o.config.master_addr, "trn04");
  EXPECT_EQ(o.config.max_nodes, 2);  // SLURM_NNODES, which srun sets to the step's
}

TEST_F(SlurmEnvironment, FlagsWin) {
  const auto o = parse({"--nnodes", "1", "--node-rank", "0", "--master-addr", "10.1.1.1",
                        "--rdzv-id", "mine", "--local-addr", "ib-trn06"});
  ASSERT_FALSE(o.exit_now) << err_.str();
  EXPECT_EQ(o.config.max_nodes, 1);
  EXPECT_EQ(o.config.node_rank, 0);
  EXPECT_EQ(o.config.master_addr, "10.1.1.1");
  EXPECT_EQ(o.config.run_id, "mine");
  EXPECT_EQ(o.config.local_addr, "ib-trn06");
}

TEST_F(SlurmEnvironment, AnExtraTaskOnANodeExitsZeroSayingWhy) {
  ::setenv("SLURM_LOCALID", "1", 1);
  const auto o = parse({"--nproc-per-node", "2"});
  EXPECT_TRUE(o.exit_now);
  EXPECT_EQ(o.exit_code, kExitOk);
  EXPECT_NE(err_.str().find("Slurm task 1 of node trn06 exits"), std::string::npos) << err_.str();
  EXPECT_NE(err_.str().find("srun --ntasks-per-node=1"), std::string::npos) << err_.str();
}

TEST_F(SlurmEnvironment, AnExtraTaskWithItsOwnNodeRankRuns) {
  ::setenv("SLURM_LOCALID", "1", 1);
  const auto o = parse({"--node-rank", "1"});
  EXPECT_FALSE(o.exit_now) << err_.str();
}

TEST_F(SlurmEnvironment, AMultiNodeBatchScriptIsAnErrorAtOnce) {
  become_batch_script();
  const auto o = parse({"--nproc-per-node", "2"});
  EXPECT_TRUE(o.exit_now);
  EXPECT_EQ(o.exit_code, kExitUsage);
  const std::string e = err_.str();
  EXPECT_NE(e.find("Slurm job 4242 has 3 nodes"), std::string::npos) << e;
  EXPECT_NE(e.find("no SLURM_STEP_ID"), std::string::npos) << e;
  EXPECT_NE(e.find("srun --ntasks-per-node=1 dist-launch"), std::string::npos) << e;
  EXPECT_EQ(std::count(e.begin(), e.end(), '\n'), 1) << e;
}

TEST_F(SlurmEnvironment, SlurmsOwnStepsAreNotTaskSteps) {
  become_batch_script();
  ::setenv("SLURM_STEP_ID", "4294967290", 1);  // the interactive step of salloc
  const auto o = parse({});
  EXPECT_TRUE(o.exit_now);
  EXPECT_NE(err_.str().find("no SLURM_STEP_ID"), std::string::npos) << err_.str();
}

TEST_F(SlurmEnvironment, TheBatchScriptMayRunOneNodeOrElasticOrStandalone) {
  become_batch_script();
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--nnodes", "1"},
        {"--nnodes", "1:3", "--rdzv-endpoint", "trn04:29400"},
        {"--standalone"}}) {
    SCOPED_TRACE(args.front() + " " + args.back());
    const auto o = parse(args);
    ASSERT_FALSE(o.exit_now) << err_.str();
    EXPECT_EQ(o.config.run_id.rfind("slurm-4242", 0) == 0, args.back() != "--standalone");
  }
  ::setenv("SLURM_JOB_NUM_NODES", "1", 1);  // a one-node job needs no srun either
  ::setenv("SLURM_JOB_NODELIST", "trn04", 1);
  const auto o = parse({});
  ASSERT_FALSE(o.exit_now) << err_.str();
  EXPECT_EQ(o.config.max_nodes, 1);
  EXPECT_EQ(o.config.run_id, "slurm-4242");
}

TEST_F(SlurmEnvironment, AMalformedVariableIsAOneLineError) {
  ::setenv("SLURM_STEP_NUM_NODES", "two", 1);
  const auto o = parse({});
  EXPECT_TRUE(o.exit_now);
  EXPECT_EQ(o.exit_code, kExitUsage);
  EXPECT_NE(err_.str().find("SLURM_STEP_NUM_NODES='two'"), std::string::npos) << err_.str();
}

// A child process named `name` sends `signal` to this process; what sent_by_slurm_step says of it.
bool signal_from_process_named(const char* name, int signal) {
  sigset_t set, old;
  sigemptyset(&set);
  sigaddset(&set, signal);
  ::sigprocmask(SIG_BLOCK, &set, &old);
  const pid_t parent = ::getpid();
  int ready[2];
  EXPECT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(ready[1]);
    ::prctl(PR_SET_NAME, name);
    ::kill(parent, signal);
    char byte = 0;
    [[maybe_unused]] ssize_t n = ::read(ready[0], &byte, 1);  // alive until the parent has looked
    ::_exit(0);
  }
  siginfo_t info{};
  ::sigwaitinfo(&set, &info);
  const bool verdict = agent::sent_by_slurm_step(info);
  EXPECT_EQ(info.si_pid, child);
  ::close(ready[1]);
  ::close(ready[0]);
  ::waitpid(child, nullptr, 0);
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
  return verdict;
}

TEST(SignalOrigin, OnlyAKillBySlurmstepdCounts) {
  EXPECT_TRUE(signal_from_process_named("slurmstepd", SIGTERM));
  EXPECT_FALSE(signal_from_process_named("bash", SIGTERM));
  EXPECT_FALSE(signal_from_process_named("slurmstepd-ish", SIGTERM));
  EXPECT_FALSE(agent::sent_by_slurm_step(SI_KERNEL, 1)) << "not a kill()";
  EXPECT_FALSE(agent::sent_by_slurm_step(SI_USER, 0)) << "from outside this pid namespace";
  EXPECT_EQ(agent::process_command_name(::getpid()).empty(), false);
}

}  // namespace
}  // namespace dist::launcher
