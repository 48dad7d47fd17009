// Several agents on one machine forming one static job: node 0 hosts the store on --master-addr
// (127.0.0.2 here, a distinct loopback address), the others connect to it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "dist/store/client.h"
#include "dist/store/token.h"
#include "process_helpers.h"
#include "programs.h"
#include "test_ports.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const std::string kWorker = DIST_TEST_WORKER_BIN;
const std::string kMaster = "127.0.0.2";

class Agent : public dist::agent::testing::Child {
 public:
  Agent(const fs::path& log, std::vector<std::string> args)
      : Child(DIST_LAUNCH_BIN, std::move(args), log) {}
};

class MultiNode : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dist-multinode-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    port_ = dist::agent::testing::free_port(kMaster);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<Agent> node(int nnodes, int rank, int nproc, std::vector<std::string> extra,
                              std::vector<std::string> worker, std::string log = "") {
    std::vector<std::string> args{"--nnodes",           std::to_string(nnodes), "--node-rank",
                                  std::to_string(rank), "--master-addr",        kMaster,
                                  "--master-port",      std::to_string(port_),  "--nproc-per-node",
                                  std::to_string(nproc)};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("--no-python");
    args.push_back(kWorker);
    args.insert(args.end(), worker.begin(), worker.end());
    if (log.empty()) log = "node" + std::to_string(rank) + ".log";
    return std::make_unique<Agent>(dir_ / log, args);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // How many lines `file` has (0 when it is not there yet).
  static int count_lines(const std::string& file) {
    std::ifstream in(file);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) ++n;
    return n;
  }
  std::map<std::string, std::string> env(const std::string& file) const {
    std::map<std::string, std::string> e;
    std::ifstream in(path(file));
    std::string line;
    while (std::getline(in, line)) {
      const auto eq = line.find('=');
      if (eq != std::string::npos) e[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return e;
  }

  fs::path dir_;
  int port_ = 0;
};

TEST_F(MultiNode, ThreeNodesStartedOutOfOrderGetContiguousUniqueRanks) {
  // Node k runs k + 1 workers: global ranks are contiguous per node, in node-rank order.
  std::vector<std::unique_ptr<Agent>> agents;
  for (int k : {2, 0, 1}) {
    agents.push_back(
        node(3, k, k + 1, {}, {"env", path("env_" + std::to_string(k) + "_${local_rank}")}));
  }
  for (auto& a : agents) ASSERT_EQ(a->wait(), 0) << a->output();
  std::set<int> ranks;
  int expected = 0;
  for (int k = 0; k < 3; ++k) {
    for (int local = 0; local <= k; ++local, ++expected) {
      auto e = env("env_" + std::to_string(k) + "_" + std::to_string(local));
      SCOPED_TRACE("node " + std::to_string(k) + " local rank " + std::to_string(local));
      EXPECT_EQ(e["RANK"], std::to_string(expected));
      EXPECT_EQ(e["WORLD_SIZE"], "6");
      EXPECT_EQ(e["GROUP_RANK"], std::to_string(k));
      EXPECT_EQ(e["GROUP_WORLD_SIZE"], "3");
      EXPECT_EQ(e["LOCAL_WORLD_SIZE"], std::to_string(k + 1));
      EXPECT_EQ(e["MASTER_ADDR"], kMaster);
      EXPECT_EQ(e["MASTER_PORT"], std::to_string(port_));
      ranks.insert(std::stoi(e["RANK"]));
    }
  }
  EXPECT_EQ(ranks.size(), 6u);
}

TEST_F(MultiNode, AFailureOnOneNodeRestartsEveryNodeWithOneJobWideCount) {
  std::vector<std::unique_ptr<Agent>> agents;
  for (int k : {0, 1}) {
    agents.push_back(node(2, k, 2, {"--max-restarts", "1"},
                          {"env", path("env_" + std::to_string(k) + "_${local_rank}"), "crash-if",
                           path(""), "3", "0", "sleep-if-attempt", "0", "30000"}));
  }
  for (auto& a : agents) ASSERT_EQ(a->wait(), 0) << a->output();
  for (const char* f : {"env_0_0", "env_0_1", "env_1_0", "env_1_1"}) {
    EXPECT_EQ(env(f)["TORCHELASTIC_RESTART_COUNT"], "1") << f;
  }
  EXPECT_NE(agents[0]->output().find("a worker on another node failed"), std::string::npos)
      << agents[0]->output();
}

TEST_F(MultiNode, RestartsAreBoundedForTheWholeJobAndEveryNodeReportsTheRootCause) {
  // Rank 3 (node 1) fails on every attempt: one restart in all, then every node fails with its
  // code.
  std::vector<std::unique_ptr<Agent>> agents;
  for (int k : {0, 1}) {
    agents.push_back(node(2, k, 2, {"--max-restarts", "1"},
                          {"env", path("env_" + std::to_string(k) + "_${local_rank}"),
                           "exit-if-rank", "3", "5", "sleep", "30000"}));
  }
  for (auto& a : agents) {
    EXPECT_EQ(a->wait(), 5) << a->output();
    const std::string out = a->output();
    EXPECT_NE(out.find("Root Cause"), std::string::npos) << out;
    EXPECT_NE(out.find("rank      : 3 (local_rank: 1)"), std::string::npos) << out;
    EXPECT_NE(out.find("(node 1)"), std::string::npos) << out;
    EXPECT_NE(out.find("restarting the worker group (restart 1 of 1)"), std::string::npos) << out;
    EXPECT_EQ(out.find("restart 2"), std::string::npos) << out;
  }
}

// Node 1's worker is done at once; node 0's takes 4 s (rank 0 evaluating, say); node 1 waits 1 s
// at most, then leaves with its success, as torchrun's agent does (it used to exit 1, and node 0
// took it for lost and restarted the healthy job). Node 0, which serves the store, would wait on
// past the timeout (below).
TEST_F(MultiNode, ANodeWhoseExitBarrierTimesOutLeavesWithItsSuccessAndTheOthersRunOn) {
  const std::string runs = path("runs");
  auto slow = node(2, 0, 1, {"--exit-barrier-timeout", "1"}, {"append", runs, "sleep", "4000"});
  auto fast = node(2, 1, 1, {"--exit-barrier-timeout", "1"}, {"append", runs, "exit", "0"});
  const auto start = Clock::now();
  EXPECT_EQ(fast->wait(20s), 0) << fast->output();
  EXPECT_LT(Clock::now() - start, 4s) << "the fast node did not wait for the slow one";
  EXPECT_NE(fast->output().find("not every node finished within 1 s (--exit-barrier-timeout)"),
            std::string::npos)
      << fast->output();
  EXPECT_EQ(slow->wait(20s), 0) << slow->output();
  EXPECT_EQ(slow->output().find("lost"), std::string::npos) << slow->output();
  std::ifstream in(runs);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) ++lines;
  EXPECT_EQ(lines, 2) << "each worker ran once";
}

// Node 0, whose worker is done at once, serves the job's store: past its barrier's timeout it
// says why it stays, and waits for node 1's worker (3 s).
TEST_F(MultiNode, TheStoresHostWaitsOnPastItsExitBarrierTimeout) {
  auto host = node(2, 0, 1, {"--exit-barrier-timeout", "1"}, {"exit", "0"});
  auto slow = node(2, 1, 1, {"--exit-barrier-timeout", "1"}, {"sleep", "3000"});
  EXPECT_EQ(slow->wait(20s), 0) << slow->output();
  EXPECT_EQ(host->wait(20s), 0) << host->output();
  EXPECT_NE(host->output().find("serves a store the others still use"), std::string::npos)
      << host->output();
}

// Static: node 1's agent is lost (SIGKILL) while node 0, its worker done, waits at its exit
// barrier, with no failure said: node 0's is the only node still there and it succeeded, so the
// job is done and node 0 leaves with 0, as torchrun's would. It used to restart the finished job
// (and wait its rendezvous timeout for node 1).
TEST_F(MultiNode, ANodeLostWhileTheOtherWaitsAtItsExitBarrierLeavesTheJobDone) {
  const std::string runs = path("runs");
  const auto lines = [&] { return count_lines(runs); };
  auto done = node(2, 0, 1, {"--max-restarts", "3"}, {"append", runs, "exit", "0"});
  auto lost = node(2, 1, 1, {"--max-restarts", "3"}, {"append", runs, "forever"});
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] {  // (and node 1's worker started)
        return done->output().find("at the exit barrier") != std::string::npos && lines() == 2;
      },
      60s))
      << done->output() << lost->output();
  ::kill(lost->pid(), SIGKILL);
  EXPECT_EQ(lost->wait(), 128 + SIGKILL);
  EXPECT_EQ(done->wait(30s), 0) << done->output();
  EXPECT_NE(done->output().find("node(s) [1] lost at the exit barrier"), std::string::npos)
      << done->output();
  EXPECT_EQ(done->output().find("restarting"), std::string::npos) << done->output();
  EXPECT_EQ(lines(), 2) << "each worker ran once";
}

// Static: node 1's worker succeeded and its agent is lost at the exit barrier while node 0's
// worker still runs (rank 0 evaluating, say). Node 1's agent relaunched (Slurm's --requeue, a
// supervisor) takes its place at the barrier and runs nothing; node 0's worker runs on to its end,
// and both nodes exit 0. The relaunch used to abort the round: node 0's healthy worker was stopped
// and the job ran again on both nodes.
TEST_F(MultiNode, ANodeRelaunchedAfterItsWorkersSucceededWaitsAtTheBarrierAndTheJobRunsOn) {
  const std::string runs = path("runs"), go = path("go");
  const auto lines = [&] { return count_lines(runs); };
  const std::vector<std::string> conf{"--max-restarts", "3"};
  auto running = node(2, 0, 1, conf, {"append", runs, "wait-file", go});
  auto lost = node(2, 1, 1, conf, {"append", runs, "exit", "0"});
  // The job's keys, as node 0's store holds them (under the job's prefix).
  dist::store::ClientOptions options;
  options.host = kMaster;
  options.port = port_;
  options.connect_timeout = 30s;  // (node 0 may not listen yet)
  auto store = dist::store::StoreClient::connect(options);
  const auto key_ending = [&](const std::string& tail) -> std::optional<std::string> {
    for (const auto& key : store.list_keys()) {
      if (key.size() >= tail.size() &&
          key.compare(key.size() - tail.size(), tail.size(), tail) == 0)
        return key;
    }
    return std::nullopt;
  };
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] {  // node 1 counted at its barrier, node 0's worker started
        const auto at_barrier = key_ending("/r0/at_barrier/1");
        return at_barrier && store.try_get(*at_barrier) == "counted" && lines() == 2;
      },
      60s))
      << running->output() << lost->output();
  ::kill(lost->pid(), SIGKILL);
  EXPECT_EQ(lost->wait(), 128 + SIGKILL);
  ASSERT_TRUE(dist::agent::testing::eventually([&] { return !key_ending("/alive/1"); }, 30s));
  auto again = node(2, 1, 1, conf, {"append", runs, "exit", "0"}, "node1-again.log");
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] {
        return again->output().find("that agent's place at the barrier") != std::string::npos;
      },
      60s))
      << again->output() << running->output();
  { std::ofstream(go) << "1"; }
  EXPECT_EQ(running->wait(30s), 0) << running->output();
  EXPECT_EQ(again->wait(30s), 0) << again->output();
  for (const auto* agent : {running.get(), again.get()}) {
    EXPECT_EQ(agent->output().find("restarting"), std::string::npos) << agent->output();
    EXPECT_EQ(agent->output().find("aborting"), std::string::npos) << agent->output();
  }
  EXPECT_EQ(lines(), 2) << "each worker ran once";
}

TEST_F(MultiNode, ANodeThatNeverArrivesIsATimeoutNamingIt) {
  auto lonely = node(2, 0, 1, {"--rdzv-conf", "timeout=1"}, {"exit", "0"});
  EXPECT_EQ(lonely->wait(), 1);
  const std::string out = lonely->output();
  EXPECT_NE(out.find("nodes seen [0], missing [1]"), std::string::npos) << out;
}

// A node started with another token than node 0's: it leaves at once, saying so; node 0, which
// hosts the store, waits for it, then says the refused connections beside the missing node (its
// own machine's log is not where node 1's user looks).
TEST_F(MultiNode, ANodeWithAnotherTokenIsSaidByTheNodeThatWaitedForIt) {
  dist::store::write_secret_file(path("token0"), "the-jobs-token");
  dist::store::write_secret_file(path("token1"), "another-token");
  auto host =
      node(2, 0, 1, {"--rdzv-conf", "timeout=10", "--token-file", path("token0")}, {"exit", "0"});
  auto stranger =
      node(2, 1, 1, {"--rdzv-conf", "timeout=10", "--token-file", path("token1")}, {"exit", "0"});
  EXPECT_EQ(stranger->wait(), 1) << stranger->output();
  EXPECT_NE(stranger->output().find("token is not the store's"), std::string::npos)
      << stranger->output();
  EXPECT_EQ(host->wait(), 1) << host->output();
  const std::string out = host->output();
  EXPECT_NE(out.find("missing [1]"), std::string::npos) << out;
  EXPECT_NE(out.find("this node's store refused"), std::string::npos) << out;
  EXPECT_NE(out.find("give every node's agent the same --token-file"), std::string::npos) << out;
}

TEST_F(MultiNode, ANodeRankGivenTwiceIsRejected) {
  auto first = node(2, 0, 1, {"--rdzv-conf", "timeout=5"}, {"sleep", "3000"});
  auto second = node(2, 1, 1, {"--rdzv-conf", "timeout=5"}, {"sleep", "3000"});
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] { return second->output().find("round 0: node 1 of 2") != std::string::npos; }, 30s))
      << second->output();
  // A second agent given node rank 1 while the first one's agent lives is refused, naming the
  // agent that holds it; the job goes on.
  auto impostor = std::make_unique<Agent>(
      dir_ / "impostor.log",
      std::vector<std::string>{"--nnodes", "2", "--node-rank", "1", "--master-addr", kMaster,
                               "--master-port", std::to_string(port_), "--rdzv-conf", "timeout=5",
                               "--no-python", kWorker, "sleep", "100"});
  EXPECT_EQ(impostor->wait(), 1) << impostor->output();
  EXPECT_NE(impostor->output().find("node rank 1 joined twice"), std::string::npos)
      << impostor->output();
  EXPECT_NE(impostor->output().find("give every node its own --node-rank"), std::string::npos);
  EXPECT_EQ(second->wait(), 0) << second->output();
  EXPECT_EQ(first->wait(), 0) << first->output();
}

TEST_F(MultiNode, SigkillOfOneAgentStopsTheOthersAndLeavesNoWorker) {
  std::vector<std::unique_ptr<Agent>> agents;
  for (int k : {0, 1}) {
    agents.push_back(node(2, k, 1, {"--rdzv-conf", "timeout=2"},
                          {"pidfile", path("pid_" + std::to_string(k)), "forever"}));
  }
  ASSERT_GT(dist::agent::testing::written_pid(path("pid_0"), 20s), 0);
  const pid_t worker1 = dist::agent::testing::written_pid(path("pid_1"), 20s);
  ASSERT_GT(worker1, 0);
  const auto killed = Clock::now();
  ::kill(agents[1]->pid(), SIGKILL);
  EXPECT_EQ(agents[1]->wait(), 128 + SIGKILL);
  EXPECT_NE(agents[0]->wait(30s), 0) << agents[0]->output();
  EXPECT_LT(Clock::now() - killed, 10s) << "the survivor noticed the dead node at once";
  EXPECT_NE(agents[0]->output().find("node 1's agent is gone"), std::string::npos)
      << agents[0]->output();
  EXPECT_TRUE(dist::agent::testing::process_gone(worker1)) << "node 1's worker outlived its agent";
}

}  // namespace

namespace {

std::pair<int, std::string> run_status(const std::string& args) {
  return dist::agent::testing::run_command(std::string(DIST_LAUNCH_BIN) + " status " + args);
}

TEST_F(MultiNode, StatusShowsTheNodesOfARunningJob) {
  std::vector<std::unique_ptr<Agent>> agents;
  for (int k : {0, 1}) {
    agents.push_back(node(2, k, 2, {"--rdzv-id", "job7"},
                          {"pidfile", path("pid_" + std::to_string(k)), "sleep", "3000"}));
  }
  const auto deadline = Clock::now() + 20s;
  while ((!fs::exists(path("pid_0")) || !fs::exists(path("pid_1"))) && Clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  const std::string endpoint = kMaster + ":" + std::to_string(port_);
  auto [code, out] = run_status("--rdzv-endpoint " + endpoint + " --rdzv-id job7");
  for (int i = 0; i < 100 && out.find(" s ago") == std::string::npos; ++i) {  // first heartbeats
    std::this_thread::sleep_for(20ms);
    std::tie(code, out) = run_status("--rdzv-endpoint " + endpoint + " --rdzv-id job7");
  }
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("(static): round 0, restarts so far 0, 2 node(s), running"), std::string::npos)
      << out;
  EXPECT_NE(out.find(" s ago"), std::string::npos) << "heartbeats: " << out;
  EXPECT_NE(out.find("0..1"), std::string::npos) << out;
  EXPECT_NE(out.find("2..3"), std::string::npos) << out;
  const auto [missing_code, missing] =
      run_status("--rdzv-endpoint " + kMaster + ":" + std::to_string(port_) + " --rdzv-id other");
  EXPECT_EQ(missing_code, 1);
  EXPECT_NE(missing.find("no job 'other'"), std::string::npos) << missing;
  for (auto& a : agents) EXPECT_EQ(a->wait(), 0) << a->output();
  EXPECT_EQ(run_status("--rdzv-endpoint nowhere").first, 2);
}

}  // namespace
