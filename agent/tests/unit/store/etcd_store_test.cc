// The etcd v3 rendezvous store: the store's conformance suite against a real etcd member, then
// what only etcd does: --rdzv-conf, the keys' layout, a session's process killed, the leader
// killed mid-operation, quorum lost, TLS with user/password.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "dist/store/errors.h"
#include "etcd_cluster.h"
#include "lossy_proxy.h"
#include "process_helpers.h"
#include "run_task.h"
#include "store/store.h"
#include "store_conformance.h"

namespace dist::agent::testing {
namespace {

using namespace std::chrono_literals;
using store::StoreErrc;
using store::StoreError;
using store::testing::EtcdCluster;
using store::testing::EtcdClusterOptions;
using store::testing::run_task;
using store::testing::TaskGroup;

// etcd raises shorter TTLs to its minimum (1.5 s with its default election timeout).
constexpr std::chrono::seconds kLeaseTtl{2};
// What etcd takes past a lease's TTL to delete its keys (it checks expiry every 500 ms), on a
// loaded machine.
constexpr std::chrono::seconds kExpiryGrace{5};

// The members as --rdzv-endpoint lists them ("h1:2379,h2:2379").
EtcdConfig members(const std::string& list) {
  EtcdConfig c;
  std::stringstream items(list);
  for (std::string item; std::getline(items, item, ',');) c.endpoints.push_back(item);
  return c;
}

EtcdOptions options_for(const EtcdCluster& cluster,
                        std::chrono::milliseconds unavailable_timeout = 20s) {
  auto o = etcd_options(members(cluster.endpoint_list()), kLeaseTtl);
  o.client.unavailable_timeout = unavailable_timeout;
  return o;
}

std::string run_id() {
  return ::testing::UnitTest::GetInstance()->current_test_info()->name() + std::string("-") +
         std::to_string(::getpid());
}

// The StoreError `f` throws; fails the test when it throws nothing.
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

class EtcdBackend final : public StoreBackend {
 public:
  Task<std::unique_ptr<RendezvousStore>> open(boost::asio::io_context& io,
                                              std::string run_id) override {
    return open_rendezvous_store(io, options_for(cluster_), std::move(run_id));
  }

 private:
  EtcdCluster cluster_;
};

INSTANTIATE_TEST_SUITE_P(Etcd, StoreConformance,
                         ::testing::Values(StoreBackendFactory{
                             "etcd", [] { return std::make_unique<EtcdBackend>(); }}));

class TempFile {
 public:
  explicit TempFile(const std::string& content)
      : path_(std::filesystem::temp_directory_path() /
              ("dist-etcd-test-" + std::to_string(::getpid()) + "-" + std::to_string(next_++))) {
    std::ofstream(path_) << content;
  }
  ~TempFile() { std::filesystem::remove(path_); }
  std::string path() const { return path_.string(); }

 private:
  static inline int next_ = 0;
  std::filesystem::path path_;
};

TEST(EtcdStoreOptions, TheLaunchConfigurationBecomesClientOptions) {
  const TempFile password("s3cret\n");
  EtcdConfig c = members("h1:2379,https://h2:2379,h3");
  c.ca_file = "/ca.crt";
  c.cert_file = "/c.crt";
  c.key_file = "/c.key";
  c.user = "root";
  c.password_file = password.path();
  c.protocol = "https";
  c.prefix = "/custom";
  c.unavailable_timeout = 2500ms;
  c.spread_over_members = false;
  const auto o = etcd_options(c, 4s);
  EXPECT_EQ(o.client.endpoints,
            (std::vector<std::string>{"https://h1:2379", "https://h2:2379", "https://h3"}));
  EXPECT_EQ(o.client.ca_file, "/ca.crt");
  EXPECT_EQ(o.client.cert_file, "/c.crt");
  EXPECT_EQ(o.client.key_file, "/c.key");
  EXPECT_EQ(o.client.user, "root");
  EXPECT_EQ(o.client.password, "s3cret");
  EXPECT_EQ(o.client.unavailable_timeout, 2500ms);
  EXPECT_FALSE(o.client.spread_over_members);
  EXPECT_TRUE(etcd_options(members("h1"), 4s).client.spread_over_members);
  EXPECT_EQ(o.prefix, "/custom");
  EXPECT_EQ(o.lease_ttl, 4s);
}

TEST(EtcdStoreOptions, WhatTheAgentCannotUseIsAOneLineConfigError) {
  const TempFile password("pw");
  const auto with = [](auto change) {
    EtcdConfig c = members("h:1");
    change(c);
    return c;
  };
  const std::vector<EtcdConfig> cases{
      with([](EtcdConfig& c) { c.endpoints.clear(); }),
      with([](EtcdConfig& c) { c.user = "root"; }),
      with([&](EtcdConfig& c) { c.password_file = password.path(); }), with([](EtcdConfig& c) {
        c.user = "root";
        c.password_file = "/nonexistent/pw";
      })};
  for (const auto& c : cases) {
    try {
      etcd_options(c, 3s);
      ADD_FAILURE() << "no ConfigError for user '" << c.user << "', file '" << c.password_file
                    << "'";
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
}

TEST(EtcdStore, TheJobsKeysLiveUnderItsPrefix) {
  EtcdCluster cluster;
  boost::asio::io_context io;
  auto options = options_for(cluster);
  options.prefix = "/custom/";
  const auto store = run_task(io, open_rendezvous_store(io, options, "job-1"));
  const auto other = run_task(io, open_rendezvous_store(io, options, "job-2"));
  run_task(io, store->set("round/1/node", "v"));
  run_task(io, store->set_ephemeral("alive", "x"));
  run_task(io, other->set("elsewhere", "y"));
  const auto keys = cluster.etcdctl({"get", "--prefix", "--keys-only", "/custom/job-1/"});
  EXPECT_NE(keys.find("/custom/job-1/round/1/node\n"), std::string::npos) << keys;
  EXPECT_NE(keys.find("/custom/job-1/alive\n"), std::string::npos) << keys;
  EXPECT_EQ(keys.find("elsewhere"), std::string::npos) << keys;
  EXPECT_EQ(cluster.etcdctl({"get", "--print-value-only", "/custom/job-1/round/1/node"}), "v\n");
}

TEST(EtcdStore, OpeningWithoutAMemberFailsClearlyInBoundedTime) {
  EtcdCluster cluster;
  cluster.kill(0);
  boost::asio::io_context io;
  const auto started = std::chrono::steady_clock::now();
  const auto e =
      error_of([&] { run_task(io, open_rendezvous_store(io, options_for(cluster, 1s), "job")); });
  EXPECT_EQ(e.code(), StoreErrc::kUnavailable) << e.what();
  EXPECT_LT(std::chrono::steady_clock::now() - started, 10s);
  EXPECT_NE(std::string(e.what()).find(cluster.endpoint(0)), std::string::npos) << e.what();
}

TEST(EtcdStore, AnEphemeralKeyGoesWithinItsTtlWhenItsProcessIsKilled) {
  EtcdCluster cluster;
  const auto log = cluster.dir() / "child.log";
  Child child(DIST_ETCD_STORE_CHILD_BIN,
              {cluster.endpoint_list(), run_id(), "node/0", std::to_string(kLeaseTtl.count())},
              log);
  const auto end = std::chrono::steady_clock::now() + 60s;
  while (child.output().find("ready") == std::string::npos) {
    ASSERT_FALSE(process_gone(child.pid(), 0ms)) << child.output();
    ASSERT_LT(std::chrono::steady_clock::now(), end) << "the child never set its key";
    std::this_thread::sleep_for(20ms);
  }
  boost::asio::io_context io;
  const auto store = run_task(io, open_rendezvous_store(io, options_for(cluster), run_id()));
  EXPECT_EQ(run_task(io, store->try_get("node/0")), "held by this process");
  ::kill(child.pid(), SIGKILL);
  EXPECT_EQ(child.wait(), 128 + SIGKILL);
  EXPECT_EQ(run_task(io, store->wait_deleted({"node/0"}, kLeaseTtl + kExpiryGrace)), 0u);
}

TEST(EtcdStore, AnAddWhoseAnswerWasLostIsCountedOnce) {
  EtcdCluster cluster;
  const auto member = cluster.endpoint(0);  // 127.0.0.1:port
  LossyProxy proxy("127.0.0.1", std::stoi(member.substr(member.rfind(':') + 1)));
  boost::asio::io_context io;
  const auto options =
      etcd_options(members("127.0.0.1:" + std::to_string(proxy.port())), kLeaseTtl);
  const auto store = run_task(io, open_rendezvous_store(io, options, run_id()));
  struct Case {
    const char* what;
    const char* key;
    std::int64_t delta, expected;
  };
  const std::vector<Case> cases{{"a counter created", "tickets", 1, 1},
                                {"a counter bumped", "tickets", 1, 2},
                                {"any other add, creating", "total", 5, 5},
                                {"any other add", "total", 5, 10}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    proxy.lose_answer_to("POST /v3/kv/txn");
    EXPECT_EQ(run_task(io, store->add(c.key, c.delta)), c.expected);
  }
  EXPECT_EQ(proxy.answers_lost(), static_cast<int>(cases.size()));  // each applied, unanswered
  EXPECT_EQ(run_task(io, store->try_get("tickets")), "2");
  EXPECT_EQ(run_task(io, store->try_get("total")), "10");
}

TEST(EtcdStoreCluster, TheLeaderKilledMidOperationIsSurvived) {
  EtcdCluster cluster(3);
  const int leader = cluster.leader();
  boost::asio::io_context io;
  const auto store = run_task(io, open_rendezvous_store(io, options_for(cluster), run_id()));
  const auto watcher = run_task(io, store->open_another());
  const auto adder = run_task(io, store->open_another());
  run_task(io, store->set_ephemeral("alive", "1"));

  constexpr int kAdds = 60, kAddsBeforeKill = 10;
  std::vector<std::int64_t> tickets;
  bool watched = false;
  TaskGroup beside(io);
  beside.spawn([&]() -> Task<void> {
    const std::vector<std::string> keys{"after"};  // GCC 12: no braced list in a co_await
    watched = co_await watcher->wait(keys, 120s);
  });
  beside.spawn([&]() -> Task<void> {
    for (int i = 0; i < kAdds; ++i) tickets.push_back(co_await adder->add("tickets", 1));
  });
  run_task(io, [&]() -> Task<void> {
    boost::asio::steady_timer timer(io);
    while (tickets.size() < kAddsBeforeKill) {
      timer.expires_after(1ms);
      co_await timer.async_wait(boost::asio::use_awaitable);
    }
    cluster.kill(leader);  // the adder's next call is on its way
    co_await store->set("after", "1");
  }());
  beside.wait();

  std::sort(tickets.begin(), tickets.end());
  std::vector<std::int64_t> expected(kAdds);
  for (int i = 0; i < kAdds; ++i) expected[i] = i + 1;
  EXPECT_EQ(tickets, expected);  // every add counted once, through the election
  EXPECT_TRUE(watched);          // the wait begun before the kill saw the key set after it
  EXPECT_EQ(run_task(io, store->try_get("alive")), "1");  // the lease survived the election
  EXPECT_EQ(run_task(io, store->try_get("tickets")), std::to_string(kAdds));
}

// close() ends at once what a session has in flight while the leader's death holds it up (as the
// agent's stop_watch() does to its watch session when the workers are done): a wait whose member
// died, a call waiting for the election. Their own timeouts are a minute away.
TEST(EtcdStoreCluster, CloseEndsCallsHeldUpByTheLeadersDeath) {
  constexpr std::chrono::milliseconds kBeforeAnyElection{500};  // an election takes over 1 s
  constexpr std::chrono::seconds kPromptly{2};  // what "at once" may take on a loaded machine
  EtcdCluster cluster(3);
  const int leader = cluster.leader();
  std::string endpoints = cluster.endpoint(leader);
  for (int m = 0; m < 3; ++m) {
    if (m != leader) endpoints += "," + cluster.endpoint(m);
  }
  auto options = etcd_options(members(endpoints), kLeaseTtl);
  options.client.spread_over_members = false;  // every call starts at the leader
  options.client.request_timeout = 60s;
  options.client.unavailable_timeout = 60s;
  boost::asio::io_context io;
  const auto store = run_task(io, open_rendezvous_store(io, options, run_id()));
  const auto waiter = run_task(io, store->open_another());
  run_task(io, store->set_ephemeral("alive", "1"));  // a lease, kept alive meanwhile

  struct Ended {
    std::optional<StoreError> error;
    std::optional<std::chrono::steady_clock::time_point> at;
  };
  Ended wait, set;
  TaskGroup beside(io);
  beside.spawn([&]() -> Task<void> {
    try {
      const std::vector<std::string> keys{"never"};  // GCC 12: no braced list in a co_await
      co_await waiter->wait(keys, 120s);
    } catch (const StoreError& e) {
      wait.error = e;
    }
    wait.at = std::chrono::steady_clock::now();
  });
  run_task(io, store->try_get("anything"));  // a round trip while the wait opens its watch
  cluster.kill(leader);
  beside.spawn([&]() -> Task<void> {
    try {
      co_await store->set("k", "v");
    } catch (const StoreError& e) {
      set.error = e;
    }
    set.at = std::chrono::steady_clock::now();
  });
  std::chrono::steady_clock::time_point closed_at;
  run_task(io, [&]() -> Task<void> {
    boost::asio::steady_timer timer(io, kBeforeAnyElection);
    co_await timer.async_wait(boost::asio::use_awaitable);
    closed_at = std::chrono::steady_clock::now();
    waiter->close();
    store->close();
  }());
  beside.wait(30s);
  for (const auto* e : {&wait, &set}) {
    SCOPED_TRACE(e == &wait ? "the wait" : "the set");
    ASSERT_TRUE(e->error.has_value()) << "it succeeded";
    EXPECT_EQ(e->error->code(), StoreErrc::kCancelled) << e->error->what();
    EXPECT_GE(*e->at, closed_at) << "it ended before close()";
    EXPECT_LT(*e->at - closed_at, kPromptly);
  }
}

// A member lost mid-session, as the agents' sessions live it: each with the agents' default
// 2 s TTL and its keepalive, all starting at the member that goes. Several times in a row, each
// in a fresh cluster. A lease the loss cost is gone well within kLostLeaseGone (its TTL, the new
// leader's extension of an election timeout, etcd's 500 ms expiry check and the election).
struct MemberLoss {
  const char* what;
  bool leader;  // the leader, or a follower
  int signal;   // SIGKILL: the kernel closes its connections; SIGSTOP: they go silent
};

constexpr int kLossesInARow = 3;
constexpr std::chrono::seconds kLostLeaseGone{10};

void leases_outlive(const MemberLoss& loss) {
  for (int round = 0; round < kLossesInARow; ++round) {
    SCOPED_TRACE(std::string(loss.what) + ", round " + std::to_string(round));
    EtcdCluster cluster(3);
    const int leader = cluster.leader();
    const int lost = loss.leader ? leader : (leader + 1) % 3;
    std::string first = cluster.endpoint(lost), others;
    for (int m = 0; m < 3; ++m) {
      if (m != lost) others += "," + cluster.endpoint(m);
    }
    auto options = etcd_options(members(first + others), kLeaseTtl);
    options.client.spread_over_members = false;  // every call starts at the member lost
    boost::asio::io_context io;
    constexpr int kSessions = 3;
    std::vector<std::unique_ptr<RendezvousStore>> sessions;
    std::vector<std::string> keys;
    for (int i = 0; i < kSessions; ++i) {
      sessions.push_back(run_task(io, open_rendezvous_store(io, options, run_id())));
      keys.push_back("alive/" + std::to_string(i));
      run_task(io, sessions.back()->set_ephemeral(keys.back(), "1"));
    }
    // Watched through the members left, from before the loss.
    const auto observer = run_task(
        io,
        open_rendezvous_store(io, etcd_options(members(others.substr(1)), kLeaseTtl), run_id()));
    ::kill(cluster.pid(lost), loss.signal);
    if (loss.signal == SIGKILL) cluster.kill(lost);  // reaped
    EXPECT_EQ(run_task(io, observer->wait_deleted(keys, kLostLeaseGone)), std::nullopt)
        << "a session's lease did not outlive the loss";
    for (int i = 0; i < kSessions; ++i) {
      EXPECT_EQ(run_task(io, sessions[i]->try_get(keys[i])), "1");  // a call goes on elsewhere
    }
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(EtcdStoreCluster, LeasesOutliveTheLeadersDeath) {
  leases_outlive({"the leader killed", true, SIGKILL});
}

TEST(EtcdStoreCluster, LeasesOutliveAFrozenLeader) {
  leases_outlive({"the leader frozen", true, SIGSTOP});
}

TEST(EtcdStoreCluster, LeasesOutliveAFrozenFollower) {
  leases_outlive({"a follower frozen", false, SIGSTOP});
}

TEST(EtcdStoreCluster, QuorumLostGivesAClearErrorInBoundedTime) {
  EtcdCluster cluster(3);
  const int survivor = (cluster.leader() + 1) % 3;
  boost::asio::io_context io;
  const auto store = run_task(io, open_rendezvous_store(io, options_for(cluster, 3s), run_id()));
  const auto waiter = run_task(io, store->open_another());
  run_task(io, store->set("k", "before"));
  std::optional<StoreError> wait_error;
  TaskGroup beside(io);
  beside.spawn([&]() -> Task<void> {
    try {
      const std::vector<std::string> keys{"never"};  // GCC 12: no braced list in a co_await
      co_await waiter->wait(keys, 120s);
    } catch (const StoreError& e) {
      wait_error = e;
    }
  });
  for (int i = 0; i < 3; ++i) {
    if (i != survivor) cluster.kill(i);
  }
  const auto started = std::chrono::steady_clock::now();
  const auto e = error_of([&] { run_task(io, store->set("k", "after")); });
  EXPECT_EQ(e.code(), StoreErrc::kUnavailable) << e.what();
  EXPECT_LT(std::chrono::steady_clock::now() - started, 15s);
  const std::string what = e.what();
  EXPECT_NE(what.find("majority"), std::string::npos) << what;
  EXPECT_NE(what.find("/" + run_id() + "/k'"), std::string::npos) << what;
  EXPECT_NE(what.find(cluster.endpoint(survivor)), std::string::npos) << what;
  beside.wait(60s);
  ASSERT_TRUE(wait_error.has_value()) << "the wait outlived the quorum";
  EXPECT_EQ(wait_error->code(), StoreErrc::kUnavailable) << wait_error->what();
}

TEST(EtcdStore, TlsAndPasswordFromRdzvConf) {
  const auto pki_dir = std::filesystem::temp_directory_path() /
                       ("dist-etcd-store-pki-" + std::to_string(::getpid()));
  EtcdClusterOptions cluster_options;
  cluster_options.tls = store::testing::make_test_pki(pki_dir);
  EtcdCluster cluster(cluster_options);
  cluster.etcdctl({"user", "add", "root:s3cret"});
  cluster.etcdctl({"auth", "enable"});
  const TempFile right("s3cret\n"), wrong("guess\n");
  const auto conf = [&](const TempFile& password) {
    EtcdConfig c = members(cluster.endpoint_list());
    c.ca_file = cluster_options.tls->ca_cert;
    c.cert_file = cluster_options.tls->client_cert;
    c.key_file = cluster_options.tls->client_key;
    c.user = "root";
    c.password_file = password.path();
    return c;
  };
  boost::asio::io_context io;
  const auto store =
      run_task(io, open_rendezvous_store(io, etcd_options(conf(right), kLeaseTtl), run_id()));
  run_task(io, store->set_ephemeral("secure", "v"));
  EXPECT_EQ(run_task(io, store->add("count", 1)), 1);
  EXPECT_EQ(run_task(io, store->try_get("secure")), "v");
  const auto refused = [&](const EtcdConfig& conf) {
    return error_of(
        [&] { run_task(io, open_rendezvous_store(io, etcd_options(conf, kLeaseTtl), run_id())); });
  };
  const auto wrong_password = refused(conf(wrong));
  EXPECT_EQ(wrong_password.code(), StoreErrc::kUnauthenticated) << wrong_password.what();
  auto named = conf(right);
  named.cert_file = cluster_options.tls->named_client_cert;
  named.key_file = cluster_options.tls->named_client_key;
  const auto common_name = refused(named);
  EXPECT_EQ(common_name.code(), StoreErrc::kUnauthenticated) << common_name.what();
  EXPECT_NE(std::string(common_name.what()).find("without"), std::string::npos)
      << common_name.what();
  std::filesystem::remove_all(pki_dir);
}

}  // namespace
}  // namespace dist::agent::testing
