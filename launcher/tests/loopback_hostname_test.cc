// The warning for a job across machines whose host name resolves to loopback alone (Debian and
// Ubuntu's /etc/hosts: 127.0.1.1), where torch's gloo would bind unless GLOO_SOCKET_IFNAME says
// otherwise: numeric addresses and "localhost", which resolve without a name service.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "config_from_options.h"
#include "scoped_variable.h"

namespace dist::launcher {
namespace {

using dist::agent::testing::ScopedVariable;

TEST(LoopbackHostname, LoopbackAddressesAndNamesAreToldApart) {
  EXPECT_TRUE(resolves_to_loopback_only("127.0.1.1"));
  EXPECT_TRUE(resolves_to_loopback_only("::1"));
  EXPECT_TRUE(resolves_to_loopback_only("localhost"));
  EXPECT_FALSE(resolves_to_loopback_only("198.18.0.1"));
  EXPECT_FALSE(resolves_to_loopback_only("no-such-host.invalid"));
}

TEST(LoopbackHostname, SaidOnlyForSeveralMachinesWithoutAnInterfaceNamed) {
  ScopedVariable unset("GLOO_SOCKET_IFNAME", std::nullopt);
  agent::LaunchConfig c;
  c.max_nodes = 2;
  c.python_workers = true;
  c.master_addr = "198.18.0.1";
  const std::string said = loopback_hostname_warning(c, "127.0.1.1");
  EXPECT_NE(said.find("this host's name '127.0.1.1' resolves to loopback addresses only"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("set GLOO_SOCKET_IFNAME"), std::string::npos) << said;
  EXPECT_EQ(loopback_hostname_warning(c, "198.18.0.2"), "") << "a name of the machine's address";
  agent::LaunchConfig one = c;
  one.max_nodes = 1;
  EXPECT_EQ(loopback_hostname_warning(one, "127.0.1.1"), "");
  agent::LaunchConfig here = c;
  here.master_addr = "127.0.0.1";  // every node on this machine: loopback is right
  EXPECT_EQ(loopback_hostname_warning(here, "127.0.1.1"), "");
  agent::LaunchConfig sdk = c;
  sdk.python_workers = false;
  EXPECT_EQ(loopback_hostname_warning(sdk, "127.0.1.1"), "");
  ScopedVariable named("GLOO_SOCKET_IFNAME", "eth0");
  EXPECT_EQ(loopback_hostname_warning(c, "127.0.1.1"), "");
}

// The master named by this host's own name (MASTER_ADDR=$(hostname) on node 0): loopback here,
// this host's address on the others. Said: node 0 is the one whose workers gloo binds to
// 127.0.1.1 (it had been taken for a job on one machine, like 127.0.0.1).
TEST(LoopbackHostname, SaidOnTheNodeTheMasterAddressNamesByItsOwnName) {
  ScopedVariable unset("GLOO_SOCKET_IFNAME", std::nullopt);
  agent::LaunchConfig c;
  c.max_nodes = 2;
  c.python_workers = true;
  c.master_addr = "127.0.1.1";  // as a name: this machine's own (the test's host name)
  EXPECT_NE(loopback_hostname_warning(c, "127.0.1.1"), "");
  c.master_addr = "127.0.0.1";  // an address: every node on this machine
  EXPECT_EQ(loopback_hostname_warning(c, "127.0.1.1"), "");
  // localhost is every machine's loopback, a host named localhost(.localdomain) too.
  c.master_addr = "localhost";
  EXPECT_EQ(loopback_hostname_warning(c, "localhost"), "");
  c.master_addr = "LocalHost";
  EXPECT_EQ(loopback_hostname_warning(c, "localhost"), "");
  ScopedVariable named("GLOO_SOCKET_IFNAME", "eth0");
  c.master_addr = "localhost";
  EXPECT_EQ(loopback_hostname_warning(c, "127.0.1.1"), "");
}

}  // namespace
}  // namespace dist::launcher
