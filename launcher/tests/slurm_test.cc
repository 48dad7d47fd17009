// Slurm's environment fills what the command line leaves out.
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>

#include "dist/launcher/cli.h"
#include "dist/launcher/slurm.h"

namespace dist::launcher {
namespace {

TEST(Slurm, FirstHostOfANodeList) {
  const std::pair<const char*, const char*> cases[] = {
      {"node1", "node1"},        {"gpu[07-09,12],cpu1", "gpu07"},
      {"a[3,5]", "a3"},          {"rack1-node[001-128]", "rack1-node001"},
      {"x[10-11]-ib", "x10-ib"}, {"solo,other[1-2]", "solo"},
  };
  for (const auto& [list, first] : cases) EXPECT_EQ(first_host(list), first) << list;
}

TEST(Slurm, ThePortDependsOnlyOnTheJob) {
  EXPECT_EQ(slurm_port("123456"), slurm_port("123456"));
  EXPECT_NE(slurm_port("123456"), slurm_port("123457"));
  for (const char* id : {"1", "99999", "7777777"}) {
    EXPECT_GE(slurm_port(id), 20000);
    EXPECT_LT(slurm_port(id), 60000);
  }
}

class SlurmEnvironment : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("SLURM_JOB_NODELIST", "trn[04-05]", 1);
    ::setenv("SLURM_NNODES", "2", 1);
    ::setenv("SLURM_NODEID", "1", 1);
    ::setenv("SLURM_JOB_ID", "4242", 1);
  }
  void TearDown() override {
    for (const char* v : {"SLURM_JOB_NODELIST", "SLURM_NNODES", "SLURM_NODEID", "SLURM_JOB_ID"}) {
      ::unsetenv(v);
    }
  }
  CliOutcome parse(std::vector<std::string> args) {
    args.insert(args.end(), {"--no-python", "/bin/true"});
    std::ostringstream out;
    return parse_command_line(args, out, err_);
  }
  std::ostringstream err_;
};

TEST_F(SlurmEnvironment, FillsTheJobShapeWhenTheFlagsAreAbsent) {
  const auto o = parse({});
  ASSERT_FALSE(o.exit_now) << err_.str();
  EXPECT_EQ(o.config.max_nodes, 2);
  EXPECT_EQ(o.config.node_rank, 1);
  EXPECT_EQ(o.config.master_addr, "trn04");
  EXPECT_EQ(o.config.master_port, slurm_port("4242"));
  EXPECT_EQ(o.config.run_id, "slurm-4242");
}

TEST_F(SlurmEnvironment, FlagsWin) {
  const auto o = parse(
      {"--nnodes", "1", "--node-rank", "0", "--master-addr", "10.1.1.1", "--rdzv-id", "mine"});
  ASSERT_FALSE(o.exit_now) << err_.str();
  EXPECT_EQ(o.config.max_nodes, 1);
  EXPECT_EQ(o.config.node_rank, 0);
  EXPECT_EQ(o.config.master_addr, "10.1.1.1");
  EXPECT_EQ(o.config.run_id, "mine");
}

TEST_F(SlurmEnvironment, AMalformedVariableIsAOneLineError) {
  ::setenv("SLURM_NNODES", "two", 1);
  const auto o = parse({});
  EXPECT_TRUE(o.exit_now);
  EXPECT_EQ(o.exit_code, kExitUsage);
  EXPECT_NE(err_.str().find("SLURM_NNODES='two'"), std::string::npos) << err_.str();
}

}  // namespace
}  // namespace dist::launcher
