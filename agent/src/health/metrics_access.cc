#include "health/metrics_access.h"

#include <algorithm>

namespace dist::agent {
namespace asio = boost::asio;

namespace {

bool several_nodes(const JobConfig& job) {
  return job.max_nodes > 1 || job.elastic;
}

std::string bracketed(const std::string& address) {
  return address.find(':') != std::string::npos && !address.starts_with('[') ? "[" + address + "]"
                                                                             : address;
}

}  // namespace

MetricsAccess metrics_access(const JobConfig& job, const TelemetryOptions& telemetry,
                             const std::string& host) {
  MetricsAccess access;
  access.token = telemetry.metrics_token;
  access.listen.port = telemetry.metrics_port.value_or(0);
  const std::string& given = telemetry.metrics_addr;
  if (given.empty() && !several_nodes(job)) {
    access.listen.addresses = {asio::ip::address_v4::loopback()};
    access.shown_host = "127.0.0.1";
    access.loopback_names_only = access.token.empty();
    return access;
  }
  const std::string name = given.empty() ? host : given;
  try {
    access.listen.addresses = listen_addresses(name);
  } catch (const std::exception& e) {
    throw ConfigError(
        "--metrics-addr: " + std::string(e.what()) +
        (given.empty() ? " (by default the metrics listen on the node's address, --local-addr or "
                         "its host name; give --metrics-addr ADDRESS, or 0.0.0.0 for every "
                         "interface)"
                       : ""));
  }
  const auto& addresses = access.listen.addresses;
  const bool every = std::any_of(addresses.begin(), addresses.end(),
                                 [](const auto& a) { return a.is_unspecified(); });
  access.shown_host = every || given.empty() ? bracketed(host) : bracketed(given);
  const bool loopback = std::all_of(addresses.begin(), addresses.end(),
                                    [](const auto& a) { return a.is_loopback(); });
  access.loopback_names_only = loopback && access.token.empty();
  if (given.empty() && loopback) {
    const std::string address = addresses.front().to_string();
    access.warning = "the metrics and the status page listen on " + bracketed(address) +
                     (address == host ? "" : ", the address of " + host) +
                     " (this node's address: --local-addr, else its host name), a loopback "
                     "address other machines cannot reach; --metrics-addr chooses another "
                     "(0.0.0.0: every interface)";
  }
  return access;
}

HttpEndpoint::Handler guarded(HttpEndpoint::Handler handler, const MetricsAccess& access) {
  if (access.token.empty() && !access.loopback_names_only) return handler;
  return [handler = std::move(handler), token = access.token,
          check_host = access.loopback_names_only](const HttpRequest& request) {
    if (check_host && !request.names_loopback_or_address()) return misdirected(request);
    if (!token.empty() && !request.presents(token)) {
      return unauthorized(
          "send `Authorization: Bearer <token>` (Prometheus: authorization: credentials_file), "
          "or open the page as http://HOST:PORT/?token=<token>; the token is in the file given "
          "to --metrics-token-file");
    }
    return handler(request);
  };
}

}  // namespace dist::agent
