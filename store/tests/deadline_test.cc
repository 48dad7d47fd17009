// Deadlines and connection slots: a connection that owes the server something (its
// authentication, the rest of a request) is closed when it takes too long, and one that does is
// closed first when every slot is taken, so stalled or unauthenticated connections never lock out
// a working client. Waiting on keys and staying connected while idle are never punished by
// default: PyTorch's clients do both for the whole job.
#include <gtest/gtest.h>

#include "dist/store/client.h"
#include "dist/store/server.h"
#include "protocol.h"
#include "raw_client.h"
#include "session.h"

namespace dist::store {
namespace {

using namespace std::chrono_literals;
using namespace testing;
namespace cur = wire::current;
namespace leg = wire::legacy;

ClientOptions client_options(std::uint16_t port, std::string secret = {}) {
  ClientOptions o;
  o.port = port;
  o.secret = std::move(secret);
  o.timeout = 5s;
  o.connect_timeout = 5s;
  return o;
}

std::string half_a_set() {  // promises a 64-byte key, sends 11 bytes of it
  return u8(cur::kSet) + u64(64) + "only-a-part";
}

TEST(Deadlines, ARequestThatNeverCompletesIsClosed) {
  ServerOptions options;
  options.deadlines.request_timeout = 300ms;
  StoreServerThread server("127.0.0.1", 0, options);
  RawClient slow("127.0.0.1", server.port());
  const auto start = std::chrono::steady_clock::now();
  slow.send(validate() + half_a_set());
  EXPECT_TRUE(slow.closed_by_server(10s));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 300ms);
  EXPECT_EQ(server.stats().connections_timed_out, 1u);
  // A request that does complete in time is served.
  RawClient prompt("127.0.0.1", server.port());
  prompt.send(validate() + u8(cur::kAdd) + str("/n"));
  prompt.send(i64(5));
  EXPECT_EQ(prompt.read_i64(), 5);
}

TEST(Deadlines, IdleTimeoutSparesConnectionsWithAPendingWait) {
  ServerOptions options;
  options.deadlines.idle_timeout = 200ms;
  StoreServerThread server("127.0.0.1", 0, options);
  RawClient waiting("127.0.0.1", server.port());  // a torch 1.13 client blocked in WAIT
  waiting.send(u8(leg::kWait) + list({"/late"}));
  RawClient idle("127.0.0.1", server.port());
  idle.send(u8(leg::kGetNumKeys));
  EXPECT_EQ(idle.read_i64(), 0);
  EXPECT_TRUE(idle.closed_by_server(10s)) << "idle with nothing pending: closed";
  EXPECT_EQ(waiting.read(1, 600ms), std::nullopt) << "still waiting, not closed";
  RawClient writer("127.0.0.1", server.port());
  writer.send(u8(leg::kSet) + str("/late") + str("1"));
  EXPECT_EQ(waiting.read_u8(), wire::kStopWaiting);
}

// The defaults, checked against the clock a day later: an idle connection and a wait are kept;
// only a connection that must authenticate and has not, or a stalled request, is overdue.
TEST(Deadlines, DefaultsNeverCutAnIdleOrWaitingTorchClient) {
  ServerOptions options;
  options.secret = "s";
  options.unauthenticated = UnauthenticatedPolicy::kLoopback;
  StoreState state(options);
  const auto later = Session::Clock::now() + 24h;

  Session torch_idle(state, PeerInfo{"127.0.0.1:1", "127.0.0.1", true}, nullptr);
  EXPECT_EQ(torch_idle.overdue(later), "") << "torch 1.13's second socket never sends a byte";
  Session torch_waiting(state, PeerInfo{"127.0.0.1:2", "127.0.0.1", true}, nullptr);
  const std::string wait = u8(leg::kWait) + list({"/never"});
  torch_waiting.feed(wait.data(), wait.size());
  EXPECT_EQ(torch_waiting.overdue(later), "");

  Session stranger(state, PeerInfo{"10.0.0.9:3", "10.0.0.9", false}, nullptr);
  EXPECT_NE(stranger.overdue(later).find("did not authenticate"), std::string::npos);
  Session stalled(state, PeerInfo{"127.0.0.1:4", "127.0.0.1", true}, nullptr);
  const std::string partial = validate() + half_a_set();
  stalled.feed(partial.data(), partial.size());
  EXPECT_NE(stalled.overdue(later).find("--request-timeout-ms"), std::string::npos);
}

TEST(Deadlines, AConnectionThatMustAuthenticateAndDoesNotIsClosed) {
  ServerOptions options;
  options.secret = "s3cret";
  options.unauthenticated = UnauthenticatedPolicy::kDeny;
  options.deadlines.auth_timeout = 300ms;
  StoreServerThread server("127.0.0.1", 0, options);
  auto agent = StoreClient::connect(client_options(server.port(), "s3cret"));
  RawClient silent("127.0.0.1", server.port());
  EXPECT_TRUE(silent.closed_by_server(10s));
  EXPECT_EQ(agent.add("n", 1), 1) << "the authenticated connection is kept";
}

constexpr std::uint64_t kSlots = 50;

TEST(ConnectionSlots, FiftySlowLorisConnectionsDoNotLockOutAClient) {
  ServerOptions options;
  options.limits.max_connections = kSlots;
  StoreServerThread server("127.0.0.1", 0, options);
  std::vector<std::unique_ptr<RawClient>> slow;
  for (std::uint64_t i = 0; i < kSlots; ++i) {
    slow.push_back(std::make_unique<RawClient>("127.0.0.1", server.port()));
    slow.back()->send(validate() + half_a_set());
  }
  // Every slot holds a stalled request (the request deadline is 30 s away): the oldest is closed
  // to admit the client.
  auto client = StoreClient::connect(client_options(server.port()));
  EXPECT_EQ(client.add("n", 1), 1);
  EXPECT_TRUE(slow.front()->closed_by_server());
  EXPECT_GE(server.stats().connections_evicted, 1u);
}

TEST(ConnectionSlots, FiftyUnauthenticatedConnectionsDoNotLockOutAnAgent) {
  ServerOptions options;
  options.secret = "s3cret";
  options.unauthenticated = UnauthenticatedPolicy::kDeny;
  options.limits.max_connections = kSlots;
  StoreServerThread server("127.0.0.1", 0, options);
  std::vector<std::unique_ptr<RawClient>> strangers;
  for (std::uint64_t i = 0; i < kSlots; ++i) {
    strangers.push_back(std::make_unique<RawClient>("127.0.0.1", server.port()));
    strangers.back()->send(validate());  // and never authenticates
  }
  auto agent = StoreClient::connect(client_options(server.port(), "s3cret"));
  EXPECT_EQ(agent.add("n", 1), 1);
}

TEST(ConnectionSlots, WorkingClientsAreNeverClosedToAdmitOthers) {
  ServerOptions options;
  options.limits.max_connections = 4;
  StoreServerThread server("127.0.0.1", 0, options);
  std::vector<StoreClient> working;
  for (int i = 0; i < 4; ++i)
    working.push_back(StoreClient::connect(client_options(server.port())));
  RawClient extra("127.0.0.1", server.port());
  EXPECT_TRUE(extra.closed_by_server()) << "no slot and nobody to close: refused";
  for (auto& c : working) EXPECT_EQ(c.ping(3), 3u);
  EXPECT_EQ(server.stats().connections_evicted, 0u);
}

}  // namespace
}  // namespace dist::store
