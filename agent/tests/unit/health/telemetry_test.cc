// The telemetry component on its own io_context: given what the agent reports and what the worker
// group's heartbeats say, what the health check and the metrics answer over a real socket.
#include "health/telemetry.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>
#include <thread>

#include "http_client.h"

namespace dist::agent {
namespace {

using testing::http_request;

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
  Telemetry t(io, config, "node-a");
  std::vector<WorkerProgress> workers = {silent_for(0, std::chrono::seconds(2)),
                                         silent_for(1, std::chrono::seconds(61))};
  t.set_progress_source([&] { return workers; });
  t.state("running");
  const int port = *t.health_check_port();
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
  Telemetry t(io, config, "node-a");
  std::vector<WorkerProgress> workers = {silent_for(1, std::chrono::seconds(3))};
  t.set_progress_source([&] { return workers; });
  Assignment a;
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
  const int port = *t.metrics_port();
  std::thread serving([&] { io.run(); });
  const auto reply = http_request(port, "GET /metrics HTTP/1.1");
  const auto other = http_request(port, "GET / HTTP/1.1");
  io.stop();
  serving.join();
  ASSERT_EQ(reply.status, 200);
  EXPECT_EQ(other.status, 404) << "the health check has its own port here";
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
    Telemetry probe(io, config, "node-a");
    config.telemetry.metrics_port = config.watchdogs.health_check_port = *probe.metrics_port();
  }
  Telemetry t(io, config, "node-a");
  const int port = *t.metrics_port();
  EXPECT_EQ(t.health_check_port(), t.metrics_port());
  std::thread serving([&] { io.run(); });
  const auto metrics = http_request(port, "GET /metrics HTTP/1.1");
  const auto health = http_request(port, "GET / HTTP/1.1");
  io.stop();
  serving.join();
  EXPECT_EQ(metrics.status, 200);
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(nlohmann::json::parse(health.body)["alive"], true);
}

TEST(Telemetry, APortInUseIsAnErrorNamingWhatCouldNotBeServed) {
  LaunchConfig config = config_with_ports();
  boost::asio::io_context io;
  Telemetry holder(io, config, "node-a");
  config.telemetry.metrics_port = *holder.metrics_port();
  try {
    Telemetry t(io, config, "node-a");
    FAIL() << "bound a port in use";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot serve the metrics (--metrics-port)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dist::agent
