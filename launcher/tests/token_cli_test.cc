// The job's token on the command line: --token-file (or PET_TOKEN_FILE, or DIST_LAUNCH_TOKEN_FILE,
// which a launcher that writes the file sets), "-" for standard input, --generate-token for one
// node, --unauthenticated for the store an agent hosts; every mistake a one-line error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "dist/launcher/cli.h"

namespace dist::launcher {
namespace {

namespace fs = std::filesystem;
using store::UnauthenticatedPolicy;

class TokenOnTheCommandLine : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dist-token-cli-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    token_ = (dir_ / "token").string();
    std::ofstream(token_) << "job-token\n";
    fs::permissions(token_, fs::perms::owner_read | fs::perms::owner_write);
  }
  void TearDown() override {
    for (const auto& name : set_) ::unsetenv(name.c_str());
    fs::remove_all(dir_);
  }
  void set_env(const std::string& name, const std::string& value) {
    ::setenv(name.c_str(), value.c_str(), 1);
    set_.push_back(name);
  }
  CliOutcome parse(std::vector<std::string> args) {
    args.insert(args.end(), {"--no-python", "/bin/true"});
    std::ostringstream out;
    err_.str("");
    return parse_command_line(args, out, err_);
  }
  // A usage error: exit 2, one line that contains `needle`.
  void expect_error(std::vector<std::string> args, const std::string& needle) {
    const auto o = parse(std::move(args));
    EXPECT_TRUE(o.exit_now);
    EXPECT_EQ(o.exit_code, kExitUsage);
    const std::string said = err_.str();
    EXPECT_NE(said.find(needle), std::string::npos) << said;
    EXPECT_EQ(std::count(said.begin(), said.end(), '\n'), 1) << said;
  }

  fs::path dir_;
  std::string token_;
  std::vector<std::string> set_;
  std::ostringstream err_;
};

TEST_F(TokenOnTheCommandLine, NoTokenByDefault) {
  const auto o = parse({});
  ASSERT_FALSE(o.exit_now) << err_.str();
  EXPECT_TRUE(o.config.secret.empty());
  EXPECT_TRUE(o.config.token_file.empty());
}

TEST_F(TokenOnTheCommandLine, ATokenFileGivesTheSecretAndItsAbsolutePathForTheWorkers) {
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_);
  const auto o = parse({"--nnodes", "2", "--master-addr", "node-a", "--token-file", "token"});
  fs::current_path(cwd);
  ASSERT_FALSE(o.exit_now) << err_.str();
  EXPECT_EQ(o.config.secret, "job-token");
  EXPECT_EQ(o.config.token_file, token_);
  EXPECT_EQ(o.config.unauthenticated, UnauthenticatedPolicy::kKnownHosts);
}

TEST_F(TokenOnTheCommandLine, TheTokenFileMayComeFromTheEnvironment) {
  set_env("DIST_LAUNCH_TOKEN_FILE", token_);
  auto o = parse({});
  ASSERT_FALSE(o.exit_now) << err_.str();
  EXPECT_EQ(o.config.secret, "job-token");
  EXPECT_EQ(o.config.token_file, token_);

  const std::string other = (dir_ / "other").string();
  std::ofstream(other) << "other-token\n";
  fs::permissions(other, fs::perms::owner_read);
  set_env("PET_TOKEN_FILE", other);  // dist-launch's own option wins over the workers' variable
  o = parse({});
  ASSERT_FALSE(o.exit_now) << err_.str();
  EXPECT_EQ(o.config.secret, "other-token");
  o = parse({"--token-file", token_});  // and the command line over both
  ASSERT_FALSE(o.exit_now) << err_.str();
  EXPECT_EQ(o.config.secret, "job-token");

  set_env("DIST_LAUNCH_TOKEN_FILE", "");
  ::unsetenv("PET_TOKEN_FILE");
  expect_error({}, "DIST_LAUNCH_TOKEN_FILE is set but empty");
}

TEST_F(TokenOnTheCommandLine, ATokenFileOthersCanReadOrThatIsMissingIsAClearError) {
  fs::permissions(token_, fs::perms::others_read, fs::perm_options::add);
  expect_error({"--token-file", token_}, "chmod 600");
  expect_error({"--token-file", (dir_ / "missing").string()}, (dir_ / "missing").string());
}

// Standard input (descriptor 0, a pipe here) for the test's duration.
class StdinFrom {
 public:
  explicit StdinFrom(const std::string& text) : saved_(::dup(STDIN_FILENO)) {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    EXPECT_EQ(::write(fds[1], text.data(), text.size()), static_cast<ssize_t>(text.size()));
    ::close(fds[1]);
    ::dup2(fds[0], STDIN_FILENO);
    ::close(fds[0]);
  }
  ~StdinFrom() {
    ::dup2(saved_, STDIN_FILENO);
    ::close(saved_);
  }
  StdinFrom(const StdinFrom&) = delete;
  StdinFrom& operator=(const StdinFrom&) = delete;
  std::string rest() const {
    std::string text;
    char buffer[256];
    for (ssize_t n; (n = ::read(STDIN_FILENO, buffer, sizeof buffer)) > 0;) text.append(buffer, n);
    return text;
  }

 private:
  int saved_;
};

// One line, and no more: what follows is the workers' (they inherit the launcher's stdin).
TEST_F(TokenOnTheCommandLine, ADashReadsOneLineFromStandardInputAndLeavesTheRest) {
  {
    StdinFrom in("piped-token\nthe worker's input\n");
    const auto o = parse({"--nnodes", "2", "--master-addr", "node-a", "--token-file", "-"});
    ASSERT_FALSE(o.exit_now) << err_.str();
    EXPECT_EQ(o.config.secret, "piped-token");
    EXPECT_TRUE(o.config.token_file.empty());  // the agent writes one for the workers
    EXPECT_EQ(in.rest(), "the worker's input\n");
  }
  StdinFrom empty("");
  const auto none = parse({"--token-file", "-"});
  EXPECT_TRUE(none.exit_now);
  EXPECT_EQ(none.exit_code, kExitUsage);
}

TEST_F(TokenOnTheCommandLine, AGeneratedTokenIsRandomAndForOneNodeOnly) {
  const auto a = parse({"--generate-token"});
  const auto b = parse({"--standalone", "--generate-token"});
  ASSERT_FALSE(a.exit_now) << err_.str();
  ASSERT_FALSE(b.exit_now) << err_.str();
  EXPECT_EQ(a.config.secret.size(), 64u);
  EXPECT_NE(a.config.secret, b.config.secret);
  EXPECT_TRUE(a.config.token_file.empty());
  expect_error({"--nnodes", "2", "--generate-token"}, "the same --token-file on every node");
  expect_error({"--nnodes", "1:2", "--rdzv-endpoint", "h:1", "--generate-token"},
               "the same --token-file on every node");
  expect_error({"--generate-token", "--token-file", token_}, "cannot be used together");
}

TEST_F(TokenOnTheCommandLine, ThePolicyForClientsWithoutTheTokenNeedsAToken) {
  auto o = parse({"--generate-token", "--unauthenticated", "deny"});
  ASSERT_FALSE(o.exit_now) << err_.str();
  EXPECT_EQ(o.config.unauthenticated, UnauthenticatedPolicy::kDeny);
  set_env("PET_UNAUTHENTICATED", "loopback");
  o = parse({"--token-file", token_});
  ASSERT_FALSE(o.exit_now) << err_.str();
  EXPECT_EQ(o.config.unauthenticated, UnauthenticatedPolicy::kLoopback);
  expect_error({}, "applies to a job with a token");
  ::unsetenv("PET_UNAUTHENTICATED");
  expect_error({"--token-file", token_, "--unauthenticated", "nobody"}, "--unauthenticated");
}

}  // namespace
}  // namespace dist::launcher
