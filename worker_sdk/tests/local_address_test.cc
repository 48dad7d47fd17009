// The address a rank's Gloo device listens on: the route to MASTER_ADDR (a name, IPv4 or IPv6),
// GLOO_SOCKET_IFNAME, DIST_LOCAL_ADDR; an error, never a silent loopback, when none works; and a
// group whose ranks mix loopback and other addresses fails at once on every rank.
#include "local_address.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dist/sdk/process_group.h"
#include "dist/store/server.h"

namespace dist::sdk {
namespace {

using detail::address_towards;
using detail::choose_local_address;
using detail::is_loopback;

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// An IPv4 address of this host that is not loopback, when it has one.
std::optional<std::string> non_loopback_ipv4() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return std::nullopt;
  std::optional<std::string> found;
  for (const ifaddrs* i = list; i && !found; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, text,
                sizeof text);
    if (!is_loopback(text)) found = text;
  }
  ::freeifaddrs(list);
  return found;
}

bool has_ipv6_loopback() {
  const int fd = ::socket(AF_INET6, SOCK_DGRAM, 0);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  const bool ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  if (fd >= 0) ::close(fd);
  return ok;
}

TEST(LocalAddress, LoopbackAddressesAreRecognised) {
  const std::pair<const char*, bool> cases[] = {
      {"127.0.0.1", true},        {"127.0.1.1", true},
      {"127.255.0.9", true},      {"::1", true},
      {"::ffff:127.0.0.1", true}, {"10.0.0.1", false},
      {"::ffff:10.0.0.1", false}, {"fd00::1", false},
      {"localhost", false},
  };
  for (const auto& [address, loopback] : cases)
    EXPECT_EQ(is_loopback(address), loopback) << address;
}

TEST(LocalAddress, TheRouteToANameIPv4OrIPv6) {
  EXPECT_EQ(address_towards("127.0.0.1"), "127.0.0.1");
  EXPECT_TRUE(is_loopback(address_towards("127.0.0.3")));  // the source is lo's 127.0.0.1
  EXPECT_TRUE(is_loopback(address_towards("localhost")));
  if (has_ipv6_loopback()) {
    EXPECT_EQ(address_towards("::1"), "::1");
  }
  if (const auto own = non_loopback_ipv4()) {
    EXPECT_EQ(address_towards(*own), *own) << "this host's own address routes over lo";
  }
}

TEST(LocalAddress, AnUnresolvableMasterIsAnErrorNamingIt) {
  try {
    address_towards("no-such-host.invalid");
    FAIL() << "resolved a name that cannot exist";
  } catch (const CollectiveError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("MASTER_ADDR 'no-such-host.invalid' does not resolve"), std::string::npos)
        << what;
    EXPECT_NE(what.find("GLOO_SOCKET_IFNAME"), std::string::npos) << what;
  }
}

TEST(LocalAddress, GlooSocketIfnameWinsOverTheRoute) {
  ScopedEnv ifname("GLOO_SOCKET_IFNAME", "lo,eth9");  // torch's list: the first is used
  EXPECT_EQ(choose_local_address("", "127.0.0.2"), "127.0.0.1");
  if (has_ipv6_loopback()) {
    EXPECT_EQ(choose_local_address("", "::1"), "::1");
  }
  EXPECT_EQ(choose_local_address("127.0.0.7", "127.0.0.2"), "127.0.0.7") << "explicit wins";
  ScopedEnv missing("GLOO_SOCKET_IFNAME", "nosuch0");
  try {
    choose_local_address("", "127.0.0.2");
    FAIL() << "an interface that does not exist";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("GLOO_SOCKET_IFNAME=nosuch0"), std::string::npos)
        << e.what();
  }
}

TEST(LocalAddress, DistLocalAddrUnlessItIsLoopbackAndTheMasterIsNot) {
  {
    ScopedEnv local("DIST_LOCAL_ADDR", "127.0.0.5");
    EXPECT_EQ(choose_local_address("", "127.0.0.2"), "127.0.0.5");
  }
  const auto own = non_loopback_ipv4();
  if (!own) GTEST_SKIP() << "this host has no IPv4 address besides loopback";
  {
    // The node's name maps to 127.0.1.1 on itself (Debian): the route to the master is right.
    ScopedEnv local("DIST_LOCAL_ADDR", "127.0.1.1");
    EXPECT_EQ(choose_local_address("", *own), *own);
  }
  // The master's name maps to loopback here, but this node's address is known: it wins.
  ScopedEnv local("DIST_LOCAL_ADDR", *own);
  EXPECT_EQ(choose_local_address("", "127.0.1.1"), *own);
}

TEST(LocalAddress, AGroupMixingLoopbackAndOtherAddressesFailsOnEveryRank) {
  const auto own = non_loopback_ipv4();
  if (!own) GTEST_SKIP() << "this host has no IPv4 address besides loopback";
  store::StoreServerThread store;
  const std::string addresses[] = {"127.0.1.1", *own};
  std::string errors[2];
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      store::ClientOptions client;
      client.port = store.port();
      GlooOptions options;
      options.local_address = addresses[rank];
      options.timeout = std::chrono::seconds(20);
      try {
        make_gloo_group(store::StoreClient::connect(client), rank, 2, options);
      } catch (const CollectiveError& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_NE(errors[0].find("rank 0 would listen on 127.0.1.1, a loopback address the other "
                           "hosts cannot reach (1 of 2 ranks"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[0].find("GLOO_SOCKET_IFNAME"), std::string::npos) << errors[0];
  // The other rank's error names the rank on loopback and the fix too: whichever rank fails
  // first is the one a failure report shows.
  EXPECT_NE(errors[1].find("rank 1 (" + *own + ") cannot form the group"), std::string::npos)
      << errors[1];
  EXPECT_NE(errors[1].find("cannot reach (1 of 2 ranks: rank 0 at 127.0.1.1)"), std::string::npos)
      << errors[1];
  EXPECT_NE(errors[1].find("GLOO_SOCKET_IFNAME"), std::string::npos) << errors[1];
}

}  // namespace
}  // namespace dist::sdk
