// The agent's generations over a real workers' store: once a generation recovered, the keys of
// the generations before it go (the workers' records, arrivals and words; their process groups'
// keys, as the SDK's client stores them and as torch's does, with "/" before), and nothing else.
#include <gtest/gtest.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "dist/contract/worker_contract.h"
#include "dist/store/client.h"
#include "dist/store/server.h"
#include "recovery/generations.h"

namespace dist::agent {
namespace {

using namespace std::chrono_literals;
namespace contract = worker_contract;

const std::string kRecords = contract::generation_prefix("job", 0);  // "/dist_launch/inplace/..."
const std::string kGroups = contract::group_prefix("job", 0);        // "sdk/job/attempt_0/"

// Keys of generations 1 and 2 that generation 3's recovery makes stale, and keys it must keep.
std::vector<std::string> stale_keys() {
  return {contract::generation_key(kRecords, 1),
          contract::recovered_key(kRecords, 1),
          contract::arrived_key(kRecords, 2, 0),
          contract::generation_key(kRecords, 2),
          kGroups + "gen_1/nccl",              // the SDK's client: as it is
          "/" + kGroups + "gen_2//0//rank_0",  // torch's: "/" first, PrefixStore's "/"s
          "/" + kGroups + "gen_2//0//rank_1"};
}
std::vector<std::string> kept_keys() {
  return {contract::generation_counter_key(kRecords),
          contract::generation_key(kRecords, 3),
          contract::recovered_key(kRecords, 3),
          contract::generation_key(kRecords, 30),  // a later generation, not gen 3's prefix
          contract::regroup_key(kRecords, 1, 0),   // a regroup's place
          "/" + kGroups + "gen_3//0//rank_0",      // this generation's group
          "/" + kGroups + "0//rank_0",             // generation 0's: no gen_ in it
          "/" + kGroups + "gen_1",                 // not a group's key
          contract::group_prefix("job", 1) + "gen_1/nccl",  // another restart's
          "/" + contract::group_prefix("other", 0) + "gen_1//0"};
}

TEST(KeysBefore, NamesEveryEarlierGenerationsKeyAndNothingElse) {
  auto all = kept_keys();
  for (const auto& key : stale_keys()) all.push_back(key);
  EXPECT_EQ(keys_before(all, kRecords, kGroups, 3), stale_keys());
  EXPECT_TRUE(keys_before(all, kRecords, kGroups, 1).empty());
}

TEST(Generations, ARecoveredGenerationDeletesTheKeysOfThoseBeforeIt) {
  store::StoreServerThread server;
  store::ClientOptions options;
  options.port = server.port();
  store::StoreClient client = store::StoreClient::connect(options);
  for (const auto& key : stale_keys()) client.set(key, "x");
  for (const auto& key : kept_keys()) client.set(key, "x");

  boost::asio::io_context io;
  Generations generations(io, "job", "", store::Endpoint{"127.0.0.1", server.port()}, 0);
  std::exception_ptr failure;
  std::vector<std::string> left;
  boost::asio::co_spawn(
      io,
      [&]() -> store::Task<void> {
        const auto outcome = co_await generations.publish_and_wait(3, "replaced=1", 10s);
        EXPECT_TRUE(outcome.recovered) << outcome.why;
        // The cleanup runs in the background: until the stale keys are gone (at most 10 s).
        const auto stale = stale_keys();
        for (int i = 0; i < 1000; ++i) {
          left = client.list_keys();
          const bool any = std::any_of(stale.begin(), stale.end(), [&](const std::string& k) {
            return std::find(left.begin(), left.end(), k) != left.end();
          });
          if (!any) break;
          boost::asio::steady_timer t(io, 10ms);
          co_await t.async_wait(boost::asio::use_awaitable);
        }
        generations.close();
      },
      [&](std::exception_ptr e) { failure = e; });
  // The group's word, as its new root writes it, once the generation is out.
  std::thread root([&] {
    store::StoreClient worker = store::StoreClient::connect(options);
    worker.wait({contract::generation_key(kRecords, 3)}, 10s);
    worker.set(contract::recovered_key(kRecords, 3), "root=0");
  });
  io.run();
  root.join();
  if (failure) std::rethrow_exception(failure);
  std::sort(left.begin(), left.end());
  auto expected = kept_keys();
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(left, expected);
}

// A failure folded into a recovery under way, as two nodes' agents see it: node B finds node A's
// generation 1 under way once it is published, checks that every rank follows folds, counts
// generation 2 and marks 1 superseded; A's wait for generation 1 follows to 2 and ends with 2's
// word, as B's does. A generation that recovered cannot be superseded.
TEST(Generations, AWaitForASupersededGenerationFollowsToTheOneThatSupersedesIt) {
  store::StoreServerThread server;
  store::ClientOptions options;
  options.port = server.port();
  store::StoreClient worker = store::StoreClient::connect(options);
  boost::asio::io_context io;
  const store::Endpoint endpoint{"127.0.0.1", server.port()};
  Generations a(io, "job", "", endpoint, 0), b(io, "job", "", endpoint, 0);
  std::exception_ptr failure;
  RecoveryOutcome a_saw, b_saw;
  boost::asio::co_spawn(
      io,
      [&]() -> store::Task<void> {
        // (Each result in a variable first: no co_await inside a call's arguments, GCC 12.)
        const auto none = co_await b.under_way(50ms);
        EXPECT_FALSE(none) << "nothing counted yet";
        const int first = co_await a.next();
        EXPECT_EQ(first, 1);
        const auto unpublished = co_await b.under_way(50ms);
        EXPECT_FALSE(unpublished) << "counted, not published";
        co_await a.publish(1, "replaced=2 survivors=0,1,3");
        const auto under_way = co_await b.under_way(50ms);
        EXPECT_TRUE(under_way && under_way->generation == 1 &&
                    under_way->record == "replaced=2 survivors=0,1,3");
        const bool three_of_four = co_await b.all_follow_folds(4);
        EXPECT_FALSE(three_of_four) << "rank 3 did not say so";
        worker.set(contract::fold_key(kRecords, 3), "1");
        const bool all_four = co_await b.all_follow_folds(4);
        EXPECT_TRUE(all_four);
        const int second = co_await b.next();
        EXPECT_EQ(second, 2);
        const bool superseded = co_await b.supersede(1, 2);
        EXPECT_TRUE(superseded);
        const bool again = co_await b.supersede(1, 3);
        EXPECT_FALSE(again) << "once";
        co_await b.publish(2, "replaced=1,2 survivors=0,3 supersedes=1");
        a_saw = co_await a.wait_recovered(1, 10s);
        b_saw = co_await b.wait_recovered(2, 10s);
        const bool after_its_word = co_await b.supersede(2, 3);
        EXPECT_FALSE(after_its_word) << "generation 2 recovered";
        a.close();
        b.close();
      },
      [&](std::exception_ptr e) { failure = e; });
  for (const int rank : {0, 1, 2}) worker.set(contract::fold_key(kRecords, rank), "1");
  std::thread root([&] {  // generation 2's new root, once the generation is out
    store::StoreClient w = store::StoreClient::connect(options);
    w.wait({contract::generation_key(kRecords, 2)}, 10s);
    w.set(contract::recovered_key(kRecords, 2), "root=0 step=10");
  });
  io.run();
  root.join();
  if (failure) std::rethrow_exception(failure);
  EXPECT_TRUE(a_saw.recovered) << a_saw.why;
  EXPECT_EQ(a_saw.generation, 2);
  EXPECT_EQ(a_saw.record, "root=0 step=10");
  EXPECT_TRUE(b_saw.recovered) << b_saw.why;
  EXPECT_EQ(b_saw.generation, 2);
}

}  // namespace
}  // namespace dist::agent
