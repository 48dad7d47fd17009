// What an NCCL group does before NCCL runs, on machines without a GPU too: a communicator's own
// store keys (a rebuilt group never reads a stale unique id), every rank meeting on the store,
// NCCL_SOCKET_IFNAME chosen as Gloo chooses its address, and the loaded NCCL's version.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <future>
#include <optional>
#include <regex>
#include <thread>

#include "dist/sdk/process_group.h"
#include "dist/store/server.h"
#include "local_address.h"
#include "nccl_bootstrap.h"

#if DIST_HAVE_NCCL
#include <nccl.h>
#endif

namespace dist::sdk {
namespace {

using namespace std::chrono_literals;

store::StoreClient client(std::uint16_t port) {
  store::ClientOptions options;
  options.port = port;
  return store::StoreClient::connect(options);
}

// Sets (or unsets, with nullopt) an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(NcclBootstrap, EveryGroupARankBuildsOnAPrefixHasKeysOfItsOwn) {
  EXPECT_EQ(detail::nccl_communicator_key("test/keys", 0), "test/keys/0");
  EXPECT_EQ(detail::nccl_communicator_key("test/keys", 0), "test/keys/1");
  // Another rank of this process (ranks as threads) counts its own groups.
  EXPECT_EQ(detail::nccl_communicator_key("test/keys", 1), "test/keys/0");
  EXPECT_EQ(detail::nccl_communicator_key("test/other", 0), "test/other/0");
}

// Two groups in a row, as a group rebuilt after a failure: rank 1's second exchange must wait for
// rank 0's second id, where one key per attempt handed it the first at once.
TEST(NcclBootstrap, ARebuiltGroupNeverReadsThePreviousGroupsUniqueId) {
  if (!nccl_available()) GTEST_SKIP() << "this build has no NCCL backend (DIST_WITH_NCCL)";
  store::StoreServerThread store;
  auto rank0 = client(store.port());
  auto rank1 = client(store.port());
  const auto exchange = [](store::StoreClient& c, int rank) {
    const std::string key = detail::nccl_communicator_key("test/rebuild", rank);
    return exchange_nccl_unique_id(c, rank, key + "/unique_id", 10s);
  };
  const std::string first0 = exchange(rank0, 0);
  EXPECT_EQ(exchange(rank1, 1), first0);
  auto second1 = std::async(std::launch::async, [&] { return exchange(rank1, 1); });
  EXPECT_EQ(second1.wait_for(300ms), std::future_status::timeout)
      << "rank 1 read a unique id before rank 0 published its second one";
  const std::string second0 = exchange(rank0, 0);
  EXPECT_NE(second0, first0);
  EXPECT_EQ(second1.get(), second0);
}

TEST(NcclBootstrap, EveryRankMeetsOnTheStore) {
  store::StoreServerThread store;
  std::vector<std::thread> ranks;
  std::vector<std::string> errors(3);
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      try {
        auto c = client(store.port());
        detail::meet_on_store(c, "test/meet", r, 3, 10s);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(NcclBootstrap, ARankThatNeverComesIsCountedAtInitTimeout) {
  store::StoreServerThread store;
  auto other = client(store.port());
  auto self = client(store.port());
  std::thread early([&] {
    try {
      detail::meet_on_store(other, "test/missing", 1, 3, 300ms);
    } catch (const CollectiveError&) {  // it times out too
    }
  });
  try {
    detail::meet_on_store(self, "test/missing", 0, 3, 300ms);
    ADD_FAILURE() << "two of three ranks met";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("only 2 of 3 ranks reached it"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("test/missing"), std::string::npos) << e.what();
  }
  early.join();
}

TEST(NcclBootstrap, TheInterfaceOfAnAddressIsFound) {
  EXPECT_EQ(detail::interface_with_address("127.0.0.1"), "lo");
  EXPECT_EQ(detail::interface_with_address("127.0.0.2"), "lo");  // an alias of lo
  EXPECT_EQ(detail::interface_with_address("::1"), "lo");
  EXPECT_EQ(detail::interface_with_address("198.51.100.7"), "");  // TEST-NET-2: on no interface
}

TEST(NcclBootstrap, NcclSocketIfnameFollowsTheAddressGlooWouldChoose) {
  const ScopedEnv no_ifname("NCCL_SOCKET_IFNAME", std::nullopt);
  const ScopedEnv no_comm_id("NCCL_COMM_ID", std::nullopt);
  const ScopedEnv no_gloo("GLOO_SOCKET_IFNAME", std::nullopt);
  const ScopedEnv no_local("DIST_LOCAL_ADDR", std::nullopt);
  NcclOptions options;
  options.route_to = "127.0.0.3";  // the route's local address is on lo
  EXPECT_EQ(detail::nccl_socket_interface(options), "lo");
  options.local_address = "127.0.0.2";
  EXPECT_EQ(detail::nccl_socket_interface(options), "lo");
  {
    const ScopedEnv local("DIST_LOCAL_ADDR", "127.0.0.2");
    options.local_address.clear();
    EXPECT_EQ(detail::nccl_socket_interface(options), "lo");
  }
  EXPECT_EQ(detail::set_nccl_socket_interface(options), "lo");
  ASSERT_NE(std::getenv("NCCL_SOCKET_IFNAME"), nullptr);
  EXPECT_STREQ(std::getenv("NCCL_SOCKET_IFNAME"), "=lo");  // exactly lo, not every lo* interface
}

TEST(NcclBootstrap, TheUsersNcclSocketIfnameWins) {
  const ScopedEnv ifname("NCCL_SOCKET_IFNAME", "eth7");
  NcclOptions options;
  EXPECT_EQ(detail::nccl_socket_interface(options), "");
  EXPECT_EQ(detail::set_nccl_socket_interface(options), "");
  EXPECT_STREQ(std::getenv("NCCL_SOCKET_IFNAME"), "eth7");
}

TEST(NcclBootstrap, TheLoadedNcclVersionIsReported) {
  const std::string version = nccl_version();
  std::printf("loaded NCCL %s\n", version.c_str());  // scripts/gpu-check.sh reports it
  if (!nccl_available()) {
    EXPECT_EQ(version, "none");
    return;
  }
#if DIST_HAVE_NCCL
  std::smatch m;
  ASSERT_TRUE(std::regex_match(version, m,
                               std::regex(R"((\d+)\.(\d+)\.(\d+) \(built with (\d+\.\d+\.\d+)\))")))
      << version;
  EXPECT_EQ(m[4].str(), std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." +
                            std::to_string(NCCL_PATCH));
  EXPECT_EQ(m[1].str(), "2") << version;
#endif
}

}  // namespace
}  // namespace dist::sdk
