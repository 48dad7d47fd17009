// The HTTP side of telemetry.h: Prometheus metrics, the status page and its status.json (on
// --metrics-port, guarded as metrics_access.h says) and torch's health check
// (TORCHELASTIC_HEALTH_CHECK_PORT), all read from a Telemetry's counts, timeline and workers'
// progress. What each path answers: telemetry.h's opening comment.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "dist/agent/config.h"
#include "health/http_endpoint.h"
#include "health/progress_history.h"
#include "health/telemetry.h"

namespace dist::agent {

struct MetricsAccess;  // health/metrics_access.h

class TelemetryEndpoints {
 public:
  // Binds the endpoints the configuration asks for (none: nothing is served). Throws
  // std::runtime_error saying which could not be bound (the flag, the port). `telemetry` outlives
  // this object.
  TelemetryEndpoints(boost::asio::io_context& io, const LaunchConfig& config, std::string host,
                     const Telemetry& telemetry);
  TelemetryEndpoints(const TelemetryEndpoints&) = delete;
  TelemetryEndpoints& operator=(const TelemetryEndpoints&) = delete;

  // Whether `config` asks for an endpoint that shows the workers' heartbeats (then workers get a
  // heartbeat slot even without --worker-heartbeat-timeout).
  static bool show_heartbeats(const LaunchConfig& config) {
    return config.telemetry.metrics_port || config.watchdogs.health_check_port;
  }
  // What status.json shows of the snapshots (the worker group's snapshot store).
  void set_snapshot_source(std::function<nlohmann::ordered_json()> source);
  std::optional<std::uint16_t> metrics_port() const;
  std::optional<std::uint16_t> health_check_port() const;

 private:
  std::map<std::string, HttpEndpoint::Handler> metrics_routes(bool shared,
                                                              const MetricsAccess& access);
  HttpResponse metrics() const;
  HttpResponse health() const;
  HttpResponse page() const;
  HttpResponse status_json(const HttpRequest& request) const;
  nlohmann::ordered_json status(double since) const;
  void arm_sampler();

  const LaunchConfig& config_;
  std::string host_;
  const Telemetry& telemetry_;
  std::unique_ptr<HttpEndpoint> metrics_endpoint_;
  std::unique_ptr<HttpEndpoint> health_endpoint_;  // null when the metrics' serves it too
  std::function<nlohmann::ordered_json()> snapshot_source_;
  ProgressHistory history_;  // sampled every second while the page is served
  boost::asio::steady_timer sampler_;
};

}  // namespace dist::agent
