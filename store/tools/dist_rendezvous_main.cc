// dist-rendezvous: the rendezvous store on its own, for jobs that want it outside any node.
#include <spdlog/spdlog.h>

#include <malloc.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <map>

#include "dist/store/client.h"
#include "dist/store/errors.h"
#include "dist/store/limits.h"
#include "dist/store/server.h"
#include "dist/store/token.h"

namespace {

// Allocations from this size up get their own mapping, returned to the system when freed. glibc
// otherwise raises this threshold as large blocks are freed (up to 32 MiB) and serves the next
// ones from its heap, where freed memory stays resident: the process would then keep more memory
// than --max-total-bytes counts long after an attack ended.
constexpr int kMmapThresholdBytes = 256 * 1024;

constexpr int kExitUsage = 2;
constexpr int kExitFailure = 1;

}  // namespace

int main(int argc, char** argv) {
  using namespace dist::store;
  CLI::App app{
      "dist-rendezvous: the rendezvous store of dist-launch (speaks PyTorch's TCPStore "
      "protocol)",
      "dist-rendezvous"};
  std::string host = "0.0.0.0";
  std::uint16_t port = 29400;
  std::string token_file;
  std::string policy = "known-hosts";
  std::string log_level = "info";
  ServerOptions options;
  StoreLimits& limits = options.limits;
  app.add_option("--host", host, "Address to listen on")->capture_default_str();
  app.add_option("--port", port, "Port to listen on (0: pick a free one and print it)")
      ->capture_default_str();
  app.add_option("--token-file", token_file,
                 "File holding the shared secret that agents must prove they know (chmod 600)")
      ->envname(kTokenFileVariable)
      ->check(CLI::ExistingFile);
  app.add_option("--unauthenticated", policy,
                 "With a token: who may connect without authenticating (PyTorch workers cannot)")
      ->check(CLI::IsMember({"deny", "loopback", "known-hosts", "allow"}))
      ->capture_default_str();
  app.add_option("--max-key-bytes", limits.max_key_bytes, "Longest key")->capture_default_str();
  app.add_option("--max-value-bytes", limits.max_value_bytes, "Largest value")
      ->capture_default_str();
  app.add_option("--max-keys-per-request", limits.max_keys_per_request, "Most keys in one request")
      ->capture_default_str();
  app.add_option("--max-request-bytes", limits.max_request_bytes, "Largest request")
      ->capture_default_str();
  app.add_option("--max-total-bytes", limits.max_total_bytes,
                 "Memory for clients: keys and values held plus every connection's partial "
                 "request, unsent replies and waits; over it, the connections holding the most "
                 "are closed first, and a write that still does not fit is refused")
      ->capture_default_str();
  app.add_option("--max-connection-bytes", limits.max_connection_bytes,
                 "What one connection may make the server hold (partial request, unsent "
                 "replies, waits); over it, that connection is closed")
      ->capture_default_str();
  app.add_option("--max-connections", limits.max_connections,
                 "Open connections; when all are taken, one that has not authenticated or is "
                 "stuck in the middle of a request is closed to admit a new one")
      ->capture_default_str();
  auto add_timeout = [&](const char* flag, std::chrono::milliseconds& field, const char* what) {
    return app
        .add_option_function<std::int64_t>(
            flag, [&field](std::int64_t v) { field = std::chrono::milliseconds(v); }, what)
        ->check(CLI::NonNegativeNumber)
        ->default_str(std::to_string(field.count()));
  };
  add_timeout("--auth-timeout-ms", options.deadlines.auth_timeout,
              "With a token: close a connection that must authenticate and has not, this long "
              "after connecting (0: never)");
  add_timeout("--request-timeout-ms", options.deadlines.request_timeout,
              "Close a connection whose request has not arrived whole this long after its first "
              "bytes (slow-loris; 0: never)");
  add_timeout("--idle-timeout-ms", options.deadlines.idle_timeout,
              "Close a connection that sent nothing this long and has no wait, watch or reply "
              "pending (0: never; PyTorch keeps idle connections for the whole job)");
  // For clients that do not ask for a schedule of their own (PyTorch's): an elastic job's agents'
  // (config.h). dist-launch's agents ask for their job's in HELLO (a fixed-size job's 30 s).
  int keep_alive_interval = 1, keep_alive_max_attempt = 8;
  app.add_option("--keep-alive-interval", keep_alive_interval,
                 "Seconds between TCP keepalive probes; a peer that vanished (a dead host, a "
                 "partition) is dropped, and its ephemeral keys deleted, after about interval * "
                 "max-attempt seconds (0: never); for clients that do not ask for their own "
                 "(dist-launch's agents ask for their job's)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--keep-alive-max-attempt", keep_alive_max_attempt,
                 "Keepalive intervals without an answer before a peer is dropped")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}))
      ->capture_default_str();
  app.set_version_flag("--version", "dist-rendezvous " DIST_VERSION);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "dist-rendezvous: error: " << e.what() << " (see --help)\n";
    return kExitUsage;
  }

  spdlog::set_level(spdlog::level::from_str(log_level));
  const std::map<std::string, UnauthenticatedPolicy> policies = {
      {"deny", UnauthenticatedPolicy::kDeny},
      {"loopback", UnauthenticatedPolicy::kLoopback},
      {"known-hosts", UnauthenticatedPolicy::kKnownHosts},
      {"allow", UnauthenticatedPolicy::kAllow}};
  options.unauthenticated = policies.at(policy);
  if (keep_alive_interval > 0) {  // the agents' own liveness settings, by default
    options.keepalive = {keep_alive_interval, keep_alive_interval,
                         std::max(1, keep_alive_max_attempt - 1)};
  }

  raise_open_file_limit();
  mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes);
  try {
    if (!token_file.empty()) options.secret = read_secret_file(token_file);
    boost::asio::io_context io;
    StoreServer server(io, StoreServer::bind(io, host, port), options);
    server.start();
    // Handled before the port is printed: whoever reads that line may stop us at once.
    boost::asio::signal_set signals(io, SIGINT, SIGTERM);
    signals.async_wait([&](const boost::system::error_code& ec, int signal) {
      if (ec) return;
      spdlog::info("dist-rendezvous: {} received, shutting down", strsignal(signal));
      server.stop();
    });
    const auto endpoint = server.local_endpoint();
    std::printf("dist-rendezvous: listening on %s:%u\n", host.c_str(),
                static_cast<unsigned>(endpoint.port()));
    std::fflush(stdout);
    io.run();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "dist-rendezvous: error: " << e.what() << "\n";
    return kExitFailure;
  }
}
