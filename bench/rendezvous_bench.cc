// rendezvous-bench: N simulated nodes (threads, each with its own store connection, running the
// agent's real NodeRendezvous) against one store. Per N: the time for all of them to join a round,
// the time from one agent's connection dropping to every other node's watch reporting the lost
// node, and (elastic) to the survivors having agreed on their next round without it.
//
//   build/bin/rendezvous-bench --nodes 10,100,1000 [--mode static|elastic]
#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <latch>
#include <memory>
#include <thread>
#include <vector>

#include "dist/rendezvous/server.h"
#include "node_rendezvous.h"

namespace {

using Clock = std::chrono::steady_clock;
using dist::agent::Assignment;
using dist::agent::JobShape;
using dist::agent::NodeRendezvous;
using dist::agent::Verdict;
using dist::agent::WatchResult;
using std::chrono::seconds;

constexpr int kWorkersPerNode = 8;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

double max_of(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, x);
  return m;
}

void run(int n, bool elastic) {
  dist::rendezvous::StoreServerThread store;
  dist::rendezvous::ClientOptions options;
  options.port = store.port();
  options.connect_timeout = seconds(60);
  options.timeout = seconds(120);

  std::vector<std::unique_ptr<NodeRendezvous>> nodes(static_cast<std::size_t>(n));
  std::vector<Assignment> assignments(static_cast<std::size_t>(n));
  std::latch connected(n);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  Clock::time_point start;
  std::atomic<bool> go{false};
  std::vector<double> joined_ms(static_cast<std::size_t>(n));
  for (int k = 0; k < n; ++k) {
    threads.emplace_back([&, k] {
      const auto i = static_cast<std::size_t>(k);
      const JobShape shape{elastic ? 1 : n, n, kWorkersPerNode, "node" + std::to_string(k)};
      nodes[i] = std::make_unique<NodeRendezvous>(options, "bench", shape);
      connected.count_down();
      while (!go.load()) std::this_thread::yield();
      try {
        assignments[i] = elastic ? nodes[i]->join_elastic(0, nullptr, seconds(120), seconds(30))
                                 : nodes[i]->join_static(0, k, seconds(120));
        joined_ms[i] = ms_since(start);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "node %d: %s\n", k, e.what());
        ++failures;
      }
    });
  }
  connected.wait();  // connections are not part of a round: agents hold theirs for the job
  const auto requests_before = store.stats().requests;
  start = Clock::now();
  go = true;
  for (auto& t : threads) t.join();
  threads.clear();
  const double join_requests = static_cast<double>(store.stats().requests - requests_before) / n;

  // Every node but the one with the highest node rank watches; that one's agent "dies" (its
  // connection closes). Elastic survivors then agree on a verdict and form the next round.
  int victim = 0;
  for (int k = 0; k < n; ++k) {
    if (assignments[static_cast<std::size_t>(k)].node_rank == n - 1) victim = k;
  }
  std::atomic<int> noticed{0}, regrouped{0};
  std::vector<double> notice_ms(static_cast<std::size_t>(n)),
      regroup_ms(static_cast<std::size_t>(n));
  std::latch watching(n - 1);
  Clock::time_point killed;
  for (int k = 0; k < n; ++k) {
    if (k == victim) continue;
    threads.emplace_back([&, k] {
      const auto i = static_cast<std::size_t>(k);
      watching.count_down();
      const WatchResult r = nodes[i]->watch(assignments[i], seconds(60));
      notice_ms[i] = ms_since(killed);
      if (r.kind == WatchResult::kNodeLost && r.node == n - 1) ++noticed;
      if (!elastic) return;
      try {
        const Verdict v = nodes[i]->decide(assignments[i], 0);
        const Assignment next = nodes[i]->join_elastic(assignments[i].round + 1, &assignments[i],
                                                       seconds(120), seconds(30));
        regroup_ms[i] = ms_since(killed);
        if (v.action == Verdict::kReshape && next.num_nodes == n - 1) ++regrouped;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "node %d: %s\n", k, e.what());
        ++failures;
      }
    });
  }
  watching.wait();
  std::this_thread::sleep_for(std::chrono::milliseconds(200 + n / 2));  // watches registered
  const auto requests_at_kill = store.stats().requests;
  killed = Clock::now();
  nodes[static_cast<std::size_t>(victim)].reset();
  for (auto& t : threads) t.join();
  // Store requests per node: constant in N means O(N) for the whole job.
  const double regroup_requests =
      static_cast<double>(store.stats().requests - requests_at_kill) / (n - 1);
  if (elastic) {
    std::printf("| %d | %.1f | %.1f | %.1f | %.1f | %.1f | %d/%d | %d |\n", n, max_of(joined_ms),
                join_requests, max_of(notice_ms), max_of(regroup_ms), regroup_requests,
                regrouped.load(), n - 1, failures.load());
  } else {
    std::printf("| %d | %.1f | %.1f | %.1f | %d/%d | %d |\n", n, max_of(joined_ms), join_requests,
                max_of(notice_ms), noticed.load(), n - 1, failures.load());
  }
  std::fflush(stdout);
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
