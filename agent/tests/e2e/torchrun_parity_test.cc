// torchrun 2.x's command line, end to end: the real dist-launch binary, real workers
// (dist-test-worker) and their real output, environment and store.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "launch_fixture.h"

namespace {

using namespace dist::agent::testing;

std::string read_file(const fs::path& file) {
  std::ifstream in(file);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The console lines that are the workers' (the agent's own messages left out).
std::vector<std::string> worker_lines(const std::string& output) {
  std::vector<std::string> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("[dist-launch]")) lines.push_back(line);
  }
  return lines;
}

bool has_line(const std::string& output, const std::string& line) {
  const auto lines = worker_lines(output);
  return std::find(lines.begin(), lines.end(), line) != lines.end();
}

class TorchrunParityTest : public LaunchTest {};

// torchrun: a stream both redirected and tee'd is tee'd (file and console), whatever the order.
TEST_F(TorchrunParityTest, RedirectsAndTeeTogetherStillReachTheConsole) {
  Launch launch({"--nproc-per-node", "2", "--log-dir", path("logs"), "--rdzv-id", "both",
                 "--redirect=3", "--tee=3", "--no-python", kWorker, "lines", "2"});
  ASSERT_EQ(launch.wait(), 0) << launch.output();
  const std::string out = launch.output();
  for (const char* line :
       {"[default0]:out line 1 of rank 0 end", "[default1]:err line 1 of rank 1 end"}) {
    EXPECT_TRUE(has_line(out, line)) << line << "\n" << out;
  }
  const auto dirs = run_dirs(path("logs"), "both");
  ASSERT_EQ(dirs.size(), 1u);
  EXPECT_EQ(read_file(dirs[0] / "attempt_0" / "1" / "stderr.log"),
            "err line 0 of rank 1 end\nerr line 1 of rank 1 end\n");
}

TEST_F(TorchrunParityTest, ThePrefixTemplateComesFromTheFlagOrTorchelasticsVariable) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  {
    Launch launch({"--nproc-per-node", "2", "--log-line-prefix-template",
                   "${hostname}|${role_name}|${rank}|${local_rank}> ", "--role", "trainer",
                   "--no-python", kWorker, "lines", "1"});
    ASSERT_EQ(launch.wait(), 0) << launch.output();
    EXPECT_TRUE(
        has_line(launch.output(), std::string(host) + "|trainer|1|1> out line 0 of rank 1 end"))
        << launch.output();
  }
  Launch launch({"--nproc-per-node", "2", "--no-python", kWorker, "lines", "1"},
                {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[rank${rank}]: "}});
  ASSERT_EQ(launch.wait(), 0) << launch.output();
  EXPECT_TRUE(has_line(launch.output(), "[rank0]: err line 0 of rank 0 end")) << launch.output();
  EXPECT_TRUE(has_line(launch.output(), "[rank1]: out line 0 of rank 1 end")) << launch.output();
}

// --console-prefix tee gives torchrun's console: only tee'd streams carry the prefix.
TEST_F(TorchrunParityTest, ConsolePrefixTeeLeavesStreamsThatAreNotTeedUnprefixed) {
  Launch plain(
      {"--nproc-per-node", "1", "--console-prefix", "tee", "--no-python", kWorker, "lines", "1"});
  ASSERT_EQ(plain.wait(), 0) << plain.output();
  EXPECT_TRUE(has_line(plain.output(), "out line 0 of rank 0 end")) << plain.output();
  EXPECT_TRUE(has_line(plain.output(), "err line 0 of rank 0 end")) << plain.output();

  // (Its tee'd log is kept, as a run whose logs were written is: in the test's directory.)
  Launch teed({"--nproc-per-node", "1", "--console-prefix", "tee", "--tee", "1", "--no-python",
               kWorker, "lines", "1"},
              {{"TMPDIR", path("")}});
  ASSERT_EQ(teed.wait(), 0) << teed.output();
  EXPECT_TRUE(has_line(teed.output(), "[default0]:out line 0 of rank 0 end")) << teed.output();
  EXPECT_TRUE(has_line(teed.output(), "err line 0 of rank 0 end")) << teed.output();
}

// The tee'd lines that hold a filter string, of every local rank, prefixed, in one file per
// attempt; a ',,' is a comma.
TEST_F(TorchrunParityTest, DuplicateFiltersCopyTheMatchingTeedLinesOfEveryRank) {
  Launch launch({"--nproc-per-node", "2", "--log-dir", path("logs"), "--rdzv-id", "dup", "--tee",
                 "3", "--duplicate-stdout-filters", "line 1 ,line 2,,",
                 "--duplicate-stderr-filters", "rank 1", "--no-python", kWorker, "lines", "3",
                 "write", "line 2, with a comma\n"});
  ASSERT_EQ(launch.wait(), 0) << launch.output();
  const auto dirs = run_dirs(path("logs"), "dup");
  ASSERT_EQ(dirs.size(), 1u);
  std::istringstream out(read_file(dirs[0] / "attempt_0" / "filtered_stdout.log"));
  std::multiset<std::string> lines;
  for (std::string line; std::getline(out, line);) lines.insert(line);
  EXPECT_EQ(lines, (std::multiset<std::string>{
                       "[default0]:out line 1 of rank 0 end", "[default1]:out line 1 of rank 1 end",
                       "[default0]:line 2, with a comma", "[default1]:line 2, with a comma"}));
  std::istringstream err(read_file(dirs[0] / "attempt_0" / "filtered_stderr.log"));
  int rank1_lines = 0;
  for (std::string line; std::getline(err, line); ++rank1_lines) {
    EXPECT_TRUE(line.starts_with("[default1]:err line ")) << line;
  }
  EXPECT_EQ(rank1_lines, 3);
}

TEST_F(TorchrunParityTest, WorkersSeeTheSignalsToHandle) {
  Launch launch({"--nproc-per-node", "1", "--signals-to-handle", "SIGTERM,SIGUSR1,SIGUSR2",
                 "--no-python", kWorker, "env", path("env")});
  ASSERT_EQ(launch.wait(), 0) << launch.output();
  EXPECT_EQ(read_env(path("env"))["TORCHELASTIC_SIGNALS_TO_HANDLE"], "SIGTERM,SIGUSR1,SIGUSR2");
  Launch defaults({"--nproc-per-node", "1", "--no-python", kWorker, "env", path("env_default")});
  ASSERT_EQ(defaults.wait(), 0) << defaults.output();
  EXPECT_EQ(read_env(path("env_default"))["TORCHELASTIC_SIGNALS_TO_HANDLE"],
            "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
}

// Port 0 is a free port, bound by the agent: the workers get the real one and reach the store
// there, statically and with the c10d backend on one node.
TEST_F(TorchrunParityTest, PortZeroIsAFreePortTheWorkersCanReach) {
  const std::vector<std::vector<std::string>> ways = {
      {"--master-port", "0"},
      {"--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0"},
      {"--nnodes", "1:1", "--rdzv-endpoint", "localhost:0"},
  };
  for (std::size_t i = 0; i < ways.size(); ++i) {
    SCOPED_TRACE(ways[i][1]);
    std::vector<std::string> args = ways[i];
    const std::string env_file = path("env_" + std::to_string(i) + "_${local_rank}");
    args.insert(args.end(), {"--nproc-per-node", "2", "--no-python", kWorker, "env", env_file,
                             "connect-master"});
    Launch launch(args);
    ASSERT_EQ(launch.wait(), 0) << launch.output();
    const auto env0 = read_env(path("env_" + std::to_string(i) + "_0"));
    const auto env1 = read_env(path("env_" + std::to_string(i) + "_1"));
    EXPECT_NE(env0.at("MASTER_PORT"), "0");
    EXPECT_EQ(env0.at("MASTER_PORT"), env1.at("MASTER_PORT"));
  }
}

TEST_F(TorchrunParityTest, ASingleWorkersSuccessIsSaidInTheSingular) {
  Launch one({"--nproc-per-node", "1", "--no-python", kWorker});
  ASSERT_EQ(one.wait(), 0) << one.output();
  EXPECT_NE(one.output().find("the worker of this node succeeded"), std::string::npos)
      << one.output();
  Launch two({"--nproc-per-node", "2", "--no-python", kWorker});
  ASSERT_EQ(two.wait(), 0) << two.output();
  EXPECT_NE(two.output().find("all 2 workers of this node succeeded"), std::string::npos)
      << two.output();
}

TEST_F(TorchrunParityTest, ANonExecutableScriptIsSaidToBeNotExecutable) {
  std::ofstream(path("job.sh")) << "#!/bin/sh\necho hi\n";
  ::chmod(path("job.sh").c_str(), 0644);
  Launch launch({"--no-python", path("job.sh")});
  EXPECT_EQ(launch.wait(), 2);
  EXPECT_NE(launch.output().find("'" + path("job.sh") + "' is not executable (chmod +x it"),
            std::string::npos)
      << launch.output();
}

// What torchrun reports as an unknown option is one here too, not a training script.
TEST_F(TorchrunParityTest, AnUnknownOptionIsNamedWithTheSpellingItResembles) {
  Launch launch({"--nprocs-per-node", "2", "--no-python", kWorker});
  EXPECT_EQ(launch.wait(), 2);
  const std::string out = launch.output();
  EXPECT_NE(out.find("unknown option '--nprocs-per-node': did you mean --nproc-per-node?"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("not found"), std::string::npos) << out;
}

}  // namespace
