// etcd-failover-bench: what the loss of one etcd member costs the agents' sessions. Per run, a
// fresh 3-member etcd (127.0.0.1-3), S sessions with the agents' lease TTL (each an ephemeral
// key, its lease kept alive) and a writer session putting a key in a loop, all starting at the
// member about to be lost; then that member is lost:
//   kill-leader      SIGKILL to the leader (the kernel closes its connections)
//   freeze-leader    SIGSTOP to the leader (its connections stay open and silent: a hung or
//                    cut-off host)
//   freeze-follower  SIGSTOP to a follower (no election: no lease is extended)
// Measured: when the writer's puts went through again (the first put sent after the loss came
// back), the longest put (one in flight at the loss may wait out an exchange's timeout), and how
// many sessions' leases outlived the loss (their keys still there kLostLeaseGone after it, their
// sessions not lost).
//
//   build/bin/etcd-failover-bench --losses kill-leader,freeze-leader,freeze-follower --repeats 5
//
// Runs for the losses are interleaved; the table gives each run and the medians.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/store/errors.h"
#include "etcd_cluster.h"
#include "run_task.h"
#include "store/store.h"

namespace {

using Clock = std::chrono::steady_clock;
using dist::agent::RendezvousStore;
using dist::agent::Task;
using dist::store::testing::EtcdCluster;
using dist::store::testing::run_task;
using dist::store::testing::TaskGroup;

// A lease the loss cost is gone by then: its TTL, a new leader's extension of an election timeout,
// etcd's 500 ms expiry check, and the election itself on a loaded machine.
constexpr std::chrono::seconds kLostLeaseGone{10};
constexpr std::chrono::seconds kCallTimeout{30};

struct Loss {
  std::string name;
  bool leader;
  int signal;
};

const std::vector<Loss> kLosses{{"kill-leader", true, SIGKILL},
                                {"freeze-leader", true, SIGSTOP},
                                {"freeze-follower", false, SIGSTOP}};

struct RunResult {
  std::optional<double> writes_back_ms;
  double longest_write_ms = 0;
  int leases_kept = 0;
};

double ms_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

RunResult run(const Loss& loss, int sessions, std::chrono::seconds ttl) {
  EtcdCluster cluster(3);
  const int leader = cluster.leader();
  const int lost = loss.leader ? leader : (leader + 1) % 3;
  dist::agent::EtcdConfig config;
  config.endpoints.push_back(cluster.endpoint(lost));
  for (int m = 0; m < 3; ++m) {
    if (m != lost) config.endpoints.push_back(cluster.endpoint(m));
  }
  config.spread_over_members = false;  // every call starts at the member lost
  config.unavailable_timeout = kCallTimeout;
  const auto options = dist::agent::etcd_options(config, ttl);

  boost::asio::io_context io;
  std::vector<std::unique_ptr<RendezvousStore>> held;
  std::vector<std::string> keys;
  for (int i = 0; i < sessions; ++i) {
    held.push_back(run_task(io, dist::agent::open_rendezvous_store(io, options, "bench")));
    keys.push_back("alive/" + std::to_string(i));
    run_task(io, held.back()->set_ephemeral(keys.back(), "1"));
  }
  const auto writer = run_task(io, dist::agent::open_rendezvous_store(io, options, "bench"));

  RunResult result;
  Clock::time_point lost_at;
  bool writing = true;
  std::optional<Clock::time_point> back_at;  // the first put sent after the loss came back
  TaskGroup beside(io);
  beside.spawn([&]() -> Task<void> {
    for (int i = 0; writing; ++i) {
      const auto sent = Clock::now();
      co_await writer->set("written", std::to_string(i));
      const auto now = Clock::now();
      result.longest_write_ms = std::max(result.longest_write_ms, ms_between(sent, now));
      if (!back_at && lost_at != Clock::time_point{} && sent > lost_at) back_at = now;
    }
  });
  run_task(io, [&]() -> Task<void> {
    ::kill(cluster.pid(lost), loss.signal);
    lost_at = Clock::now();
    boost::asio::steady_timer timer(io, kLostLeaseGone);
    co_await timer.async_wait(boost::asio::use_awaitable);
  }());
  writing = false;
  beside.wait(kCallTimeout);
  if (back_at) result.writes_back_ms = ms_between(lost_at, *back_at);
  for (int i = 0; i < sessions; ++i) {
    try {
      if (run_task(io, held[i]->try_get(keys[i]))) ++result.leases_kept;
    } catch (const dist::store::StoreError&) {
      // The session was lost: its lease expired.
    }
  }
  return result;
}

std::string text(const std::optional<double>& ms) {
  return ms ? std::to_string(static_cast<long>(*ms)) : std::string("-");
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"What the loss of one etcd member costs the agents' sessions"};
  std::vector<std::string> names{"kill-leader", "freeze-leader", "freeze-follower"};
  int repeats = 5;
  int sessions = 10;
  int lease_ttl_seconds = 2;
  app.add_option("--losses", names, "kill-leader, freeze-leader, freeze-follower")->delimiter(',');
  app.add_option("--repeats", repeats, "Runs per loss (interleaved)")->check(CLI::PositiveNumber);
  app.add_option("--sessions", sessions, "Sessions holding a lease")->check(CLI::PositiveNumber);
  app.add_option("--lease-ttl", lease_ttl_seconds, "Lease TTL of each session, in seconds")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  std::vector<Loss> losses;
  for (const auto& name : names) {
    const auto it =
        std::find_if(kLosses.begin(), kLosses.end(), [&](const Loss& l) { return l.name == name; });
    if (it == kLosses.end()) {
      std::fprintf(stderr,
                   "--losses: '%s' is none of kill-leader, freeze-leader, "
                   "freeze-follower\n",
                   name.c_str());
      return 2;
    }
    losses.push_back(*it);
  }

  std::printf(
      "| loss | run | writes back after (ms) | longest write (ms) | leases kept |\n"
      "|---|---|---|---|---|\n");
  std::map<std::string, std::vector<double>> back_ms, longest_ms;
  std::map<std::string, int> kept, total;
  for (int r = 0; r < repeats; ++r) {
    for (const auto& loss : losses) {
      const auto result = run(loss, sessions, std::chrono::seconds(lease_ttl_seconds));
      std::printf("| %s | %d | %s | %.0f | %d/%d |\n", loss.name.c_str(), r + 1,
                  text(result.writes_back_ms).c_str(), result.longest_write_ms, result.leases_kept,
                  sessions);
      std::fflush(stdout);
      if (result.writes_back_ms) back_ms[loss.name].push_back(*result.writes_back_ms);
      longest_ms[loss.name].push_back(result.longest_write_ms);
      kept[loss.name] += result.leases_kept;
      total[loss.name] += sessions;
    }
  }
  for (const auto& loss : losses) {
    std::printf("| %s | median | %.0f | %.0f | %d/%d |\n", loss.name.c_str(),
                median(back_ms[loss.name]), median(longest_ms[loss.name]), kept[loss.name],
                total[loss.name]);
  }
  return 0;
}
