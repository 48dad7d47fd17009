// A Telemetry and the endpoints that serve it (health/telemetry_endpoints.h), made as the agent
// makes them: for tests of what is served over HTTP.
#pragma once

#include <boost/asio/io_context.hpp>
#include <string>

#include "health/telemetry.h"
#include "health/telemetry_endpoints.h"

namespace dist::agent::testing {

struct ServedTelemetry {
  // `config` outlives this object (both keep a reference to it).
  ServedTelemetry(boost::asio::io_context& io, const LaunchConfig& config, const std::string& host)
      : telemetry(config, host), endpoints(io, config, host, telemetry) {}

  Telemetry telemetry;
  TelemetryEndpoints endpoints;
};

}  // namespace dist::agent::testing
