// etcd-join-bench: N simulated nodes, each its own etcd session (own connections, own lease) on
// one io_context, join one round through the etcd rendezvous store the way a node does: a lease
// and an ephemeral key (its liveness), an add (its ticket), a put (its record) and a watch for
// the key that closes the round (the last ticket sets it). Per N: the time to open the sessions,
// then the time from the first node starting to join to the last node's watch returning.
//
//   build/bin/etcd-join-bench --nodes 100,1000 --repeats 3
//       (a 3-member etcd on 127.0.0.1-3, started and stopped by the bench)
//   build/bin/etcd-join-bench --endpoints h1:2379,h2:2379,h3:2379 ...   (an existing cluster)
//
// Runs for the sizes are interleaved (100, 1000, 100, 1000, ...); the table gives each run and
// the medians.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/rendezvous/limits.h"
#include "etcd_cluster.h"
#include "etcd_store.h"
#include "run_task.h"

namespace {

using Clock = std::chrono::steady_clock;
using dist::agent::EtcdOptions;
using dist::agent::RendezvousStore;
using dist::agent::Task;
using dist::rendezvous::testing::TaskGroup;

// How long the last node may wait for the round to close before the run counts as failed.
constexpr std::chrono::seconds kRoundTimeout{120};

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

struct RunResult {
  double open_ms = 0;  // all sessions open (connected, a first read answered)
  double join_ms = 0;  // all nodes joined and saw the round close
  int failures = 0;
};

RunResult run_round(const EtcdOptions& options, int n, const std::string& run_id) {
  boost::asio::io_context io;
  std::vector<std::unique_ptr<RendezvousStore>> stores(static_cast<std::size_t>(n));
  RunResult result;
  const auto report = [&result](int node, const std::exception& e) {
    if (result.failures++ < 5) std::fprintf(stderr, "node %d: %s\n", node, e.what());
  };

  const auto opening = Clock::now();
  TaskGroup open(io);
  for (int k = 0; k < n; ++k) {
    open.spawn([&, k]() -> Task<void> {
      try {
        stores[static_cast<std::size_t>(k)] =
            co_await dist::agent::open_etcd_store(io, options, run_id);
      } catch (const std::exception& e) {
        report(k, e);
      }
    });
  }
  open.wait(kRoundTimeout);
  result.open_ms = ms_since(opening);
  if (result.failures > 0) return result;

  const auto joining = Clock::now();
  TaskGroup join(io);
  for (int k = 0; k < n; ++k) {
    join.spawn([&, k]() -> Task<void> {
      auto& store = *stores[static_cast<std::size_t>(k)];
      try {
        co_await store.set_ephemeral("node/" + std::to_string(k), "10.0.0.1:29500");
        const auto ticket = co_await store.add("join", 1);
        co_await store.set("record/" + std::to_string(ticket), "node " + std::to_string(k));
        if (ticket == n) co_await store.set("closed", "1");
        const std::vector<std::string> closed{"closed"};
        if (!co_await store.wait(closed, kRoundTimeout)) {
          throw std::runtime_error("the round did not close in time");
        }
      } catch (const std::exception& e) {
        report(k, e);
      }
    });
  }
  join.wait(kRoundTimeout + std::chrono::seconds(10));
  result.join_ms = ms_since(joining);
  for (auto& store : stores) store->close();  // revokes the leases before the next run
  stores.clear();
  io.run();
  return result;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"N simulated nodes join one rendezvous round through etcd"};
  std::vector<int> sizes{100, 1000};
  int repeats = 3;
  int members = 3;
  int lease_ttl_seconds = 3;
  std::string endpoints;
  app.add_option("--nodes", sizes, "Simulated nodes per run, e.g. 100,1000")->delimiter(',');
  app.add_option("--repeats", repeats, "Runs per size (interleaved)")->check(CLI::PositiveNumber);
  app.add_option("--members", members, "etcd members to start (without --endpoints)")
      ->check(CLI::Range(1, 3));
  app.add_option("--lease-ttl", lease_ttl_seconds, "Lease TTL of each session, in seconds")
      ->check(CLI::PositiveNumber);
  app.add_option("--endpoints", endpoints, "An existing etcd cluster: h1:2379,h2:2379,...");
  CLI11_PARSE(app, argc, argv);

  dist::rendezvous::raise_open_file_limit();  // before etcd starts: its members inherit it
  std::optional<dist::rendezvous::testing::EtcdCluster> cluster;
  if (endpoints.empty()) {
    cluster.emplace(members);
    endpoints = cluster->endpoint_list();
  }
  auto options = dist::agent::etcd_options(endpoints, {}, std::chrono::seconds(lease_ttl_seconds));
  options.client.unavailable_timeout = kRoundTimeout;

  std::printf(
      "| nodes | run | open all sessions (ms) | join: lease, ephemeral put, add, put, "
      "watch (ms) | failures |\n|---|---|---|---|---|\n");
  std::map<int, std::vector<double>> open_ms, join_ms;
  for (int r = 0; r < repeats; ++r) {
    for (const int n : sizes) {
      const auto run_id = "bench-" + std::to_string(n) + "-" + std::to_string(r);
      const auto result = run_round(options, n, run_id);
      std::printf("| %d | %d | %.0f | %.0f | %d |\n", n, r + 1, result.open_ms, result.join_ms,
                  result.failures);
      std::fflush(stdout);
      open_ms[n].push_back(result.open_ms);
      join_ms[n].push_back(result.join_ms);
    }
  }
  for (const int n : sizes) {
    std::printf("| %d | median | %.0f | %.0f | |\n", n, median(open_ms[n]), median(join_ms[n]));
  }
  return 0;
}
