// The telemetry component on its own io_context: given what the agent reports and what the worker
// group's heartbeats say, what the health check and the metrics answer over a real socket.
#include "health/telemetry.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>
#include <thread>

#include "http_client.h"
#include "process_helpers.h"
#include "served_telemetry.h"

namespace dist::agent {
namespace {

using testing::http_request;
using testing::ServedTelemetry;

LaunchConfig config_with_ports() {
  LaunchConfig c;
  c.run_id = "job \"7\"";  // a label value that needs escaping
  c.nproc_per_node = 2;
  c.max_restarts = 3;
  c.watchdogs.health_check_port = 0;
  c.telemetry.metrics_port = 0;
  c.watchdogs.worker_heartbeat_timeout = std::chrono::milliseconds(90'000);
  return c;
}

WorkerProgress silent_for(int rank, std::chrono::seconds silence) {
  WorkerProgress p;
  p.worker = {0, rank, rank, 1000 + rank};
  p.silence = silence;
  p.beats = 42;
  return p;
}

TEST(Telemetry, HealthIs503OnceTheMostSilentWorkerPassedTorchsTimeout) {
  const LaunchConfig config = config_with_ports();
  boost::asio::io_context io;
  ServedTelemetry served(io, config, "node-a");
  Telemetry& t = served.telemetry;
  std::vector<WorkerProgress> workers = {silent_for(0, std::chrono::seconds(2)),
                                         silent_for(1, std::chrono::seconds(61))};
  t.set_progress_source([&] { return workers; });
  t.state("running");
  const int port = *served.endpoints.health_check_port();
  std::thread serving([&] { io.run(); });
  const auto reply = http_request(port, "GET /health HTTP/1.1");
  io.stop();
  serving.join();
  ASSERT_EQ(reply.status, 503) << reply.head;
  const auto body = nlohmann::json::parse(reply.body);
  EXPECT_EQ(body["alive"], false);
  EXPECT_EQ(body["most_silent_worker"]["rank"], 1);
  EXPECT_NEAR(body["most_silent_worker"]["heartbeat_age_s"].get<double>(), 61, 0.001);
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  EXPECT_NEAR(body["last_progress_time"].get<double>(), static_cast<double>(now - 61), 2);
}

TEST(Telemetry, TheMetricsSayWhatTheAgentReported) {
  const LaunchConfig config = config_with_ports();
  boost::asio::io_context io;
  ServedTelemetry served(io, config, "node-a");
  Telemetry& t = served.telemetry;
  std::vector<WorkerProgress> workers = {silent_for(1, std::chrono::seconds(3))};
  t.set_progress_source([&] { return workers; });
  Round a;
  a.round = 4;
  a.node_rank = 1;
  a.num_nodes = 2;
  a.world_size = 4;
  a.restarts = 2;
  t.state("running");
  t.round_joined(a);
  t.worker_started({4, 2, 0, 100});
  t.worker_started({4, 3, 1, 101});
  t.worker_exited({4, 2, 0, 100}, -9, true, "no heartbeat for 90 s (hung?)");
  t.worker_hung({4, 2, 0, 100}, std::chrono::seconds(90), 9);
  const int port = *served.endpoints.metrics_port();
  std::thread serving([&] { io.run(); });
  const auto reply = http_request(port, "GET /metrics HTTP/1.1");
  const auto other = http_request(port, "GET / HTTP/1.1");
  io.stop();
  serving.join();
  ASSERT_EQ(reply.status, 200);
  // The health check has its own port here: / on the metrics' port is the status page, for any
  // client.
  EXPECT_EQ(other.status, 200);
  EXPECT_NE(other.head.find("Content-Type: text/html"), std::string::npos) << other.head;
  EXPECT_EQ(other.body.find("\"alive\""), std::string::npos);
  for (const std::string expected : {
           "# TYPE dist_launch_restarts_total counter\ndist_launch_restarts_total 2\n",
           "dist_launch_info{run_id=\"job \\\"7\\\"\",role=\"default\",host=\"node-a\",version=\"",
           "dist_launch_state{state=\"running\"} 1\n",
           "dist_launch_state{state=\"stopping\"} 0\n",
           "dist_launch_round 4\n",
           "dist_launch_node_rank 1\n",
           "dist_launch_nodes 2\n",
           "dist_launch_world_size 4\n",
           "dist_launch_max_restarts 3\n",
           "dist_launch_workers 2\n",
           "dist_launch_workers_alive 1\n",
           "dist_launch_worker_starts_total 2\n",
           "dist_launch_worker_failures_total 1\n",
           "dist_launch_hung_workers_total 1\n",
           "dist_launch_worker_heartbeat_timeout_seconds 90\n",
           "dist_launch_worker_heartbeat_age_seconds{rank=\"1\",local_rank=\"1\"} 3\n",
           "dist_launch_worker_heartbeats_total{rank=\"1\",local_rank=\"1\"} 42\n",
       }) {
    EXPECT_NE(reply.body.find(expected), std::string::npos) << expected << "\n" << reply.body;
  }
}

TEST(Telemetry, OnePortServesBothWhenTheyAreTheSame) {
  LaunchConfig config = config_with_ports();
  boost::asio::io_context io;
  {  // a port that was free a moment ago
    ServedTelemetry probe(io, config, "node-a");
    config.telemetry.metrics_port = config.watchdogs.health_check_port =
        *probe.endpoints.metrics_port();
  }
  ServedTelemetry served(io, config, "node-a");
  const int port = *served.endpoints.metrics_port();
  EXPECT_EQ(served.endpoints.health_check_port(), served.endpoints.metrics_port());
  std::thread serving([&] { io.run(); });
  const auto metrics = http_request(port, "GET /metrics HTTP/1.1");
  const auto health = http_request(port, "GET / HTTP/1.1");
  // A browser asks for HTML (what Chromium sends); torch's clients and curl do not.
  const auto browser =
      http_request(port, "GET / HTTP/1.1\r\nAccept: text/html,application/xhtml+xml,*/*;q=0.8");
  const auto any = http_request(port, "GET / HTTP/1.1\r\nAccept: */*");
  const auto page = http_request(port, "GET /ui HTTP/1.1");
  io.stop();
  serving.join();
  EXPECT_EQ(metrics.status, 200);
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(nlohmann::json::parse(health.body)["alive"], true);
  EXPECT_EQ(nlohmann::json::parse(any.body)["alive"], true);
  for (const auto* reply : {&browser, &page}) {
    EXPECT_EQ(reply->status, 200);
    EXPECT_NE(reply->head.find("Content-Type: text/html"), std::string::npos) << reply->head;
    EXPECT_NE(reply->body.find("<svg id=\"chart\""), std::string::npos);
  }
}

// The page's data over a real socket: this node's ranks as the worker group reports them, one
// sample of each a second with the step time measured, the events so far; ?since= leaves out what
// the page has.
TEST(Telemetry, StatusJsonHasTheRanksTheirHistoryAndTheEvents) {
  const LaunchConfig config = config_with_ports();
  boost::asio::io_context io;
  ServedTelemetry served(io, config, "node-a");
  Telemetry& t = served.telemetry;
  const auto start = std::chrono::steady_clock::now();
  t.set_progress_source([start] {  // on the io thread: steps every 100 ms (rank 1: 200 ms)
    const auto elapsed = std::chrono::steady_clock::now() - start;
    std::vector<WorkerProgress> workers;
    for (int rank : {0, 1}) {
      const auto pace = std::chrono::milliseconds(100 * (rank + 1));
      WorkerProgress p = silent_for(rank, std::chrono::seconds(0));
      p.steps = static_cast<std::uint64_t>(elapsed / pace);
      p.since_step = elapsed % pace;
      p.straggler = rank == 1;
      workers.push_back(p);
    }
    return workers;
  });
  Round a;
  a.round = 2;
  a.world_size = 2;
  t.state("running");
  t.round_joined(a);
  t.worker_started({2, 0, 0, 100});
  const int port = *served.endpoints.metrics_port();
  std::thread serving([&] { io.run(); });
  nlohmann::json body;
  const bool measured = dist::agent::testing::eventually(
      [&] {
        const auto r = http_request(port, "GET /status.json HTTP/1.1");
        if (r.status != 200) return false;
        body = nlohmann::json::parse(r.body);
        const auto& h = body["history"]["ranks"];
        return h.contains("1") && h["1"]["step_s"].size() >= 2 &&
               !h["1"]["step_s"].back().is_null();
      },
      std::chrono::seconds(20));
  const double time = body["time"];
  const auto later =
      http_request(port, "GET /status.json?since=" + std::to_string(time) + " HTTP/1.1");
  const auto bad = http_request(port, "GET /status.json?since=soon HTTP/1.1");
  io.stop();
  serving.join();
  ASSERT_TRUE(measured) << body.dump();
  EXPECT_EQ(body["state"], "running");
  EXPECT_EQ(body["round"], 2);
  EXPECT_EQ(body["workers_alive"], 1);
  ASSERT_EQ(body["ranks"].size(), 2u);
  EXPECT_EQ(body["ranks"][1]["rank"], 1);
  EXPECT_GT(body["ranks"][1]["steps"].get<int>(), 0);
  EXPECT_EQ(body["ranks"][1]["straggler"], true);
  EXPECT_TRUE(body["ranks"][1]["steps_per_second"].is_null()) << "not reported: null, not 0";
  EXPECT_EQ(body["history"]["interval_s"], 1);
  EXPECT_EQ(body["history"]["window_s"], 600);
  const double step_s = body["history"]["ranks"]["1"]["step_s"].back();
  EXPECT_NEAR(step_s, 0.2, 0.05) << "rank 1 steps every 200 ms";
  std::vector<std::string> events;
  for (const auto& e : body["events"]) events.push_back(e["event"]);
  EXPECT_EQ(events, (std::vector<std::string>{"rendezvous", "worker_start"}));
  ASSERT_EQ(later.status, 200);
  const auto newer = nlohmann::json::parse(later.body);
  EXPECT_TRUE(newer["events"].empty());
  for (const auto& [rank, cols] : newer["history"]["ranks"].items()) {
    for (const auto& sample_time : cols["t"]) EXPECT_GT(sample_time.get<double>(), time) << rank;
  }
  EXPECT_EQ(bad.status, 400);
}

TEST(Telemetry, APortInUseIsAnErrorNamingWhatCouldNotBeServed) {
  LaunchConfig config = config_with_ports();
  boost::asio::io_context io;
  ServedTelemetry holder(io, config, "node-a");
  config.telemetry.metrics_port = *holder.endpoints.metrics_port();
  try {
    ServedTelemetry served(io, config, "node-a");
    FAIL() << "bound a port in use";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot serve the metrics (--metrics-port)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dist::agent
