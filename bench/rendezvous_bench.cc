// rendezvous-bench: N simulated nodes (coroutines on one thread, each with its own store
// session, running the agent's real NodeRendezvous) against one store: the job's TCPStore (on
// another thread of this process) or etcd v3 (a 3-member cluster of Debian's etcd the bench starts
// on 127.0.0.1-3, or --etcd-endpoints). Per run: the time for every node to open its session, for
// all of them to join a round, from one agent's session ending to every other node's watch
// reporting the lost node, and (elastic) to the survivors having agreed on their next round
// without it.
//
//   build/bin/rendezvous-bench --nodes 10,100,1000 [--mode static|elastic]
//   build/bin/rendezvous-bench --nodes 100,1000 --mode elastic --backend tcp,etcd-v3 --repeats 3
//
// --max-requests-per-node and --max-requests-per-survivor make it a regression guard (the test
// suite runs it so, bench/CMakeLists.txt): the store requests a round costs are a count, not a
// timing, the same on any machine; a run above a bound exits 2, saying which.
//
// Runs are interleaved (each repeat runs every size, each size every backend); with --repeats
// above 1 the table ends with the medians.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "dist/store/limits.h"
#include "dist/store/server.h"
#include "etcd_cluster.h"
#include "rendezvous/rendezvous.h"

namespace {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using dist::agent::Assignment;
using dist::agent::JobShape;
using dist::agent::NodeRendezvous;
using dist::agent::RendezvousStore;
using dist::agent::RendezvousTimeouts;
using dist::agent::Task;
using dist::agent::Verdict;
using dist::agent::WatchResult;
using std::chrono::seconds;

constexpr int kWorkersPerNode = 8;
// Watches are registered on the store before the victim goes; the bench gives them this long,
// or as long as the join took where that is longer (each watch opens a session of its own: on
// etcd, a new connection and a watch stream per node).
constexpr std::chrono::milliseconds kWatchSettle{300};
// Every wait of a run (a round forming, a store that stopped answering) ends within this.
constexpr seconds kRunTimeout{120};
// After the run: the sessions' ends (etcd: lease revocations) get this long.
constexpr seconds kCloseGrace{5};

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

double max_of(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, x);
  return m;
}

// One job's store for one run: a fresh TCPStore, or a fresh run id on the etcd cluster.
class JobStore {
 public:
  virtual ~JobStore() = default;
  virtual Task<std::unique_ptr<RendezvousStore>> open_session(asio::io_context& io) = 0;
  // Requests the store has served, where the bench can count them.
  virtual std::optional<std::uint64_t> requests() { return std::nullopt; }
};

class TcpJobStore final : public JobStore {
 public:
  explicit TcpJobStore(std::string run_id) : run_id_(std::move(run_id)) {}
  Task<std::unique_ptr<RendezvousStore>> open_session(asio::io_context& io) override {
    dist::store::ClientOptions options;
    options.port = server_.port();
    options.connect_timeout = kRunTimeout;
    options.timeout = kRunTimeout;
    return dist::agent::open_rendezvous_store(io, dist::agent::TcpStoreTarget{options}, run_id_);
  }
  std::optional<std::uint64_t> requests() override { return server_.stats().requests; }

 private:
  dist::store::StoreServerThread server_;
  std::string run_id_;
};

// The members and options an agent would be given.
struct EtcdTarget {
  dist::agent::EtcdConfig config;
  seconds lease_ttl{2};
};

class EtcdJobStore final : public JobStore {
 public:
  EtcdJobStore(const EtcdTarget& target, std::string run_id)
      : target_(target), run_id_(std::move(run_id)) {}
  Task<std::unique_ptr<RendezvousStore>> open_session(asio::io_context& io) override {
    return dist::agent::open_rendezvous_store(
        io, dist::agent::etcd_options(target_.config, target_.lease_ttl), run_id_);
  }

 private:
  const EtcdTarget& target_;
  std::string run_id_;
};

// Runs `body(i)` for i in [0, n) as coroutines on `io` and returns once all of them finished
// (the sessions' own work, such as lease renewals, stays queued); counts and shows failures.
void for_all(asio::io_context& io, int n, const std::function<Task<void>(int)>& body,
             int& failures) {
  int running = n;
  for (int i = 0; i < n; ++i) {
    asio::co_spawn(io, body(i), [&failures, &running, i](std::exception_ptr e) {
      --running;
      if (!e) return;
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& error) {
        if (failures++ < 5) std::fprintf(stderr, "node %d: %s\n", i, error.what());
      }
    });
  }
  io.restart();
  while (running > 0) io.run_one();
}

// One run's figures: none for a phase where a node failed, nor for the phases after it.
struct RunResult {
  std::optional<double> open_ms, join_ms, join_requests, notice_ms, regroup_ms, regroup_requests;
  int ok = 0;  // survivors that noticed the right node (static) or regrouped without it (elastic)
  int failures = 0;
};

std::optional<double> per(std::optional<std::uint64_t> requests, int n) {
  if (!requests) return std::nullopt;
  return static_cast<double>(*requests) / n;
}

RunResult run(JobStore& job, int n, bool elastic) {
  RendezvousTimeouts timeouts;
  timeouts.rdzv = timeouts.join = kRunTimeout;
  timeouts.last_call = seconds(30);
  RunResult result;

  asio::io_context io;
  std::vector<std::optional<NodeRendezvous>> nodes(static_cast<std::size_t>(n));
  std::vector<Assignment> assignments(static_cast<std::size_t>(n));
  const auto end_run = [&] {
    for (auto& node : nodes) {
      if (node) node->close();
    }
    nodes.clear();
    io.restart();
    io.run_for(kCloseGrace);
  };
  // Sessions are not part of a round: agents hold theirs for the job.
  const auto opening = Clock::now();
  for_all(
      io, n,
      [&](int k) -> Task<void> {
        const JobShape shape{elastic ? 1 : n, n, kWorkersPerNode, "node" + std::to_string(k)};
        nodes[static_cast<std::size_t>(k)].emplace(co_await job.open_session(io), shape, timeouts);
      },
      result.failures);
  result.open_ms = ms_since(opening);
  if (result.failures > 0) {
    end_run();
    return result;
  }

  const auto requests_before = job.requests();
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
      result.failures);
  if (requests_before) result.join_requests = per(*job.requests() - *requests_before, n);
  if (result.failures > 0) {
    end_run();
    return result;
  }
  result.join_ms = max_of(joined_ms);

  // Every node but the one with the highest node rank watches; that one's agent "dies" (its
  // session ends). Elastic survivors then agree on a verdict and form the next round.
  int victim = 0;
  for (int k = 0; k < n; ++k) {
    if (assignments[static_cast<std::size_t>(k)].node_rank == n - 1) victim = k;
  }
  std::vector<double> notice_ms(static_cast<std::size_t>(n)),
      regroup_ms(static_cast<std::size_t>(n));
  Clock::time_point killed;
  std::optional<std::uint64_t> requests_at_kill;
  asio::steady_timer settle(
      io, std::max<std::chrono::milliseconds>(
              kWatchSettle, std::chrono::milliseconds(static_cast<long>(*result.join_ms))));
  settle.async_wait([&](boost::system::error_code) {
    requests_at_kill = job.requests();
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
        const bool noticed = r.kind == WatchResult::kNodeLost && r.node == n - 1;
        if (!elastic) {
          if (noticed) ++result.ok;
          co_return;
        }
        const Verdict v = co_await nodes[i]->decide(assignments[i], 0);
        const Assignment next =
            co_await nodes[i]->join_elastic(assignments[i].round + 1, assignments[i]);
        regroup_ms[i] = ms_since(killed);
        if (v.action == Verdict::kReshape && next.num_nodes == n - 1) {
          ++result.ok;
        } else if (k == 0 || (victim == 0 && k == 1)) {  // every node hears the same verdict
          std::fprintf(stderr,
                       "not regrouped as expected: verdict %d (%s), next round %d of %d nodes\n",
                       static_cast<int>(v.action), v.reason.c_str(), next.round, next.num_nodes);
        }
      },
      result.failures);
  if (result.failures == 0) {
    result.notice_ms = max_of(notice_ms);
    if (elastic) result.regroup_ms = max_of(regroup_ms);
  }
  // Store requests per survivor: constant in N means O(N) for the whole job.
  if (requests_at_kill) result.regroup_requests = per(*job.requests() - *requests_at_kill, n - 1);
  end_run();
  return result;
}

std::string cell(std::optional<double> v) {
  if (!v) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", *v);
  return text;
}

std::optional<double> median(std::vector<std::optional<double>> values) {
  std::vector<double> present;
  for (const auto& v : values) {
    if (v) present.push_back(*v);
  }
  if (present.empty()) return std::nullopt;
  std::sort(present.begin(), present.end());
  return present[present.size() / 2];
}

void print_row(const std::string& backend, int n, const std::string& run, const RunResult& r,
               bool elastic, const std::string& ok, const std::string& failures) {
  std::printf("| %s | %d | %s | %s | %s | %s | %s |", backend.c_str(), n, run.c_str(),
              cell(r.open_ms).c_str(), cell(r.join_ms).c_str(), cell(r.join_requests).c_str(),
              cell(r.notice_ms).c_str());
  if (elastic) {
    std::printf(" %s | %s |", cell(r.regroup_ms).c_str(), cell(r.regroup_requests).c_str());
  }
  std::printf(" %s | %s |\n", ok.c_str(), failures.c_str());
  std::fflush(stdout);
}

// The median of each figure over a backend's runs at one size.
RunResult medians(const std::vector<RunResult>& runs) {
  const auto of = [&](std::optional<double> RunResult::*field) {
    std::vector<std::optional<double>> values;
    for (const auto& r : runs) values.push_back(r.*field);
    return median(std::move(values));
  };
  RunResult m;
  m.open_ms = of(&RunResult::open_ms);
  m.join_ms = of(&RunResult::join_ms);
  m.join_requests = of(&RunResult::join_requests);
  m.notice_ms = of(&RunResult::notice_ms);
  m.regroup_ms = of(&RunResult::regroup_ms);
  m.regroup_requests = of(&RunResult::regroup_requests);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes{10, 100, 1000};
  std::vector<std::string> backends{"tcp"};
  std::string mode = "static";
  int repeats = 1;
  int members = 3;
  int lease_ttl_seconds = 2;
  std::string etcd_endpoints;
  std::optional<double> max_per_node, max_per_survivor;
  CLI::App app{"rendezvous-bench: N simulated nodes joining a round and noticing a dead node"};
  app.add_option("--nodes", sizes, "node counts")->delimiter(',');
  app.add_option("--mode", mode, "static (--nnodes N) or elastic (--nnodes 1:N, c10d)")
      ->check(CLI::IsMember({"static", "elastic"}))
      ->capture_default_str();
  app.add_option("--backend", backends, "rendezvous stores, interleaved: tcp, etcd-v3")
      ->delimiter(',')
      ->check(CLI::IsMember({"tcp", "etcd-v3"}))
      ->capture_default_str();
  app.add_option("--repeats", repeats, "runs per size and backend")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--etcd-endpoints", etcd_endpoints,
                 "an existing etcd cluster, h1:2379,h2:2379,... (default: start one)");
  app.add_option("--etcd-members", members, "members of the etcd cluster the bench starts")
      ->check(CLI::Range(1, 3))
      ->capture_default_str();
  app.add_option("--lease-ttl", lease_ttl_seconds,
                 "etcd: each session's lease TTL in seconds (the agents' default: 2)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-requests-per-node", max_per_node,
                 "exit 2 when a run's round costs more store requests per node than this");
  app.add_option("--max-requests-per-survivor", max_per_survivor,
                 "elastic: exit 2 when the survivors' next round costs more per survivor");
  CLI11_PARSE(app, argc, argv);
  dist::store::raise_open_file_limit();  // before etcd starts: its members inherit it

  const bool elastic = mode == "elastic";
  std::optional<dist::store::testing::EtcdCluster> cluster;
  EtcdTarget etcd;
  if (std::find(backends.begin(), backends.end(), "etcd-v3") != backends.end()) {
    if (etcd_endpoints.empty()) {
      cluster.emplace(members);
      etcd_endpoints = cluster->endpoint_list();
    }
    std::stringstream items(etcd_endpoints);
    for (std::string item; std::getline(items, item, ',');) etcd.config.endpoints.push_back(item);
    etcd.config.prefix = "/rendezvous-bench";
    etcd.config.unavailable_timeout = kRunTimeout;
    etcd.lease_ttl = seconds(lease_ttl_seconds);
  }

  std::printf(
      "| backend | nodes | run | all sessions open, ms | all joined, ms | requests per node "
      "| dead node noticed by all, ms |");
  if (elastic) std::printf(" survivors in their next round, ms | requests per survivor |");
  std::printf(" %s | errors |\n|---|---:|---|---:|---:|---:|---:|%s---:|---:|\n",
              elastic ? "regrouped" : "noticed", elastic ? "---:|---:|" : "");
  std::map<std::pair<std::string, int>, std::vector<RunResult>> runs;
  int failed_runs = 0;
  for (int r = 1; r <= repeats; ++r) {
    for (const int n : sizes) {
      for (const auto& backend : backends) {
        // A fresh job per run; etcd keeps every run's keys under its own run id.
        const auto run_id = "bench-" + std::to_string(::getpid()) + "-" + std::to_string(n) + "-" +
                            std::to_string(r);
        std::unique_ptr<JobStore> job;
        if (backend == "tcp") {
          job = std::make_unique<TcpJobStore>(run_id);
        } else {
          job = std::make_unique<EtcdJobStore>(etcd, run_id);
        }
        const auto result = run(*job, n, elastic);
        print_row(backend, n, std::to_string(r), result, elastic,
                  std::to_string(result.ok) + "/" + std::to_string(n - 1),
                  std::to_string(result.failures));
        runs[{backend, n}].push_back(result);
        if (result.failures > 0) ++failed_runs;
      }
    }
  }
  for (const int n : sizes) {
    for (const auto& backend : backends) {
      if (repeats == 1) continue;
      print_row(backend, n, "median of " + std::to_string(repeats), medians(runs[{backend, n}]),
                elastic, "", "");
    }
  }
  if (failed_runs > 0) return 1;
  bool above = false;
  const auto check = [&](std::optional<double> value, std::optional<double> bound, const char* what,
                         int n) {
    if (!value || !bound || *value <= *bound) return;
    std::fprintf(stderr,
                 "rendezvous-bench: %s %.2f at %d nodes, above the bound %.2f: a change to the "
                 "rounds costs every node more store requests (say each in the code, issue 46)\n",
                 what, *value, n, *bound);
    above = true;
  };
  for (const auto& [key, results] : runs) {
    for (const auto& r : results) {
      check(r.join_requests, max_per_node, "requests per node", key.second);
      check(r.regroup_requests, max_per_survivor, "requests per survivor", key.second);
    }
  }
  return above ? 2 : 0;
}
