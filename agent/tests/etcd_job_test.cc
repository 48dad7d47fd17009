// Elastic jobs over a real 3-member etcd (--rdzv-backend etcd-v3): real dist-launch agents, real
// workers, etcd members killed by PID. Workers append one line per round they run in.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "etcd_cluster.h"
#include "process_helpers.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using dist::agent::testing::Child;
using dist::agent::testing::eventually;
using dist::rendezvous::testing::EtcdCluster;

const std::string kWorker = DIST_TEST_WORKER_BIN;

struct RoundSeen {
  int rank, world_size, node_rank, num_nodes, restarts;
  long long start_ns;
};

class EtcdJob : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dist-etcd-job-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    cluster_ = std::make_unique<EtcdCluster>(3);
  }
  void TearDown() override {
    agents_.clear();  // killed and reaped before the cluster goes
    cluster_.reset();
    fs::remove_all(dir_);
  }

  Child& agent(const std::string& name, const std::string& nnodes,
               std::vector<std::string> worker) {
    std::vector<std::string> args{"--nnodes",         nnodes,
                                  "--rdzv-backend",   "etcd-v3",
                                  "--rdzv-endpoint",  cluster_->endpoint_list(),
                                  "--rdzv-id",        "job",
                                  "--rdzv-conf",      "last_call_timeout=1,join_timeout=60",
                                  "--nproc-per-node", "1",
                                  "--local-addr",     "127.0.0.1",
                                  "--no-python",      kWorker,
                                  "append",           history(name)};
    args.insert(args.end(), worker.begin(), worker.end());
    agents_.push_back(
        std::make_unique<Child>(DIST_LAUNCH_BIN, args, dir_ / (name + ".log"),
                                std::map<std::string, std::string>{{"LOGLEVEL", "debug"}}));
    return *agents_.back();
  }

  std::string history(const std::string& name) const {
    return (dir_ / (name + ".rounds")).string();
  }
  std::vector<RoundSeen> rounds(const std::string& name) const {
    std::vector<RoundSeen> seen;
    std::ifstream in(history(name));
    RoundSeen r{};
    while (in >> r.rank >> r.world_size >> r.node_rank >> r.num_nodes >> r.restarts >> r.start_ns) {
      seen.push_back(r);
    }
    return seen;
  }
  bool in_world(const std::vector<std::string>& names, int world_size) const {
    return eventually(
        [&] {
          for (const auto& n : names) {
            const auto r = rounds(n);
            if (r.empty() || r.back().world_size != world_size) return false;
          }
          return true;
        },
        60s);
  }

  fs::path dir_;
  std::unique_ptr<EtcdCluster> cluster_;
  std::vector<std::unique_ptr<Child>> agents_;
};

TEST_F(EtcdJob, AThreeNodeJobRunsOverEtcd) {
  const std::vector<std::string> worker{"exit", "0"};
  auto& a = agent("a", "3:3", worker);
  auto& b = agent("b", "3:3", worker);
  auto& c = agent("c", "3:3", worker);
  std::set<int> ranks, node_ranks;
  for (auto* x : {&a, &b, &c}) EXPECT_EQ(x->wait(), 0) << x->output();
  for (const char* name : {"a", "b", "c"}) {
    const auto r = rounds(name);
    ASSERT_EQ(r.size(), 1u) << name;
    EXPECT_EQ(r[0].world_size, 3);
    ranks.insert(r[0].rank);
    node_ranks.insert(r[0].node_rank);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(node_ranks, (std::set<int>{0, 1, 2}));
}

// The etcd leader is killed while the workers run: the rendezvous goes on through the other
// members, nothing restarts.
TEST_F(EtcdJob, TheLeaderKilledMidJobLeavesTheJobAlone) {
  const std::string go = (dir_ / "go").string();
  const std::vector<std::string> worker{"exit-if-file", go, "0", "forever"};
  auto& a = agent("a", "3:3", worker);
  auto& b = agent("b", "3:3", worker);
  auto& c = agent("c", "3:3", worker);
  ASSERT_TRUE(in_world({"a", "b", "c"}, 3)) << a.output() << b.output() << c.output();
  cluster_->kill(cluster_->leader());
  // Heartbeats go through another member now: give them a few rounds before finishing.
  ASSERT_TRUE(eventually([&] { return cluster_->leader(30s) >= 0; }, 30s));
  std::ofstream(go) << "1\n";
  for (auto* x : {&a, &b, &c}) EXPECT_EQ(x->wait(), 0) << x->output();
  for (const char* name : {"a", "b", "c"}) EXPECT_EQ(rounds(name).size(), 1u) << name;
}

// The node whose agent hosts the workers' store (node rank 0) is killed: the survivors reshape
// into a world of two, with a store of the new node rank 0, and finish.
TEST_F(EtcdJob, TheNodeHostingTheWorkersStoreIsLostAndTheSurvivorsFinish) {
  const std::vector<std::string> worker{"exit-if-world", "2", "0", "forever"};
  const std::vector<std::string> names{"a", "b", "c"};
  for (const auto& n : names) agent(n, "2:3", worker);
  ASSERT_TRUE(in_world(names, 3)) << agents_[0]->output();
  std::size_t hosting = 0;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (rounds(names[i]).back().node_rank == 0) hosting = i;
  }
  ::kill(agents_[hosting]->pid(), SIGKILL);
  agents_[hosting]->wait();
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i == hosting) continue;
    EXPECT_EQ(agents_[i]->wait(60s), 0) << agents_[i]->output();
    const auto r = rounds(names[i]);
    ASSERT_EQ(r.size(), 2u) << names[i];
    EXPECT_EQ(r[1].world_size, 2);
    EXPECT_EQ(r[1].restarts, 0) << "a lost node is a reshape, not a restart";
  }
}

// Two of three members lost: no quorum. The agents say so and stop within a bounded time.
TEST_F(EtcdJob, LosingQuorumIsAClearErrorWithinBoundedTime) {
  const std::vector<std::string> worker{"forever"};
  auto& a = agent("a", "2:2", worker);
  auto& b = agent("b", "2:2", worker);
  ASSERT_TRUE(in_world({"a", "b"}, 2)) << a.output() << b.output();
  const int leader = cluster_->leader();
  for (int m = 0; m < cluster_->size(); ++m) {
    if (m != leader) cluster_->kill(m);
  }
  const auto lost = std::chrono::steady_clock::now();
  for (auto* x : {&a, &b}) {
    EXPECT_EQ(x->wait(90s), 1) << x->output();
    EXPECT_NE(x->output().find("lost the rendezvous store"), std::string::npos) << x->output();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - lost, 60s);
}

}  // namespace
