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
// --max-requests-per-node, --max-requests-per-survivor and --max-connections-per-node make it a
// regression guard (the test suite runs it so, bench/CMakeLists.txt): the store requests a round
// costs, and the connections the nodes hold, are counts, not timings, the same on any machine; a
// run above a bound exits 2, saying which.
//
// --processes P spreads each run's nodes over P child processes (this program, --slice), the
// store staying in this one: the store's process then holds one end of each connection, not both,
// and 16,000 nodes' sessions fit a 20,000-file limit. A node's watch shares its TCP session (a
// lane of its connection); through etcd it opens a second session, and the dead-node phase runs
// where this process can hold those, and is said to be skipped where it cannot.
//
//   build/bin/rendezvous-bench --nodes 4000,16000 --mode elastic --processes 4
//
// Runs are interleaved (each repeat runs every size, each size every backend); with --repeats
// above 1 the table ends with the medians.
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dist/store/limits.h"
#include "dist/store/server.h"
#include "etcd_cluster.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/schema.h"

namespace {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using dist::agent::JobShape;
using dist::agent::NodeRendezvous;
using dist::agent::RendezvousStore;
using dist::agent::RendezvousTimeouts;
using dist::agent::Round;
using dist::agent::Task;
using dist::agent::Verdict;
using dist::agent::WatchResult;
using std::chrono::seconds;

constexpr int kWorkersPerNode = 8;
// The victim goes once every other node's watch is under way (its first heartbeat written, its
// wait on the store sent next), and this long after: as in a job, whose watches begin right after
// the join, long before a node is lost. (A fixed delay did not do: at 9,000 nodes on one machine
// three quarters of the watches' sessions were still connecting after it, and the loss seemed to
// take 3 s to notice instead of 0.5 s.)
constexpr std::chrono::milliseconds kWatchSettle{300};
// Every wait of a run (a round forming, a store that stopped answering) ends within this.
constexpr seconds kRunTimeout{120};
// After the run: the sessions' ends (etcd: lease revocations) get this long.
constexpr seconds kCloseGrace{5};

double ms_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

double ms_since(Clock::time_point t) {
  return ms_between(t, Clock::now());
}

// steady_clock is CLOCK_MONOTONIC, one clock for every process of this machine: the slices of a
// run report their phases' ends as its nanoseconds, and the driver takes the latest.
std::int64_t to_ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
Clock::time_point from_ns(std::int64_t ns) {
  return Clock::time_point(
      std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(ns)));
}

// The members and options an agent would be given.
struct EtcdTarget {
  dist::agent::EtcdConfig config;
  seconds lease_ttl{2};
};

// Where one run's nodes open their sessions: the run's TCPStore, or a fresh run id on etcd.
struct Target {
  std::string backend = "tcp";
  std::uint16_t port = 0;  // tcp
  EtcdTarget etcd;
  std::string run_id;
};

Task<std::unique_ptr<RendezvousStore>> open_session(asio::io_context& io, const Target& target) {
  if (target.backend == "tcp") {
    dist::store::ClientOptions options;
    options.port = target.port;
    options.connect_timeout = kRunTimeout;
    options.timeout = kRunTimeout;
    return dist::agent::open_rendezvous_store(io, dist::agent::TcpStoreTarget{options},
                                              target.run_id);
  }
  return dist::agent::open_rendezvous_store(
      io, dist::agent::etcd_options(target.etcd.config, target.etcd.lease_ttl), target.run_id);
}

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

// What a slice of the job's nodes saw in one phase: its latest end, and failures.
struct JoinedSlice {
  Clock::time_point end;
  int victim = -1;  // the node (index in the job) given the highest node rank, when in this slice
  int failures = 0;
};
struct WatchedSlice {
  Clock::time_point noticed, regrouped;     // the slice's latest
  std::optional<Clock::time_point> killed;  // when the victim went, where it is in this slice
  int ok = 0;
  int failures = 0;
};

// Nodes [first, first + count) of a job of n, as coroutines on one thread, each with its own
// store session running the agent's real NodeRendezvous: the whole job in one process, or one
// child process's share of it (--processes).
class NodeSlice {
 public:
  NodeSlice(Target target, int n, int first, int count, bool elastic)
      : target_(std::move(target)),
        n_(n),
        first_(first),
        count_(count),
        elastic_(elastic),
        nodes_(static_cast<std::size_t>(count)),
        assignments_(static_cast<std::size_t>(count)) {
    timeouts_.rdzv = timeouts_.join = kRunTimeout;
    timeouts_.last_call = seconds(30);
  }
  ~NodeSlice() { close(); }

  // Sessions are not part of a round: agents hold theirs for the job.
  int open() {
    int failures = 0;
    for_all(
        io_, count_,
        [&](int i) -> Task<void> {
          const int k = first_ + i;
          const JobShape shape{elastic_ ? 1 : n_, n_, kWorkersPerNode, "node" + std::to_string(k)};
          node(i).emplace(co_await open_session(io_, target_), shape, timeouts_);
        },
        failures);
    return failures;
  }

  JoinedSlice join() {
    JoinedSlice result;
    result.end = Clock::now();
    for_all(
        io_, count_,
        [&](int i) -> Task<void> {
          const int k = first_ + i;
          auto& a = assignments_[static_cast<std::size_t>(i)];
          if (elastic_) {  // (not a conditional expression: g++ 12 miscompiles co_await in one)
            a = co_await node(i)->join_elastic(0, std::nullopt);
          } else {
            a = co_await node(i)->join_static(0, k);
          }
          result.end = std::max(result.end, Clock::now());
          if (a.node_rank == n_ - 1) result.victim = k;
        },
        result.failures);
    return result;
  }

  // Every node but `victim` watches; once their watches are under way (kWatchSettle) the
  // victim's agent "dies" (its session ends), when it is in this slice. Elastic survivors then
  // agree on a verdict and form the next round.
  WatchedSlice watch(int victim) {
    WatchedSlice result;
    result.noticed = result.regrouped = Clock::now();
    for_all(
        io_, count_,
        [&](int i) -> Task<void> {
          const int k = first_ + i;
          const auto slot = static_cast<std::size_t>(i);
          if (k == victim) {
            co_await kill_once_watched(i, result);
            co_return;
          }
          const WatchResult r = co_await node(i)->watch(assignments_[slot], seconds(60));
          result.noticed = std::max(result.noticed, Clock::now());
          const bool noticed = r.kind == WatchResult::kNodeLost && r.node == n_ - 1;
          if (!elastic_) {
            if (noticed) ++result.ok;
            co_return;
          }
          const Verdict v = co_await node(i)->decide(assignments_[slot], 0);
          const Round next =
              co_await node(i)->join_elastic(assignments_[slot].round + 1, assignments_[slot]);
          result.regrouped = std::max(result.regrouped, Clock::now());
          if (v.action == Verdict::kReshape && next.num_nodes == n_ - 1) {
            ++result.ok;
          } else if (k == 0 || (victim == 0 && k == 1)) {  // every node hears the same verdict
            std::fprintf(stderr,
                         "not regrouped as expected: verdict %d (%s), next round %d of %d nodes\n",
                         static_cast<int>(v.action), v.reason.c_str(), next.round, next.num_nodes);
          }
        },
        result.failures);
    return result;
  }

  // The victim (node i): waits for every other node's first heartbeat of the round, gives their
  // watches kWatchSettle more, and ends its session.
  Task<void> kill_once_watched(int i, WatchedSlice& result) {
    const Round& a = assignments_[static_cast<std::size_t>(i)];
    std::vector<std::string> beats;
    for (int rank = 0; rank < n_; ++rank) {
      if (rank != a.node_rank) {
        beats.push_back(
            dist::agent::schema::in_round(a.round, dist::agent::schema::name::kHeartbeat, rank));
      }
    }
    auto probe = co_await open_session(io_, target_);
    const bool watched = co_await probe->wait(std::move(beats), kRunTimeout);
    probe->close();
    if (!watched) throw std::runtime_error("the other nodes' watches did not begin");
    asio::steady_timer timer(io_, kWatchSettle);
    co_await timer.async_wait(asio::use_awaitable);
    result.killed = Clock::now();
    node(i)->close();
  }

  // After the run: the sessions' ends (etcd: lease revocations) get kCloseGrace.
  void close() {
    if (closed_) return;
    closed_ = true;
    for (auto& node : nodes_) {
      if (node) node->close();
    }
    nodes_.clear();
    io_.restart();
    io_.run_for(kCloseGrace);
  }

 private:
  std::optional<NodeRendezvous>& node(int i) { return nodes_[static_cast<std::size_t>(i)]; }

  asio::io_context io_;
  Target target_;
  int n_, first_, count_;
  bool elastic_;
  RendezvousTimeouts timeouts_;
  std::vector<std::optional<NodeRendezvous>> nodes_;
  std::vector<Round> assignments_;
  bool closed_ = false;
};

// One run's figures: none for a phase where a node failed, nor for the phases after it.
struct RunResult {
  std::optional<double> open_ms, join_ms, join_requests, notice_ms, regroup_ms, regroup_requests;
  std::optional<double> connections;      // per node, every phase (TCP: the store counts them)
  std::string join_by_op, regroup_by_op;  // the requests by operation (--by-op)
  int ok = 0;  // survivors that noticed the right node (static) or regrouped without it (elastic)
  int failures = 0;
};

std::optional<double> per(std::optional<std::uint64_t> requests, int n) {
  if (!requests) return std::nullopt;
  return static_cast<double>(*requests) / n;
}

// The nodes of a run, wherever they are: one NodeSlice here, or one per child process.
class Nodes {
 public:
  virtual ~Nodes() = default;
  virtual int open() = 0;
  virtual JoinedSlice join() = 0;
  virtual WatchedSlice watch(int victim) = 0;
};

class LocalNodes final : public Nodes {
 public:
  LocalNodes(const Target& target, int n, bool elastic) : slice_(target, n, 0, n, elastic) {}
  int open() override { return slice_.open(); }
  JoinedSlice join() override { return slice_.join(); }
  WatchedSlice watch(int victim) override { return slice_.watch(victim); }

 private:
  NodeSlice slice_;
};

// A child's side of --processes: `rendezvous-bench --slice FIRST,COUNT ...` runs a NodeSlice and
// answers its parent's commands (stdin), one line each (stdout):
//   open                  -> opened FAILURES
//   join                  -> joined END_NS VICTIM FAILURES
//   watch VICTIM          -> watched NOTICED_NS REGROUPED_NS OK FAILURES KILLED_NS (0: not here)
//   end (or end of input) -> closes the sessions and exits
int serve_slice(NodeSlice& slice) {
  for (std::string line; std::getline(std::cin, line);) {
    std::istringstream command(line);
    std::string verb;
    command >> verb;
    if (verb == "open") {
      std::printf("opened %d\n", slice.open());
    } else if (verb == "join") {
      const JoinedSlice r = slice.join();
      std::printf("joined %lld %d %d\n", static_cast<long long>(to_ns(r.end)), r.victim,
                  r.failures);
    } else if (verb == "watch") {
      int victim = -1;
      command >> victim;
      const WatchedSlice r = slice.watch(victim);
      std::printf("watched %lld %lld %d %d %lld\n", static_cast<long long>(to_ns(r.noticed)),
                  static_cast<long long>(to_ns(r.regrouped)), r.ok, r.failures,
                  r.killed ? static_cast<long long>(to_ns(*r.killed)) : 0LL);
    } else {
      break;
    }
    std::fflush(stdout);
  }
  slice.close();
  return 0;
}

// The run's nodes split over child processes (this program, --slice), each with its own
// connections: the store's process holds one end of each connection, not both.
class ChildNodes final : public Nodes {
 public:
  ChildNodes(const Target& target, int n, bool elastic, int processes) {
    for (int p = 0; p < processes; ++p) {
      const int first = n * p / processes, count = n * (p + 1) / processes - first;
      std::vector<std::string> args{"rendezvous-bench",
                                    "--slice",
                                    std::to_string(first) + "," + std::to_string(count),
                                    "--nodes",
                                    std::to_string(n),
                                    "--mode",
                                    elastic ? "elastic" : "static",
                                    "--backend",
                                    target.backend,
                                    "--run-id",
                                    target.run_id,
                                    "--lease-ttl",
                                    std::to_string(target.etcd.lease_ttl.count())};
      if (target.backend == "tcp") {
        args.insert(args.end(), {"--port", std::to_string(target.port)});
      } else {
        std::string endpoints;
        for (const auto& e : target.etcd.config.endpoints) {
          endpoints += (endpoints.empty() ? "" : ",") + e;
        }
        args.insert(args.end(), {"--etcd-endpoints", endpoints});
      }
      try {
        children_.push_back(spawn(args));
      } catch (...) {
        end_all();
        throw;
      }
    }
  }
  ~ChildNodes() override { end_all(); }

  int open() override {
    int failures = 0;
    for (const auto& line : ask_all("open")) failures += std::stoi(field(line, 1));
    return failures;
  }
  JoinedSlice join() override {
    JoinedSlice result;
    result.end = Clock::now();
    for (const auto& line : ask_all("join")) {
      result.end = std::max(result.end, from_ns(std::stoll(field(line, 1))));
      result.victim = std::max(result.victim, std::stoi(field(line, 2)));
      result.failures += std::stoi(field(line, 3));
    }
    return result;
  }
  WatchedSlice watch(int victim) override {
    WatchedSlice result;
    result.noticed = result.regrouped = Clock::now();
    for (const auto& line : ask_all("watch " + std::to_string(victim))) {
      result.noticed = std::max(result.noticed, from_ns(std::stoll(field(line, 1))));
      result.regrouped = std::max(result.regrouped, from_ns(std::stoll(field(line, 2))));
      result.ok += std::stoi(field(line, 3));
      result.failures += std::stoi(field(line, 4));
      if (const long long killed = std::stoll(field(line, 5)); killed != 0) {
        result.killed = from_ns(killed);
      }
    }
    return result;
  }

 private:
  struct Child {
    pid_t pid = -1;
    FILE* to = nullptr;    // its stdin
    FILE* from = nullptr;  // its stdout
  };

  static Child spawn(const std::vector<std::string>& args) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
      throw std::runtime_error("rendezvous-bench: pipe: " + std::string(std::strerror(errno)));
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    Child c;
    const int error =
        ::posix_spawn(&c.pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(in[0]);
    ::close(out[1]);
    if (error != 0) {
      throw std::runtime_error("rendezvous-bench: cannot start a slice: " +
                               std::string(std::strerror(error)));
    }
    c.to = ::fdopen(in[1], "w");
    c.from = ::fdopen(out[0], "r");
    return c;
  }

  // Each child closes its sessions and exits; every one is reaped.
  void end_all() {
    for (auto& c : children_) {
      send(c, "end");
      std::fclose(c.to);
      std::fclose(c.from);
      int status = 0;
      ::waitpid(c.pid, &status, 0);
    }
    children_.clear();
  }

  static void send(Child& c, const std::string& line) {
    std::fprintf(c.to, "%s\n", line.c_str());
    std::fflush(c.to);
  }

  // Sends `command` to every child, then reads each one's answer.
  std::vector<std::string> ask_all(const std::string& command) {
    for (auto& c : children_) send(c, command);
    std::vector<std::string> answers;
    for (auto& c : children_) {
      char* line = nullptr;
      std::size_t size = 0;
      const ssize_t got = ::getline(&line, &size, c.from);
      std::string answer = got > 0 ? std::string(line, static_cast<std::size_t>(got)) : "";
      std::free(line);
      if (answer.empty()) {
        throw std::runtime_error("rendezvous-bench: a slice (pid " + std::to_string(c.pid) +
                                 ") ended without answering '" + command + "'");
      }
      answers.push_back(std::move(answer));
    }
    return answers;
  }

  static std::string field(const std::string& line, int index) {
    std::istringstream words(line);
    std::string word;
    for (int i = 0; i <= index; ++i) words >> word;
    return word;
  }

  std::vector<Child> children_;
};

// Requests the run's store has served, in all and by operation, where the bench can count them
// (its own TCPStore).
struct RequestCount {
  std::uint64_t total = 0;
  std::map<std::string, std::uint64_t> by_op;
};
using RequestCounter = std::function<std::optional<RequestCount>()>;

// The requests served between two counts, by operation, per node: "ADD 3.00, GET 2.00, ...".
std::string per_op(const RequestCount& before, const RequestCount& after, int n) {
  std::string text;
  for (const auto& [op, count] : after.by_op) {
    const auto was = before.by_op.find(op);
    const std::uint64_t served = count - (was == before.by_op.end() ? 0 : was->second);
    if (served == 0) continue;
    char figure[64];
    std::snprintf(figure, sizeof figure, "%s%s %.2f", text.empty() ? "" : ", ", op.c_str(),
                  static_cast<double>(served) / n);
    text += figure;
  }
  return text;
}

// Connections the store's process can hold: its open-file limit, less a margin for its own files.
std::uint64_t store_connection_room() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return UINT64_MAX;
  return limit.rlim_cur > 64 ? limit.rlim_cur - 64 : 0;
}

// `watch`: whether the dead-node phase runs (each watching node: no second connection to the
// TCP store, a second session through etcd).
RunResult run(Nodes& nodes, int n, const RequestCounter& requests, bool watch) {
  RunResult result;
  const auto opening = Clock::now();
  result.failures = nodes.open();
  result.open_ms = ms_since(opening);
  if (result.failures > 0) return result;

  const auto requests_before = requests();
  const auto start = Clock::now();
  const JoinedSlice joined = nodes.join();
  result.failures = joined.failures;
  if (requests_before) {
    const auto after = requests();
    result.join_requests = per(after->total - requests_before->total, n);
    result.join_by_op = per_op(*requests_before, *after, n);
  }
  if (result.failures > 0) return result;
  result.join_ms = ms_between(start, joined.end);
  if (!watch) return result;

  // The survivors' requests count from the moment every watch is under way (n - 1 WAIT_DELETED
  // more; the victim goes kWatchSettle after that): watched from here, where the store is.
  const auto watches_before = requests();
  std::optional<RequestCount> requests_at_kill;
  std::atomic<bool> phase_over{false};
  std::jthread count_at_kill([&] {  // joined on every path, an exception's too
    if (!watches_before) return;
    const auto waits = [](const RequestCount& c) {
      const auto it = c.by_op.find("WAIT_DELETED");
      return it == c.by_op.end() ? std::uint64_t{0} : it->second;
    };
    while (!phase_over) {
      auto now = requests();
      if (waits(*now) - waits(*watches_before) >= static_cast<std::uint64_t>(n - 1)) {
        requests_at_kill = std::move(now);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // (each look asks the store)
    }
  });
  const WatchedSlice watched = nodes.watch(joined.victim);
  phase_over = true;
  count_at_kill.join();
  result.failures = watched.failures;
  result.ok = watched.ok;
  if (result.failures == 0 && watched.killed) {
    result.notice_ms = ms_between(*watched.killed, watched.noticed);
    result.regroup_ms = ms_between(*watched.killed, watched.regrouped);
  }
  // Store requests per survivor: constant in N means O(N) for the whole job.
  if (requests_at_kill) {
    const auto after = requests();
    result.regroup_requests = per(after->total - requests_at_kill->total, n - 1);
    result.regroup_by_op = per_op(*requests_at_kill, *after, n - 1);
  }
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
  std::optional<double> max_per_node, max_per_survivor, max_connections;
  int processes = 1;
  bool by_op = false;
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
  app.add_option("--max-connections-per-node", max_connections,
                 "TCP: exit 2 when a run opened more store connections per node than this (a "
                 "node's watch shares its session's connection)");
  app.add_option("--processes", processes,
                 "spread each run's nodes over this many processes (the store's process then "
                 "holds one end of each connection, not both: 16,000 nodes fit)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--by-op", by_op,
               "after each run's row, its store requests by operation (GET, ADD, ...)");
  // A child of --processes: its share of one run's nodes (not for use by hand).
  std::string slice;
  std::uint16_t port = 0;
  std::string run_id;
  app.add_option("--slice", slice)->group("");
  app.add_option("--port", port)->group("");
  app.add_option("--run-id", run_id)->group("");
  CLI11_PARSE(app, argc, argv);
  dist::store::raise_open_file_limit();  // before etcd starts: its members inherit it

  const bool elastic = mode == "elastic";
  EtcdTarget etcd;
  const auto parse_endpoints = [&] {
    std::stringstream items(etcd_endpoints);
    for (std::string item; std::getline(items, item, ',');) etcd.config.endpoints.push_back(item);
    etcd.config.prefix = "/rendezvous-bench";
    etcd.config.unavailable_timeout = kRunTimeout;
    etcd.lease_ttl = seconds(lease_ttl_seconds);
  };
  if (!slice.empty()) {
    const auto comma = slice.find(',');
    parse_endpoints();
    const Target target{backends.front(), port, etcd, run_id};
    NodeSlice nodes(target, sizes.front(), std::stoi(slice.substr(0, comma)),
                    std::stoi(slice.substr(comma + 1)), elastic);
    return serve_slice(nodes);
  }
  std::signal(SIGPIPE, SIG_IGN);  // a slice that died is told by its pipe's error, not a signal
  std::optional<dist::store::testing::EtcdCluster> cluster;
  if (std::find(backends.begin(), backends.end(), "etcd-v3") != backends.end()) {
    if (etcd_endpoints.empty()) {
      cluster.emplace(members);
      etcd_endpoints = cluster->endpoint_list();
    }
    parse_endpoints();
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
        Target target{backend, 0, etcd, run_id};
        std::optional<dist::store::StoreServerThread> store;
        if (backend == "tcp") {
          store.emplace();
          target.port = store->port();
        }
        const RequestCounter requests = [&]() -> std::optional<RequestCount> {
          if (!store) return std::nullopt;
          const auto stats = store->stats();
          return RequestCount{stats.requests,
                              {stats.requests_by_op.begin(), stats.requests_by_op.end()}};
        };
        RunResult result;
        {
          std::unique_ptr<Nodes> nodes;
          if (processes > 1) {
            nodes = std::make_unique<ChildNodes>(target, n, elastic, processes);
          } else {
            nodes = std::make_unique<LocalNodes>(target, n, elastic);
          }
          // A node's watch is a lane of its TCP session; through etcd, a session of its own.
          const std::uint64_t sessions = backend == "tcp" ? 1 : 2;
          const std::uint64_t needed = sessions * n * (processes > 1 ? 1 : 2);
          const bool watch = needed <= store_connection_room();
          if (!watch) {
            std::fprintf(stderr,
                         "rendezvous-bench: no dead-node phase at %d nodes: its watches need %llu "
                         "connections in the store's process, above its open-file limit (%llu, "
                         "ulimit -Hn; --processes halves what one process holds)\n",
                         n, static_cast<unsigned long long>(needed),
                         static_cast<unsigned long long>(store_connection_room() + 64));
          }
          try {
            result = run(*nodes, n, requests, watch);
          } catch (const std::exception& e) {  // a slice that died: the run failed
            std::fprintf(stderr, "%s\n", e.what());
            result.failures = std::max(result.failures, 1);
          }
        }  // the nodes' sessions end before their store
        print_row(backend, n, std::to_string(r), result, elastic,
                  result.notice_ms ? std::to_string(result.ok) + "/" + std::to_string(n - 1) : "-",
                  std::to_string(result.failures));
        if (by_op && !result.join_by_op.empty()) {
          std::printf("  requests per node in the join: %s\n", result.join_by_op.c_str());
        }
        if (by_op && !result.regroup_by_op.empty()) {
          std::printf("  requests per survivor from the loss to the next round: %s\n",
                      result.regroup_by_op.c_str());
        }
        if (store) result.connections = per(store->stats().connections_total, n);
        if (by_op && store) {
          const auto stats = store->stats();
          std::printf("  the store: %llu connections, %llu refused, %llu timed out\n",
                      static_cast<unsigned long long>(stats.connections_total),
                      static_cast<unsigned long long>(stats.connections_rejected),
                      static_cast<unsigned long long>(stats.connections_timed_out));
        }
        runs[{backend, n}].push_back(result);
        // A run fails where a node failed, or a survivor did not see the lost node (or regroup).
        if (result.failures > 0 || (result.notice_ms && result.ok != n - 1)) ++failed_runs;
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
                 "rounds costs every node more of the store (issue 46: each request a round "
                 "makes is said in the code where it is made)\n",
                 what, *value, n, *bound);
    above = true;
  };
  for (const auto& [key, results] : runs) {
    for (const auto& r : results) {
      check(r.join_requests, max_per_node, "requests per node", key.second);
      check(r.regroup_requests, max_per_survivor, "requests per survivor", key.second);
      check(r.connections, max_connections, "store connections per node", key.second);
    }
  }
  return above ? 2 : 0;
}
