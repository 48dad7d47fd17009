// The C++ client against a real server over loopback: every operation, waits and their timeouts,
// ephemeral keys, deletion waits, barriers and many concurrent waiters.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <filesystem>
#include <thread>
#include <vector>

#include "dist/store/client.h"
#include "dist/store/server.h"

namespace dist::store {
namespace {

using namespace std::chrono_literals;

class ClientTest : public ::testing::Test {
 protected:
  StoreClient connect() {
    ClientOptions options;
    options.port = server_.port();
    options.timeout = 5s;
    options.connect_timeout = 5s;
    return StoreClient::connect(options);
  }
  StoreServerThread server_;
};

TEST_F(ClientTest, SetGetRoundTripsBinaryValues) {
  auto c = connect();
  const std::string binary("a\0b\xff", 4);
  c.set("k", binary);
  EXPECT_EQ(c.get("k"), binary);
  c.set("k", "overwritten");
  EXPECT_EQ(c.get("k"), "overwritten");
  c.set("empty", "");
  EXPECT_EQ(c.get("empty"), "");
  EXPECT_EQ(c.try_get("missing"), std::nullopt);
}

// The server counts what it served, in all and by operation (what rendezvous-bench --by-op
// reports), each request once.
TEST_F(ClientTest, TheServerCountsItsRequestsByOperation) {
  auto c = connect();
  const auto before = server_.stats();
  c.set("k", "v");
  c.get("k");
  c.get("k");
  c.add("n", 1);
  const auto after = server_.stats();
  EXPECT_EQ(after.requests - before.requests, 4u);
  const auto count = [](const ServerStats& s, const std::string& op) -> std::uint64_t {
    for (const auto& [name, n] : s.requests_by_op) {
      if (name == op) return n;
    }
    return 0;
  };
  EXPECT_EQ(count(after, "GET") - count(before, "GET"), 2u);
  EXPECT_EQ(count(after, "ADD") - count(before, "ADD"), 1u);
  EXPECT_EQ(count(after, "SET") + count(after, "SET_EXT") - count(before, "SET") -
                count(before, "SET_EXT"),
            1u);
  std::uint64_t all = 0;
  for (const auto& entry : after.requests_by_op) all += entry.second;
  EXPECT_EQ(all, after.requests);
}

// The keepalive schedule of each connection the server accepted on `port`, read from this
// process's own sockets (the server runs in it): {idle, interval, probes}, or {0, 0, 0} when off.
std::vector<std::array<int, 3>> served_keepalives(std::uint16_t port) {
  std::vector<std::array<int, 3>> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(entry.path().filename().string());
    sockaddr_in local{};
    socklen_t length = sizeof local;
    int listening = 0;
    socklen_t int_length = sizeof listening;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0 ||
        local.sin_family != AF_INET || ntohs(local.sin_port) != port ||
        ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &int_length) != 0 || listening) {
      continue;
    }
    int on = 0;
    std::array<int, 3> k{};
    ::getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, &int_length);
    if (on) {
      ::getsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &k[0], &int_length);
      ::getsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &k[1], &int_length);
      ::getsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &k[2], &int_length);
    }
    found.push_back(k);
  }
  return found;
}

// A client asking for its own keepalive schedule (a dist-launch agent's options).
ClientOptions asking_for(std::uint16_t port, int idle, int interval, int probes) {
  ClientOptions options;
  options.port = port;
  options.keepalive_idle_seconds = idle;
  options.keepalive_interval_seconds = interval;
  options.keepalive_probes = probes;
  return options;
}

// A client with a keepalive schedule of its own (a dist-launch agent: its liveness is its
// connection) has the server probe its connection on that schedule, whatever the server's own:
// a fixed-size job's 30 s holds on a dist-rendezvous started with 8 s. A client that asks
// nothing (PyTorch's) keeps the server's.
TEST(ClientKeepalive, TheServerProbesAClientsConnectionOnTheClientsSchedule) {
  ServerOptions options;
  options.keepalive = {1, 1, 7};  // dist-rendezvous's default: 8 s
  StoreServerThread server("127.0.0.1", 0, options);
  auto agent = StoreClient::connect(asking_for(server.port(), 1, 1, 29));
  agent.set("k", "v");  // the handshake is done
  EXPECT_EQ(served_keepalives(server.port()), (std::vector<std::array<int, 3>>{{1, 1, 29}}));

  ClientOptions silent;
  silent.port = server.port();
  auto torch_like = StoreClient::connect(silent);
  torch_like.get("k");
  auto both = served_keepalives(server.port());
  std::sort(both.begin(), both.end());
  EXPECT_EQ(both, (std::vector<std::array<int, 3>>{{1, 1, 7}, {1, 1, 29}}));
}

// Beyond Linux's bounds (a value past one is refused, and the socket kept the rest of the
// server's schedule; the user timeout overflowed an int): held to them.
TEST(ClientKeepalive, ASchedulePastTheKernelsBoundsIsHeldToThem) {
  StoreServerThread server;
  auto agent = StoreClient::connect(asking_for(server.port(), 65535, 65535, 65535));
  agent.set("k", "v");
  EXPECT_EQ(served_keepalives(server.port()),
            (std::vector<std::array<int, 3>>{
                {kMaxKeepaliveSeconds, kMaxKeepaliveSeconds, kMaxKeepaliveProbes}}));
}

// With a secret, the schedule a client asks for is its own once it has proven the secret.
TEST(ClientKeepalive, WithASecretTheScheduleHoldsOnceTheClientAuthenticated) {
  ServerOptions options;
  options.secret = "s3cret";
  options.unauthenticated = UnauthenticatedPolicy::kDeny;  // loopback too must prove it
  options.keepalive = {1, 1, 7};
  StoreServerThread server("127.0.0.1", 0, options);
  ClientOptions asking = asking_for(server.port(), 1, 1, 29);
  asking.secret = "s3cret";
  auto agent = StoreClient::connect(asking);
  agent.set("k", "v");
  EXPECT_EQ(served_keepalives(server.port()), (std::vector<std::array<int, 3>>{{1, 1, 29}}));
}

TEST(ClientKeepalive, AServerWithoutKeepaliveProbesAnAskingClientsConnectionAlone) {
  StoreServerThread server;  // keepalive off
  ClientOptions silent;
  silent.port = server.port();
  auto plain = StoreClient::connect(silent);
  EXPECT_EQ(plain.try_get("k"), std::nullopt);
  auto agent = StoreClient::connect(asking_for(server.port(), 2, 3, 4));
  agent.set("k", "v");
  auto both = served_keepalives(server.port());
  std::sort(both.begin(), both.end());
  EXPECT_EQ(both, (std::vector<std::array<int, 3>>{{0, 0, 0}, {2, 3, 4}}));
}

TEST_F(ClientTest, AddKeepsADecimalCounter) {
  auto c = connect();
  EXPECT_EQ(c.add("n", 5), 5);
  EXPECT_EQ(c.add("n", -7), -2);
  EXPECT_EQ(c.get("n"), "-2");
  c.set("text", "abc");
  try {
    c.add("text", 1);
    FAIL() << "ADD to a non-number must fail";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), StoreErrc::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'text'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(c.add("n", 1), -1) << "the connection stays usable after a request error";
  // Stored text reads as PyTorch's servers read it; an overflow is an error here (PyTorch's
  // clients get the wrapped sum, as from PyTorch's servers).
  c.set("padded", " 41abc");
  EXPECT_EQ(c.add("padded", 1), 42);
  EXPECT_EQ(c.get("padded"), "42");
  c.set("max", std::to_string(INT64_MAX));
  try {
    c.add("max", 1);
    FAIL() << "ADD past INT64_MAX must fail for our clients";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), StoreErrc::kInvalidArgument) << e.what();
  }
  EXPECT_EQ(c.get("max"), std::to_string(INT64_MAX)) << "nothing changed";
}

TEST_F(ClientTest, CompareSetFollowsPyTorchSemantics) {
  struct Case {
    const char* name;
    std::optional<std::string> initial;
    std::string expected, desired, reply, stored;  // stored "" with initial nullopt: stays missing
  };
  const Case cases[] = {
      {"missing key, empty expected: stores", std::nullopt, "", "new", "new", "new"},
      {"missing key, other expected: no store", std::nullopt, "x", "new", "x", ""},
      {"present, matching: swaps", std::string("old"), "old", "new", "new", "new"},
      {"present, not matching: keeps", std::string("old"), "zzz", "new", "old", "old"},
  };
  auto c = connect();
  int i = 0;
  for (const Case& t : cases) {
    SCOPED_TRACE(t.name);
    const std::string key = "cas" + std::to_string(i++);
    if (t.initial) c.set(key, *t.initial);
    EXPECT_EQ(c.compare_set(key, t.expected, t.desired), t.reply);
    if (t.stored.empty()) {
      EXPECT_FALSE(c.check({key}));
    } else {
      EXPECT_EQ(c.get(key), t.stored);
    }
  }
}

TEST_F(ClientTest, CheckDeleteNumKeysListKeysAppendMulti) {
  auto c = connect();
  c.multi_set({{"a", "1"}, {"b", "2"}, {"c", "3"}});
  EXPECT_TRUE(c.check({"a", "b"}));
  EXPECT_FALSE(c.check({"a", "nope"}));
  EXPECT_EQ(c.multi_get({"c", "a"}), (std::vector<std::string>{"3", "1"}));
  c.append("a", "+x");
  c.append("fresh", "y");
  EXPECT_EQ(c.get("a"), "1+x");
  EXPECT_EQ(c.get("fresh"), "y");
  EXPECT_EQ(c.num_keys(), 4);
  EXPECT_EQ(c.list_keys(), (std::vector<std::string>{"a", "b", "c", "fresh"}));
  EXPECT_TRUE(c.delete_key("b"));
  EXPECT_FALSE(c.delete_key("b"));
  EXPECT_EQ(c.num_keys(), 3);
  EXPECT_EQ(c.ping(0xABCD1234u), 0xABCD1234u);
}

TEST_F(ClientTest, WaitReturnsWhenAnotherClientSetsTheKey) {
  auto waiter = connect();
  auto writer = connect();
  std::thread t([&] {
    std::this_thread::sleep_for(50ms);
    writer.set("late", "v");
    writer.add("counter", 1);
  });
  waiter.wait({"late", "counter"}, 5s);
  EXPECT_EQ(waiter.get("late"), "v");
  t.join();
}

TEST_F(ClientTest, GetWaitsForAMissingKey) {
  auto getter = connect();
  auto writer = connect();
  std::thread t([&] {
    std::this_thread::sleep_for(50ms);
    writer.set("later", "value");
  });
  EXPECT_EQ(getter.get("later", 5s), "value");
  t.join();
}

TEST_F(ClientTest, WaitTimeoutCancelsAndLeavesTheConnectionUsable) {
  auto c = connect();
  const auto start = std::chrono::steady_clock::now();
  try {
    c.wait({"never"}, 200ms);
    FAIL() << "wait must time out";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), StoreErrc::kTimeout);
    EXPECT_NE(std::string(e.what()).find("'never'"), std::string::npos) << e.what();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, 200ms);
  // The cancelled wait must not leave a stray reply behind.
  c.set("never", "now");
  EXPECT_EQ(c.get("never"), "now");
  EXPECT_EQ(c.add("x", 2), 2);
}

TEST_F(ClientTest, EphemeralKeyVanishesWithItsConnectionAndWakesDeletionWaiters) {
  auto watcher = connect();
  {
    auto owner = connect();
    owner.set("alive/node1", "pid 42", /*ephemeral=*/true);
    owner.set("permanent", "stays");
    EXPECT_EQ(watcher.get("alive/node1"), "pid 42");
    std::thread closer([o = std::move(owner)]() mutable {
      std::this_thread::sleep_for(50ms);
      StoreClient gone = std::move(o);  // destroyed: the connection closes
    });
    EXPECT_EQ(watcher.wait_deleted({"alive/node1", "permanent"}, 5s), 0u);
    closer.join();
  }
  EXPECT_FALSE(watcher.check({"alive/node1"}));
  EXPECT_EQ(watcher.get("permanent"), "stays");
  // Already missing: answered at once.
  EXPECT_EQ(watcher.wait_deleted({"permanent", "alive/node1"}, 1s), 1u);
}

TEST_F(ClientTest, PlainSetMakesAnEphemeralKeyPermanent) {
  auto other = connect();
  {
    auto owner = connect();
    owner.set("k", "mine", true);
    other.set("k", "taken over");
  }
  // The owner's close has been processed once a fresh connection's request is answered after it.
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(connect().get("k"), "taken over");
}

TEST_F(ClientTest, WaitDeletedTimesOut) {
  auto c = connect();
  c.set("stays", "1");
  try {
    c.wait_deleted({"stays"}, 100ms);
    FAIL();
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), StoreErrc::kTimeout);
  }
  EXPECT_EQ(c.get("stays"), "1");
}

TEST_F(ClientTest, DeleteAllExceptKeepsOnlyThePrefixAndWakesDeletionWaiters) {
  auto c = connect();
  c.set("rdzv/job/r0/closed", "1");
  c.set("rdzv/job/alive/0", "1", true);
  c.set("/worker/attempt_0/init", "2");
  c.set("default_pg/0", "x");
  c.queue_push("q", "item");
  auto waiter = std::thread([this] {
    auto w = connect();
    EXPECT_EQ(w.wait_deleted({"rdzv/job/r0/closed", "default_pg/0"}, 5s), 1u);
  });
  std::this_thread::sleep_for(50ms);           // the waiter is registered
  EXPECT_EQ(c.delete_all_except("rdzv/"), 3);  // two keys and the queue
  waiter.join();
  EXPECT_EQ(c.list_keys().size(), 2u);
  EXPECT_TRUE(c.check({"rdzv/job/r0/closed", "rdzv/job/alive/0"}));
  EXPECT_EQ(c.queue_len("q"), 0);
  EXPECT_EQ(c.delete_all_except("rdzv/"), 0);
}

TEST_F(ClientTest, BarrierReleasesEveryoneAtWorldSize) {
  constexpr int kWorld = 8;
  std::vector<std::thread> threads;
  std::atomic<int> released{0};
  for (int i = 0; i < kWorld; ++i) {
    threads.emplace_back([&] {
      auto c = connect();
      c.barrier("barrier/1", kWorld, 5s);
      released.fetch_add(1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(released.load(), kWorld);
  auto c = connect();
  EXPECT_EQ(c.get("barrier/1"), std::to_string(kWorld));
}

TEST_F(ClientTest, QueuePushPopLen) {
  auto c = connect();
  EXPECT_EQ(c.queue_len("q"), 0);
  EXPECT_EQ(c.queue_pop("q"), std::nullopt);
  c.queue_push("q", "first");
  c.queue_push("q", "second");
  EXPECT_EQ(c.queue_len("q"), 2);
  EXPECT_TRUE(c.check({"q"})) << "a non-empty queue counts as an existing key";
  EXPECT_EQ(c.queue_pop("q"), "first");
  EXPECT_EQ(c.queue_pop("q"), "second");
  EXPECT_EQ(c.queue_pop("q"), std::nullopt);
}

TEST_F(ClientTest, ManyConcurrentWaitersAreAllReleasedBySet) {
  // Many connections each waiting on the same key; one SET releases all of them.
  constexpr int kWaiters = 256;
  constexpr int kThreads = 8;
  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      std::vector<StoreClient> clients;
      for (int i = 0; i < kWaiters / kThreads; ++i) clients.push_back(connect());
      std::vector<std::thread> waits;
      for (auto& c : clients) {
        waits.emplace_back([&c, &done] {
          c.wait({"go"}, 10s);
          done.fetch_add(1);
        });
      }
      for (auto& w : waits) w.join();
    });
  }
  std::this_thread::sleep_for(100ms);
  auto setter = connect();
  setter.set("go", "1");
  for (auto& t : threads) t.join();
  EXPECT_EQ(done.load(), kWaiters);
}

// A port a store listened on a moment ago: nothing listens there now.
std::uint16_t a_port_just_freed() {
  StoreServerThread s;
  return s.port();
}

TEST(ClientConnect, UnavailableAfterTheDeadlineWithAClearMessage) {
  const std::uint16_t port = a_port_just_freed();
  ClientOptions options;
  options.port = port;
  options.connect_timeout = 300ms;
  const auto start = std::chrono::steady_clock::now();
  try {
    StoreClient::connect(options);
    FAIL();
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), StoreErrc::kUnavailable);
    EXPECT_NE(std::string(e.what()).find(std::to_string(port)), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
}

// A client that reached a store before (an agent rejoining its job) takes a refusal as the
// store's end: at once, saying so, not after connect_timeout's retries.
TEST(ClientConnect, ARefusalEndsTheConnectAtOnceWhenAsked) {
  const std::uint16_t port = a_port_just_freed();
  ClientOptions options;
  options.port = port;
  options.connect_timeout = 60s;
  options.refusal_is_final = true;
  const auto start = std::chrono::steady_clock::now();
  try {
    StoreClient::connect(options);
    FAIL();
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), StoreErrc::kUnavailable);
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port) +
                                         " refused the connection: its host answers but the "
                                         "store is gone"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

TEST(ClientConnect, RetriesUntilTheServerAppears) {
  const std::uint16_t port = a_port_just_freed();
  std::optional<StoreServerThread> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(300ms);
    server.emplace("127.0.0.1", port);
  });
  ClientOptions options;
  options.port = port;
  options.connect_timeout = 10s;
  auto c = StoreClient::connect(options);
  EXPECT_EQ(c.add("up", 1), 1);
  starter.join();
}

TEST(ServerBind, PortInUseIsAClearError) {
  StoreServerThread first;
  try {
    StoreServerThread second("127.0.0.1", first.port());
    FAIL();
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), StoreErrc::kUnavailable);
    EXPECT_NE(std::string(e.what()).find("Address already in use"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dist::store
