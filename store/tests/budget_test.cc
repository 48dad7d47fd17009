// Memory budgets: what the server holds for a connection (partial requests, unsent replies, waits,
// watches) counts against a per-connection limit and, with the stored data, a global one. Over
// either, the connection is closed with a typed error, or the connections holding the most are
// closed to make room, and everyone else keeps being served.
#include <gtest/gtest.h>

#include <thread>

#include "dist/store/client.h"
#include "dist/store/server.h"
#include "protocol.h"
#include "raw_client.h"

namespace dist::store {
namespace {

using namespace std::chrono_literals;
using namespace testing;
namespace cur = wire::current;
namespace leg = wire::legacy;

constexpr std::uint64_t kMiB = 1024 * 1024;

ServerOptions small_budgets() {
  ServerOptions o;
  o.limits.max_value_bytes = 1 * kMiB;
  o.limits.max_request_bytes = 2 * kMiB;
  o.limits.max_reply_backlog_bytes = 4 * kMiB;
  o.limits.max_connection_bytes = 8 * kMiB;
  o.limits.max_total_bytes = 24 * kMiB;
  return o;
}

StoreClient connect(std::uint16_t port) {
  ClientOptions options;
  options.port = port;
  options.timeout = 10s;
  options.connect_timeout = 5s;
  return StoreClient::connect(options);
}

std::vector<std::string> keys(int n, const std::string& prefix) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(prefix + std::to_string(i) + std::string(24, 'k'));
  return out;
}

TEST(Budget, AWaitOverTheConnectionLimitIsRefusedWithATypedError) {
  StoreServerThread server("127.0.0.1", 0, small_budgets());
  auto waiter = connect(server.port());
  // 40,000 missing keys: a 1.6 MB request, but over 8 MiB of waiter bookkeeping.
  try {
    waiter.wait(keys(40'000, "missing/"), 5s);
    FAIL() << "a wait that needs more than max_connection_bytes must be refused";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), StoreErrc::kLimitExceeded) << e.what();
    EXPECT_NE(std::string(e.what()).find("--max-connection-bytes"), std::string::npos) << e.what();
  }
  EXPECT_THROW(waiter.ping(1), StoreError) << "the connection was closed";
  auto other = connect(server.port());
  other.set("fine", "1");
  other.wait({"fine"}, 1s);
}

TEST(Budget, ClientsThatNeverReadAreClosedWhileOthersKeepWorking) {
  const ServerOptions options = small_budgets();
  StoreServerThread server("127.0.0.1", 0, options);
  auto legit = connect(server.port());
  legit.set("big", std::string(1 * kMiB - 64, 'b'));

  // Eight clients pipeline 100 GETs of 1 MiB each and read nothing: 800 MiB of replies asked for.
  std::string batch = validate();
  for (int i = 0; i < 100; ++i) batch += u8(cur::kGet) + str("big");
  std::vector<std::unique_ptr<RawClient>> greedy;
  std::vector<std::thread> senders;
  for (int i = 0; i < 8; ++i) {
    greedy.push_back(std::make_unique<RawClient>("127.0.0.1", server.port()));
    senders.emplace_back([&, c = greedy.back().get()] {
      try {
        c->send(batch);  // blocks while the server holds back, fails once it closes
      } catch (const std::exception&) {
      }
    });
  }
  // Meanwhile the legitimate client is served, and the server never holds more than its limit.
  std::uint64_t most_held = 0;
  const auto until = std::chrono::steady_clock::now() + 3s;
  int round_trips = 0;
  while (std::chrono::steady_clock::now() < until) {
    ASSERT_EQ(legit.add("n", 1), ++round_trips);
    most_held = std::max(most_held, server.stats().held_bytes);
  }
  const ServerStats stats = server.stats();
  EXPECT_LE(most_held, options.limits.max_total_bytes);
  EXPECT_GE(stats.connections_evicted, 1u) << "the biggest holders were closed to make room";
  for (auto& c : greedy) c.reset();  // unblocks the senders
  for (auto& t : senders) t.join();
  EXPECT_EQ(legit.get("big").size(), 1 * kMiB - 64);
}

TEST(Budget, AWatcherThatNeverReadsIsClosedNotTheWriter) {
  StoreServerThread server("127.0.0.1", 0, small_budgets());
  RawClient watcher("127.0.0.1", server.port());
  watcher.send(u8(leg::kWatchKey) + str("/w"));
  ASSERT_EQ(watcher.read_u8(), wire::kWatchCallbackRegistered);
  auto writer = connect(server.port());
  // Each event carries the old and the new value: 2 MiB, 40 MiB in all, none of it read.
  for (int i = 0; i < 20; ++i) writer.set("/w", std::string(1 * kMiB - 64, 'a' + i % 26));
  EXPECT_TRUE(watcher.closed_by_server(10s));
  EXPECT_EQ(writer.get("/w").front(), 'a' + 19 % 26);
}

TEST(Budget, LimitsThatCannotHoldOneRequestAndReplyAreRejected) {
  ServerOptions o = small_budgets();
  o.limits.max_connection_bytes = 2 * kMiB;  // less than a request plus a value
  EXPECT_THROW(StoreServerThread("127.0.0.1", 0, o), StoreError);
}

}  // namespace
}  // namespace dist::store
