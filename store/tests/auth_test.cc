// Authentication with a shared secret, and the policy for clients that cannot authenticate.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "dist/store/client.h"
#include "dist/store/server.h"
#include "protocol.h"
#include "raw_client.h"
#include "session.h"

namespace dist::store {
namespace {

using namespace std::chrono_literals;
using namespace testing;

ServerOptions with_secret(UnauthenticatedPolicy policy) {
  ServerOptions o;
  o.secret = "s3cret-token";
  o.unauthenticated = policy;
  return o;
}

ClientOptions client_options(std::uint16_t port, std::string secret) {
  ClientOptions o;
  o.port = port;
  o.secret = std::move(secret);
  o.timeout = 5s;
  o.connect_timeout = 2s;
  return o;
}

TEST(Auth, TheRightSecretAuthenticates) {
  StoreServerThread server("127.0.0.1", 0, with_secret(UnauthenticatedPolicy::kDeny));
  auto c = StoreClient::connect(client_options(server.port(), "s3cret-token"));
  c.set("k", "v");
  EXPECT_EQ(c.get("k"), "v");
}

TEST(Auth, AWrongOrMissingSecretIsRejectedWithATypedError) {
  StoreServerThread server("127.0.0.1", 0, with_secret(UnauthenticatedPolicy::kDeny));
  for (const std::string secret : {"wrong", ""}) {
    SCOPED_TRACE(secret.empty() ? "missing secret" : "wrong secret");
    try {
      StoreClient::connect(client_options(server.port(), secret));
      FAIL() << "connect must fail";
    } catch (const StoreError& e) {
      EXPECT_EQ(e.code(), StoreErrc::kUnauthenticated) << e.what();
    }
  }
}

TEST(Auth, ClientRefusesAServerThatCannotProveTheSecret) {
  // The server knows a different secret: the client's proof fails first, so check the other
  // direction explicitly by giving the client a secret while the server requires one it lacks.
  StoreServerThread server("127.0.0.1", 0, with_secret(UnauthenticatedPolicy::kDeny));
  EXPECT_THROW(StoreClient::connect(client_options(server.port(), "s3cret-token-but-longer")),
               StoreError);
}

TEST(Auth, DenyPolicyClosesUnauthenticatedTorchStyleClients) {
  StoreServerThread server("127.0.0.1", 0, with_secret(UnauthenticatedPolicy::kDeny));
  RawClient torch_like("127.0.0.1", server.port());
  torch_like.send(validate() + u8(wire::current::kAdd) + str("/init/") + i64(1));
  EXPECT_TRUE(torch_like.closed_by_server());
  RawClient legacy_like("127.0.0.1", server.port());
  legacy_like.send(u8(wire::legacy::kGetNumKeys));
  EXPECT_TRUE(legacy_like.closed_by_server());
}

TEST(Auth, LoopbackPolicyLetsLocalTorchClientsIn) {
  StoreServerThread server("127.0.0.1", 0, with_secret(UnauthenticatedPolicy::kLoopback));
  RawClient torch_like("127.0.0.1", server.port());
  torch_like.send(validate() + u8(wire::current::kAdd) + str("/init/") + i64(1));
  EXPECT_EQ(torch_like.read_i64(), 1);
  // Our own clients still have to authenticate.
  EXPECT_THROW(StoreClient::connect(client_options(server.port(), "wrong")), StoreError);
}

// The known-hosts policy, for a peer that is not on loopback: driven through the protocol engine
// itself, since every address on this machine is a loopback one.
TEST(Auth, KnownHostsPolicyAdmitsHostsWhereAnAgentAuthenticated) {
  StoreState state(with_secret(UnauthenticatedPolicy::kKnownHosts));
  const std::string request = validate() + u8(wire::current::kAdd) + str("/init/") + i64(1);

  Session stranger(state, PeerInfo{"10.0.0.7:5000", "10.0.0.7", false}, nullptr);
  stranger.feed(request.data(), request.size());
  EXPECT_TRUE(stranger.closing());
  EXPECT_NE(stranger.close_reason().find("ADD before authenticating"), std::string::npos)
      << stranger.close_reason();

  state.remember_authenticated_host("10.0.0.7");  // what a successful AUTH from there records
  Session worker(state, PeerInfo{"10.0.0.7:5001", "10.0.0.7", false}, nullptr);
  worker.feed(request.data(), request.size());
  EXPECT_FALSE(worker.closing()) << worker.close_reason();
  EXPECT_EQ(worker.output(), i64(1));
}

// A PyTorch worker admitted without the secret gets PyTorch's operations on the job's keys; the
// agents' keys (rdzv/) and the extension operations that act on other clients need the secret.
TEST(Auth, ClientsAdmittedWithoutTheSecretStayOutOfTheAgentsKeys) {
  StoreServerThread server("127.0.0.1", 0, with_secret(UnauthenticatedPolicy::kLoopback));
  auto agent = StoreClient::connect(client_options(server.port(), "s3cret-token"));
  agent.set("rdzv/job/node/0", "agent record");
  agent.set("/worker/attempt_0/a", "worker value");

  // Allowed: the job's keys, both dialects.
  RawClient torch("127.0.0.1", server.port());
  torch.send(validate() + u8(wire::current::kGet) + str("/worker/attempt_0/a"));
  EXPECT_EQ(torch.read_bytes(), "worker value");
  torch.send(u8(wire::current::kGetNumKeys));
  EXPECT_EQ(torch.read_i64(), 1) << "the agents' keys are not counted for it";
  torch.send(u8(wire::current::kListKeys));
  EXPECT_EQ(torch.read_i64(), 1);
  EXPECT_EQ(torch.read_bytes(), "/worker/attempt_0/a");

  struct Case {
    const char* name;
    std::string request;  // after VALIDATE (current) or raw (legacy)
    bool legacy = false;
  };
  const Case refused[] = {
      {"GET of an agent key", u8(wire::current::kGet) + str("rdzv/job/node/0")},
      {"SET of an agent key", u8(wire::legacy::kSet) + str("rdzv/job/node/1") + str("x"), true},
      {"DELETE of an agent key", u8(wire::legacy::kDeleteKey) + str("rdzv/job/node/0"), true},
      {"WAIT on an agent key among others",
       u8(wire::current::kWait) + list({"/worker/x", "rdzv/job/alive/0"})},
      {"MULTI_SET with an agent key",
       u8(wire::current::kMultiSet) + u64(2) + str("/w") + str("1") + str("rdzv/x") + str("2")},
      {"DELETE_ALL_EXCEPT", u8(wire::ext::kHello) + u32(wire::ext::kVersion) + u64(0) +
                                u8(wire::ext::kDeleteAllExcept) + str("/keep")},
      {"an ephemeral SET_EXT", u8(wire::ext::kHello) + u32(wire::ext::kVersion) + u64(0) +
                                   u8(wire::ext::kSetExt) + str("/e") + str("v") + u8(1)},
  };
  for (const Case& t : refused) {
    SCOPED_TRACE(t.name);
    RawClient c("127.0.0.1", server.port());
    c.send(t.legacy ? t.request : validate() + t.request);
    EXPECT_TRUE(c.closed_by_server());
  }
  // Nothing changed, and the agents still have everything.
  EXPECT_EQ(agent.get("rdzv/job/node/0"), "agent record");
  EXPECT_FALSE(agent.check({"rdzv/job/node/1"}));
  EXPECT_EQ(agent.num_keys(), 2);
  EXPECT_EQ(agent.delete_all_except("rdzv/"), 1);
}

TEST(Auth, WithoutASecretEveryoneMayUseEverything) {
  StoreServerThread server;
  RawClient torch("127.0.0.1", server.port());
  torch.send(u8(wire::legacy::kSet) + str("rdzv/job/x") + str("1") + u8(wire::legacy::kGetNumKeys));
  EXPECT_EQ(torch.read_i64(), 1);
}

class SecretFile : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = std::filesystem::temp_directory_path() /
            ("dist-secret-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { std::filesystem::remove(path_); }
  void write(const std::string& text, std::filesystem::perms perms) {
    std::ofstream(path_) << text;
    std::filesystem::permissions(path_, perms);
  }
  std::string error() {
    try {
      read_secret_file(path_.string());
    } catch (const StoreError& e) {
      EXPECT_EQ(e.code(), StoreErrc::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(path_.string()), std::string::npos) << e.what();
      return e.what();
    }
    ADD_FAILURE() << "read_secret_file must refuse " << path_;
    return {};
  }
  std::filesystem::path path_;
};

TEST_F(SecretFile, ReadsTheTokenWithoutItsNewline) {
  using std::filesystem::perms;
  write("tok3n\n", perms::owner_read | perms::owner_write);
  EXPECT_EQ(read_secret_file(path_.string()), "tok3n");
  write("team-token\r\n", perms::owner_read | perms::group_read);  // a team's group may read it
  EXPECT_EQ(read_secret_file(path_.string()), "team-token");
}

TEST_F(SecretFile, RefusesMissingEmptyAndWorldReadableFiles) {
  using std::filesystem::perms;
  EXPECT_NE(error().find("cannot be read"), std::string::npos);
  write("\n", perms::owner_read);
  EXPECT_NE(error().find("is empty"), std::string::npos);
  write("tok3n", perms::owner_read | perms::owner_write | perms::others_read);
  EXPECT_NE(error().find("chmod 600"), std::string::npos);
}

}  // namespace
}  // namespace dist::store
