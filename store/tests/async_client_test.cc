// The asynchronous client against a real server over loopback, on one io_context thread: every
// operation, wait timeouts that leave the connection usable, close() cancelling a pending wait,
// waits that give way to other calls, lanes, and connect retries that say why they wait.
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <exception>
#include <functional>
#include <optional>

#include "dist/store/async_client.h"
#include "dist/store/client.h"
#include "dist/store/server.h"

namespace dist::store {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
template <typename T = void>
using Task = asio::awaitable<T>;
using Keys = std::vector<std::string>;

// GCC 12 cannot compile a braced list inside a co_await expression ("array used as
// initializer"): lists are built by a plain function call instead.
template <typename... K>
Keys keys(K... k) {
  return {std::string(k)...};
}

// Runs one coroutine to completion on a fresh io_context; rethrows what it threw.
template <typename F>
void run(F&& body) {
  asio::io_context io;
  std::exception_ptr failure;
  asio::co_spawn(io, std::forward<F>(body)(), [&](std::exception_ptr e) { failure = e; });
  io.run();
  if (failure) std::rethrow_exception(failure);
}

// Polls `done` every millisecond on the test's io_context (ctest's timeout bounds it).
Task<> until(std::function<bool()> done) {
  auto executor = co_await asio::this_coro::executor;
  while (!done()) {
    asio::steady_timer t(executor, 1ms);
    co_await t.async_wait(asio::use_awaitable);
  }
}

// The store error a call ends with; nullopt when it succeeds.
template <typename T>
Task<std::optional<StoreErrc>> error_of(Task<T> call) {
  try {
    co_await std::move(call);
  } catch (const StoreError& e) {
    co_return e.code();
  }
  co_return std::nullopt;
}

class AsyncClientTest : public ::testing::Test {
 protected:
  ClientOptions options() const {
    ClientOptions o;
    o.port = server_.port();
    o.timeout = 5s;
    o.connect_timeout = 5s;
    return o;
  }
  StoreServerThread server_;
};

TEST_F(AsyncClientTest, EveryOperationRoundTrips) {
  run([&]() -> Task<> {
    auto c = co_await AsyncStoreClient::connect(options());
    const std::string binary("a\0b\xff", 4);
    co_await c.set("k", binary);
    const auto r1 = co_await c.try_get("k");
    EXPECT_EQ(r1, binary);
    const auto r2 = co_await c.try_get("missing");
    EXPECT_EQ(r2, std::nullopt);
    const auto r3 = co_await c.add("n", 5);
    EXPECT_EQ(r3, 5);
    const auto r4 = co_await c.add("n", -2);
    EXPECT_EQ(r4, 3);
    const auto r5 = co_await c.compare_set("cas", "", "first");
    EXPECT_EQ(r5, "first");
    const auto r6 = co_await c.compare_set("cas", "wrong", "second");
    EXPECT_EQ(r6, "first");
    const auto r7 = co_await c.compare_set("cas", "first", "second");
    EXPECT_EQ(r7, "second");
    AsyncStoreClient::Items items{{"a", "1"}, {"b", "2"}};
    co_await c.multi_set(items);
    const auto r8 = co_await c.multi_get(keys("a", "b"));
    EXPECT_EQ(r8, keys("1", "2"));
    const bool r9 = co_await c.check(keys("a", "b"));
    EXPECT_TRUE(r9);
    const bool r10 = co_await c.check(keys("a", "nope"));
    EXPECT_FALSE(r10);
    const bool r11 = co_await c.delete_key("a");
    EXPECT_TRUE(r11);
    const bool r12 = co_await c.delete_key("a");
    EXPECT_FALSE(r12);
    const auto keys = co_await c.list_keys();
    EXPECT_EQ(keys.size(), 4u);  // k, n, cas, b
    co_await c.set("rdzv/keep", "x");
    const auto r13 = co_await c.delete_all_except("rdzv/");
    EXPECT_EQ(r13, 4);
    const auto r14 = co_await c.try_get("rdzv/keep");
    EXPECT_EQ(r14, "x");
  });
}

TEST_F(AsyncClientTest, MultiGetOfAMissingKeyIsNotFound) {
  run([&]() -> Task<> {
    auto c = co_await AsyncStoreClient::connect(options());
    co_await c.set("a", "1");
    try {
      co_await c.multi_get(keys("a", "missing"));
      ADD_FAILURE() << "MULTI_GET of a missing key succeeded";
    } catch (const StoreError& e) {
      EXPECT_EQ(e.code(), StoreErrc::kNotFound);
    }
    const auto r15 = co_await c.try_get("a");
    EXPECT_EQ(r15, "1");  // the connection is still usable
  });
}

TEST_F(AsyncClientTest, AWaitThatTimesOutLeavesTheConnectionUsable) {
  run([&]() -> Task<> {
    auto c = co_await AsyncStoreClient::connect(options());
    const bool r16 = co_await c.wait(keys("never"), 50ms);
    EXPECT_FALSE(r16);
    const auto r17 = co_await c.wait_deleted(keys("never"), 50ms);
    EXPECT_EQ(r17, std::optional<std::size_t>(0));
    co_await c.set("present", "1");
    const auto r18 = co_await c.wait_deleted(keys("present"), 50ms);
    EXPECT_EQ(r18, std::nullopt);
    const auto r19 = co_await c.add("after", 1);
    EXPECT_EQ(r19, 1);  // no stray WAIT_CANCELED in the stream
  });
}

TEST_F(AsyncClientTest, AWaitEndsWhenAnotherClientSetsTheKey) {
  run([&]() -> Task<> {
    auto waiter = co_await AsyncStoreClient::connect(options());
    auto writer = co_await AsyncStoreClient::connect(options());
    asio::co_spawn(
        co_await asio::this_coro::executor,
        [&]() -> Task<> {
          // Set the keys only once the waiter's requests are on the server.
          auto probe = StoreClient::connect(options());
          while (!probe.try_get("go")) {
            asio::steady_timer t(co_await asio::this_coro::executor, 1ms);
            co_await t.async_wait(asio::use_awaitable);
          }
          co_await writer.set("k1", "v");
          co_await writer.delete_key("gone");
        },
        asio::detached);
    co_await waiter.set("gone", "1");
    co_await waiter.set("go", "1");
    const bool r20 = co_await waiter.wait(keys("k1"), 10s);
    EXPECT_TRUE(r20);
    const auto r21 = co_await waiter.wait_deleted(keys("k1", "gone"), 10s);
    EXPECT_EQ(r21, std::optional<std::size_t>(1));
  });
}

TEST_F(AsyncClientTest, CloseCancelsAPendingWait) {
  run([&]() -> Task<> {
    auto c = co_await AsyncStoreClient::connect(options());
    asio::steady_timer later(co_await asio::this_coro::executor, 20ms);
    later.async_wait([&](boost::system::error_code) { c.close(); });
    try {
      co_await c.wait(keys("never"), 60s);
      ADD_FAILURE() << "the wait returned";
    } catch (const StoreError& e) {
      EXPECT_EQ(e.code(), StoreErrc::kCancelled) << e.what();
    }
    try {
      co_await c.add("x", 1);
      ADD_FAILURE() << "a call after close() succeeded";
    } catch (const StoreError& e) {
      EXPECT_EQ(e.code(), StoreErrc::kCancelled);
    }
  });
}

TEST_F(AsyncClientTest, ConcurrentCallsAreServedInOrder) {
  run([&]() -> Task<> {
    auto c = co_await AsyncStoreClient::connect(options());
    auto executor = co_await asio::this_coro::executor;
    std::vector<int> order;
    int finished = 0;
    for (int i = 0; i < 5; ++i) {
      asio::co_spawn(
          executor,
          [&, i]() -> Task<> {
            const auto v = co_await c.add("counter", 1);
            order.push_back(static_cast<int>(v));
            ++finished;
          },
          asio::detached);
    }
    co_await asio::post(executor, asio::use_awaitable);     // the five start and queue
    const bool set = co_await c.wait(keys("never"), 30ms);  // queued behind them
    EXPECT_FALSE(set);
    EXPECT_EQ(finished, 5);
    EXPECT_EQ(order, (std::vector<int>{1, 2, 3, 4, 5}));
  });
}

// Several coroutines that each open one client before their call (the recovery's store calls do)
// share one connection and one handshake: a second open() waits for the first and returns; it never
// connects again between the first's connect and its HELLO (each open made a connection of its
// own, the one before it dropped with its ephemeral keys, and a HELLO came on a connection that
// had said it).
void open_together(StoreServerThread& server, const std::string& secret) {
  ClientOptions options;
  options.port = server.port();
  options.timeout = 5s;
  options.connect_timeout = 5s;
  options.secret = secret;
  run([&]() -> Task<> {
    auto executor = co_await asio::this_coro::executor;
    AsyncStoreClient c(executor, options);
    constexpr int kCallers = 6;
    int finished = 0;
    std::vector<std::optional<std::string>> read(kCallers);
    for (int i = 0; i < kCallers; ++i) {
      asio::co_spawn(
          executor,
          [&, i]() -> Task<> {
            co_await c.open();
            const std::string key = "/dist_launch/opened/" + std::to_string(i);
            co_await c.set(key, std::string(100, static_cast<char>('a' + i)), /*ephemeral=*/true);
            read[i] = co_await c.try_get(key);
            ++finished;
          },
          [&](std::exception_ptr e) {
            if (!e) return;
            try {
              std::rethrow_exception(e);
            } catch (const std::exception& what) {
              ADD_FAILURE() << "caller " << i << ": " << what.what();
            }
            ++finished;
          });
    }
    co_await until([&] { return finished == kCallers; });
    for (int i = 0; i < kCallers; ++i) {
      EXPECT_EQ(read[i], std::string(100, static_cast<char>('a' + i))) << "caller " << i;
    }
    co_await c.open();  // once open, open() is nothing
    const auto keys = co_await c.list_keys();
    EXPECT_EQ(keys.size(), static_cast<std::size_t>(kCallers));  // every ephemeral key still there
  });
  const ServerStats stats = server.stats();
  EXPECT_EQ(stats.connections_total, 1u);
  EXPECT_EQ(stats.protocol_errors, 0u);
}

TEST_F(AsyncClientTest, OpensMadeTogetherShareOneConnectionAndOneHandshake) {
  open_together(server_, "");
}

TEST(AsyncClientAuth, OpensMadeTogetherShareOneConnectionAndOneAuthentication) {
  ServerOptions with_secret;
  with_secret.secret = "s3cret-token";
  StoreServerThread server("127.0.0.1", 0, with_secret);
  open_together(server, "s3cret-token");
}

TEST_F(AsyncClientTest, EphemeralKeysGoWithTheirConnection) {
  run([&]() -> Task<> {
    auto observer = co_await AsyncStoreClient::connect(options());
    {
      auto owner = co_await AsyncStoreClient::connect(options());
      co_await owner.set("alive", "1", /*ephemeral=*/true);
      const bool r22 = co_await observer.check(keys("alive"));
      EXPECT_TRUE(r22);
    }  // destroyed: closed
    const auto r23 = co_await observer.wait_deleted(keys("alive"), 5s);
    EXPECT_EQ(r23, std::optional<std::size_t>(0));
  });
}

// A wait gives way: a call made while it is in flight is served at once (the wait is cancelled
// on the store and made again), and the wait still ends on its key.
TEST_F(AsyncClientTest, AWaitGivesWayToACallMadeMeanwhileAndStillSeesItsKey) {
  run([&]() -> Task<> {
    auto c = co_await AsyncStoreClient::connect(options());
    auto executor = co_await asio::this_coro::executor;
    std::optional<bool> waited;
    asio::co_spawn(
        executor, [&]() -> Task<> { waited = co_await c.wait(keys("k"), 60s); }, asio::detached);
    // The wait is on the store once the store has counted its request.
    co_await until([&] { return server_.stats().requests >= 2; });  // HELLO, WAIT
    for (int i = 1; i <= 3; ++i) {
      const auto n = co_await c.add("n", 1);  // served while the wait is pending
      EXPECT_EQ(n, i);
      EXPECT_FALSE(waited.has_value()) << "the wait ended before its key was set";
    }
    auto writer = co_await AsyncStoreClient::connect(options());
    co_await writer.set("k", "v");
    co_await until([&] { return waited.has_value(); });
    EXPECT_TRUE(*waited);
  });
}

// Two waits on one connection (a client's and a lane's) take turns without end: the first to hold
// the connection keeps it until it ends, the other then has it; each ends on its own key.
TEST_F(AsyncClientTest, TwoWaitsOnOneConnectionEachEndOnTheirKey) {
  run([&]() -> Task<> {
    auto c = co_await AsyncStoreClient::connect(options());
    co_await c.set("a", "1");
    auto lane = c.lane();
    auto executor = co_await asio::this_coro::executor;
    std::optional<std::optional<std::size_t>> first;
    std::optional<bool> second;
    asio::co_spawn(
        executor, [&]() -> Task<> { first = co_await lane.wait_deleted(keys("a"), 60s); },
        asio::detached);
    asio::co_spawn(
        executor, [&]() -> Task<> { second = co_await c.wait(keys("b"), 60s); }, asio::detached);
    auto writer = co_await AsyncStoreClient::connect(options());
    co_await writer.set("b", "1");
    co_await until([&] { return second.has_value(); });
    EXPECT_TRUE(*second);
    EXPECT_FALSE(first.has_value());
    co_await writer.delete_key("a");
    co_await until([&] { return first.has_value(); });
    EXPECT_EQ(*first, std::optional<std::size_t>(0));
    // No ping-pong: a handful of requests, not a wait cancelled and made again without end.
    EXPECT_LT(server_.stats().requests, 30u);
  });
}

// A wait that gave way to another wait, and waits for its turn behind it, still ends at its own
// timeout, and at its lane's close(), not when the other wait ends.
TEST_F(AsyncClientTest, AWaitQueuedBehindAnotherEndsAtItsOwnTimeoutOrClose) {
  run([&]() -> Task<> {
    auto c = co_await AsyncStoreClient::connect(options());
    auto executor = co_await asio::this_coro::executor;
    for (const bool by_close : {false, true}) {
      auto lane = c.lane();
      const auto before = server_.stats().requests;
      std::optional<std::string> ended;
      asio::co_spawn(
          executor,
          [&]() -> Task<> {
            try {
              const bool set = co_await lane.wait(keys("never"), by_close ? 60s : 100ms);
              ended = set ? "set" : "timed out";
            } catch (const StoreError& e) {
              ended = e.code() == StoreErrc::kCancelled ? "cancelled" : e.what();
            }
          },
          asio::detached);
      co_await until([&] { return server_.stats().requests >= before + 1; });  // its WAIT
      bool other_ended = false;
      asio::co_spawn(
          executor,
          [&]() -> Task<> {
            co_await c.wait(keys("other"), 60s);  // takes the connection: the lane's queues
            other_ended = true;
          },
          asio::detached);
      // The lane's wait gave way (CANCEL_WAIT) and waits behind the client's WAIT.
      co_await until([&] { return server_.stats().requests >= before + 3; });
      if (by_close) lane.close();
      co_await until([&] { return ended.has_value(); });
      EXPECT_EQ(*ended, by_close ? "cancelled" : "timed out");
      EXPECT_FALSE(other_ended) << "it waited for the other wait to end";
      auto writer = co_await AsyncStoreClient::connect(options());
      co_await writer.set("other", "1");
      co_await writer.delete_key("other");
      co_await until([&] { return other_ended; });
    }
  });
}

// close() while the connection passes from one call to the next (the next not yet resumed): that
// call, and every later one on the client or its lanes, ends in kCancelled; none waits for ever.
TEST_F(AsyncClientTest, CloseDuringAHandOverEndsEveryCall) {
  run([&]() -> Task<> {
    auto c = co_await AsyncStoreClient::connect(options());
    auto lane = c.lane();
    auto executor = co_await asio::this_coro::executor;
    std::optional<StoreErrc> queued;
    asio::co_spawn(
        executor, [&]() -> Task<> { queued = co_await error_of(c.add("b", 1)); }, asio::detached);
    co_await c.add("a", 1);  // the call above queued behind this one, and is handed the connection
    c.close();               // before it resumes
    const auto later = co_await error_of(lane.add("x", 1));
    EXPECT_EQ(later, std::optional<StoreErrc>(StoreErrc::kCancelled));
    EXPECT_EQ(queued, std::optional<StoreErrc>(StoreErrc::kCancelled));
  });
}

// A lane's close() ends its own calls, the wait in flight first, and leaves the connection (and
// the ephemeral keys it holds) to the client; the client's close() ends its lanes.
TEST_F(AsyncClientTest, ALanesCloseEndsOnlyItsOwnCalls) {
  run([&]() -> Task<> {
    auto c = co_await AsyncStoreClient::connect(options());
    auto observer = co_await AsyncStoreClient::connect(options());
    co_await c.set("alive", "1", /*ephemeral=*/true);
    auto lane = c.lane();
    co_await lane.open();  // nothing to do: the connection is the client's
    co_await lane.set("by-lane", "1");
    asio::steady_timer later(co_await asio::this_coro::executor, 20ms);
    later.async_wait([&](boost::system::error_code) { lane.close(); });
    const auto waited = co_await error_of(lane.wait(keys("never"), 60s));
    EXPECT_EQ(waited, std::optional<StoreErrc>(StoreErrc::kCancelled));
    const auto after = co_await error_of(lane.add("x", 1));
    EXPECT_EQ(after, std::optional<StoreErrc>(StoreErrc::kCancelled));
    const auto n = co_await c.add("x", 1);
    EXPECT_EQ(n, 1);
    const bool still = co_await observer.check(keys("alive", "by-lane"));
    EXPECT_TRUE(still);

    auto other = c.lane();
    c.close();
    const auto orphaned = co_await error_of(other.add("x", 1));
    EXPECT_EQ(orphaned, std::optional<StoreErrc>(StoreErrc::kCancelled));
    const auto gone = co_await observer.wait_deleted(keys("alive"), 10s);
    EXPECT_EQ(gone, std::optional<std::size_t>(0));
  });
}

TEST(AsyncClientConnect, AnUnresolvableNameRetriesSayingWhyThenFailsNamingIt) {
  ClientOptions o;
  o.host = "no-such-host.invalid";
  o.port = 1;
  o.connect_timeout = 600ms;
  o.retry_notice_interval = 100ms;
  std::vector<std::string> notices;
  o.on_retry = [&](const std::string& why) { notices.push_back(why); };
  try {
    run([&]() -> Task<> { co_await AsyncStoreClient::connect(o); });
    FAIL() << "connected to a name that does not exist";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), StoreErrc::kUnavailable);
    EXPECT_NE(std::string(e.what()).find("no-such-host.invalid"), std::string::npos) << e.what();
  }
  ASSERT_FALSE(notices.empty());
  EXPECT_NE(notices.front().find("cannot resolve 'no-such-host.invalid'"), std::string::npos)
      << notices.front();
}

TEST(AsyncClientConnect, ARefusalEndsTheConnectAtOnceWhenAsked) {
  ClientOptions o;
  o.host = "127.0.0.1";
  o.port = 1;  // nothing listens there
  o.connect_timeout = 60s;
  o.refusal_is_final = true;
  const auto started = std::chrono::steady_clock::now();
  try {
    run([&]() -> Task<> { co_await AsyncStoreClient::connect(o); });
    FAIL() << "connected to a closed port";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), StoreErrc::kUnavailable);
    EXPECT_NE(std::string(e.what()).find(
                  "127.0.0.1:1 refused the connection: its host answers but the store is gone"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, 10s);
}

TEST(AsyncClientConnect, CloseDuringConnectRetriesCancelsAtOnce) {
  ClientOptions o;
  o.host = "127.0.0.1";
  o.port = 1;  // nothing listens there: connect retries until connect_timeout
  o.connect_timeout = 60s;
  const auto started = std::chrono::steady_clock::now();
  run([&]() -> Task<> {
    AsyncStoreClient c(co_await asio::this_coro::executor, o);
    asio::steady_timer later(co_await asio::this_coro::executor, 50ms);
    later.async_wait([&](boost::system::error_code) { c.close(); });
    try {
      co_await c.open();
      ADD_FAILURE() << "connected to a closed port";
    } catch (const StoreError& e) {
      EXPECT_EQ(e.code(), StoreErrc::kCancelled) << e.what();
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - started, 10s);
}

// The hosting process's own keys (StoreServer::multi_set): stored without a connection, and a
// client waiting on one of them wakes as for a client's MULTI_SET.
TEST(StoreServerTest, TheHostsOwnKeysWakeAWaitingClient) {
  asio::io_context io;
  StoreServer server(io, StoreServer::bind(io, "127.0.0.1", 0));
  server.start();
  ClientOptions o;
  o.port = server.local_endpoint().port();
  o.timeout = 5s;
  o.connect_timeout = 5s;
  std::exception_ptr failure;
  asio::co_spawn(
      io,
      [&]() -> Task<> {
        auto c = co_await AsyncStoreClient::connect(o);
        // Written once the client waits: the wait is sent before the post below runs.
        asio::post(io, [&] { server.multi_set({{"k", "v"}, {"other", "w"}}); });
        const bool woke = co_await c.wait(keys("k"), 5s);
        EXPECT_TRUE(woke);
        const auto values = co_await c.multi_get(keys("k", "other"));
        EXPECT_EQ(values, keys("v", "w"));
        c.close();
        server.stop();
      },
      [&](std::exception_ptr e) { failure = e; });
  io.run();
  if (failure) std::rethrow_exception(failure);
}

TEST(StoreServerTest, TheHostsOwnKeysOverTheStoresLimitsAreRefusedWhole) {
  asio::io_context io;
  ServerOptions options;
  options.limits.max_total_bytes = 64 * 1024;
  StoreServer server(io, StoreServer::bind(io, "127.0.0.1", 0), options);
  try {
    server.multi_set({{"small", "1"}, {"large", std::string(128 * 1024, 'x')}});
    FAIL() << "a write over max_total_bytes was stored";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("store is full"), std::string::npos) << e.what();
  }
  server.multi_set({{"after", "1"}});  // the store still takes what fits
  EXPECT_EQ(server.stats().keys, 1u) << "part of a refused write was stored";
}

}  // namespace
}  // namespace dist::store
