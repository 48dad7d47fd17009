// The job's token between a client and a store that disagree about it, both clients: each side
// refuses the other with an error that names the store and says what to do; and the token file
// a launcher writes for its workers.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <fstream>
#include <set>

#include "dist/store/async_client.h"
#include "dist/store/client.h"
#include "dist/store/server.h"
#include "dist/store/token.h"

namespace dist::store {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

ClientOptions client_options(std::uint16_t port, std::string secret) {
  ClientOptions o;
  o.port = port;
  o.secret = std::move(secret);
  o.timeout = 5s;
  o.connect_timeout = 2s;
  return o;
}

// What connecting says, with the blocking client and with the asynchronous one (the agent's):
// both must fail with kUnauthenticated.
std::vector<std::string> refusals(const ClientOptions& options) {
  std::vector<std::string> said;
  try {
    StoreClient::connect(options);
    ADD_FAILURE() << "the blocking client must refuse";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), StoreErrc::kUnauthenticated) << e.what();
    said.push_back(e.what());
  }
  boost::asio::io_context io;
  std::exception_ptr failure;
  auto connect = [&]() -> boost::asio::awaitable<void> {
    co_await AsyncStoreClient::connect(options);
  };
  boost::asio::co_spawn(io, connect(), [&](std::exception_ptr e) { failure = e; });
  io.run();
  try {
    if (failure) std::rethrow_exception(failure);
    ADD_FAILURE() << "the asynchronous client must refuse";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), StoreErrc::kUnauthenticated) << e.what();
    said.push_back(e.what());
  }
  return said;
}

void expect_names_store_and_remedy(const std::vector<std::string>& said, std::uint16_t port,
                                   const std::string& problem) {
  ASSERT_EQ(said.size(), 2u);
  for (const std::string& what : said) {
    EXPECT_NE(what.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << what;
    EXPECT_NE(what.find(problem), std::string::npos) << what;
    EXPECT_NE(what.find("--token-file"), std::string::npos) << what;
  }
}

TEST(Token, AWrongTokenNamesTheStoreAndWhatToDo) {
  ServerOptions with_token;
  with_token.secret = "the-jobs-token";
  StoreServerThread server("127.0.0.1", 0, with_token);
  expect_names_store_and_remedy(refusals(client_options(server.port(), "another-token")),
                                server.port(), "this client's token is not the store's");
}

TEST(Token, NoTokenForAStoreThatAsksForOneNamesTheStoreAndWhatToDo) {
  ServerOptions with_token;
  with_token.secret = "the-jobs-token";
  StoreServerThread server("127.0.0.1", 0, with_token);
  expect_names_store_and_remedy(refusals(client_options(server.port(), "")), server.port(),
                                "requires the job's token");
}

// A store that asks for no token cannot prove it knows the job's: a client that has one does not
// trust it (an agent started without --token-file, or the wrong endpoint).
TEST(Token, AClientWithATokenRefusesAStoreThatAsksForNone) {
  StoreServerThread server;
  expect_names_store_and_remedy(refusals(client_options(server.port(), "the-jobs-token")),
                                server.port(), "does not ask for the job's token");
}

TEST(Token, GeneratedTokensAreLongRandomAndDistinct) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string t = generate_secret();
    EXPECT_EQ(t.size(), 64u);
    EXPECT_EQ(t.find_first_not_of("0123456789abcdef"), std::string::npos) << t;
    seen.insert(t);
  }
  EXPECT_EQ(seen.size(), 100u);
}

class TokenFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dist-token-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(TokenFile, IsWrittenForItsOwnerAloneAndReadsBack) {
  const auto old_umask = ::umask(0);  // the mode must not depend on the caller's umask
  const std::string path = (dir_ / "token").string();
  write_secret_file(path, "tok3n");
  ::umask(old_umask);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(read_secret_file(path), "tok3n");

  ServerOptions with_token;  // and a client that read it authenticates
  with_token.secret = read_secret_file(path);
  with_token.unauthenticated = UnauthenticatedPolicy::kDeny;
  StoreServerThread server("127.0.0.1", 0, with_token);
  auto client = StoreClient::connect(client_options(server.port(), read_secret_file(path)));
  client.set("k", "v");
  EXPECT_EQ(client.get("k"), "v");
}

TEST_F(TokenFile, NeverReplacesAFileOrFollowsALink) {
  const fs::path existing = dir_ / "existing";
  std::ofstream(existing) << "someone else's\n";
  const fs::path link = dir_ / "link";
  fs::create_symlink(dir_ / "elsewhere", link);
  for (const fs::path& path : {existing, link}) {
    try {
      write_secret_file(path.string(), "tok3n");
      ADD_FAILURE() << "must refuse " << path;
    } catch (const StoreError& e) {
      EXPECT_EQ(e.code(), StoreErrc::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    }
  }
  std::ifstream in(existing);
  std::string content;
  std::getline(in, content);
  EXPECT_EQ(content, "someone else's");
  EXPECT_FALSE(fs::exists(dir_ / "elsewhere"));
}

}  // namespace
}  // namespace dist::store
