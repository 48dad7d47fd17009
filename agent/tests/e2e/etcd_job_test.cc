// Elastic jobs over a real 3-member etcd (--rdzv-backend etcd-v3): real dist-launch agents, real
// workers, etcd members killed by PID. Workers append one line per round they run in; the
// in-place job's (dist-inplace-worker) write their start and their final state.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "etcd_cluster.h"
#include "process_helpers.h"
#include "programs.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using dist::agent::testing::Child;
using dist::agent::testing::eventually;
using dist::store::testing::EtcdCluster;

const std::string kWorker = DIST_TEST_WORKER_BIN;
const std::string kInPlaceWorker = DIST_INPLACE_WORKER_BIN;

// Heartbeats are wall-clock seconds. One this far past the second the new leader was elected
// comes after the new leader's extension of every lease (the agents' 2 s TTL plus its election
// timeout, 1 s) ran out and its next expiry check (every 500 ms) ran: a lease the election lost
// is gone by then.
constexpr long long kLostLeaseGoneSeconds = 5;

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
    agents_.push_back(std::make_unique<Child>(DIST_LAUNCH_BIN, args, dir_ / (name + ".log")));
    return *agents_.back();
  }

  // How many keys start with `prefix`, read with etcdctl.
  std::size_t keys_under(const std::string& prefix) const {
    std::istringstream in(cluster_->etcdctl({"get", "--prefix", "--keys-only", prefix}));
    std::size_t keys = 0;
    for (std::string line; std::getline(in, line);) keys += !line.empty();
    return keys;
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

  // Two nodes of an in-place job over etcd, `nproc` dist-inplace-workers each (`worker` added to
  // their flags), their files under inplace/`tag`; both must end 0. Returns both outputs.
  std::string in_place_job(const std::string& tag, int nproc, int max_restarts,
                           const std::vector<std::string>& worker) {
    const fs::path out = dir_ / "inplace" / tag;
    fs::create_directories(out);
    std::vector<Child*> nodes;
    for (const std::string node : {"a", "b"}) {
      std::vector<std::string> args{"--nnodes", "2", "--rdzv-backend", "etcd-v3", "--rdzv-endpoint",
                                    cluster_->endpoint_list(), "--rdzv-id", "inplace-" + tag,
                                    // This test is about in-place recovery, not lost leases: a
                                    // TTL of 6 s, not 2, rides out a loaded machine's stalls.
                                    "--rdzv-conf", "keep_alive_interval=3", "--nproc-per-node",
                                    std::to_string(nproc), "--local-addr", "127.0.0.1",
                                    "--max-restarts", std::to_string(max_restarts),
                                    "--restart-policy", "in-place", "--no-python", kInPlaceWorker,
                                    "--steps", "30", "--out", out.string()};
      args.insert(args.end(), worker.begin(), worker.end());
      agents_.push_back(
          std::make_unique<Child>(DIST_LAUNCH_BIN, args, dir_ / (tag + "_" + node + ".log")));
      nodes.push_back(agents_.back().get());
    }
    // One deadline for both, well inside the test's own timeout, so that a node that never ends
    // is killed and both nodes' outputs are shown (a hang once showed only node a's).
    const auto deadline = std::chrono::steady_clock::now() + 100s;
    std::vector<int> codes;
    for (Child* n : nodes) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      codes.push_back(n->wait(std::max(left, std::chrono::milliseconds(1000))));
    }
    std::string both;
    for (Child* n : nodes) both += n->output();
    for (const int code : codes) EXPECT_EQ(code, 0) << both;
    return both;
  }
  static std::string read_file(const fs::path& file) {
    std::ifstream in(file);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  struct InPlaceFinal {
    long pid = -1;
    long step = -1;
    std::string digest;
    int generation = -1;
  };
  InPlaceFinal in_place_final(const std::string& tag, int rank) const {
    InPlaceFinal f;
    std::istringstream(read_file(dir_ / "inplace" / tag / ("final_" + std::to_string(rank)))) >>
        f.pid >> f.step >> f.digest >> f.generation;
    return f;
  }
  long in_place_start_pid(const std::string& tag, int rank, int generation) const {
    long pid = -1;
    std::istringstream(
        read_file(dir_ / "inplace" / tag /
                  ("start_" + std::to_string(rank) + "_0_" + std::to_string(generation)))) >>
        pid;
    return pid;
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
// members, every node's lease (its liveness) survives the election, nothing restarts.
TEST_F(EtcdJob, TheLeaderKilledMidJobLeavesTheJobAlone) {
  const std::string go = (dir_ / "go").string();
  const std::vector<std::string> worker{"wait-file", go, "exit", "0"};
  auto& a = agent("a", "3:3", worker);
  auto& b = agent("b", "3:3", worker);
  auto& c = agent("c", "3:3", worker);
  ASSERT_TRUE(in_world({"a", "b", "c"}, 3)) << a.output() << b.output() << c.output();
  cluster_->kill(cluster_->leader());
  cluster_->leader();  // elected among the other two
  // A lease the election lost would be gone once the new leader's extension (its TTL plus an
  // election timeout) ran out: wait until every node's heartbeat is past that, then check that
  // every node's liveness key is still there before the workers finish.
  const auto elected = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  const auto heartbeats_past = [&](long long at) {
    std::istringstream in(cluster_->etcdctl(
        {"get", "--prefix", "--print-value-only", "/dist-launch/job/r0/heartbeat/"}));
    int past = 0;
    for (long long beat = 0; in >> beat;) past += beat >= at;
    return past == 3;
  };
  ASSERT_TRUE(eventually([&] { return heartbeats_past(elected + kLostLeaseGoneSeconds); }, 60s))
      << a.output() << b.output() << c.output();
  EXPECT_EQ(keys_under("/dist-launch/job/r0/node/"), 3u) << "a node's lease did not survive";
  std::ofstream(go) << "1\n";
  for (auto* x : {&a, &b, &c}) EXPECT_EQ(x->wait(), 0) << x->output();
  for (const char* name : {"a", "b", "c"}) EXPECT_EQ(rounds(name).size(), 1u) << name;
}

// A spare over etcd: 1:2 nodes, both in, a third waiting for a place, and the job then ends
// well. Nobody hosts a store here that could vanish under the spare: it must see the job's
// verdict in etcd and leave with the job's success, having run no worker.
TEST_F(EtcdJob, ASpareWaitingForAPlaceLeavesWithTheJobsSuccess) {
  const std::string go = (dir_ / "go").string();
  const std::vector<std::string> worker{"wait-file", go, "exit", "0"};
  auto& a = agent("a", "1:2", worker);
  auto& b = agent("b", "1:2", worker);
  ASSERT_TRUE(in_world({"a", "b"}, 2)) << a.output() << b.output();
  auto& spare = agent("spare", "1:2", worker);
  ASSERT_TRUE(eventually(
      [&] { return spare.output().find("is full: waiting for a place") != std::string::npos; },
      60s))
      << spare.output();

  std::ofstream(go) << "1\n";
  EXPECT_EQ(a.wait(), 0) << a.output();
  EXPECT_EQ(b.wait(), 0) << b.output();
  EXPECT_EQ(spare.wait(60s), 0) << spare.output();
  EXPECT_NE(spare.output().find("the job already finished (round 0)"), std::string::npos)
      << spare.output();
  EXPECT_TRUE(rounds("spare").empty()) << "no worker ran";
  EXPECT_EQ(rounds("a").size(), 1u) << "the spare restarted the job";
  EXPECT_EQ(rounds("b").size(), 1u) << "the spare restarted the job";
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

// An agent frozen past its lease's TTL (a host that stalled, or was cut off from etcd) is lost to
// the others, who reshape without it. Back, it learns that it was taken for lost, stops its
// workers and rejoins the job as a newcomer: it never hangs, nor runs on in a round that went on
// without it. (Here the job finished meanwhile: it leaves with the job's success.)
TEST_F(EtcdJob, ANodeWhoseLeaseExpiredRejoinsAndLeavesWithTheJobsSuccess) {
  const std::vector<std::string> worker{"exit-if-world", "2", "0", "forever"};
  const std::vector<std::string> names{"a", "b", "c"};
  for (const auto& n : names) agent(n, "2:3", worker);
  ASSERT_TRUE(in_world(names, 3)) << agents_[0]->output();
  std::size_t frozen = 0;
  while (rounds(names[frozen]).back().node_rank == 0) ++frozen;  // not the workers' store host
  ::kill(agents_[frozen]->pid(), SIGSTOP);
  std::vector<std::string> survivors;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i != frozen) survivors.push_back(names[i]);
  }
  ASSERT_TRUE(in_world(survivors, 2)) << agents_[(frozen + 1) % 3]->output();
  ::kill(agents_[frozen]->pid(), SIGCONT);
  // Taken for lost, it stops its workers and rejoins; the job, whose two others finished in
  // their round of 2, is over by then: it leaves with its success, as a spare would.
  EXPECT_EQ(agents_[frozen]->wait(60s), 0) << agents_[frozen]->output();
  // It says what happened to itself, not "node N's agent is gone" of its own node rank.
  EXPECT_NE(agents_[frozen]->output().find("was taken for lost: its lease in etcd ended"),
            std::string::npos)
      << agents_[frozen]->output();
  EXPECT_NE(agents_[frozen]->output().find("rejoining the job"), std::string::npos)
      << agents_[frozen]->output();
  EXPECT_EQ(rounds(names[frozen]).size(), 1u) << "it joined the round that went on without it";
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i == frozen) continue;
    EXPECT_EQ(agents_[i]->wait(60s), 0) << agents_[i]->output();
  }
}

// --restart-policy in-place over etcd: the job's replacements are counted in etcd, the group's
// generations in the round's workers' store. Rank 1 crashes at step 10: its worker alone is
// replaced; rank 0, on the other node, keeps its process; both end with the digest of a run
// without failures (the same job once more, no crash).
TEST_F(EtcdJob, InPlaceReplacesTheFailedWorkerAloneAndTheOtherNodeRunsOn) {
  in_place_job("clean", 1, 1, {});
  const std::string both = in_place_job("crash", 1, 1, {"--crash", "1:10"});
  const InPlaceFinal clean = in_place_final("clean", 0), survivor = in_place_final("crash", 0),
                     replaced = in_place_final("crash", 1);
  ASSERT_FALSE(clean.digest.empty()) << both;
  EXPECT_EQ(survivor.pid, in_place_start_pid("crash", 0, 0)) << "rank 0 kept its process: " << both;
  EXPECT_EQ(survivor.generation, 1) << both;
  EXPECT_EQ(replaced.generation, 1) << both;
  EXPECT_EQ(survivor.digest, clean.digest) << both;
  EXPECT_EQ(replaced.digest, clean.digest) << both;
  EXPECT_NE(both.find("replaced in place by pid " + std::to_string(replaced.pid) +
                      ": generation 1 (restart 1 of 1); rank 0 keeps running"),
            std::string::npos)
      << both;
  EXPECT_EQ(both.find("restarting"), std::string::npos) << both;
}

// The same over etcd with two workers a node: rank 2 fails at step 10 and its node replaces it as
// generation 1; rank 1, on the other node, dies as it reads that generation. Its node takes the
// job's recovery over in etcd and folds the failure into generation 2, which replaces both: no
// group restart, ranks 0 and 3 keep their processes, every rank ends at the clean digest.
TEST_F(EtcdJob, InPlaceAFailureOnAnotherNodeDuringARecoveryIsFoldedIntoIt) {
  in_place_job("clean", 2, 2, {});
  const std::string both =
      in_place_job("crash", 2, 2, {"--crash", "2:10", "--fail-in-recovery", "1"});
  const InPlaceFinal clean = in_place_final("clean", 0);
  ASSERT_FALSE(clean.digest.empty()) << both;
  for (const int rank : {0, 1, 2, 3}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const InPlaceFinal f = in_place_final("crash", rank);
    EXPECT_EQ(f.digest, clean.digest) << both;
    EXPECT_EQ(f.generation, 2) << both;
    const bool survivor = rank == 0 || rank == 3;
    EXPECT_EQ(f.pid == in_place_start_pid("crash", rank, 0), survivor) << both;
  }
  EXPECT_NE(both.find(": generation 2 (restart 2 of 2), folded into the recovery under way "
                      "(generation 1, which it supersedes: ranks 1,2 replaced); ranks 0,3 keep "
                      "running"),
            std::string::npos)
      << both;
  EXPECT_EQ(both.find("restarting"), std::string::npos) << both;
}

// An elastic in-place job over etcd (--nnodes 2:3): a third node joins midway. The running
// workers keep their processes and take the newcomer's in at their next step, as ranks 0 and 1 of
// a world of three; the newcomer's worker starts as the regroup's generation with their state, and
// all three end with the same. The rounds, the verdict and the newcomer's wait are etcd's; the
// generations are the round's workers' store's.
TEST_F(EtcdJob, InPlaceANewcomerJoinsTheRunningWorkersAtAStepBoundary) {
  const fs::path out = dir_ / "join";
  fs::create_directories(out);
  const auto node = [&](const std::string& name) -> Child& {
    std::vector<std::string> args{"--nnodes",
                                  "2:3",
                                  "--rdzv-backend",
                                  "etcd-v3",
                                  "--rdzv-endpoint",
                                  cluster_->endpoint_list(),
                                  "--rdzv-id",
                                  "join",
                                  "--rdzv-conf",
                                  "last_call_timeout=1,join_timeout=60",
                                  "--nproc-per-node",
                                  "1",
                                  "--local-addr",
                                  "127.0.0.1",
                                  "--max-restarts",
                                  "1",
                                  "--restart-policy",
                                  "in-place",
                                  "--no-python",
                                  kInPlaceWorker,
                                  "--steps",
                                  "300",
                                  "--step-ms",
                                  "10",
                                  "--out",
                                  out.string()};
    agents_.push_back(std::make_unique<Child>(DIST_LAUNCH_BIN, args, dir_ / (name + ".log")));
    return *agents_.back();
  };
  Child& a = node("a");
  Child& b = node("b");
  ASSERT_TRUE(eventually(
      [&] {
        return a.output().find("rank 0 step 5\n") != std::string::npos ||
               b.output().find("rank 0 step 5\n") != std::string::npos;
      },
      60s))
      << a.output() << b.output();
  Child& c = node("c");
  std::string all;
  for (Child* n : {&a, &b, &c}) {
    EXPECT_EQ(n->wait(120s), 0) << n->output();
    all += n->output();
  }
  const auto read = [&](const std::string& file) {
    std::ifstream in(out / file);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  std::string digest;
  for (const int rank : {0, 1, 2}) {
    long pid = -1, step = -1;
    std::string hex;
    int generation = -1, world = -1;
    std::istringstream(read("final_" + std::to_string(rank))) >> pid >> step >> hex >> generation >>
        world;
    EXPECT_EQ(step, 300) << all;
    EXPECT_EQ(world, 3) << all;
    EXPECT_EQ(generation, 1) << all;
    long started = -1;
    std::istringstream(read("start_" + std::to_string(rank) + "_0_" + (rank < 2 ? "0" : "1"))) >>
        started;
    EXPECT_EQ(pid, started) << "ranks 0 and 1 kept their processes, rank 2 started as generation "
                            << "1: " << all;
    if (rank == 0) digest = hex;
    EXPECT_EQ(hex, digest) << all;
  }
  EXPECT_NE(c.output().find("this node's workers joined the running workers as generation 1"),
            std::string::npos)
      << c.output();
  EXPECT_EQ(all.find("restarting"), std::string::npos) << all;
  EXPECT_EQ(all.find("stopping the workers"), std::string::npos) << all;
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
