// Limits and malformed input: each gets a clear error, the offending connection (only) is closed,
// and the server keeps serving everyone else.
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

ServerOptions small_limits() {
  ServerOptions o;
  o.limits.max_key_bytes = 64;
  o.limits.max_value_bytes = 1024;
  o.limits.max_keys_per_request = 16;
  o.limits.max_request_bytes = 4096;
  o.limits.max_connections = 8;
  return o;
}

StoreClient connect(std::uint16_t port) {
  ClientOptions options;
  options.port = port;
  options.timeout = 5s;
  options.connect_timeout = 5s;
  return StoreClient::connect(options);
}

// Each malformed or oversized request closes its connection; the next client is served.
TEST(Limits, MalformedAndOversizedRequestsCloseOnlyThatConnection) {
  struct Case {
    const char* name;
    std::string bytes;  // sent after VALIDATE unless `raw`
    bool raw = false;
  };
  const Case cases[] = {
      {"unknown query type", u8(0x77)},
      {"key longer than the limit", u8(cur::kSet) + u64(65) + std::string(65, 'k')},
      {"value larger than the limit (declared, bytes never sent)",
       u8(cur::kSet) + str("/k") + u64(1u << 30)},
      {"too many keys in one request", u8(cur::kMultiGet) + u64(17)},
      {"absurd key count", u8(cur::kCheck) + u64(~0ull)},
      {"VALIDATE with a wrong magic", u8(0) + u32(0xdeadbeef) + std::string(8, '\xff'), true},
      {"legacy op number past the legacy range", u8(9) + str("/k"), true},
      {"HELLO on a legacy connection", u8(3) + str("/k") + i64(1) + u8(wire::ext::kHello), true},
      {"AUTH without a challenge", u8(wire::ext::kAuth) + std::string(64, 'x')},
      {"request larger than the request limit", u8(cur::kMultiSet) + u64(8) +
                                                    [] {
                                                      std::string s;
                                                      for (int i = 0; i < 8; ++i)
                                                        s += str("/k" + std::to_string(i)) +
                                                             str(std::string(1000, 'v'));
                                                      return s;
                                                    }()},
  };
  StoreServerThread server("127.0.0.1", 0, small_limits());
  for (const Case& t : cases) {
    SCOPED_TRACE(t.name);
    RawClient bad("127.0.0.1", server.port());
    bad.send(t.raw ? t.bytes : validate() + t.bytes);
    EXPECT_TRUE(bad.closed_by_server());
    auto good = connect(server.port());
    EXPECT_EQ(good.ping(7), 7u);
  }
  EXPECT_GE(server.stats().protocol_errors, std::size(cases));
}

TEST(Limits, StoreFullIsAnErrorReplyAndTheDataStaysIntact) {
  ServerOptions options = small_limits();
  options.limits.max_total_bytes = 16 * 1024;  // data, its bookkeeping and the connection's buffers
  StoreServerThread server("127.0.0.1", 0, options);
  auto c = connect(server.port());
  int stored = 0;
  try {
    for (; stored < 100; ++stored) c.set("k" + std::to_string(stored), std::string(1000, 'a'));
    FAIL() << "the store must refuse to grow past max_total_bytes";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), StoreErrc::kLimitExceeded);
    EXPECT_NE(std::string(e.what()).find("'k" + std::to_string(stored) + "'"), std::string::npos)
        << e.what();
  }
  EXPECT_GE(stored, 10) << "bookkeeping is a small part of what is counted";
  EXPECT_LE(server.stats().held_bytes, options.limits.max_total_bytes);
  // MULTI_SET is all or nothing.
  EXPECT_THROW(c.multi_set({{"m1", std::string(100, 'm')}, {"m2", std::string(1000, 'm')}}),
               StoreError);
  EXPECT_FALSE(c.check({"m1"}));
  EXPECT_EQ(c.get("k3"), std::string(1000, 'a'));
  c.delete_key("k0");
  c.delete_key("k1");
  c.set("one-more", std::string(1000, 'z'));  // room again
  EXPECT_EQ(c.get("one-more").size(), 1000u);
}

TEST(Limits, ClientChecksSizesBeforeSending) {
  StoreServerThread server("127.0.0.1", 0, small_limits());
  auto c = connect(server.port());
  EXPECT_EQ(c.server_limits().max_value_bytes, 1024u);
  try {
    c.set("k", std::string(2000, 'v'));
    FAIL();
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), StoreErrc::kLimitExceeded);
  }
  EXPECT_THROW(c.get(std::string(100, 'k')), StoreError);
  EXPECT_THROW(c.check(std::vector<std::string>(17, "k")), StoreError);
  EXPECT_EQ(c.ping(3), 3u) << "nothing was sent, the connection is fine";
  EXPECT_EQ(server.stats().protocol_errors, 0u);
}

TEST(Limits, ConnectionsOverTheLimitAreRefused) {
  StoreServerThread server("127.0.0.1", 0, small_limits());
  std::vector<StoreClient> clients;
  for (int i = 0; i < 8; ++i) clients.push_back(connect(server.port()));
  RawClient extra("127.0.0.1", server.port());
  EXPECT_TRUE(extra.closed_by_server());
  clients.pop_back();
  std::this_thread::sleep_for(50ms);
  auto again = connect(server.port());
  EXPECT_EQ(again.ping(1), 1u);
  EXPECT_GE(server.stats().connections_rejected, 1u);
}

TEST(Limits, AClientThatNeverReadsDoesNotGrowTheServerWithoutBound) {
  ServerOptions options;
  options.limits.max_reply_backlog_bytes = 256 * 1024;
  StoreServerThread server("127.0.0.1", 0, options);
  auto writer = connect(server.port());
  writer.set("big", std::string(64 * 1024, 'b'));

  // Pipeline 4,000 GETs of 64 KiB (250 MiB of replies) and read none of them.
  RawClient greedy("127.0.0.1", server.port());
  greedy.send(validate());
  std::string batch;
  for (int i = 0; i < 4000; ++i) batch += u8(cur::kGet) + str("big");
  std::thread sender([&] {
    try {
      greedy.send(batch);  // blocks once the server stops reading
    } catch (...) {
    }
  });
  std::this_thread::sleep_for(300ms);
  // Everyone else is still served promptly.
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 100; ++i) writer.add("n", 1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  // Draining the replies lets the greedy client's requests all complete.
  std::size_t got = 0;
  for (int i = 0; i < 4000; ++i) got += greedy.read_bytes().size();
  EXPECT_EQ(got, 4000u * 64 * 1024);
  sender.join();
}

}  // namespace
}  // namespace dist::store
