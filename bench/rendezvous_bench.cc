// rendezvous-bench: N simulated nodes (coroutines on one thread, each with its own store
// session, running the agent's real NodeRendezvous) against one store on another thread. Per N:
// the time for all of them to join a round, the time from one agent's connection dropping to
// every other node's watch reporting the lost node, and (elastic) to the survivors having agreed
// on their next round without it.
//
//   build/bin/rendezvous-bench --nodes 10,100,1000 [--mode static|elastic]
#include <CLI/CLI.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "dist/agent/rendezvous.h"
#include "dist/rendezvous/server.h"

namespace {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using dist::agent::Assignment;
using dist::agent::JobShape;
using dist::agent::NodeRendezvous;
using dist::agent::RendezvousTimeouts;
using dist::agent::Task;
using dist::agent::Verdict;
using dist::agent::WatchResult;
using std::chrono::seconds;

constexpr int kWorkersPerNode = 8;
// Watches are registered on the store before the victim goes; the bench gives them this long.
constexpr std::chrono::milliseconds kWatchSettle{300};

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

double max_of(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, x);
  return m;
}

// Runs `body(i)` for i in [0, n) as coroutines on `io` and returns once all of them finished.
void for_all(asio::io_context& io, int n, const std::function<Task<void>(int)>& body,
             int& failures) {
  for (int i = 0; i < n; ++i) {
    asio::co_spawn(io, body(i), [&failures, i](std::exception_ptr e) {
      if (!e) return;
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& error) {
        std::fprintf(stderr, "node %d: %s\n", i, error.what());
        ++failures;
      }
    });
  }
  io.restart();
  io.run();
}

void run(int n, bool elastic) {
  dist::rendezvous::StoreServerThread store;
  dist::rendezvous::ClientOptions options;
  options.port = store.port();
  options.connect_timeout = seconds(60);
  options.timeout = seconds(120);
  RendezvousTimeouts timeouts;
  timeouts.rdzv = timeouts.join = seconds(120);
  timeouts.last_call = seconds(30);

  asio::io_context io;
  int failures = 0;
  std::vector<std::optional<NodeRendezvous>> nodes(static_cast<std::size_t>(n));
  std::vector<Assignment> assignments(static_cast<std::size_t>(n));
  // Connections are not part of a round: agents hold theirs for the job.
  for_all(
      io, n,
      [&](int k) -> Task<void> {
        const JobShape shape{elastic ? 1 : n, n, kWorkersPerNode, "node" + std::to_string(k)};
        nodes[static_cast<std::size_t>(k)].emplace(
            co_await dist::agent::open_tcp_store(options, "bench"), shape, timeouts);
      },
      failures);

  const auto requests_before = store.stats().requests;
  const auto start = Clock::now();
  std::vector<double> joined_ms(static_cast<std::size_t>(n));
  for_all(
      io, n,
      [&](int k) -> Task<void> {
        const auto i = static_cast<std::size_t>(k);
        if (elastic) {
          assignments[i] = co_await nodes[i]->join_elastic(0, std::nullopt);
        } else {
          assignments[i] = co_await nodes[i]->join_static(0, k);
        }
        joined_ms[i] = ms_since(start);
      },
      failures);
  const double join_requests = static_cast<double>(store.stats().requests - requests_before) / n;

  // Every node but the one with the highest node rank watches; that one's agent "dies" (its
  // connection closes). Elastic survivors then agree on a verdict and form the next round.
  int victim = 0;
  for (int k = 0; k < n; ++k) {
    if (assignments[static_cast<std::size_t>(k)].node_rank == n - 1) victim = k;
  }
  int noticed = 0, regrouped = 0;
  std::vector<double> notice_ms(static_cast<std::size_t>(n)),
      regroup_ms(static_cast<std::size_t>(n));
  Clock::time_point killed;
  std::uint64_t requests_at_kill = 0;
  asio::steady_timer settle(io, kWatchSettle);
  settle.async_wait([&](boost::system::error_code) {
    requests_at_kill = store.stats().requests;
    killed = Clock::now();
    nodes[static_cast<std::size_t>(victim)]->close();
  });
  for_all(
      io, n,
      [&](int k) -> Task<void> {
        if (k == victim) co_return;
        const auto i = static_cast<std::size_t>(k);
        const WatchResult r = co_await nodes[i]->watch(assignments[i], seconds(60));
        notice_ms[i] = ms_since(killed);
        if (r.kind == WatchResult::kNodeLost && r.node == n - 1) ++noticed;
        if (!elastic) co_return;
        const Verdict v = co_await nodes[i]->decide(assignments[i], 0);
        const Assignment next =
            co_await nodes[i]->join_elastic(assignments[i].round + 1, assignments[i]);
        regroup_ms[i] = ms_since(killed);
        if (v.action == Verdict::kReshape && next.num_nodes == n - 1) ++regrouped;
      },
      failures);
  // Store requests per node: constant in N means O(N) for the whole job.
  const double regroup_requests =
      static_cast<double>(store.stats().requests - requests_at_kill) / (n - 1);
  if (elastic) {
    std::printf("| %d | %.1f | %.1f | %.1f | %.1f | %.1f | %d/%d | %d |\n", n, max_of(joined_ms),
                join_requests, max_of(notice_ms), max_of(regroup_ms), regroup_requests, regrouped,
                n - 1, failures);
  } else {
    std::printf("| %d | %.1f | %.1f | %.1f | %d/%d | %d |\n", n, max_of(joined_ms), join_requests,
                max_of(notice_ms), noticed, n - 1, failures);
  }
  std::fflush(stdout);
  for (auto& node : nodes) {
    if (node) node->close();
  }
  io.restart();
  io.poll();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes{10, 100, 1000};
  std::string mode = "static";
  CLI::App app{"rendezvous-bench: N simulated nodes joining a round and noticing a dead node"};
  app.add_option("--nodes", sizes, "node counts")->delimiter(',');
  app.add_option("--mode", mode, "static (--nnodes N) or elastic (--nnodes 1:N, c10d)")
      ->check(CLI::IsMember({"static", "elastic"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  dist::rendezvous::raise_open_file_limit();
  if (mode == "elastic") {
    std::printf(
        "| nodes | all joined, ms | requests per node | dead node noticed by all, ms | "
        "survivors in their next round, ms | requests per survivor | regrouped | errors |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  } else {
    std::printf(
        "| nodes | all joined, ms | requests per node | dead node noticed by all, ms | noticed | "
        "errors |\n|---:|---:|---:|---:|---:|---:|\n");
  }
  for (int n : sizes) run(n, mode == "elastic");
}
