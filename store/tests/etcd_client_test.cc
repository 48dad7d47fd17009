// The etcd v3 client: its encoding, then real members of Debian's etcd 3.4 (one, or three on
// 127.0.0.1-3): calls, leases, watches, members killed, quorum lost, TLS and user/password.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "dist/store/errors.h"
#include "dist/store/etcd/client.h"
#include "etcd/codec.h"
#include "etcd_cluster.h"
#include "run_task.h"
#include "silent_endpoint.h"

namespace dist::store::etcd {
namespace {

using store::testing::EtcdCluster;
using store::testing::EtcdClusterOptions;
using store::testing::run_task;
using store::testing::SilentEndpoint;
using store::testing::TaskGroup;
using namespace std::chrono_literals;

// The code of the StoreError `f` throws; fails the test when it throws nothing.
template <typename F>
StoreError error_of(F&& f) {
  try {
    f();
  } catch (const StoreError& e) {
    return e;
  }
  ADD_FAILURE() << "no StoreError";
  return StoreError(StoreErrc::kProtocol, "none");
}

ClientOptions options_for(const EtcdCluster& cluster) {
  ClientOptions o;
  o.endpoints = cluster.endpoints();
  return o;
}

TEST(EtcdCodec, Base64RoundTripsEveryTailLength) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"", ""},        {"a", "YQ=="},        {"ab", "YWI="},
      {"abc", "YWJj"}, {"abcd", "YWJjZA=="}, {std::string("\0\xff\x10", 3), "AP8Q"}};
  for (const auto& [bytes, text] : cases) {
    SCOPED_TRACE(text);
    EXPECT_EQ(detail::base64_encode(bytes), text);
    EXPECT_EQ(detail::base64_decode(text), bytes);
  }
}

TEST(EtcdCodec, Base64RefusesWhatIsNotBase64) {
  for (const std::string text : {"YQ=", "Y===", "YW!j", "YQ==YQ=="}) {
    SCOPED_TRACE(text);
    EXPECT_FALSE(detail::base64_decode(text).has_value());
  }
}

TEST(EtcdCodec, PrefixEndIsTheFirstKeyPastThePrefix) {
  EXPECT_EQ(prefix_end("/job/"), "/job0");
  EXPECT_EQ(prefix_end(std::string("a\xff", 2)), "b");
  EXPECT_EQ(prefix_end(""), std::string(1, '\0'));
}

TEST(EtcdCodec, GatewayErrorsSayWhatToDoNext) {
  using Action = detail::GatewayError::Action;
  struct Case {
    int code;
    std::string message;
    Action action;
    StoreErrc errc;
  };
  const std::vector<Case> cases{
      {14, "etcdserver: no leader", Action::kRetry, StoreErrc::kUnavailable},
      {14, "etcdserver: request timed out", Action::kRetry, StoreErrc::kUnavailable},
      {8, "etcdserver: too many requests", Action::kRetry, StoreErrc::kUnavailable},
      {8, "etcdserver: mvcc: database space exceeded", Action::kFail, StoreErrc::kLimitExceeded},
      {3, "etcdserver: request is too large", Action::kFail, StoreErrc::kLimitExceeded},
      {3, "etcdserver: too many operations in txn request", Action::kFail,
       StoreErrc::kLimitExceeded},
      {3, "etcdserver: duplicate key given in txn request", Action::kFail,
       StoreErrc::kInvalidArgument},
      {3, "etcdserver: authentication failed, invalid user ID or password", Action::kFail,
       StoreErrc::kUnauthenticated},
      {16, "etcdserver: invalid auth token", Action::kReauthenticate, StoreErrc::kUnauthenticated},
      {7, "etcdserver: permission denied", Action::kFail, StoreErrc::kUnauthenticated},
      {5, "etcdserver: requested lease not found", Action::kFail, StoreErrc::kNotFound},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.message);
    const auto e = detail::classify(nlohmann::json{{"code", c.code}, {"message", c.message}});
    EXPECT_EQ(e.action, c.action);
    EXPECT_EQ(e.code, c.errc);
    EXPECT_EQ(e.message, c.message);
  }
  // A watch stream's error object, in the stream or as the whole answer.
  const nlohmann::json streamed{
      {"grpc_code", 14}, {"http_code", 503}, {"message", "etcdserver: no leader"}};
  for (const auto& error : {streamed, nlohmann::json{{"error", streamed}}}) {
    const auto e = detail::classify(error);
    EXPECT_EQ(e.action, Action::kRetry);
    EXPECT_EQ(e.message, "etcdserver: no leader");
  }
}

TEST(EtcdClientOptions, BadOptionsAreInvalidArguments) {
  struct Case {
    std::vector<std::string> endpoints;
    std::string ca_file, cert_file, key_file;
  };
  const std::vector<Case> cases{{{}, "", "", ""},
                                {{"h:0"}, "", "", ""},
                                {{"h:x"}, "", "", ""},
                                {{":2379"}, "", "", ""},
                                {{"ftp://h:1"}, "", "", ""},
                                {{"::1:2379"}, "", "", ""},
                                {{"[::1:2379"}, "", "", ""},
                                {{"http://a:1", "https://b:1"}, "", "", ""},
                                {{"a:1"}, "", "/c.crt", ""},
                                {{"http://a:1"}, "/ca.crt", "", ""},
                                {{"a:1"}, "/nonexistent/ca.crt", "", ""}};
  boost::asio::io_context io;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.endpoints.empty() ? "(none)" : c.endpoints.front());
    ClientOptions o;
    o.endpoints = c.endpoints;
    o.ca_file = c.ca_file;
    o.cert_file = c.cert_file;
    o.key_file = c.key_file;
    EXPECT_EQ(error_of([&] { Client::create(io, o); }).code(), StoreErrc::kInvalidArgument);
  }
}

TEST(EtcdClientOptions, NamesAndDefaultPortsAreTaken) {
  boost::asio::io_context io;
  ClientOptions o;
  o.endpoints = {"h1", "http://h2:2380/", "[::1]:2379", "10.0.0.1:12379"};
  EXPECT_EQ(Client::create(io, o)->describe(), "etcd h1:2379,h2:2380,[::1]:2379,10.0.0.1:12379");
}

TEST(EtcdClient, PutReadDeleteRoundTripAnyBytes) {
  EtcdCluster cluster;
  boost::asio::io_context io;
  const auto client = Client::create(io, options_for(cluster));
  Cancellation cancel;
  const std::string key("k\0\xff", 3), value(70'000, '\x01');
  const auto written = run_task(io, client->put(key, value, 0, cancel));
  const auto read = run_task(io, client->range(key, cancel));
  ASSERT_EQ(read.kvs.size(), 1u);
  EXPECT_EQ(read.kvs[0].key, key);
  EXPECT_EQ(read.kvs[0].value, value);
  EXPECT_EQ(read.kvs[0].mod_revision, written);
  EXPECT_EQ(read.kvs[0].version, 1);
  EXPECT_EQ(run_task(io, client->delete_key(key, cancel)), 1);
  EXPECT_EQ(run_task(io, client->delete_key(key, cancel)), 0);
  EXPECT_TRUE(run_task(io, client->range(key, cancel)).kvs.empty());
}

TEST(EtcdClient, TransactionRunsTheBranchItsComparisonsChoose) {
  EtcdCluster cluster;
  boost::asio::io_context io;
  const auto client = Client::create(io, options_for(cluster));
  Cancellation cancel;
  const auto create_if_missing = [](const std::string& value) {
    TxnRequest t;
    t.compare = {Compare::revision_equals(Compare::Target::kCreateRevision, "k", 0)};
    t.success = {Op::put("k", value)};
    t.failure = {Op::range("k")};
    return t;
  };
  const auto created = run_task(io, client->txn(create_if_missing("first"), cancel));
  EXPECT_TRUE(created.succeeded);
  const auto refused = run_task(io, client->txn(create_if_missing("second"), cancel));
  EXPECT_FALSE(refused.succeeded);
  ASSERT_EQ(refused.results.size(), 1u);
  ASSERT_EQ(refused.results[0].kvs.size(), 1u);
  EXPECT_EQ(refused.results[0].kvs[0].value, "first");
  EXPECT_EQ(refused.results[0].kvs[0].create_revision, created.revision);

  TxnRequest swap;
  swap.compare = {Compare::value_equals("k", "first")};
  swap.success = {Op::put("k", "swapped"), Op::erase("other")};
  EXPECT_TRUE(run_task(io, client->txn(swap, cancel)).succeeded);
  EXPECT_FALSE(run_task(io, client->txn(swap, cancel)).succeeded);
  EXPECT_EQ(run_task(io, client->range("k", cancel)).kvs.at(0).value, "swapped");

  // etcd refuses two puts of one key in a transaction: a typed refusal naming the key.
  TxnRequest twice;
  twice.success = {Op::put("dup", "1"), Op::put("dup", "2")};
  const auto e = error_of([&] { run_task(io, client->txn(twice, cancel)); });
  EXPECT_EQ(e.code(), StoreErrc::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("'dup'"), std::string::npos) << e.what();
}

TEST(EtcdClient, LeaseHoldsItsKeysUntilRevoked) {
  EtcdCluster cluster;
  boost::asio::io_context io;
  const auto client = Client::create(io, options_for(cluster));
  Cancellation cancel;
  const auto lease = run_task(io, client->lease_grant(1s, cancel));
  EXPECT_NE(lease.id, 0);
  EXPECT_GE(lease.ttl, 1s);  // etcd raises a TTL below its minimum
  run_task(io, client->put("held", "x", lease.id, cancel));
  EXPECT_EQ(run_task(io, client->range("held", cancel)).kvs.at(0).lease, lease.id);
  EXPECT_GT(run_task(io, client->lease_keep_alive(lease.id, cancel)), 0s);
  run_task(io, client->lease_revoke(lease.id, cancel));
  EXPECT_TRUE(run_task(io, client->range("held", cancel)).kvs.empty());
  EXPECT_EQ(run_task(io, client->lease_keep_alive(lease.id, cancel)), 0s);
  run_task(io, client->lease_revoke(lease.id, cancel));  // gone already: no error
  EXPECT_EQ(error_of([&] { run_task(io, client->put("late", "x", lease.id, cancel)); }).code(),
            StoreErrc::kNotFound);
}

TEST(EtcdClient, WatchReplaysFromItsStartRevisionThenFollows) {
  EtcdCluster cluster;
  boost::asio::io_context io;
  const auto client = Client::create(io, options_for(cluster));
  Cancellation cancel;
  const auto first = run_task(io, client->put("w", "1", 0, cancel));
  run_task(io, client->put("w", "2", 0, cancel));
  run_task(io, client->put("unwatched", "x", 0, cancel));
  WatchRequest request;
  request.key = "w";
  request.start_revision = first;
  const auto watch = client->watch(request);
  std::vector<std::string> seen;
  while (seen.size() < 2) {
    const auto batch = run_task(io, watch->next(Clock::now() + 30s, cancel));
    ASSERT_TRUE(batch.has_value());
    for (const auto& e : batch->events) seen.push_back(e.kv.value);
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"1", "2"}));
  run_task(io, client->delete_key("w", cancel));
  const auto deleted = run_task(io, watch->next(Clock::now() + 30s, cancel));
  ASSERT_TRUE(deleted.has_value());
  ASSERT_EQ(deleted->events.size(), 1u);
  EXPECT_EQ(deleted->events[0].type, WatchEvent::Type::kDelete);
  EXPECT_EQ(deleted->events[0].kv.key, "w");
  // Nothing more happens to "w": the watch gives up at its deadline.
  EXPECT_FALSE(run_task(io, watch->next(Clock::now() + 300ms, cancel)).has_value());
}

TEST(EtcdClient, CancelEndsAWatchInFlight) {
  EtcdCluster cluster;
  boost::asio::io_context io;
  const auto client = Client::create(io, options_for(cluster));
  Cancellation cancel, other;
  const auto watch = client->watch(WatchRequest{"never", "", 0, false, false});
  boost::asio::co_spawn(
      io,
      [&]() -> Task<void> {
        co_await client->range("anything", other);  // a round trip while the watch connects
        cancel.cancel();
      },
      boost::asio::detached);
  const auto started = Clock::now();
  const auto e = error_of([&] { run_task(io, watch->next(Clock::now() + 60s, cancel)); });
  EXPECT_EQ(e.code(), StoreErrc::kCancelled);
  EXPECT_LT(Clock::now() - started, 30s);
  EXPECT_EQ(error_of([&] { run_task(io, client->range("k", cancel)); }).code(),
            StoreErrc::kCancelled);
}

TEST(EtcdClient, NoMemberReachableIsUnavailableWithinItsTimeout) {
  EtcdCluster cluster;
  boost::asio::io_context io;
  ClientOptions o;
  o.endpoints = cluster.endpoints();
  o.unavailable_timeout = 1500ms;
  const auto client = Client::create(io, o);
  cluster.kill(0);  // nothing listens on its port any more
  Cancellation cancel;
  const auto started = Clock::now();
  const auto e = error_of([&] { run_task(io, client->put("some/key", "v", 0, cancel)); });
  const auto took = Clock::now() - started;
  EXPECT_EQ(e.code(), StoreErrc::kUnavailable);
  EXPECT_GE(took, 1500ms);
  EXPECT_LT(took, 10s);
  const std::string what = e.what();
  EXPECT_NE(what.find(cluster.endpoint(0)), std::string::npos) << what;
  EXPECT_NE(what.find("'some/key'"), std::string::npos) << what;
}

// A host with no route to any member (its own link down: a network namespace with loopback only)
// is told to look at its own network, not at the members' majority.
TEST(EtcdClient, NoRouteFromThisHostSaysToCheckItsOwnNetwork) {
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(out[0]);
    std::string said;
    if (::unshare(CLONE_NEWNET) != 0) {
      said = "skip: unshare(CLONE_NEWNET): " + std::string(std::strerror(errno));
    } else {
      boost::asio::io_context io;
      ClientOptions o;
      o.endpoints = {"http://192.0.2.77:2379"};  // no route: only lo here, and it is down
      o.unavailable_timeout = 500ms;
      Cancellation cancel;
      try {
        const auto client = Client::create(io, o);
        run_task(io, client->put("k", "v", 0, cancel));
        said = "no error";
      } catch (const StoreError& e) {
        said = e.what();
      } catch (...) {  // whatever it is, the child ends here (never in the rest of the suite)
        said = "the child threw something other than a StoreError";
      }
    }
    [[maybe_unused]] const auto n = ::write(out[1], said.data(), said.size());
    ::_exit(0);
  }
  ::close(out[1]);
  std::string said;
  char buffer[4096];
  for (ssize_t n; (n = ::read(out[0], buffer, sizeof buffer)) > 0;) said.append(buffer, n);
  ::close(out[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  if (said.starts_with("skip: ")) GTEST_SKIP() << said;
  EXPECT_NE(said.find("Network is unreachable"), std::string::npos) << said;
  EXPECT_NE(said.find("this host has no route to the members: check its own network"),
            std::string::npos)
      << said;
  EXPECT_EQ(said.find("check that a majority"), std::string::npos) << said;
}

// Cancellation while a call is stuck: its own timeouts are far away, it is cancelled once it has
// been stuck a while, and must end at once.
constexpr std::chrono::seconds kFarTimeouts{60};
constexpr std::chrono::milliseconds kStuckFor{500};
constexpr std::chrono::seconds kPromptly{2};  // what "at once" may take on a loaded machine

ClientOptions stuck_options(std::vector<std::string> endpoints) {
  ClientOptions o;
  o.endpoints = std::move(endpoints);
  o.spread_over_members = false;
  o.request_timeout = kFarTimeouts;
  o.unavailable_timeout = kFarTimeouts;
  return o;
}

struct CancelOutcome {
  bool ended_before_cancel = false;
  std::optional<StoreError> error;
  Clock::duration ended_after_cancel{};
};

// Runs `call` on `io` and cancels it after kStuckFor.
template <typename T>
CancelOutcome cancel_while_stuck(boost::asio::io_context& io, Task<T> call, Cancellation& cancel) {
  CancelOutcome out;
  Clock::time_point cancelled_at, ended_at;
  bool ended = false;
  TaskGroup group(io);
  group.spawn([&]() -> Task<void> {
    try {
      co_await std::move(call);
    } catch (const StoreError& e) {
      out.error = e;
    }
    ended_at = Clock::now();
    ended = true;
  });
  group.spawn([&]() -> Task<void> {
    boost::asio::steady_timer timer(io, kStuckFor);
    co_await timer.async_wait(boost::asio::use_awaitable);
    out.ended_before_cancel = ended;
    cancelled_at = Clock::now();
    cancel.cancel();
  });
  group.wait(kFarTimeouts / 2);
  out.ended_after_cancel = ended_at - cancelled_at;
  return out;
}

void expect_ended_at_once(const CancelOutcome& out) {
  EXPECT_FALSE(out.ended_before_cancel) << "the call was not stuck";
  ASSERT_TRUE(out.error.has_value()) << "the call succeeded";
  EXPECT_EQ(out.error->code(), StoreErrc::kCancelled) << out.error->what();
  EXPECT_LT(out.ended_after_cancel, kPromptly);
}

TEST(EtcdClientCancel, ACallStuckInAnyPhaseEndsAtOnce) {
  struct Case {
    const char* phase;
    SilentEndpoint::Kind member;
  };
  const std::vector<Case> cases{{"connecting", SilentEndpoint::Kind::kConnectsNever},
                                {"waiting for the answer", SilentEndpoint::Kind::kAnswersNothing},
                                {"backing off between members", SilentEndpoint::Kind::kRefuses}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.phase);
    const SilentEndpoint member(c.member);
    boost::asio::io_context io;
    const auto client = Client::create(io, stuck_options({member.endpoint()}));
    Cancellation cancel;
    expect_ended_at_once(cancel_while_stuck(io, client->put("k", "v", 0, cancel), cancel));
  }
}

// The watch's member dies; while the watch resumes on the next one, close comes.
TEST(EtcdClientCancel, AWatchResumingAfterItsMemberDiedEndsAtOnce) {
  struct Case {
    const char* phase;
    SilentEndpoint::Kind next_member;
  };
  const std::vector<Case> cases{
      {"connecting to the next member", SilentEndpoint::Kind::kConnectsNever},
      {"waiting for the next member's answer", SilentEndpoint::Kind::kAnswersNothing},
      {"backing off between members", SilentEndpoint::Kind::kRefuses}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.phase);
    EtcdCluster cluster;
    const SilentEndpoint next(c.next_member);
    boost::asio::io_context io;
    const auto client = Client::create(io, stuck_options({cluster.endpoint(0), next.endpoint()}));
    Cancellation cancel;
    WatchRequest request;
    request.key = "w";
    request.start_revision = run_task(io, client->put("w", "1", 0, cancel));
    const auto watch = client->watch(request);
    ASSERT_TRUE(run_task(io, watch->next(Clock::now() + 30s, cancel)).has_value());
    cluster.kill(0);
    expect_ended_at_once(
        cancel_while_stuck(io, watch->next(Clock::now() + kFarTimeouts, cancel), cancel));
  }
}

TEST(EtcdClientCluster, CallsFailOverToTheMembersLeft) {
  EtcdCluster cluster(3);
  const int leader = cluster.leader();
  boost::asio::io_context io;
  ClientOptions o;
  o.spread_over_members = false;
  o.endpoints = {cluster.endpoint(leader)};  // the first tried: the one to be killed
  for (int i = 0; i < 3; ++i) {
    if (i != leader) o.endpoints.push_back(cluster.endpoint(i));
  }
  const auto client = Client::create(io, o);
  Cancellation cancel;
  run_task(io, client->put("before", "1", 0, cancel));
  cluster.kill(leader);
  for (int i = 0; i < 5; ++i)
    run_task(io, client->put("after/" + std::to_string(i), "v", 0, cancel));
  EXPECT_EQ(run_task(io, client->range("before", cancel)).kvs.at(0).value, "1");
  EXPECT_EQ(run_task(io, client->range("after/4", cancel)).kvs.at(0).value, "v");
}

TEST(EtcdClientCluster, WatchResumesOnAnotherMemberWithoutLosingOrRepeatingEvents) {
  EtcdCluster cluster(3);
  const int leader = cluster.leader();
  boost::asio::io_context io;
  ClientOptions o;
  o.spread_over_members = false;
  o.endpoints = {cluster.endpoint(leader)};  // the watch's member: the one to be killed
  for (int i = 0; i < 3; ++i) {
    if (i != leader) o.endpoints.push_back(cluster.endpoint(i));
  }
  const auto watcher = Client::create(io, o);
  const auto writer = Client::create(io, options_for(cluster));
  Cancellation cancel;
  WatchRequest request;
  request.key = "n";
  request.start_revision = run_task(io, writer->put("n", "1", 0, cancel));
  const auto watch = watcher->watch(request);
  const auto one = run_task(io, watch->next(Clock::now() + 30s, cancel));
  ASSERT_TRUE(one && one->events.size() == 1);
  EXPECT_EQ(one->events[0].kv.value, "1");

  cluster.kill(leader);
  run_task(io, writer->put("n", "2", 0, cancel));
  run_task(io, writer->put("n", "3", 0, cancel));
  std::vector<std::string> seen;
  while (seen.size() < 2) {
    const auto batch = run_task(io, watch->next(Clock::now() + 30s, cancel));
    ASSERT_TRUE(batch.has_value()) << "no event after the member's death";
    for (const auto& e : batch->events) seen.push_back(e.kv.value);
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"2", "3"}));
}

TEST(EtcdClientCluster, QuorumLostIsUnavailableWithinBoundedTime) {
  EtcdCluster cluster(3);
  boost::asio::io_context io;
  ClientOptions o = options_for(cluster);
  o.unavailable_timeout = 3s;
  const auto client = Client::create(io, o);
  Cancellation cancel;
  run_task(io, client->put("k", "before", 0, cancel));
  const int survivor = (cluster.leader() + 1) % 3;
  const auto watch = client->watch(WatchRequest{"k", "", 0, false, false});
  for (int i = 0; i < 3; ++i) {
    if (i != survivor) cluster.kill(i);
  }
  auto started = Clock::now();
  const auto put = error_of([&] { run_task(io, client->put("k", "after", 0, cancel)); });
  EXPECT_EQ(put.code(), StoreErrc::kUnavailable) << put.what();
  EXPECT_LT(Clock::now() - started, 15s);  // 3 s of tries, one exchange's timeout past it
  EXPECT_NE(std::string(put.what()).find("majority"), std::string::npos) << put.what();
  // A watch on the survivor ends too: the member drops it once it has had no leader a while.
  started = Clock::now();
  const auto watched = error_of([&] { run_task(io, watch->next(Clock::now() + 120s, cancel)); });
  EXPECT_EQ(watched.code(), StoreErrc::kUnavailable) << watched.what();
  EXPECT_LT(Clock::now() - started, 30s);
}

class EtcdClientTls : public ::testing::Test {
 protected:
  EtcdClientTls()
      : pki_dir_(std::filesystem::temp_directory_path() /
                 ("dist-etcd-pki-" + std::to_string(::getpid()))),
        pki_(store::testing::make_test_pki(pki_dir_)),
        cluster_(tls_options(pki_)) {}
  ~EtcdClientTls() override { std::filesystem::remove_all(pki_dir_); }

  static EtcdClusterOptions tls_options(const store::testing::TestPki& pki) {
    EtcdClusterOptions o;
    o.tls = pki;
    return o;
  }

  ClientOptions options() const {
    ClientOptions o = options_for(cluster_);
    o.ca_file = pki_.ca_cert;
    o.cert_file = pki_.client_cert;
    o.key_file = pki_.client_key;
    o.unavailable_timeout = 2s;
    return o;
  }

  std::filesystem::path pki_dir_;
  store::testing::TestPki pki_;
  EtcdCluster cluster_;
  boost::asio::io_context io_;
  Cancellation cancel_;
};

TEST_F(EtcdClientTls, CallsAndWatchesGoOverTls) {
  const auto client = Client::create(io_, options());
  const auto revision = run_task(io_, client->put("secure", "v", 0, cancel_));
  EXPECT_EQ(run_task(io_, client->range("secure", cancel_)).kvs.at(0).value, "v");
  const auto watch = client->watch(WatchRequest{"secure", "", revision, false, false});
  const auto batch = run_task(io_, watch->next(Clock::now() + 30s, cancel_));
  ASSERT_TRUE(batch && !batch->events.empty());
  EXPECT_EQ(batch->events[0].kv.value, "v");
}

TEST_F(EtcdClientTls, AMemberNamedByHostNameIsVerifiedByName) {
  auto o = options();
  const auto& address = cluster_.endpoint(0);  // https://127.0.0.1:port
  o.endpoints = {"https://localhost" + address.substr(address.rfind(':'))};
  const auto client = Client::create(io_, o);
  run_task(io_, client->put("by-name", "v", 0, cancel_));
  EXPECT_EQ(run_task(io_, client->range("by-name", cancel_)).kvs.at(0).value, "v");
}

TEST_F(EtcdClientTls, AnUntrustedMemberOrAMissingClientCertIsRefusedAtOnce) {
  auto untrusted = options();
  untrusted.ca_file.clear();  // the system's CAs do not know the test CA
  auto anonymous = options();
  anonymous.cert_file.clear();
  anonymous.key_file.clear();
  for (const auto& o : {untrusted, anonymous}) {
    const auto client = Client::create(io_, o);
    const auto started = Clock::now();
    const auto e = error_of([&] { run_task(io_, client->put("k", "v", 0, cancel_)); });
    EXPECT_EQ(e.code(), StoreErrc::kUnauthenticated) << e.what();
    EXPECT_NE(std::string(e.what()).find(cluster_.endpoint(0).substr(8)), std::string::npos)
        << e.what();
    EXPECT_LT(Clock::now() - started, o.unavailable_timeout);  // not retried
  }
}

class EtcdClientAuth : public ::testing::Test {
 protected:
  EtcdClientAuth() : cluster_(short_token_lives()) {
    cluster_.etcdctl({"user", "add", "root:s3cret"});
    cluster_.etcdctl({"auth", "enable"});
  }
  static EtcdClusterOptions short_token_lives() {
    EtcdClusterOptions o;
    o.extra_args = {"--auth-token-ttl=1"};
    return o;
  }
  ClientOptions options(std::string user, std::string password) const {
    ClientOptions o = options_for(cluster_);
    o.user = std::move(user);
    o.password = std::move(password);
    o.unavailable_timeout = 2s;
    return o;
  }

  EtcdCluster cluster_;
  boost::asio::io_context io_;
  Cancellation cancel_;
};

TEST_F(EtcdClientAuth, TheRightPasswordWorksAcrossTokenExpiry) {
  const auto client = Client::create(io_, options("root", "s3cret"));
  run_task(io_, client->put("k", "1", 0, cancel_));
  // The token lives 1 s unused: the watch's wait outlasts it, the next call authenticates again.
  const auto watch = client->watch(WatchRequest{"quiet", "", 0, false, false});
  EXPECT_FALSE(run_task(io_, watch->next(Clock::now() + 2500ms, cancel_)).has_value());
  run_task(io_, client->put("k", "2", 0, cancel_));
  EXPECT_EQ(run_task(io_, client->range("k", cancel_)).kvs.at(0).value, "2");
}

TEST_F(EtcdClientAuth, AWrongOrMissingPasswordIsUnauthenticated) {
  for (const auto& o : {options("root", "wrong"), options("", "")}) {
    const auto client = Client::create(io_, o);
    const auto e = error_of([&] { run_task(io_, client->put("k", "v", 0, cancel_)); });
    EXPECT_EQ(e.code(), StoreErrc::kUnauthenticated) << e.what();
  }
}

}  // namespace
}  // namespace dist::store::etcd
