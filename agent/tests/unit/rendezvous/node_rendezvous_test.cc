// NodeRendezvous without agents: several nodes as coroutines on one io_context, over a real
// TCPStore served by a StoreHost on that io_context (as an agent hosts it). Static and elastic
// rounds form, a failure reaches every watcher, a node's session ending is a lost node, the exit
// barrier releases everyone, an elastic round's verdict is one for all.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "dist/store/errors.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/schema.h"
#include "run_task.h"
#include "store/store.h"

namespace dist::agent {
namespace {

using namespace std::chrono_literals;
using store::testing::run_task;
using store::testing::TaskGroup;

class Nodes {
 public:
  // `n` nodes of a job of `min`..`max` nodes, 2 workers each.
  Nodes(int n, int min, int max, RendezvousTimeouts timeouts = default_timeouts())
      : store_(io_, "127.0.0.1", 0, {}) {
    store::ClientOptions options;
    options.port = store_.port();
    options.connect_timeout = options.timeout = 30s;
    for (int k = 0; k < n; ++k) {
      auto session = run_task(io_, open_rendezvous_store(io_, TcpStoreTarget{options}, "job"));
      const JobShape shape{min, max, 2, "node-" + std::to_string(k), 1};
      nodes_.emplace_back(std::make_unique<NodeRendezvous>(std::move(session), shape, timeouts));
    }
    probe_ = run_task(io_, open_rendezvous_store(io_, TcpStoreTarget{options}, "job"));
  }
  ~Nodes() {
    probe_->close();
    for (auto& node : nodes_) node->close();
    io_.restart();
    io_.run_for(100ms);
  }

  static RendezvousTimeouts default_timeouts() {
    RendezvousTimeouts timeouts;
    timeouts.rdzv = timeouts.join = 30s;
    timeouts.last_call = 1s;
    return timeouts;
  }

  boost::asio::io_context& io() { return io_; }

  // Nodes 0..count-1 join elastic round 0 together; returns their assignments once it closed.
  std::vector<Round> join_round_0(std::size_t count) {
    std::vector<Round> a(count);
    TaskGroup round0(io_);
    for (std::size_t k = 0; k < count; ++k) {
      round0.spawn([&, k]() -> Task<void> { a[k] = co_await nodes_[k]->join_elastic(0, {}); });
    }
    round0.wait(30s);
    return a;
  }
  NodeRendezvous& operator[](std::size_t k) { return *nodes_[k]; }
  // How many `op` requests ("MULTI_GET", ...) the store has served.
  std::uint64_t served(const std::string& op) const {
    for (const auto& [name, count] : store_.stats().requests_by_op) {
      if (name == op) return count;
    }
    return 0;
  }
  // The job's keys as the nodes see them, for what a test waits on.
  RendezvousStore& probe() { return *probe_; }
  std::size_t size() const { return nodes_.size(); }

  // Every node runs `body(k)`; returns once all have.
  template <typename T>
  std::vector<T> all(std::function<Task<T>(std::size_t)> body) {
    std::vector<T> results(nodes_.size());
    TaskGroup group(io_);
    for (std::size_t k = 0; k < nodes_.size(); ++k) {
      group.spawn([&, k]() -> Task<void> { results[k] = co_await body(k); });
    }
    group.wait(60s);
    return results;
  }

 private:
  boost::asio::io_context io_;
  StoreHost store_;
  std::vector<std::unique_ptr<NodeRendezvous>> nodes_;
  std::unique_ptr<RendezvousStore> probe_;
};

TEST(NodeRendezvous, AStaticRoundGivesEveryNodeItsRankAndContiguousGlobalRanks) {
  Nodes nodes(3, 3, 3);
  const auto a =
      nodes.all<Round>([&](std::size_t k) { return nodes[k].join_static(0, static_cast<int>(k)); });
  for (std::size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(a[k].node_rank, static_cast<int>(k));
    EXPECT_EQ(a[k].num_nodes, 3);
    EXPECT_EQ(a[k].world_size, 6);
    EXPECT_EQ(a[k].rank_offset, 2 * static_cast<int>(k));
    EXPECT_EQ(a[k].restarts, 0);
    EXPECT_FALSE(a[k].elastic);
  }
}

// The job's round pointer (what a relaunched node and `dist-launch status` read) follows the
// rounds, though only each round's first node writes it.
TEST(NodeRendezvous, TheStaticRoundPointerFollowsTheRounds) {
  Nodes nodes(3, 3, 3);
  for (const int round : {0, 1}) {
    nodes.all<Round>(
        [&](std::size_t k) { return nodes[k].join_static(round, static_cast<int>(k)); });
    const auto pointer =
        run_task(nodes.io(), nodes.probe().try_get(std::string(schema::kRoundPointer)));
    EXPECT_EQ(pointer.value_or("(none)"), std::to_string(round));
  }
}

// A relaunched node that reads a pointer one round behind (the next round's first node has not
// raised it yet) claims its rank in that round, finds it taken by its gone predecessor, and comes
// on to the next round, which the others then join.
TEST(NodeRendezvous, ARelaunchedNodeBehindTheRoundPointerComesOnToTheNextRound) {
  Nodes nodes(3, 2, 2);
  nodes.all<Round>([&](std::size_t k) -> Task<Round> {
    if (k == 2) co_return Round{};
    co_return co_await nodes[k].join_static(0, static_cast<int>(k));
  });
  nodes[1].close();  // node rank 1's agent gone, its liveness with it
  ASSERT_TRUE(run_task(nodes.io(), nodes.probe().wait_deleted({schema::static_alive(1)}, 30s)));
  Round relaunched, survivor;
  TaskGroup joining(nodes.io());
  joining.spawn([&]() -> Task<void> { relaunched = co_await nodes[2].join_static(0, 1); });
  // It claimed round 1 (round 0 was taken): only then does the survivor come to round 1.
  ASSERT_TRUE(
      run_task(nodes.io(), nodes.probe().wait({schema::in_round(1, schema::name::kNode, 1)}, 30s)));
  joining.spawn([&]() -> Task<void> { survivor = co_await nodes[0].join_static(1, 0); });
  joining.wait(30s);
  EXPECT_EQ(relaunched.round, 1);
  EXPECT_EQ(survivor.round, 1);
  EXPECT_EQ(relaunched.node_rank, 1);
  EXPECT_EQ(relaunched.rank_offset, 2);
  const auto pointer =
      run_task(nodes.io(), nodes.probe().try_get(std::string(schema::kRoundPointer)));
  EXPECT_EQ(pointer.value_or("(none)"), "1");
}

TEST(NodeRendezvous, AFailureAnnouncedByOneNodeEndsEveryOthersWatchAndIsReadBack) {
  Nodes nodes(2, 2, 2);
  const auto a =
      nodes.all<Round>([&](std::size_t k) { return nodes[k].join_static(0, static_cast<int>(k)); });
  WatchResult seen;
  TaskGroup group(nodes.io());
  group.spawn([&]() -> Task<void> { seen = co_await nodes[1].watch(a[1], 1s); });
  WorkerFailure failure;
  failure.host = "node-0";
  failure.worker.rank = 1;
  failure.exit_code = 3;
  failure.message = "ValueError: boom";
  run_task(nodes.io(), nodes[0].announce_failure(a[0], {failure}));
  group.wait(30s);
  EXPECT_EQ(seen.kind, WatchResult::kFailed);
  const auto all = run_task(nodes.io(), nodes[1].failures(a[1]));
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].worker.rank, 1);
  EXPECT_EQ(all[0].exit_code, 3);
  EXPECT_EQ(all[0].message, "ValueError: boom");
}

// A node relaunched into a static job that already failed is told so (and changes nothing):
// whether it claims the round that ran (its rank's record is there) or the next one (which the
// failure aborted).
TEST(NodeRendezvous, ANodeRelaunchedIntoAFailedStaticJobIsToldItFailed) {
  Nodes nodes(4, 2, 2);
  const auto a = nodes.all<Round>([&](std::size_t k) -> Task<Round> {
    if (k >= 2) co_return Round{};
    co_return co_await nodes[k].join_static(0, static_cast<int>(k));
  });
  run_task(nodes.io(), nodes[0].mark_failed(a[0], "worker 1 failed: exit code 3"));
  // Node rank 1's agent gone (its liveness key with it), then relaunched, twice.
  for (const int round : {0, 1}) {  // the round the pointer says, or the next one
    nodes[static_cast<std::size_t>(1 + round)].close();
    ASSERT_TRUE(run_task(nodes.io(), nodes.probe().wait_deleted({schema::static_alive(1)}, 30s)));
    try {
      run_task(nodes.io(), nodes[static_cast<std::size_t>(2 + round)].join_static(round, 1));
      ADD_FAILURE() << "round " << round << ": joined a job that failed";
    } catch (const JobOverError& e) {
      EXPECT_NE(std::string(e.what()).find("the job already failed: worker 1 failed"),
                std::string::npos)
          << e.what();
    }
  }
}

// A restart budget no in-place test here reaches.
constexpr int kAnyBudget = 100;

// --restart-policy in-place: one recovery at a time, job-wide, claimed by COMPARE_SET; the count
// is every node's.
TEST(NodeRendezvous, InPlaceOneRecoveryAtATimeAndEveryNodeReadsTheJobsCount) {
  Nodes nodes(2, 2, 2);
  const auto a =
      nodes.all<Round>([&](std::size_t k) { return nodes[k].join_static(0, static_cast<int>(k)); });
  const auto replacement = [&](std::size_t k, const Round& in) {
    return run_task(nodes.io(), nodes[k].claim_recovery(in, Recovery::kReplacement, 1, kAnyBudget));
  };
  EXPECT_EQ(run_task(nodes.io(), nodes[0].replacements()), 0);
  // Both claim at once: exactly one wins, with the count 1.
  const auto claims = nodes.all<RecoveryClaim>([&](std::size_t k) {
    return nodes[k].claim_recovery(a[k], Recovery::kReplacement, 1, kAnyBudget);
  });
  ASSERT_NE(claims[0].replacements.has_value(), claims[1].replacements.has_value());
  const std::size_t winner = claims[0].replacements ? 0 : 1, loser = 1 - winner;
  EXPECT_EQ(claims[winner].replacements, 1);
  EXPECT_EQ(claims[loser].under_way, Recovery::kReplacement);
  EXPECT_FALSE(replacement(loser, a[loser]).replacements.has_value())
      << "under way until the winner says it is over";
  // Only the claimant ends it.
  run_task(nodes.io(), nodes[loser].recovery_over(a[loser]));
  EXPECT_FALSE(replacement(loser, a[loser]).replacements.has_value());
  run_task(nodes.io(), nodes[winner].recovery_over(a[winner]));
  EXPECT_EQ(replacement(loser, a[loser]).replacements, 2);
  EXPECT_EQ(run_task(nodes.io(), nodes[winner].replacements()), 2);
  // Left under way when its round ended (a group restart): the next round may claim, here for
  // three workers replaced at once.
  Round next = a[winner];
  next.round = 1;
  EXPECT_EQ(run_task(nodes.io(),
                     nodes[winner].claim_recovery(next, Recovery::kReplacement, 3, kAnyBudget))
                .replacements,
            5);
}

// Node 0's regroup holds the job's recovery too, without counting as a replacement: a worker
// failing on another node meanwhile finds a regroup under way (its group must restart).
TEST(NodeRendezvous, InPlaceARegroupHoldsTheRecoveryWithoutCountingAReplacement) {
  Nodes nodes(2, 2, 2);
  const auto a =
      nodes.all<Round>([&](std::size_t k) { return nodes[k].join_static(0, static_cast<int>(k)); });
  const RecoveryClaim regroup =
      run_task(nodes.io(), nodes[0].claim_recovery(a[0], Recovery::kRegroup, 0, 0));
  EXPECT_EQ(regroup.replacements, 0) << "claimed, and no replacement counted";
  const RecoveryClaim refused =
      run_task(nodes.io(), nodes[1].claim_recovery(a[1], Recovery::kReplacement, 1, kAnyBudget));
  EXPECT_FALSE(refused.replacements.has_value());
  EXPECT_EQ(refused.under_way, Recovery::kRegroup);
  run_task(nodes.io(), nodes[0].recovery_over(a[0]));
  EXPECT_EQ(
      run_task(nodes.io(), nodes[1].claim_recovery(a[1], Recovery::kReplacement, 1, kAnyBudget))
          .replacements,
      1);
  EXPECT_EQ(run_task(nodes.io(), nodes[0].replacements()), 1);
}

// A failure folded into a replacement under way: the claim a refused claim found (another node's,
// or this node's own) becomes this node's, one replacement more for each worker folded in, and only
// its holder ends it. Only exactly that claim: not once it ended, was taken over or claimed again
// since; never a regroup.
TEST(NodeRendezvous, InPlaceAReplacementUnderWayIsTakenOverCountingOneMorePerWorker) {
  Nodes nodes(2, 2, 2);
  const auto a =
      nodes.all<Round>([&](std::size_t k) { return nodes[k].join_static(0, static_cast<int>(k)); });
  const auto claim = [&](std::size_t k, Recovery kind = Recovery::kReplacement) {
    return run_task(nodes.io(), nodes[k].claim_recovery(
                                    a[k], kind, kind == Recovery::kRegroup ? 0 : 1, kAnyBudget));
  };
  const auto take_over = [&](std::size_t k, const std::string& seen, int workers = 1) {
    return run_task(nodes.io(), nodes[k].take_over_recovery(a[k], seen, workers, kAnyBudget))
        .replacements;
  };
  EXPECT_FALSE(take_over(1, "").has_value()) << "nothing under way";
  ASSERT_EQ(claim(0).replacements, 1);
  const RecoveryClaim refused = claim(1);
  ASSERT_FALSE(refused.replacements.has_value());
  const std::string seen_by_0 = claim(0).seen;  // its own: the same state
  EXPECT_EQ(seen_by_0, refused.seen);
  EXPECT_EQ(take_over(1, refused.seen), 2);
  EXPECT_FALSE(take_over(0, seen_by_0).has_value()) << "taken over since";
  EXPECT_EQ(take_over(0, claim(0).seen, 2), 4) << "node 0's again, two workers folded in";
  EXPECT_EQ(run_task(nodes.io(), nodes[1].replacements()), 4);
  run_task(nodes.io(), nodes[1].recovery_over(a[1]));  // no longer node 1's to end
  EXPECT_EQ(claim(1).under_way, Recovery::kReplacement);
  const std::string before_the_end = claim(1).seen;
  run_task(nodes.io(), nodes[0].recovery_over(a[0]));
  EXPECT_FALSE(take_over(1, before_the_end).has_value()) << "it ended";
  ASSERT_EQ(claim(0, Recovery::kRegroup).replacements, 4);
  EXPECT_FALSE(take_over(1, claim(1).seen).has_value()) << "a regroup is not taken over";
}

// Workers that would pass the job's restart budget are refused uncounted, the count said: a group
// restart may still be left (counted, the job would have ended with none). A claim and a takeover
// alike; a regroup counts nothing and is never refused for it.
TEST(NodeRendezvous, InPlaceAClaimPastTheRestartBudgetIsRefusedUncounted) {
  Nodes nodes(2, 2, 2);
  const auto a =
      nodes.all<Round>([&](std::size_t k) { return nodes[k].join_static(0, static_cast<int>(k)); });
  const auto claim = [&](std::size_t k, int workers, int budget) {
    return run_task(nodes.io(),
                    nodes[k].claim_recovery(a[k], Recovery::kReplacement, workers, budget));
  };
  ASSERT_EQ(claim(0, 1, 3).replacements, 1);
  run_task(nodes.io(), nodes[0].recovery_over(a[0]));
  const RecoveryClaim over = claim(1, 3, 3);  // 1 + 3 > 3
  EXPECT_FALSE(over.replacements.has_value());
  EXPECT_EQ(over.over_budget, 1);
  EXPECT_EQ(run_task(nodes.io(), nodes[0].replacements()), 1) << "nothing counted";
  EXPECT_EQ(claim(1, 2, 3).replacements, 3) << "two fit: 1 + 2";
  // Under way (node 1's): node 0's two more workers would not fit a takeover either.
  const RecoveryClaim refused = claim(0, 2, 3);
  ASSERT_FALSE(refused.replacements.has_value());
  EXPECT_FALSE(refused.over_budget.has_value()) << "refused for the recovery under way";
  const RecoveryClaim not_taken =
      run_task(nodes.io(), nodes[0].take_over_recovery(a[0], refused.seen, 2, 4));
  EXPECT_FALSE(not_taken.replacements.has_value());
  EXPECT_EQ(not_taken.over_budget, 3);
  EXPECT_EQ(
      run_task(nodes.io(), nodes[0].take_over_recovery(a[0], refused.seen, 1, 4)).replacements, 4)
      << "one fits, against the same state";
  run_task(nodes.io(), nodes[0].recovery_over(a[0]));
  EXPECT_EQ(
      run_task(nodes.io(), nodes[0].claim_recovery(a[0], Recovery::kRegroup, 0, 0)).replacements,
      4);
}

TEST(NodeRendezvous, ANodeWhoseSessionEndsIsLostToItsWatcher) {
  Nodes nodes(2, 2, 2);
  const auto a =
      nodes.all<Round>([&](std::size_t k) { return nodes[k].join_static(0, static_cast<int>(k)); });
  WatchResult seen;
  TaskGroup group(nodes.io());
  group.spawn([&]() -> Task<void> { seen = co_await nodes[0].watch(a[0], 1s); });
  nodes[1].close();  // its agent is gone: its liveness key with its session
  group.wait(30s);
  EXPECT_EQ(seen.kind, WatchResult::kNodeLost);
  EXPECT_EQ(seen.node, 1);
}

TEST(NodeRendezvous, TheExitBarrierReleasesEveryNodeOnceAllSucceeded) {
  Nodes nodes(3, 3, 3);
  const auto a =
      nodes.all<Round>([&](std::size_t k) { return nodes[k].join_static(0, static_cast<int>(k)); });
  const auto ends =
      nodes.all<BarrierEnd>([&](std::size_t k) { return nodes[k].exit_barrier(a[k], 30s, true); });
  for (const auto& end : ends) {
    EXPECT_TRUE(end.passed);
    EXPECT_TRUE(end.lost.empty());
  }
}

// Static: node 2's agent is lost while nodes 0 and 1 wait at their exit barrier, with no failure
// said (a crash in its workers' teardown, its machine gone): every node still there succeeded, so
// the job is done and both pass, naming node 2 (they used to restart the finished job). Node 2's
// agent relaunched learns that it finished, twice: before the others marked it (from the round's
// count) and after.
TEST(NodeRendezvous, AStaticNodeLostAtTheExitBarrierLeavesTheJobDoneAndItsRelaunchIsToldSo) {
  Nodes nodes(5, 3, 3);  // nodes 3 and 4: node rank 2 relaunched
  const auto a = nodes.all<Round>([&](std::size_t k) -> Task<Round> {
    if (k >= 3) co_return Round{};
    co_return co_await nodes[k].join_static(0, static_cast<int>(k));
  });
  std::vector<BarrierEnd> ends(2);
  TaskGroup barrier(nodes.io());
  for (std::size_t k = 0; k < 2; ++k) {
    barrier.spawn(
        [&, k]() -> Task<void> { ends[k] = co_await nodes[k].exit_barrier(a[k], 30s, true); });
  }
  const std::string done = schema::in_round(0, schema::name::kDone);
  while (run_task(nodes.io(), nodes.probe().add(done, 0)) < 2) {
  }
  nodes[2].close();
  barrier.wait(30s);
  for (const auto& end : ends) {
    EXPECT_TRUE(end.passed);
    EXPECT_EQ(end.lost, std::vector<int>{2});
  }
  const auto relaunch = [&](std::size_t k) {
    try {
      run_task(nodes.io(), nodes[k].join_static(0, 2));
      ADD_FAILURE() << "node " << k << " joined a job that finished";
    } catch (const JobOverError& e) {
      EXPECT_TRUE(e.succeeded()) << e.what();
      EXPECT_NE(std::string(e.what()).find("finished"), std::string::npos) << e.what();
    }
  };
  relaunch(3);
  EXPECT_TRUE(run_task(nodes.io(), nodes[0].mark_done(a[0], ends[0].lost)));
  nodes[3].close();
  ASSERT_TRUE(run_task(nodes.io(), nodes.probe().wait_deleted({schema::static_alive(2)}, 30s)));
  relaunch(4);
}

// Static: node 2's agent is lost at its exit barrier (its workers succeeded) while node 1's
// workers still run and node 0 waits at its barrier. Node 2's agent relaunched takes its place at
// the barrier, counted no second time: it used to abort the round, and the healthy job restarted
// on every node. Then node 1 finishes (the job is done, no node lost), or a worker of node 1
// fails (the round ends for the relaunched node too, and it joins the next round with the others).
TEST(NodeRendezvous, ARelaunchedStaticNodeWhoseWorkersSucceededWaitsAtTheBarrierInItsPlace) {
  const std::string done = schema::in_round(0, schema::name::kDone);
  for (const bool node_1_fails : {false, true}) {
    SCOPED_TRACE(node_1_fails ? "node 1 fails" : "node 1 finishes");
    Nodes nodes(4, 3, 3);  // node 3: node rank 2 relaunched
    const auto a = nodes.all<Round>([&](std::size_t k) -> Task<Round> {
      if (k == 3) co_return Round{};
      co_return co_await nodes[k].join_static(0, static_cast<int>(k));
    });
    std::vector<BarrierEnd> ends(2);  // node 0's, the relaunched node's
    TaskGroup barrier(nodes.io()), lost(nodes.io());
    barrier.spawn(
        [&]() -> Task<void> { ends[0] = co_await nodes[0].exit_barrier(a[0], 30s, true); });
    lost.spawn([&]() -> Task<void> {
      try {
        co_await nodes[2].exit_barrier(a[2], 30s, true);
      } catch (const store::StoreError&) {  // its session closed under it
      }
    });
    while (run_task(nodes.io(), nodes.probe().add(done, 0)) < 2) {
    }
    nodes[2].close();
    lost.wait(30s);
    ASSERT_TRUE(run_task(nodes.io(), nodes.probe().wait_deleted({schema::static_alive(2)}, 30s)));

    const Round again = run_task(nodes.io(), nodes[3].join_static(0, 2));
    EXPECT_TRUE(again.workers_succeeded);
    EXPECT_EQ(again.round, 0);
    EXPECT_EQ(again.rank_offset, a[2].rank_offset);
    EXPECT_EQ(again.world_size, 6);
    barrier.spawn(
        [&]() -> Task<void> { ends[1] = co_await nodes[3].exit_barrier(again, 30s, true); });
    nodes.io().restart();
    nodes.io().run_for(300ms);
    ASSERT_EQ(barrier.running(), 2) << "a node left its barrier with node 1 running";
    EXPECT_EQ(run_task(nodes.io(), nodes.probe().add(done, 0)), 2) << "counted twice";
    EXPECT_TRUE(
        run_task(nodes.io(), nodes.probe().check({schema::in_round(0, schema::name::kHealthy)})))
        << "the round was aborted";

    if (!node_1_fails) {
      const BarrierEnd last = run_task(nodes.io(), nodes[1].exit_barrier(a[1], 30s, true));
      barrier.wait(30s);
      for (const auto& end : {ends[0], ends[1], last}) {
        EXPECT_TRUE(end.passed);
        EXPECT_TRUE(end.lost.empty());
      }
      continue;
    }
    WorkerFailure failure;
    failure.host = "node-1";
    failure.worker.rank = 2;
    failure.exit_code = 3;
    run_task(nodes.io(), nodes[1].announce_failure(a[1], {failure}));
    barrier.wait(30s);
    EXPECT_FALSE(ends[0].passed);
    EXPECT_FALSE(ends[1].passed);
    const auto next = nodes.all<Round>([&](std::size_t k) -> Task<Round> {
      if (k == 2) co_return Round{};
      co_return co_await nodes[k].join_static(1, k == 3 ? 2 : static_cast<int>(k));
    });
    for (const std::size_t k : {0u, 1u, 3u}) {
      EXPECT_EQ(next[k].round, 1) << k;
      EXPECT_FALSE(next[k].workers_succeeded) << k;
    }
    EXPECT_EQ(next[3].node_rank, 2);
  }
}

// Static: node 2's agent left its exit barrier past its timeout (`left`: the others run on without
// waiting for it) and was then lost before it exited. Relaunched, it leaves as its predecessor
// did, at once: it used to wait at the barrier a whole timeout again. Node 1's workers still run.
TEST(NodeRendezvous, ARelaunchedStaticNodeWhosePredecessorLeftItsBarrierLeavesAtOnce) {
  Nodes nodes(4, 3, 3);  // node 3: node rank 2 relaunched
  const auto a = nodes.all<Round>([&](std::size_t k) -> Task<Round> {
    if (k == 3) co_return Round{};
    co_return co_await nodes[k].join_static(0, static_cast<int>(k));
  });
  const BarrierEnd early = run_task(nodes.io(), nodes[2].exit_barrier(a[2], 200ms, true));
  ASSERT_TRUE(early.left_early);
  EXPECT_FALSE(early.predecessor_left);
  nodes[2].close();
  ASSERT_TRUE(run_task(nodes.io(), nodes.probe().wait_deleted({schema::static_alive(2)}, 30s)));

  const Round again = run_task(nodes.io(), nodes[3].join_static(0, 2));
  ASSERT_TRUE(again.workers_succeeded);
  const auto start = std::chrono::steady_clock::now();
  const BarrierEnd end = run_task(nodes.io(), nodes[3].exit_barrier(again, 60s, true));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s) << "waited a barrier timeout again";
  EXPECT_TRUE(end.passed);
  EXPECT_TRUE(end.left_early);
  EXPECT_TRUE(end.predecessor_left);
  EXPECT_EQ(run_task(nodes.io(), nodes.probe().add(schema::in_round(0, schema::name::kDone), 0)), 1)
      << "counted twice";
  EXPECT_TRUE(
      run_task(nodes.io(), nodes.probe().check({schema::in_round(0, schema::name::kHealthy)})))
      << "the round was aborted";

  // Node 0 (the store's host waits on) and node 1 finish: the job is done, no node lost.
  BarrierEnd host_end;
  TaskGroup barrier(nodes.io());
  barrier.spawn(
      [&]() -> Task<void> { host_end = co_await nodes[0].exit_barrier(a[0], 30s, false); });
  const BarrierEnd last = run_task(nodes.io(), nodes[1].exit_barrier(a[1], 30s, true));
  barrier.wait(30s);
  for (const auto& e : {host_end, last}) {
    EXPECT_TRUE(e.passed);
    EXPECT_TRUE(e.lost.empty());
  }
}

// Node 2's workers are done, the others' still run past --exit-barrier-timeout (rank 0 evaluates
// for minutes, say): like torchrun's agent it leaves with its success, and says so, so that node 1,
// which watches it, does not take it for lost (that restarted the healthy job) and watches node 0
// instead. A node that serves a store the others use (may_leave false: node 0) waits on. Then
// nodes 0 and 1 finish: the barrier passes with no node lost.
TEST(NodeRendezvous, ANodeWhoseExitBarrierTimesOutLeavesWithoutBeingTakenForLost) {
  Nodes nodes(3, 3, 3);
  const auto a =
      nodes.all<Round>([&](std::size_t k) { return nodes[k].join_static(0, static_cast<int>(k)); });
  WatchResult seen;
  TaskGroup watching(nodes.io());
  watching.spawn([&]() -> Task<void> { seen = co_await nodes[1].watch(a[1], 1s); });
  const BarrierEnd early = run_task(nodes.io(), nodes[2].exit_barrier(a[2], 200ms, true));
  EXPECT_TRUE(early.passed);
  EXPECT_TRUE(early.left_early);
  nodes[2].close();
  ASSERT_TRUE(run_task(nodes.io(), nodes.probe().wait_deleted({schema::static_alive(2)}, 30s)));

  BarrierEnd host_end;
  TaskGroup barrier(nodes.io());
  barrier.spawn(
      [&]() -> Task<void> { host_end = co_await nodes[0].exit_barrier(a[0], 200ms, false); });
  nodes.io().restart();
  nodes.io().run_for(700ms);  // past node 0's timeout, three times
  EXPECT_EQ(watching.running(), 1) << "node 1 took node 2 for lost: " << seen.kind;
  EXPECT_EQ(barrier.running(), 1) << "the store's host left its barrier";
  EXPECT_TRUE(
      run_task(nodes.io(), nodes.probe().check({schema::in_round(0, schema::name::kIntact)})));

  nodes[1].stop_watch();
  watching.wait(30s);
  EXPECT_EQ(seen.kind, WatchResult::kStopped);
  const BarrierEnd last = run_task(nodes.io(), nodes[1].exit_barrier(a[1], 30s, true));
  barrier.wait(30s);
  for (const auto& end : {last, host_end}) {
    EXPECT_TRUE(end.passed);
    EXPECT_FALSE(end.left_early);
    EXPECT_TRUE(end.lost.empty());
  }
}

// A node lost after it came to its exit barrier (its workers succeeded) is counted once: node 0
// and node 1 wait there, node 1's agent is lost, and node 2 still runs. Node 0 (which watches
// node 1) moves on to node 2 rather than pass, or end the round; node 2 comes too, and the job is
// done with no node lost.
TEST(NodeRendezvous, ANodeLostAtItsExitBarrierIsCountedOnceWhileAnotherStillRuns) {
  Nodes nodes(3, 3, 3);
  const auto a =
      nodes.all<Round>([&](std::size_t k) { return nodes[k].join_static(0, static_cast<int>(k)); });
  BarrierEnd first;
  TaskGroup waiting(nodes.io()), lost(nodes.io());
  waiting.spawn([&]() -> Task<void> { first = co_await nodes[0].exit_barrier(a[0], 30s, true); });
  lost.spawn([&]() -> Task<void> {
    try {
      co_await nodes[1].exit_barrier(a[1], 30s, true);
    } catch (const store::StoreError&) {  // its session closed under it
    }
  });
  const std::string done = schema::in_round(0, schema::name::kDone);
  while (run_task(nodes.io(), nodes.probe().add(done, 0)) < 2) {
  }
  nodes[1].close();
  lost.wait(30s);
  nodes.io().restart();
  nodes.io().run_for(300ms);
  ASSERT_EQ(waiting.running(), 1) << "node 0 left its barrier with node 2 running, passed: "
                                  << first.passed;
  const BarrierEnd last = run_task(nodes.io(), nodes[2].exit_barrier(a[2], 30s, true));
  waiting.wait(30s);
  for (const auto& end : {first, last}) {
    EXPECT_TRUE(end.passed);
    EXPECT_TRUE(end.lost.empty());
  }
}

// The job is done only when every node still there succeeded: static, a node lost while another
// still runs its workers ends the round for the one at its barrier (the job restarts, as on any
// loss); elastic, the barrier waits for the node still running, which either comes to it (the job
// is done: a newcomer learns so) or acts on the loss (its verdict ends the round). Node rank 0
// waits at its barrier, node rank 1 runs (and watches node rank 2, which is lost).
TEST(NodeRendezvous, ANodeLostAtTheExitBarrierWhileAnotherStillRunsDoesNotEndTheJob) {
  const auto at_rank = [](const std::vector<Round>& a, int rank) {
    return static_cast<std::size_t>(
        std::find_if(a.begin(), a.end(), [&](const Round& r) { return r.node_rank == rank; }) -
        a.begin());
  };
  const std::string done = schema::in_round(0, schema::name::kDone);
  for (const char* mode : {"static", "elastic: node 1 comes too", "elastic: node 1 decides"}) {
    SCOPED_TRACE(mode);
    const bool elastic = mode[0] == 'e';
    Nodes nodes(4, elastic ? 2 : 3, 3);  // node 3: a newcomer after the job
    auto a = elastic ? nodes.join_round_0(3) : nodes.all<Round>([&](std::size_t k) -> Task<Round> {
      if (k == 3) co_return Round{};
      co_return co_await nodes[k].join_static(0, static_cast<int>(k));
    });
    a.resize(3);
    const std::size_t waits = at_rank(a, 0), runs = at_rank(a, 1), lost = at_rank(a, 2);
    BarrierEnd end{true, {}};
    TaskGroup group(nodes.io());
    group.spawn(
        [&]() -> Task<void> { end = co_await nodes[waits].exit_barrier(a[waits], 30s, true); });
    WatchResult seen;
    group.spawn([&]() -> Task<void> { seen = co_await nodes[runs].watch(a[runs], 1s); });
    while (run_task(nodes.io(), nodes.probe().add(done, 0)) < 1) {
    }
    nodes[lost].close();
    if (!elastic) {
      group.wait(30s);
      EXPECT_EQ(seen.kind, WatchResult::kNodeLost);
      EXPECT_FALSE(end.passed);
      continue;
    }
    while (group.running() == 2) {  // node 1's watch sees the loss
      nodes.io().restart();
      nodes.io().run_for(10ms);
    }
    nodes.io().restart();
    nodes.io().run_for(300ms);
    ASSERT_EQ(group.running(), 1) << "left the barrier while a node still ran, passed: "
                                  << end.passed;
    if (std::string(mode).find("decides") != std::string::npos) {
      const Verdict v = run_task(nodes.io(), nodes[runs].decide(a[runs], 1));
      EXPECT_NE(v.action, Verdict::kDone) << v.reason;
      group.wait(30s);
      EXPECT_FALSE(end.passed) << "the round ended: on to the next";
      continue;
    }
    const BarrierEnd also = run_task(nodes.io(), nodes[runs].exit_barrier(a[runs], 30s, true));
    group.wait(30s);
    EXPECT_TRUE(end.passed);
    EXPECT_TRUE(also.passed);
    EXPECT_EQ(end.lost, std::vector<int>{2});
    EXPECT_EQ(also.lost, std::vector<int>{2});
    EXPECT_TRUE(run_task(nodes.io(), nodes[runs].mark_done(a[runs], also.lost)));
    try {
      run_task(nodes.io(), nodes[3].join_elastic(1, {}));
      ADD_FAILURE() << "a newcomer joined a job that finished";
    } catch (const JobOverError& e) {
      EXPECT_TRUE(e.succeeded()) << e.what();
    }
  }
}

TEST(NodeRendezvous, AnElasticRoundClosesAtMaxAndItsVerdictIsTheSameForAll) {
  Nodes nodes(3, 2, 3);
  const auto a =
      nodes.all<Round>([&](std::size_t k) { return nodes[k].join_elastic(0, std::nullopt); });
  std::vector<int> ranks;
  for (const auto& x : a) {
    EXPECT_TRUE(x.elastic);
    EXPECT_EQ(x.num_nodes, 3);
    EXPECT_EQ(x.world_size, 6);
    ranks.push_back(x.node_rank);
  }
  std::sort(ranks.begin(), ranks.end());
  EXPECT_EQ(ranks, (std::vector<int>{0, 1, 2}));
  run_task(nodes.io(), nodes[0].announce_failure(a[0], {}));
  const auto verdicts = nodes.all<Verdict>([&](std::size_t k) { return nodes[k].decide(a[k], 1); });
  for (const auto& v : verdicts) {
    EXPECT_EQ(v.action, Verdict::kRestart) << v.reason;
    EXPECT_EQ(v.restarts, 1);
    EXPECT_EQ(v.reason, verdicts[0].reason);
  }
}

// Nodes joining elastic round 0, each join told in words (or its error); the last call 20 s on,
// so that a round left to it shows.
class ElasticJoins {
 public:
  static RendezvousTimeouts timeouts() {
    RendezvousTimeouts t;
    t.rdzv = t.join = 40s;
    t.last_call = 20s;
    return t;
  }
  explicit ElasticJoins(Nodes& nodes)
      : nodes_(nodes), outcome_(nodes.size()), joining_(nodes.io()) {}
  void join(std::size_t k) {
    joining_.spawn([this, k]() -> Task<void> {
      try {
        const Round a = co_await nodes_[k].join_elastic(0, {});
        outcome_[k] =
            "node rank " + std::to_string(a.node_rank) + " of " + std::to_string(a.num_nodes);
      } catch (const std::exception& e) {
        outcome_[k] = e.what();
      }
    });
  }
  // Once every join ended: the outcomes, sorted, and how long it took from now.
  std::pair<std::vector<std::string>, std::chrono::steady_clock::duration> wait() {
    const auto start = std::chrono::steady_clock::now();
    joining_.wait(60s);
    std::vector<std::string> sorted = outcome_;
    std::sort(sorted.begin(), sorted.end());
    return {sorted, std::chrono::steady_clock::now() - start};
  }

 private:
  Nodes& nodes_;
  std::vector<std::string> outcome_;
  TaskGroup joining_;
};

// Only the MIN-th ticket sets `quorum`. Its node vanished between its ticket and that write (here:
// a ticket taken by hand, no record, no quorum). The MAX-th node closes the round with the two
// that are there, and the close wakes the node waiting for the quorum: not its last call, 20 s on.
TEST(NodeRendezvous, AnElasticRoundReachesItsMinimumWhenTheNodeThatReachedItVanishedFirst) {
  Nodes nodes(2, 2, 3, ElasticJoins::timeouts());
  ElasticJoins joins(nodes);
  const std::string tickets = schema::in_round(0, schema::name::kJoin);
  joins.join(0);  // ticket 1: waits for the quorum
  while (run_task(nodes.io(), nodes.probe().add(tickets, 0)) < 1) {
  }
  run_task(nodes.io(), nodes.probe().add(tickets, 1));  // ticket 2, the MIN-th: gone at once
  joins.join(1);                                        // ticket 3, MAX: closes the round
  const auto [outcomes, took] = joins.wait();
  EXPECT_EQ(outcomes, (std::vector<std::string>{"node rank 0 of 2", "node rank 1 of 2"}));
  EXPECT_LT(took, 10s) << "a node waited for the quorum until its last call";
}

// The closer (the MAX-th ticket, the only node that looks) finds a record missing after its grace
// of 2 s: that node's write is slow, not lost. It waits for it rather than give the round up to
// every node's last call, 20 s on.
TEST(NodeRendezvous, AnElasticRoundsCloserWaitsForASlowRecordUntilItsLastCall) {
  Nodes nodes(1, 2, 2, ElasticJoins::timeouts());
  ElasticJoins joins(nodes);
  const std::string tickets = schema::in_round(0, schema::name::kJoin);
  run_task(nodes.io(), nodes.probe().add(tickets, 1));  // ticket 1: a node whose record is slow
  const auto reads = nodes.served("MULTI_GET");
  joins.join(0);  // ticket 2, MAX: the closer
  // Its first read of the records comes after its grace (the join reads nothing before it).
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (nodes.served("MULTI_GET") == reads && std::chrono::steady_clock::now() < deadline) {
    nodes.io().restart();
    nodes.io().run_for(10ms);
  }
  ASSERT_GT(nodes.served("MULTI_GET"), reads) << "the closer never read the records";
  schema::NodeRecord slow;
  slow.host = "slow-node";
  slow.local_world_size = 2;
  slow.pid = 1;
  run_task(nodes.io(),
           nodes.probe().set(schema::in_round(0, schema::name::kNode, 1), schema::encode(slow)));
  const auto [outcomes, took] = joins.wait();
  EXPECT_EQ(outcomes, (std::vector<std::string>{"node rank 0 of 2"}));  // ("node-0" < "slow-node")
  EXPECT_LT(took, 10s) << "the closer gave the round up to the last call";
}

// Elastic: a newcomer let in (it deleted running round 0's no_newcomers) before any node reached
// its exit barrier. That alone ends nothing: node 1 waits at the barrier, and both pass once node
// 0 comes too (every node's workers had finished: the job is done). Only a verdict on the round
// (node 0 acted on the newcomer while its workers ran) sends node 1 on to the next round.
TEST(NodeRendezvous, ANewcomerAloneDoesNotEndTheExitBarrierANodeActingOnItDoes) {
  for (const bool acted : {false, true}) {
    SCOPED_TRACE(acted ? "node 0 decides the round" : "node 0 comes to the barrier");
    Nodes nodes(3, 2, 3);                  // node 2 is the newcomer
    const auto a = nodes.join_round_0(2);  // closes with nodes 0 and 1 after the 1 s last call
    TaskGroup newcomer(nodes.io());
    newcomer.spawn([&]() -> Task<void> {
      try {
        co_await nodes[2].join_elastic(1, {});
      } catch (const store::StoreError&) {  // closed at the end
      }
    });
    EXPECT_EQ(run_task(nodes.io(), nodes[0].watch(a[0], 1s)).kind, WatchResult::kNewcomer);

    bool passed = false;
    TaskGroup barrier(nodes.io());
    barrier.spawn(
        [&]() -> Task<void> { passed = (co_await nodes[1].exit_barrier(a[1], 30s, true)).passed; });
    const std::string done = schema::in_round(0, schema::name::kDone);
    while (run_task(nodes.io(), nodes.probe().add(done, 0)) < 1) {
    }
    // Node 1 waits at the barrier, with the newcomer in. (It used to leave at once, false: the
    // time to do so.)
    nodes.io().restart();
    nodes.io().run_for(300ms);
    ASSERT_EQ(barrier.running(), 1) << "node 1 left the barrier, passed: " << passed;
    if (acted) {
      const Verdict v = run_task(nodes.io(), nodes[0].decide(a[0], 1));
      EXPECT_EQ(v.action, Verdict::kReshape) << v.reason;
      barrier.wait(30s);
      EXPECT_FALSE(passed) << "node 1 goes on to the next round";
    } else {
      EXPECT_TRUE(run_task(nodes.io(), nodes[0].exit_barrier(a[0], 30s, true)).passed);
      barrier.wait(30s);
      EXPECT_TRUE(passed) << "the job is done: node 1 passes with node 0";
    }
    nodes[2].close();
    newcomer.wait(30s);
  }
}

// A hot spare (round 0 full) whose running round loses every node before any of them wrote its
// verdict, over a store that outlives them (here the test's; etcd or a dist-rendezvous daemon in a
// job): the spare decides that round for them, as a newcomer does, and leaves when its join
// timeout has passed since, saying why. It used to take the undecided round for one that runs on
// and wait on as a hot spare for ever.
TEST(NodeRendezvous, AHotSpareDecidesARunningRoundWhoseNodesAllVanishedAndDoesNotWaitForEver) {
  RendezvousTimeouts timeouts;
  timeouts.rdzv = timeouts.join = 1s;
  timeouts.last_call = 200ms;
  std::string ended;  // (before the nodes: the spare's task, if it outlives the test, writes it)
  Nodes nodes(3, 2, 2, timeouts);  // node 2 is the spare
  nodes.join_round_0(2);           // closes at once: MAX nodes
  TaskGroup spare(nodes.io());
  spare.spawn([&]() -> Task<void> {
    try {
      const Round got = co_await nodes[2].join_elastic(1, {});
      ended = "joined round " + std::to_string(got.round);
    } catch (const std::exception& e) {
      ended = e.what();
    }
  });
  const std::string tickets = schema::in_round(1, schema::name::kJoin);
  while (run_task(nodes.io(), nodes.probe().add(tickets, 0)) < 1) {
  }
  nodes[0].close();  // both agents gone (their sessions end, and their liveness keys with them)
  nodes[1].close();
  try {
    spare.wait(20s);
  } catch (const std::runtime_error& e) {
    nodes[2].close();
    FAIL() << "the spare still waits for round 0, which no node runs (" << e.what() << ")";
  }
  EXPECT_NE(ended.find("within join_timeout"), std::string::npos) << ended;
  const auto verdict =
      run_task(nodes.io(), nodes.probe().try_get(schema::in_round(0, schema::name::kVerdict)));
  EXPECT_TRUE(verdict.has_value()) << "round 0 was not decided";
}

}  // namespace
}  // namespace dist::agent
