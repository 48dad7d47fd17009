// Who may reach the metrics' port (--metrics-port: the metrics, the status page, status.json):
//   - where it listens, --metrics-addr: an address or a host name (0.0.0.0 or ::: every
//     interface). By default the loopback address, 127.0.0.1, when the job is one node (its page
//     is for the person at that machine, or an ssh tunnel), and the node's own address when the
//     job has several (the address it advertises itself by: --local-addr, else its host name),
//     so that a Prometheus scraping the nodes reaches each, and a network the node is also on,
//     but the job is not, does not;
//   - the token it asks for, --metrics-token-file: the page, status.json and /metrics then answer
//     401 to a request that does not present it (http_endpoint.h: a bearer token, a browser's
//     Basic prompt, or ?token=). torch's health check is never asked for it (its clients cannot
//     present one), on its own port or on this one;
//   - bound to loopback without a token, it answers only requests for localhost or an IP address
//     (DNS rebinding: a web page cannot read it under a name of its own).
#pragma once

#include <string>

#include "dist/agent/config.h"
#include "health/http_endpoint.h"

namespace dist::agent {

struct MetricsAccess {
  HttpListen listen;
  std::string shown_host;            // the host in the URLs the log prints
  std::string token;                 // empty: none asked for
  bool loopback_names_only = false;  // on loopback without a token: the Host is checked
  std::string warning;  // something the user should know about where it listens, or empty
};

// Where the metrics' port of `telemetry` listens for `job` (loopback for one node), `host` being
// the address the agent advertises. Throws ConfigError naming --metrics-addr when the address is
// none.
MetricsAccess metrics_access(const JobConfig& job, const TelemetryOptions& telemetry,
                             const std::string& host);

// `handler`, answering 401 to a request that does not present the token, and 403 to one for
// another name than localhost or an IP address when `access` checks the Host.
HttpEndpoint::Handler guarded(HttpEndpoint::Handler handler, const MetricsAccess& access);

}  // namespace dist::agent
