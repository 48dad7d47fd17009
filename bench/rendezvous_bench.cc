// rendezvous-bench: N simulated nodes (threads, each with its own store connection, running the
// agent's real NodeRendezvous) against one store: the time for all of them to join a round, and the
// time from one agent's connection dropping to every other node's watch reporting the lost node.
//
//   build/bin/rendezvous-bench --nodes 10,100,1000
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
using dist::agent::NodeRendezvous;
using dist::agent::WatchResult;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

void run(int n) {
  dist::rendezvous::StoreServerThread store;
  dist::rendezvous::ClientOptions options;
  options.port = store.port();
  options.connect_timeout = std::chrono::seconds(60);
  options.timeout = std::chrono::seconds(120);

  std::vector<std::unique_ptr<NodeRendezvous>> nodes(static_cast<std::size_t>(n));
  std::latch connected(n);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  Clock::time_point start;
  std::atomic<bool> go{false};
  std::vector<double> joined_ms(static_cast<std::size_t>(n));
  for (int k = 0; k < n; ++k) {
    threads.emplace_back([&, k] {
      nodes[static_cast<std::size_t>(k)] = std::make_unique<NodeRendezvous>(options, "bench", n, k);
      connected.count_down();
      while (!go.load()) std::this_thread::yield();
      try {
        nodes[static_cast<std::size_t>(k)]->join(0, 8, "node" + std::to_string(k),
                                                 std::chrono::seconds(120));
        joined_ms[static_cast<std::size_t>(k)] = ms_since(start);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "node %d: %s\n", k, e.what());
        ++failures;
      }
    });
  }
  connected.wait();  // connections are not part of a round: agents hold theirs for the job
  start = Clock::now();
  go = true;
  for (auto& t : threads) t.join();
  threads.clear();
  double join_all = 0;
  for (double v : joined_ms) join_all = std::max(join_all, v);

  // Every node but the last watches; the last one's agent "dies" (its connection closes).
  std::atomic<int> noticed{0};
  std::vector<double> notice_ms(static_cast<std::size_t>(n - 1));
  std::latch watching(n - 1);
  Clock::time_point killed;
  for (int k = 0; k + 1 < n; ++k) {
    threads.emplace_back([&, k] {
      watching.count_down();
      const WatchResult r = nodes[static_cast<std::size_t>(k)]->watch(0);
      notice_ms[static_cast<std::size_t>(k)] = ms_since(killed);
      if (r.kind == WatchResult::kNodeLost && r.node == n - 1) ++noticed;
    });
  }
  watching.wait();
  std::this_thread::sleep_for(std::chrono::milliseconds(200 + n / 2));  // watches registered
  killed = Clock::now();
  nodes.back().reset();
  for (auto& t : threads) t.join();
  double notice_all = 0;
  for (double v : notice_ms) notice_all = std::max(notice_all, v);
  std::printf("| %d | %.1f | %.1f | %d/%d | %d |\n", n, join_all, notice_all, noticed.load(), n - 1,
              failures.load());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes{10, 100, 1000};
  CLI::App app{"rendezvous-bench: N simulated nodes joining a round and noticing a dead node"};
  app.add_option("--nodes", sizes, "node counts")->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  dist::rendezvous::raise_open_file_limit();
  std::printf("| nodes | all joined, ms | dead node noticed by all, ms | noticed | errors |\n");
  std::printf("|---:|---:|---:|---:|---:|\n");
  for (int n : sizes) run(n);
}
