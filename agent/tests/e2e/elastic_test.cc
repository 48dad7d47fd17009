// Elastic jobs (--nnodes MIN:MAX, c10d rendezvous): several real agents on one machine around one
// store, either hosted by the agent on the endpoint's address or an external dist-rendezvous.
// Workers append one line per round they run in, so each test reads the job's history.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "dist/store/client.h"
#include "process_helpers.h"
#include "programs.h"
#include "test_ports.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using dist::agent::testing::Child;

const std::string kWorker = DIST_TEST_WORKER_BIN;
const std::string kHost = "127.0.0.2";

// One line of a worker's `append` file: the round as that worker saw it.
struct RoundSeen {
  int rank, world_size, node_rank, num_nodes, restarts;
  long long start_ns;
};

class Elastic : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dist-elastic-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    port_ = dist::agent::testing::free_port(kHost);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // An agent of the job; `name` names its log and its worker's history file.
  std::unique_ptr<Child> agent(const std::string& name, const std::string& nnodes,
                               std::vector<std::string> extra, std::vector<std::string> worker) {
    std::vector<std::string> args{
        "--nnodes",  nnodes, "--rdzv-endpoint",  kHost + ":" + std::to_string(port_),
        "--rdzv-id", "job",  "--nproc-per-node", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {"--no-python", kWorker, "append", history(name)});
    args.insert(args.end(), worker.begin(), worker.end());
    return std::make_unique<Child>(DIST_LAUNCH_BIN, args, dir_ / (name + ".log"));
  }

  // The first agent of a job, on the endpoint's address: it hosts the store. Returns once it
  // says so, so that the agents started after it join as clients.
  std::unique_ptr<Child> host(const std::string& name, const std::string& nnodes,
                              std::vector<std::string> extra, std::vector<std::string> worker) {
    auto a = agent(name, nnodes, std::move(extra), std::move(worker));
    EXPECT_TRUE(dist::agent::testing::eventually(
        [&] { return a->output().find("hosting the rendezvous store") != std::string::npos; }, 30s))
        << a->output();
    return a;
  }

  // An external store on the endpoint: every agent is its client.
  // A dist-rendezvous daemon on port_, once it listens; `log` names its own log (a test that
  // starts several must not read an earlier one's "listening on").
  std::unique_ptr<Child> external_store(const std::string& log = "store") {
    auto store = std::make_unique<Child>(
        DIST_RENDEZVOUS_BIN,
        std::vector<std::string>{"--host", kHost, "--port", std::to_string(port_)},
        dir_ / (log + ".log"));
    const auto deadline = Clock::now() + 10s;
    while (store->output().find("listening on") == std::string::npos && Clock::now() < deadline) {
      std::this_thread::sleep_for(10ms);
    }
    EXPECT_NE(store->output().find("listening on"), std::string::npos) << store->output();
    return store;
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

  // Waits until every named worker has started a round of `world_size` workers.
  bool wait_for_world(const std::vector<std::string>& names, int world_size,
                      std::chrono::milliseconds timeout = 30s) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      bool all = true;
      for (const auto& n : names) {
        const auto r = rounds(n);
        all = all && !r.empty() && r.back().world_size == world_size;
      }
      if (all) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

  // Agents "a" and "b" of a running 1:2 job whose workers wait for `go`: the one that is not node
  // rank 0 is lost (SIGKILLed once `go` is written), and the other finishes the job. Returns the
  // survivor's name.
  std::string lose_the_node_that_is_not_rank_0(Child& a, Child& b, const std::string& go) {
    std::ofstream(go) << "1\n";
    const bool a_is_rank_0 = rounds("a").back().node_rank == 0;
    Child& lost = a_is_rank_0 ? b : a;
    Child& survivor = a_is_rank_0 ? a : b;
    ::kill(lost.pid(), SIGKILL);
    lost.wait();
    EXPECT_EQ(survivor.wait(), 0) << survivor.output();
    return a_is_rank_0 ? "a" : "b";
  }

  fs::path dir_;
  int port_ = 0;
};

long long wall_clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

TEST_F(Elastic, ALateThirdNodeScalesTheJobUpWithoutARestart) {
  // 1:3 nodes; the first round closes with two after last_call_timeout; a third node arriving
  // later makes a new round of three. Workers run until they are in a world of three.
  const std::vector<std::string> conf{"--rdzv-conf", "last_call_timeout=1"};
  const std::vector<std::string> until_three{"exit-if-world", "3", "0", "forever"};
  auto a = host("a", "1:3", conf, until_three);
  auto b = agent("b", "1:3", conf, until_three);
  ASSERT_TRUE(wait_for_world({"a", "b"}, 2)) << a->output() << b->output();
  auto c = agent("c", "1:3", conf, until_three);

  EXPECT_EQ(a->wait(), 0) << a->output();
  EXPECT_EQ(b->wait(), 0) << b->output();
  EXPECT_EQ(c->wait(), 0) << c->output();
  // (On a slow machine b may miss a's first round and make a round of two itself.)
  const auto ra = rounds("a"), rb = rounds("b"), rc = rounds("c");
  ASSERT_GE(ra.size(), 2u);
  ASSERT_EQ(rb.size(), 2u);
  ASSERT_EQ(rc.size(), 1u);
  const RoundSeen& a2 = ra[ra.size() - 2];
  EXPECT_EQ((std::set<int>{a2.rank, rb[0].rank}), (std::set<int>{0, 1}));
  EXPECT_EQ((std::set<int>{ra.back().rank, rb.back().rank, rc[0].rank}), (std::set<int>{0, 1, 2}));
  for (const auto& r : {ra.back(), rb.back(), rc[0]}) EXPECT_EQ(r.num_nodes, 3);
  for (const auto& history : {ra, rb, rc}) {
    for (const auto& r : history) {
      EXPECT_EQ(r.restarts, 0) << "scaling up is not a restart";
      EXPECT_EQ(r.node_rank, r.rank) << "one worker per node";
    }
  }
  EXPECT_EQ(ra.back().rank, a2.rank) << "nodes already in the job keep their order";
  EXPECT_EQ(rc[0].rank, 2) << "the newcomer comes last";
  EXPECT_NE(a->output().find("a new node is waiting to join"), std::string::npos) << a->output();
  EXPECT_NE(a->output().find("(not a restart)"), std::string::npos) << a->output();
}

TEST_F(Elastic, SurvivorsOfAKilledNodeFinishInASmallerWorld) {
  // Three agents around an external store, 2:3 nodes; the node in the middle of the ring is
  // killed. The other two notice, stop their workers and go on as a world of two.
  auto store = external_store();
  const std::vector<std::string> names{"a", "b", "c"};
  std::vector<std::unique_ptr<Child>> agents;
  for (const auto& n : names) {
    agents.push_back(
        agent(n, "2:3", {"--rdzv-conf", "last_call_timeout=5"},
              {"pidfile", (dir_ / ("pid_" + n)).string(), "exit-if-world", "2", "0", "forever"}));
  }
  ASSERT_TRUE(wait_for_world(names, 3)) << agents[0]->output() << agents[1]->output();
  std::size_t victim = 0;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (rounds(names[i]).back().node_rank == 1) victim = i;
  }
  const pid_t victim_worker = dist::agent::testing::written_pid(dir_ / ("pid_" + names[victim]));
  ASSERT_GT(victim_worker, 0) << agents[victim]->output();
  const long long killed_ns = wall_clock_ns();
  ::kill(agents[victim]->pid(), SIGKILL);
  EXPECT_EQ(agents[victim]->wait(), 128 + SIGKILL);

  std::set<int> ranks;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i == victim) continue;
    SCOPED_TRACE(names[i]);
    EXPECT_EQ(agents[i]->wait(), 0) << agents[i]->output();
    const auto r = rounds(names[i]);
    ASSERT_EQ(r.size(), 2u);
    EXPECT_EQ(r[1].world_size, 2);
    EXPECT_EQ(r[1].restarts, 0) << "a lost node is a membership change, not a restart";
    EXPECT_LT(r[1].start_ns - killed_ns, 10'000'000'000LL) << "survivors restarted promptly";
    ranks.insert(r[1].rank);
    EXPECT_NE(agents[i]->output().find("lost"), std::string::npos) << agents[i]->output();
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1}));
  EXPECT_TRUE(dist::agent::testing::process_gone(victim_worker))
      << "the killed agent's worker outlived it";
}

TEST_F(Elastic, ANodeArrivingAtMaxWaitsAndReplacesALostOne) {
  // 1:2 nodes, both in: a third waits without disturbing them. When one is lost, the waiting node
  // takes its place in the next round (after the survivor, which keeps node rank 0).
  auto store = external_store();
  const std::string go = (dir_ / "go").string();
  const std::vector<std::string> worker{"exit-if-file", go, "0", "forever"};
  auto a = agent("a", "1:2", {}, worker);
  auto b = agent("b", "1:2", {}, worker);
  ASSERT_TRUE(wait_for_world({"a", "b"}, 2)) << a->output() << b->output();
  auto c = agent("c", "1:2", {}, worker);
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] { return c->output().find("is full: waiting for a place") != std::string::npos; }, 30s))
      << c->output();
  EXPECT_TRUE(rounds("c").empty());
  // (That a and b were not disturbed shows below: each ran exactly the rounds it should.)

  const std::string survivor = lose_the_node_that_is_not_rank_0(*a, *b, go);
  EXPECT_EQ(c->wait(), 0) << c->output();
  const auto rs = rounds(survivor), rc = rounds("c");
  ASSERT_EQ(rs.size(), 2u);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rs[1].node_rank, 0);
  EXPECT_EQ(rc[0].node_rank, 1);
  EXPECT_EQ(rc[0].world_size, 2);
  EXPECT_EQ(rc[0].restarts, 0);
}

TEST_F(Elastic, AHotSpareOutwaitsItsJoinTimeoutWhileTheJobRunsThenTakesALostNodesPlace) {
  // 1:2 nodes, both in, a third waiting for a place, every join timeout 1 s. While round 0 runs,
  // the third waits on as a hot spare (its join timeout counts from the round's end; torch
  // 1.13's would time out), saying so each time its timeout passes. When a node is lost, it takes
  // the place.
  auto store = external_store();
  const std::string go = (dir_ / "go").string();
  const std::vector<std::string> worker{"exit-if-file", go, "0", "forever"};
  const std::vector<std::string> conf{"--rdzv-conf", "join_timeout=1,last_call_timeout=0.2"};
  auto a = agent("a", "1:2", conf, worker);
  auto b = agent("b", "1:2", conf, worker);
  ASSERT_TRUE(wait_for_world({"a", "b"}, 2)) << a->output() << b->output();
  auto spare = agent("spare", "1:2", conf, worker);
  const auto said = [&](const std::string& what) {
    const std::string out = spare->output();
    int n = 0;
    for (auto at = out.find(what); at != std::string::npos; at = out.find(what, at + 1)) ++n;
    return n;
  };
  ASSERT_TRUE(dist::agent::testing::eventually([&] { return said("as a hot spare") >= 2; }, 30s))
      << "the spare did not outwait two join timeouts: " << spare->output();
  EXPECT_TRUE(rounds("spare").empty());

  lose_the_node_that_is_not_rank_0(*a, *b, go);
  EXPECT_EQ(spare->wait(), 0) << spare->output();
  const auto rs = rounds("spare");
  ASSERT_EQ(rs.size(), 1u) << spare->output();
  EXPECT_EQ(rs[0].node_rank, 1);
  EXPECT_EQ(rs[0].world_size, 2);
}

TEST_F(Elastic, ANodeWaitingForAPlaceWhenTheJobSucceedsLeavesWithItsSuccess) {
  // A spare: 1:2 nodes, both in, a third waiting, and the job then ends well. The store lives in
  // the first agent, which waits for the spare to read the outcome before it takes the store away
  // (the spare said "connection lost" and exited 1 before). last_call_timeout stays at its
  // default (30 s): the spare looks at the job's verdict more often than that.
  const std::string go = (dir_ / "go").string();
  const std::vector<std::string> worker{"wait-file", go, "exit", "0"};
  auto a = host("a", "1:2", {}, worker);
  auto b = agent("b", "1:2", {}, worker);
  ASSERT_TRUE(wait_for_world({"a", "b"}, 2)) << a->output() << b->output();
  auto spare = agent("spare", "1:2", {}, worker);
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] { return spare->output().find("is full: waiting for a place") != std::string::npos; },
      30s))
      << spare->output();

  std::ofstream(go) << "1\n";
  EXPECT_EQ(a->wait(), 0) << a->output();
  EXPECT_EQ(b->wait(), 0) << b->output();
  EXPECT_EQ(spare->wait(), 0) << spare->output();
  EXPECT_NE(spare->output().find("the job already finished (round 0)"), std::string::npos)
      << spare->output();
  EXPECT_EQ(spare->output().find("connection lost"), std::string::npos) << spare->output();
  EXPECT_TRUE(rounds("spare").empty()) << "no worker ran";
}

TEST_F(Elastic, ANewcomerLetInAsEveryNodesWorkersFinishedDoesNotRestartTheJob) {
  // The order a busy machine can give: every node's workers finish, and a newcomer gets in
  // (running round 0 not finishing yet: no node had reached its exit barrier) before either agent
  // acts. The first node at its exit barrier sees the newcomer. That alone ends nothing: it
  // waits, the other node comes, and the job ends done (the first node used to leave the barrier
  // at once for a new round with the newcomer, training again from the start). The agents are
  // stopped (SIGSTOP) to make that order; the store is external, so it answers meanwhile.
  auto store = external_store();
  const std::string go = (dir_ / "go").string();
  const auto worker = [&](const std::string& n) {
    return std::vector<std::string>{
        "pidfile", (dir_ / ("pid_" + n)).string(), "wait-file", go, "exit", "0"};
  };
  const std::vector<std::string> conf{"--rdzv-conf", "last_call_timeout=0.5"};
  auto a = agent("a", "2:3", conf, worker("a"));
  auto b = agent("b", "2:3", conf, worker("b"));
  ASSERT_TRUE(wait_for_world({"a", "b"}, 2)) << a->output() << b->output();
  const pid_t worker_a = dist::agent::testing::written_pid(dir_ / "pid_a");
  const pid_t worker_b = dist::agent::testing::written_pid(dir_ / "pid_b");
  ASSERT_GT(worker_a, 0) << a->output();
  ASSERT_GT(worker_b, 0) << b->output();

  ::kill(a->pid(), SIGSTOP);
  ::kill(b->pid(), SIGSTOP);
  std::ofstream(go) << "1\n";
  ASSERT_TRUE(dist::agent::testing::process_gone(worker_a, 30s));  // zombies: nobody reaps yet
  ASSERT_TRUE(dist::agent::testing::process_gone(worker_b, 30s));
  dist::store::ClientOptions options;
  options.host = kHost;
  options.port = port_;
  auto client = dist::store::StoreClient::connect(options);
  const std::string prefix = "rdzv/job/r0/";
  auto late = agent("late", "2:3", conf, {"exit", "0"});
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] { return !client.check({prefix + "no_newcomers"}); }, 30s))
      << "the newcomer was not let in: " << late->output();

  ::kill(a->pid(), SIGCONT);  // a reaches its barrier first, and sees the newcomer there
  ASSERT_TRUE(
      dist::agent::testing::eventually([&] { return client.add(prefix + "done", 0) == 1; }, 30s))
      << a->output();
  ::kill(b->pid(), SIGCONT);
  EXPECT_EQ(a->wait(), 0) << a->output();
  EXPECT_EQ(b->wait(), 0) << b->output();
  EXPECT_EQ(late->wait(), 0) << late->output();
  EXPECT_NE(late->output().find("the job already finished (round 0)"), std::string::npos)
      << late->output();
  for (const auto& [name, child] : {std::pair{"a", &a}, std::pair{"b", &b}}) {
    EXPECT_EQ(rounds(name).size(), 1u) << "one round, no other: " << (*child)->output();
    EXPECT_EQ((*child)->output().find("round ended"), std::string::npos) << (*child)->output();
  }
  EXPECT_TRUE(rounds("late").empty()) << "no worker ran";
}

TEST_F(Elastic, FewerNodesThanTheMinimumLeftFailsTheJobWithAClearReport) {
  // 2:2 nodes, the second agent killed: one node cannot go on.
  auto a = host("a", "2:2", {}, {"forever"});
  auto b = agent("b", "2:2", {}, {"forever"});
  ASSERT_TRUE(wait_for_world({"a", "b"}, 2)) << a->output() << b->output();
  ::kill(b->pid(), SIGKILL);
  b->wait();
  EXPECT_EQ(a->wait(30s), 1) << a->output();
  EXPECT_NE(a->output().find("1 node(s) left, fewer than the minimum 2"), std::string::npos)
      << a->output();
}

TEST_F(Elastic, ALostNodeReplacedWhileARestartIsLeftRejoinsAndTheJobGoesOn) {
  // 2:2 nodes with a restart left: the survivor waits for a second node (as torchrun's does),
  // and the killed agent's replacement (a cluster manager's relaunch) rejoins. Found by the chaos
  // soak (bench/chaos_soak.py): before, the job failed at once.
  auto store = external_store();
  const std::string go = (dir_ / "go").string();
  const std::vector<std::string> conf{"--max-restarts", "1"};
  const std::vector<std::string> worker{"exit-if-file", go, "0", "forever"};
  auto a = agent("a", "2:2", conf, worker);
  auto b = agent("b", "2:2", conf, worker);
  ASSERT_TRUE(wait_for_world({"a", "b"}, 2)) << a->output() << b->output();
  ::kill(b->pid(), SIGKILL);
  b->wait();
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] { return a->output().find("waiting for nodes to join") != std::string::npos; }, 30s))
      << a->output();
  std::ofstream(go) << "1\n";  // the next round's workers finish at once
  auto replacement = agent("b2", "2:2", conf, worker);
  EXPECT_EQ(a->wait(), 0) << a->output();
  EXPECT_EQ(replacement->wait(), 0) << replacement->output();
  const auto ra = rounds("a");
  ASSERT_EQ(ra.size(), 2u);
  EXPECT_EQ(ra[1].restarts, 1) << "losing a node below the minimum costs a restart";
  EXPECT_EQ(rounds("b2").back().restarts, 1);
}

TEST_F(Elastic, NewcomersDecideForARoundWhoseNodesAllVanishedAndFormTheNext) {
  // Every agent of a running 2:2 round is SIGKILLed before any of them decides the round's
  // verdict; their replacements find the round full, decide it for them and form the next round
  // instead of waiting out the join timeout. Found by the chaos soak (a partition, then a kill).
  auto store = external_store();
  const std::string go = (dir_ / "go").string();
  const std::vector<std::string> conf{"--max-restarts", "1", "--rdzv-conf",
                                      "last_call_timeout=1,join_timeout=60"};
  const std::vector<std::string> worker{"exit-if-file", go, "0", "forever"};
  auto a = agent("a", "2:2", conf, worker);
  auto b = agent("b", "2:2", conf, worker);
  ASSERT_TRUE(wait_for_world({"a", "b"}, 2)) << a->output() << b->output();
  // Both frozen first (a stopped agent's connections stay open), so that neither sees the other
  // go and decides the round before its own end.
  ::kill(a->pid(), SIGSTOP);
  ::kill(b->pid(), SIGSTOP);
  ::kill(a->pid(), SIGKILL);
  ::kill(b->pid(), SIGKILL);
  a->wait();
  b->wait();
  std::ofstream(go) << "1\n";  // the next round's workers finish at once
  auto a2 = agent("a2", "2:2", conf, worker);
  auto b2 = agent("b2", "2:2", conf, worker);
  EXPECT_EQ(a2->wait(), 0) << a2->output();
  EXPECT_EQ(b2->wait(), 0) << b2->output();
  EXPECT_NE((a2->output() + b2->output()).find("every node of round 0 is gone without a verdict"),
            std::string::npos)
      << a2->output() << b2->output();
  for (const char* name : {"a2", "b2"}) {
    const auto r = rounds(name);
    ASSERT_EQ(r.size(), 1u) << name;
    EXPECT_EQ(r[0].world_size, 2) << name;
    EXPECT_EQ(r[0].restarts, 0) << name << ": losing every node is a reshape, not a restart";
  }
}

TEST_F(Elastic, AWorkerFailureIsOneRestartForTheWholeJob) {
  // Rank 1 fails in the first round; with --max-restarts 1 both nodes restart once, with the same
  // count, then succeed.
  const std::vector<std::string> conf{"--max-restarts", "1"};
  const std::vector<std::string> crash{"crash-if", dir_.string(), "1", "0"};
  auto a = host("a", "1:2", conf, crash);
  auto b = agent("b", "1:2", conf, crash);
  EXPECT_EQ(a->wait(), 0) << a->output();
  EXPECT_EQ(b->wait(), 0) << b->output();
  // (Rank 0's first worker may be stopped before it writes its line.)
  for (const auto& name : {"a", "b"}) {
    const auto r = rounds(name);
    ASSERT_FALSE(r.empty()) << name;
    EXPECT_EQ(r.front().restarts, r.size() == 2 ? 0 : 1) << name;
    EXPECT_EQ(r.back().restarts, 1) << name;
    EXPECT_EQ(r.back().world_size, 2) << name;
  }
  EXPECT_NE(a->output().find("restarting the worker group (restart 1 of 1)"), std::string::npos)
      << a->output();
}

TEST_F(Elastic, ExhaustedRestartsFailEveryNodeWithTheSameRootCause) {
  auto a = host("a", "1:2", {}, {"exit-if-rank", "1", "7", "forever"});
  auto b = agent("b", "1:2", {}, {"exit-if-rank", "1", "7", "forever"});
  for (auto* x : {a.get(), b.get()}) {
    EXPECT_EQ(x->wait(), 7) << x->output();
    EXPECT_NE(x->output().find("rank      : 1 (local_rank: 0)"), std::string::npos) << x->output();
  }
}

TEST_F(Elastic, StatusShowsTheAssignedRoundAndHeartbeats) {
  auto a = host("a", "1:2", {}, {"sleep", "5000"});
  auto b = agent("b", "1:2", {}, {"sleep", "5000"});
  ASSERT_TRUE(wait_for_world({"a", "b"}, 2)) << a->output() << b->output();
  const std::string status = std::string(DIST_LAUNCH_BIN) + " status --rdzv-endpoint " + kHost +
                             ":" + std::to_string(port_) + " --rdzv-id job";
  auto [code, out] = dist::agent::testing::run_command(status);
  for (int i = 0; i < 100 && out.find(" s ago") == std::string::npos; ++i) {
    std::this_thread::sleep_for(20ms);
    std::tie(code, out) = dist::agent::testing::run_command(status);
  }
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("(elastic): round 0, restarts so far 0, 2 node(s), running"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("0..0"), std::string::npos) << out;
  EXPECT_NE(out.find("1..1"), std::string::npos) << out;
  EXPECT_NE(out.find(" s ago"), std::string::npos) << out;
  ::kill(a->pid(), SIGTERM);
  ::kill(b->pid(), SIGTERM);
  a->wait();
  b->wait();
}

TEST_F(Elastic, ANodeArrivingAfterTheJobSucceededHasNothingToDo) {
  auto store = external_store();
  auto a = agent("a", "1:2", {"--rdzv-conf", "last_call_timeout=0.2"}, {"exit", "0"});
  EXPECT_EQ(a->wait(), 0) << a->output();
  auto late = agent("late", "1:2", {}, {"exit", "0"});
  EXPECT_EQ(late->wait(), 0) << late->output();
  EXPECT_NE(late->output().find("the job already finished"), std::string::npos) << late->output();
  EXPECT_TRUE(rounds("late").empty()) << "no worker ran";
}

// Node "b"'s agent is lost (SIGKILL) while "a", its worker done, waits at its exit barrier, with
// no failure said (a crash in a process group's teardown, a machine gone after the last step):
// every node still there succeeded, so the job is done, and "a" leaves with 0 as torchrun's
// barrier would. It used to take the round as ended and train the finished job again: alone
// (1:2, a reshape), or with "b" relaunched (2:2 in place, its survivors waiting for a node).
// "b"'s agent started again finds the job finished and runs nothing.
TEST_F(Elastic, ANodeLostWhileTheOtherWaitsAtItsExitBarrierLeavesTheJobDoneNotRunAgain) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> modes{
      {"1:2", {"--rdzv-conf", "last_call_timeout=30"}},
      {"2:2", {"--restart-policy", "in-place", "--max-restarts", "1"}}};
  for (const auto& [nnodes, extra] : modes) {
    SCOPED_TRACE(nnodes);
    port_ = dist::agent::testing::free_port(kHost);
    auto store = external_store("store" + nnodes.substr(0, 1));
    const std::string a_name = "a" + nnodes.substr(0, 1), b_name = "b" + nnodes.substr(0, 1);
    auto a = agent(a_name, nnodes, extra, {"exit", "0"});
    auto b = agent(b_name, nnodes, extra, {"forever"});
    ASSERT_TRUE(dist::agent::testing::eventually(
        [&] {
          return a->output().find("at the exit barrier") != std::string::npos &&
                 rounds(b_name).size() == 1;  // (b's worker started)
        },
        60s))
        << a->output() << b->output();
    ::kill(b->pid(), SIGKILL);
    EXPECT_EQ(b->wait(), 128 + SIGKILL);
    EXPECT_EQ(a->wait(30s), 0) << a->output();
    EXPECT_NE(a->output().find("lost at the exit barrier"), std::string::npos) << a->output();
    EXPECT_EQ(rounds(a_name).size(), 1u) << "the finished job ran again\n" << a->output();
    EXPECT_EQ(rounds(b_name).size(), 1u);
    auto again = agent(b_name + "_again", nnodes, extra, {"exit", "0"});
    EXPECT_EQ(again->wait(30s), 0) << again->output();
    EXPECT_NE(again->output().find("the job already finished"), std::string::npos)
        << again->output();
    EXPECT_TRUE(rounds(b_name + "_again").empty()) << "no worker ran";
  }
}

TEST_F(Elastic, JobsSharingAnExternalStoreGiveTheirWorkersStoresOfTheirOwn) {
  // Torch workers key their entries by restart count only: two jobs on one dist-rendezvous (or
  // one job's reshaped rounds) must not meet in it. Each round's node rank 0 hosts the workers'.
  auto store = external_store();
  auto job = [&](const std::string& id) {
    return std::make_unique<Child>(
        DIST_LAUNCH_BIN,
        std::vector<std::string>{
            "--nnodes", "1:2", "--rdzv-endpoint", kHost + ":" + std::to_string(port_), "--rdzv-id",
            id, "--rdzv-conf", "last_call_timeout=0.2", "--nproc-per-node", "1", "--no-python",
            "/bin/sh", "-c", "echo $MASTER_PORT > " + (dir_ / id).string()},
        dir_ / (id + ".log"));
  };
  auto a = job("a");
  auto b = job("b");
  ASSERT_EQ(a->wait(), 0) << a->output();
  ASSERT_EQ(b->wait(), 0) << b->output();
  const auto master_port = [&](const std::string& id) {
    int port = 0;
    std::ifstream(dir_ / id) >> port;
    return port;
  };
  EXPECT_GT(master_port("a"), 0);
  EXPECT_NE(master_port("a"), port_) << "job a's workers were given the rendezvous store";
  EXPECT_NE(master_port("b"), port_) << "job b's workers were given the rendezvous store";
  EXPECT_NE(master_port("a"), master_port("b"));
}

TEST_F(Elastic, StoppingTheStoresHostStopsEveryNode) {
  // The agent hosting the store is stopped by SIGTERM: the job cannot go on without its store, so
  // it leaves at once and the others stop, saying why, instead of waiting for it.
  auto a = host("a", "1:2", {}, {"forever"});
  auto b = agent("b", "1:2", {}, {"forever"});
  ASSERT_TRUE(wait_for_world({"a", "b"}, 2)) << a->output() << b->output();
  const auto stopped = Clock::now();
  ::kill(a->pid(), SIGTERM);
  EXPECT_EQ(a->wait(), 128 + SIGTERM) << a->output();
  EXPECT_EQ(b->wait(), 1) << b->output();
  EXPECT_LT(Clock::now() - stopped, 10s);
  EXPECT_NE(a->output().find("this agent hosts the job's store"), std::string::npos) << a->output();
  EXPECT_NE(b->output().find("lost the rendezvous store"), std::string::npos) << b->output();
}

TEST_F(Elastic, TheStoresHostIsNodeZeroWhicheverAgentStartedFirst) {
  // "b" (is_host=0: a client) starts first, so its pid is the lower one and, on one machine, its
  // record would sort first; the agent that hosts the store is node 0 all the same, so that node 0
  // (the workers' store, in-place recoveries) shares the rendezvous store's fate.
  auto b = agent("b", "2", {"--rdzv-conf", "is_host=0"}, {"exit", "0"});
  auto a = host("a", "2", {}, {"exit", "0"});
  ASSERT_EQ(a->wait(), 0) << a->output();
  ASSERT_EQ(b->wait(), 0) << b->output();
  ASSERT_LT(b->pid(), a->pid()) << "pids wrapped between the two starts: nothing shown";
  const auto ra = rounds("a"), rb = rounds("b");
  ASSERT_EQ(ra.size(), 1u) << a->output();
  ASSERT_EQ(rb.size(), 1u) << b->output();
  EXPECT_EQ(ra[0].node_rank, 0) << a->output();
  EXPECT_EQ(rb[0].node_rank, 1) << b->output();
}

TEST_F(Elastic, TooFewNodesIsATimeoutSayingHowMany) {
  auto lonely = agent("a", "2:3", {"--rdzv-conf", "join_timeout=1"}, {"exit", "0"});
  EXPECT_EQ(lonely->wait(), 1);
  EXPECT_NE(lonely->output().find("1 node(s) joined, at least 2 needed"), std::string::npos)
      << lonely->output();
}

TEST_F(Elastic, IsHostInsistsOnHostingTheStore) {
  auto store = external_store();  // holds the endpoint's port
  auto a = agent("a", "1:2", {"--rdzv-conf", "is_host=1"}, {"exit", "0"});
  EXPECT_EQ(a->wait(), 1);
  EXPECT_NE(a->output().find("cannot host the rendezvous store (--rdzv-conf is_host=1)"),
            std::string::npos)
      << a->output();
}

}  // namespace
