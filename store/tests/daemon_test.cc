// dist-rendezvous as a process: prints the port it bound, exits 0 on SIGTERM, and fails with one
// clear line on a bad flag or a taken port.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <string>

#include "daemon_process.h"
#include "dist/store/client.h"
#include "dist/store/server.h"
#include "raw_client.h"

namespace dist::store {
namespace {

using namespace std::chrono_literals;

struct Result {
  int exit_code;
  std::string output;
};

Result run(const std::string& args) {
  FILE* pipe = ::popen((std::string(DIST_RENDEZVOUS_BIN) + " " + args + " 2>&1").c_str(), "r");
  std::string output;
  std::array<char, 1024> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe)) output += buffer.data();
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

TEST(Daemon, BadFlagIsOneLineAndExitTwo) {
  const Result r = run("--bogus");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_NE(r.output.find("dist-rendezvous: error:"), std::string::npos) << r.output;
}

TEST(Daemon, TakenPortIsAClearError) {
  StoreServerThread holder;
  const Result r = run("--host 127.0.0.1 --port " + std::to_string(holder.port()));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("Address already in use"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(std::to_string(holder.port())), std::string::npos) << r.output;
}

// Starts dist-rendezvous with `args` on a free port; returns its pid and the port it printed.
std::pair<pid_t, std::uint16_t> start_daemon(std::vector<std::string> args, FILE** stream_out) {
  int out[2];
  if (::pipe(out) != 0) return {-1, 0};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    ::close(out[0]);
    ::close(out[1]);
    std::vector<char*> argv{const_cast<char*>(DIST_RENDEZVOUS_BIN)};
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(DIST_RENDEZVOUS_BIN, argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  *stream_out = ::fdopen(out[0], "r");
  std::array<char, 256> line{};
  if (!std::fgets(line.data(), line.size(), *stream_out)) return {pid, 0};
  std::smatch m;
  const std::string text(line.data());
  if (!std::regex_search(text, m, std::regex("listening on [0-9.]+:(\\d+)"))) return {pid, 0};
  return {pid, static_cast<std::uint16_t>(std::stoi(m[1]))};
}

TEST(Daemon, TokenFileRequiresAgentsToAuthenticate) {
  const auto token = std::filesystem::temp_directory_path() /
                     ("dist-rendezvous-token-" + std::to_string(::getpid()));
  std::ofstream(token) << "job-secret\n";
  std::filesystem::permissions(token, std::filesystem::perms::owner_read);
  FILE* stream = nullptr;
  const auto [pid, port] =
      start_daemon({"--host", "127.0.0.1", "--port", "0", "--token-file", token.string(),
                    "--unauthenticated", "deny", "--log-level", "error"},
                   &stream);
  ASSERT_GT(pid, 0);
  ASSERT_GT(port, 0);
  ClientOptions options;
  options.port = port;
  options.connect_timeout = 5s;
  options.secret = "job-secret";  // the file's trailing newline is not part of the secret
  EXPECT_EQ(StoreClient::connect(options).add("n", 1), 1);
  options.secret = "wrong";
  try {
    StoreClient::connect(options);
    ADD_FAILURE() << "a wrong secret must be refused";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), StoreErrc::kUnauthenticated) << e.what();
  }
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::fclose(stream);
  std::filesystem::remove(token);
}

// dist-rendezvous under a file-descriptor limit lower than its clients: the connections past
// the limit are closed at once (their clients are told now, instead of waiting in the listen
// backlog until their connect timeouts), said once and then summed up; the clients it holds are
// served throughout, and new ones once there is room again.
TEST(Daemon, AtTheOpenFileLimitNewConnectionsAreRefusedAtOnce) {
  constexpr std::uint64_t kOpenFiles = 32;
  testing::DaemonProcess daemon({"--log-level", "warn"}, kOpenFiles);
  ASSERT_GT(daemon.port(), 0) << daemon.output();
  ClientOptions options;
  options.port = daemon.port();
  options.connect_timeout = 10s;
  StoreClient first = StoreClient::connect(options);
  EXPECT_EQ(first.add("n", 1), 1);

  std::vector<std::unique_ptr<testing::RawClient>> held;
  for (std::uint64_t i = 0; i < kOpenFiles + 8; ++i) {
    held.push_back(std::make_unique<testing::RawClient>("127.0.0.1", daemon.port()));
  }
  EXPECT_TRUE(held.back()->closed_by_server(10s)) << daemon.output();
  ASSERT_TRUE(daemon.wait_for(std::regex("refusing [^\\n]*: the store's process has every file it "
                                         "may open \\(32 open files"),
                              10s))
      << daemon.output();
  EXPECT_EQ(first.add("n", 1), 2);  // the clients it holds are served

  // A client's own view: its connection closes at once, not after its connect timeout.
  testing::RawClient late("127.0.0.1", daemon.port());
  EXPECT_TRUE(late.closed_by_server(10s)) << daemon.output();
  // Refusals are said once, then summed up (no line per connection).
  EXPECT_FALSE(daemon.wait_for(std::regex("refusing[\\s\\S]*refusing"), 1s)) << daemon.output();

  // Below the limit again once the store has seen the held connections close: served.
  held.clear();
  std::optional<std::int64_t> after;
  for (const auto give_up = std::chrono::steady_clock::now() + 10s;
       !after && std::chrono::steady_clock::now() < give_up;) {
    try {
      after = StoreClient::connect(options).add("n", 1);
    } catch (const StoreError& e) {  // refused: said so, at once
      EXPECT_NE(std::string(e.what()).find("refused the connection at a limit"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(after, 3) << daemon.output();
  EXPECT_EQ(daemon.stop(), 0);
  EXPECT_TRUE(std::regex_search(daemon.output(),
                                std::regex("refused connections: [0-9,]+ more in the last 10 s")))
      << daemon.output();
  EXPECT_EQ(daemon.output().find("accept failed"), std::string::npos) << daemon.output();
}

TEST(Daemon, ServesOnThePrintedPortAndStopsOnSigterm) {
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    ::close(out[0]);
    ::close(out[1]);
    ::execl(DIST_RENDEZVOUS_BIN, DIST_RENDEZVOUS_BIN, "--host", "127.0.0.1", "--port", "0",
            "--log-level", "warn", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(out[1]);
  FILE* stream = ::fdopen(out[0], "r");
  std::array<char, 256> line{};
  ASSERT_NE(std::fgets(line.data(), line.size(), stream), nullptr);
  std::smatch m;
  const std::string text(line.data());
  ASSERT_TRUE(std::regex_search(text, m, std::regex("listening on 127\\.0\\.0\\.1:(\\d+)")))
      << text;

  ClientOptions options;
  options.port = static_cast<std::uint16_t>(std::stoi(m[1]));
  options.connect_timeout = 5s;
  auto client = StoreClient::connect(options);
  EXPECT_EQ(client.add("n", 2), 2);

  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  std::fclose(stream);
  EXPECT_THROW(client.add("n", 1), StoreError) << "the server is gone";
}

}  // namespace
}  // namespace dist::store
