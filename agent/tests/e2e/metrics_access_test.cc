// The agent's pages through the real dist-launch, against what must not harm the job: a script
// and a run id that are not UTF-8 (served on status.json, the page, the metrics, the event log,
// `dist-launch status --json`, while the job runs on to exit 0), a slowloris holding hundreds of
// connections while a user asks for the metrics, and who may read the pages (--metrics-addr, its
// loopback default, --metrics-token-file, the health check that never asks for the token).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "http_client.h"
#include "output/valid_text.h"
#include "process_helpers.h"
#include "programs.h"
#include "test_ports.h"

namespace dist::agent::metrics_access_e2e {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::Child;
using testing::eventually;
using testing::http_exchange;
using testing::http_request;
using testing::run_command;
using Json = nlohmann::json;

const std::string kWorker = DIST_TEST_WORKER_BIN;
const std::string kLaunch = DIST_LAUNCH_BIN;
const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD

class MetricsAccess : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dist-metrics-access-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    agents_.clear();  // each test stops its agents; one a failed test left is killed and reaped
    fs::remove_all(dir_);
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  Child& launch(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
    agents_.push_back(std::make_unique<Child>(
        kLaunch, std::move(args), dir_ / ("agent" + std::to_string(agents_.size()) + ".log"), env,
        std::vector<std::string>{"OMP_NUM_THREADS", "DIST_LAUNCH_METRICS_TOKEN_FILE"}));
    return *agents_.back();
  }

  // The address and port in the agent's "serving <what> at http://ADDRESS:PORT" line.
  static std::pair<std::string, int> served(const Child& agent, const std::string& what) {
    const std::regex line("serving " + what + " at http://([^ ]*):([0-9]+)");
    std::smatch m;
    std::string out;
    const bool found = eventually(
        [&] {
          out = agent.output();
          return std::regex_search(out, m, line);
        },
        20s);
    return found ? std::pair{m[1].str(), std::stoi(m[2])} : std::pair{std::string(), -1};
  }

  fs::path dir_;
  std::vector<std::unique_ptr<Child>> agents_;
};

TEST_F(MetricsAccess, AScriptAndARunIdThatAreNotUtf8ReachEveryOutputAndTheJobEndsWell) {
  const std::string script = path("caf\xE9-worker");  // dist-test-worker under a Latin-1 name
  fs::create_symlink(kWorker, script);
  const std::string run_id = "job\xFF";
  const int store_port = testing::free_port("127.0.0.1");
  Child& agent =
      launch({"--nproc-per-node", "2", "--metrics-port", "0", "--event-log", path("events"),
              "--rdzv-id", run_id, "--master-port", std::to_string(store_port), "--no-python",
              script, "progress", "50", "wait-file", path("done"), "exit", "0"});
  const int port = served(agent, "the status page").second;
  ASSERT_GT(port, 0) << agent.output();

  Json status;
  ASSERT_TRUE(eventually(
      [&] {
        const auto r = http_request(port, "GET /status.json HTTP/1.1");
        if (r.status != 200 || !is_valid_utf8(r.body)) return false;
        status = Json::parse(r.body);
        return status["ranks"].size() == 2 && status["ranks"][1]["beats"].get<int>() > 0;
      },
      20s))
      << status.dump() << agent.output();
  EXPECT_EQ(status["run_id"], "job" + kReplacement);
  EXPECT_NE(status.dump().find("caf" + kReplacement + "-worker"), std::string::npos)
      << status.dump();

  for (const std::string target : {"/", "/ui", "/metrics"}) {
    SCOPED_TRACE(target);
    const auto r = http_request(port, "GET " + target + " HTTP/1.1");
    EXPECT_EQ(r.status, 200);
    EXPECT_TRUE(is_valid_utf8(r.body));
    EXPECT_NE(r.body.find("job" + kReplacement), std::string::npos);
  }

  // The store this one-node job's agent hosts, as `dist-launch status` reads it.
  const auto [code, out] =
      run_command(kLaunch + " status --rdzv-endpoint 127.0.0.1:" + std::to_string(store_port) +
                  " --rdzv-id '" + run_id + "' --json");
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(is_valid_utf8(out)) << out;
  EXPECT_EQ(Json::parse(out)["run_id"], "job" + kReplacement) << out;

  std::ofstream(path("done")) << "\n";
  EXPECT_EQ(agent.wait(60s), 0) << agent.output();
  EXPECT_TRUE(is_valid_utf8(agent.output())) << agent.output();

  std::ifstream events(path("events"));
  std::string line;
  std::vector<std::string> names;
  while (std::getline(events, line)) {
    ASSERT_TRUE(is_valid_utf8(line)) << line;
    const Json e = Json::parse(line);
    names.push_back(e["event"]);
    EXPECT_EQ(e["run_id"], "job" + kReplacement);
    if (e["event"] == "job_start") {
      EXPECT_NE(e["entrypoint"].get<std::string>().find("caf" + kReplacement), std::string::npos);
    }
  }
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "job_start");
  EXPECT_EQ(names.back(), "job_end");
}

// 300 connections, each holding an unfinished head, and a user's requests are still answered,
// promptly; the job is not disturbed.
TEST_F(MetricsAccess, ASlowlorisDoesNotKeepTheMetricsFromTheirUsers) {
  Child& agent =
      launch({"--metrics-port", "0", "--no-python", kWorker, "progress", "50", "forever"});
  const int port = served(agent, "Prometheus metrics").second;
  ASSERT_GT(port, 0) << agent.output();
  std::vector<int> held;
  for (int i = 0; i < 300; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      const std::string partial = "GET /metrics HTTP/1.1\r\nX-Slow: ";
      ::send(fd, partial.data(), partial.size(), MSG_NOSIGNAL);
    }
    held.push_back(fd);
  }
  for (int i = 0; i < 5; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const auto r = http_request(port, "GET /metrics HTTP/1.1");
    EXPECT_EQ(r.status, 200);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  }
  for (const int fd : held) ::close(fd);
  EXPECT_FALSE(testing::process_gone(agent.pid(), 0ms)) << agent.output();
  ::kill(agent.pid(), SIGTERM);
  EXPECT_EQ(agent.wait(30s), 128 + SIGTERM) << agent.output();
}

// One node, no --metrics-addr: loopback only. The token: 401 without it, 200 with it; torch's
// health check on its port asks for none.
TEST_F(MetricsAccess, OneNodeServesOnLoopbackAndTheTokenGuardsAllButTheHealthCheck) {
  const std::string token_file = path("metrics.token");
  std::ofstream(token_file) << "0123456789abcdef0123456789abcdef\n";
  ::chmod(token_file.c_str(), 0600);
  Child& agent = launch(
      {"--metrics-port", "0", "--no-python", kWorker, "forever"},
      {{"TORCHELASTIC_HEALTH_CHECK_PORT", "0"}, {"DIST_LAUNCH_METRICS_TOKEN_FILE", token_file}});
  const auto [address, port] = served(agent, "Prometheus metrics");
  ASSERT_GT(port, 0) << agent.output();
  EXPECT_EQ(address, "127.0.0.1") << agent.output();
  const int health = served(agent, "the health check").second;
  ASSERT_GT(health, 0) << agent.output();

  EXPECT_EQ(http_request(port, "GET /metrics HTTP/1.1", "127.0.0.2").status, -1)
      << "another address of the machine reached a one-node job's metrics";
  EXPECT_EQ(http_request(port, "GET /metrics HTTP/1.1").status, 401);
  EXPECT_EQ(http_request(port, "GET /status.json HTTP/1.1").status, 401);
  EXPECT_EQ(http_request(port,
                         "GET /metrics HTTP/1.1\r\n"
                         "Authorization: Bearer 0123456789abcdef0123456789abcdef")
                .status,
            200);
  EXPECT_EQ(http_request(port, "GET /?token=0123456789abcdef0123456789abcdef HTTP/1.1").status,
            200);
  EXPECT_EQ(http_request(health, "GET / HTTP/1.1").status, 200);
  ::kill(agent.pid(), SIGTERM);
  EXPECT_EQ(agent.wait(30s), 128 + SIGTERM) << agent.output();
}

TEST_F(MetricsAccess, MetricsAddrChoosesTheAddress) {
  Child& agent = launch(
      {"--metrics-port", "0", "--metrics-addr", "127.0.0.2", "--no-python", kWorker, "forever"});
  const auto [address, port] = served(agent, "Prometheus metrics");
  ASSERT_GT(port, 0) << agent.output();
  EXPECT_EQ(address, "127.0.0.2");
  EXPECT_EQ(http_request(port, "GET /metrics HTTP/1.1", "127.0.0.2").status, 200);
  EXPECT_EQ(http_request(port, "GET /metrics HTTP/1.1", "127.0.0.1").status, -1);
  ::kill(agent.pid(), SIGTERM);
  EXPECT_EQ(agent.wait(30s), 128 + SIGTERM) << agent.output();
}

// A --metrics-port another process holds: a one-line error naming the address and a failed
// job, whose event log has its start before its end (the end alone was written before).
TEST_F(MetricsAccess, APortInUseIsAOneLineErrorAndTheEventLogHasTheJobsStartAndEnd) {
  const int holder = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(holder, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(holder, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::listen(holder, 1), 0);
  socklen_t length = sizeof address;
  ASSERT_EQ(::getsockname(holder, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string port = std::to_string(ntohs(address.sin_port));
  Child& agent = launch(
      {"--metrics-port", port, "--event-log", path("events"), "--no-python", kWorker, "forever"});
  const int code = agent.wait(30s);
  ::close(holder);
  EXPECT_NE(code, 0) << agent.output();
  EXPECT_NE(code, -1) << "the agent did not end: " << agent.output();
  EXPECT_NE(agent.output().find("cannot listen on 127.0.0.1:" + port), std::string::npos)
      << agent.output();
  std::vector<std::string> names;
  std::ifstream in(path("events"));
  for (std::string line; std::getline(in, line);) names.push_back(Json::parse(line)["event"]);
  ASSERT_FALSE(names.empty()) << agent.output();
  EXPECT_EQ(names.front(), "job_start");
  EXPECT_EQ(names.back(), "job_end");
}

}  // namespace dist::agent::metrics_access_e2e
