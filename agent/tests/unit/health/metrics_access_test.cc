// The metrics' port as the telemetry serves it, over real sockets: names that are not UTF-8 on
// every endpoint, where it listens (--metrics-addr and its defaults: loopback addresses other than
// 127.0.0.1 stand for other interfaces), the token (--metrics-token-file) and the health check
// that never asks for it, the Host guard of a loopback page.
#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "health/metrics_access.h"
#include "health/telemetry.h"
#include "http_client.h"
#include "output/valid_text.h"
#include "rendezvous/schema.h"
#include "served_telemetry.h"

namespace dist::agent {
namespace metrics_access_test {

using testing::http_exchange;
using testing::http_request;
using testing::ServedTelemetry;

const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// A Telemetry and its endpoints on their own io thread.
class Serving {
 public:
  // The config is kept: Telemetry holds a reference to it, and callers pass temporaries.
  Serving(const LaunchConfig& config, const std::string& host)
      : config_(config), served_(io_, config_, host) {
    thread_ = std::thread([this] {
      auto work = boost::asio::make_work_guard(io_);
      io_.run();
    });
  }
  ~Serving() {
    io_.stop();
    thread_.join();
  }
  Telemetry& telemetry() { return served_.telemetry; }
  const TelemetryEndpoints& endpoints() const { return served_.endpoints; }
  int port() const { return *served_.endpoints.metrics_port(); }

 private:
  boost::asio::io_context io_;
  LaunchConfig config_;
  ServedTelemetry served_;
  std::thread thread_;
};

LaunchConfig with_metrics() {
  LaunchConfig c;
  c.telemetry.metrics_port = 0;
  return c;
}

// A free port for both endpoints at once (the health check on the metrics' port).
std::uint16_t free_port() {
  boost::asio::io_context io;
  LaunchConfig c = with_metrics();
  ServedTelemetry probe(io, c, "node-a");
  return *probe.endpoints.metrics_port();
}

std::string request(const std::string& path, const std::string& headers = "",
                    const std::string& host = "127.0.0.1") {
  return "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\n" + headers + "\r\n";
}

// The script, the run id, the role, the host, a worker's exit reason and its pending collective:
// none of them UTF-8. Each endpoint answers, in UTF-8, and the job's state is intact.
TEST(MetricsAccess, NamesThatAreNotUtf8AreServedReplacedOnEveryEndpoint) {
  const auto log = std::filesystem::temp_directory_path() /
                   ("dist-metrics-access-" + std::to_string(::getpid()) + ".jsonl");
  LaunchConfig c = with_metrics();
  c.run_id = "job\xFF";
  c.role = "r\xE9le";
  c.script_name = "caf\xE9.py";
  c.watchdogs.health_check_port = 0;
  c.telemetry.event_log = log.string();
  {
    Serving s(c, "n\xE9ud");
    Telemetry& t = s.telemetry();
    t.set_progress_source([] {
      WorkerProgress p;
      p.worker = {0, 0, 0, 100};
      p.silence = std::chrono::seconds(1);
      p.beats = 3;
      p.pending_collective = "all_reduce \xC0 #1";
      return std::vector<WorkerProgress>{p};
    });
    t.job_started();
    t.state("running");
    t.worker_started({0, 1, 1, 101});
    t.worker_exited({0, 1, 1, 101}, -9, true, "killed while in caf\xE9.py:12");

    const auto status = http_request(s.port(), "GET /status.json HTTP/1.1");
    ASSERT_EQ(status.status, 200) << status.body;
    EXPECT_TRUE(is_valid_utf8(status.body));
    const auto j = nlohmann::json::parse(status.body);
    EXPECT_EQ(j["run_id"], "job" + kReplacement);
    EXPECT_EQ(j["host"], "n" + kReplacement + "ud");
    EXPECT_EQ(j["ranks"][0]["pending_collective"], "all_reduce " + kReplacement + " #1");
    EXPECT_NE(status.body.find("caf" + kReplacement + ".py"), std::string::npos);

    const auto page = http_request(s.port(), "GET / HTTP/1.1");
    ASSERT_EQ(page.status, 200);
    EXPECT_TRUE(is_valid_utf8(page.body));
    EXPECT_NE(page.body.find("caf" + kReplacement + ".py"), std::string::npos);

    const auto metrics = http_request(s.port(), "GET /metrics HTTP/1.1");
    ASSERT_EQ(metrics.status, 200);
    EXPECT_TRUE(is_valid_utf8(metrics.body));
    EXPECT_NE(
        metrics.body.find("run_id=\"job" + kReplacement + "\",role=\"r" + kReplacement + "le\""),
        std::string::npos)
        << metrics.body;

    const auto health = http_request(*s.endpoints().health_check_port(), "GET /health HTTP/1.1");
    EXPECT_EQ(health.status, 200);
    EXPECT_TRUE(is_valid_utf8(health.body));

    // What this node publishes for `dist-launch status`.
    const std::string published = schema::encode(t.node_progress());
    EXPECT_TRUE(is_valid_utf8(published));
    EXPECT_EQ(schema::decode_node_progress("k", published).ranks.at(0).pending_collective,
              "all_reduce " + kReplacement + " #1");
  }
  std::ifstream in(log);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    ++lines;
    EXPECT_TRUE(is_valid_utf8(line)) << line;
    EXPECT_TRUE(nlohmann::json::accept(line)) << line;
  }
  EXPECT_EQ(lines, 3);
  std::filesystem::remove(log);
}

TEST(MetricsAccess, OneNodeListensOnLoopbackOnly) {
  Serving s(with_metrics(), "node-a");
  EXPECT_EQ(http_request(s.port(), "GET /metrics HTTP/1.1", "127.0.0.1").status, 200);
  EXPECT_EQ(http_request(s.port(), "GET /metrics HTTP/1.1", "127.0.0.2").status, -1)
      << "bound to 127.0.0.1 only, another address of the machine is refused";
}

// On loopback without a token: a request under a name (a rebinding page's) is refused, one for
// localhost or an address is answered.
TEST(MetricsAccess, ALoopbackPageAnswersOnlyLocalhostOrAnAddressWithoutAToken) {
  Serving s(with_metrics(), "node-a");
  const std::string port = std::to_string(s.port());
  for (const std::string path : {"/", "/ui", "/status.json", "/metrics"}) {
    SCOPED_TRACE(path);
    const auto evil = http_exchange(s.port(), request(path, "", "evil.example:" + port));
    EXPECT_EQ(evil.status, 403) << evil.body;
    EXPECT_NE(evil.body.find("http://127.0.0.1:" + port + path), std::string::npos) << evil.body;
    EXPECT_EQ(http_exchange(s.port(), request(path, "", "localhost:" + port)).status, 200);
    EXPECT_EQ(http_exchange(s.port(), request(path, "", "127.0.0.1:" + port)).status, 200);
  }
}

TEST(MetricsAccess, SeveralNodesListenOnTheNodesOwnAddress) {
  LaunchConfig c = with_metrics();
  c.min_nodes = c.max_nodes = 2;
  Serving s(c, "127.0.0.3");  // the address the agent advertises (--local-addr)
  EXPECT_EQ(http_request(s.port(), "GET /metrics HTTP/1.1", "127.0.0.3").status, 200);
  EXPECT_EQ(http_request(s.port(), "GET /metrics HTTP/1.1", "127.0.0.1").status, -1);
}

TEST(MetricsAccess, MetricsAddrIsWhereItListens) {
  LaunchConfig c = with_metrics();
  c.telemetry.metrics_addr = "127.0.0.2";
  {
    Serving s(c, "node-a");
    EXPECT_EQ(http_request(s.port(), "GET /metrics HTTP/1.1", "127.0.0.2").status, 200);
    EXPECT_EQ(http_request(s.port(), "GET /metrics HTTP/1.1", "127.0.0.1").status, -1);
  }
  c.telemetry.metrics_addr = "0.0.0.0";  // every interface
  Serving s(c, "node-a");
  EXPECT_EQ(http_request(s.port(), "GET /metrics HTTP/1.1", "127.0.0.2").status, 200);
  EXPECT_EQ(http_request(s.port(), "GET /metrics HTTP/1.1", "127.0.0.1").status, 200);
  // Not loopback only: no Host guard.
  EXPECT_EQ(http_exchange(s.port(), request("/metrics", "", "node-a")).status, 200);
}

TEST(MetricsAccess, AnAddressThatNamesNothingIsAnErrorNamingTheOption) {
  LaunchConfig c = with_metrics();
  c.telemetry.metrics_addr = "no-such-host.invalid";
  boost::asio::io_context io;
  try {
    ServedTelemetry served(io, c, "node-a");
    FAIL() << "served on an address that does not resolve";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("--metrics-addr"), std::string::npos) << e.what();
  }
}

// The token: the page, its data and the metrics answer 401 without it and 200 with it, however it
// is presented; torch's health check, on the same port, never asks for it.
TEST(MetricsAccess, TheTokenIsAskedForEverythingButTheHealthCheck) {
  LaunchConfig c = with_metrics();
  c.telemetry.metrics_token = "t0ken-of-the-job";
  c.telemetry.metrics_port = c.watchdogs.health_check_port = free_port();
  Serving s(c, "node-a");
  const int port = s.port();
  const std::string html = "Accept: text/html,*/*;q=0.8\r\n";
  for (const std::string path : {"/metrics", "/status.json", "/ui"}) {
    SCOPED_TRACE(path);
    const auto refused = http_exchange(port, request(path));
    EXPECT_EQ(refused.status, 401);
    EXPECT_NE(refused.head.find("WWW-Authenticate: Basic realm=\"dist-launch\""), std::string::npos)
        << refused.head;
    EXPECT_EQ(refused.body.find("t0ken"), std::string::npos);
    EXPECT_EQ(http_exchange(port, request(path, "Authorization: Bearer wrong\r\n")).status, 401);
    EXPECT_EQ(
        http_exchange(port, request(path, "Authorization: Bearer t0ken-of-the-job\r\n")).status,
        200);
    // base64("admin:t0ken-of-the-job"): what a browser sends once the user typed it.
    EXPECT_EQ(http_exchange(
                  port, request(path, "Authorization: Basic YWRtaW46dDBrZW4tb2YtdGhlLWpvYg==\r\n"))
                  .status,
              200);
    EXPECT_EQ(http_exchange(port, request(path + "?token=t0ken-of-the-job")).status, 200);
  }
  EXPECT_EQ(http_exchange(port, request("/", html)).status, 401);  // a browser: the page
  EXPECT_EQ(http_exchange(port, request("/?token=t0ken-of-the-job", html)).status, 200);
  // torch's health check clients (no Accept: text/html), and /health, /healthz.
  for (const std::string path : {"/", "/health", "/healthz"}) {
    SCOPED_TRACE(path);
    const auto health = http_exchange(port, request(path));
    EXPECT_EQ(health.status, 200);
    EXPECT_EQ(nlohmann::json::parse(health.body)["alive"], true);
  }
  // With a token, any name is answered: a page elsewhere cannot know the token.
  EXPECT_EQ(http_exchange(port, request("/metrics", "Authorization: Bearer t0ken-of-the-job\r\n",
                                        "evil.example"))
                .status,
            200);
}

TEST(MetricsAccess, OnItsOwnPortTheHealthCheckListensEverywhereAndAsksNoToken) {
  LaunchConfig c = with_metrics();
  c.telemetry.metrics_token = "t0ken";
  c.watchdogs.health_check_port = 0;
  Serving s(c, "node-a");
  const int health = *s.endpoints().health_check_port();
  EXPECT_NE(health, s.port());
  EXPECT_EQ(http_request(health, "GET / HTTP/1.1", "127.0.0.2").status, 200);
  EXPECT_EQ(http_request(s.port(), "GET /metrics HTTP/1.1").status, 401);
}

}  // namespace metrics_access_test
}  // namespace dist::agent
