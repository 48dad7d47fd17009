// --restart-policy in-place through the real dist-launch, with workers on the SDK's recovery
// (dist-inplace-worker): one failed worker is replaced alone while the survivors keep their
// processes and receive no signal; every rank ends with the digest of a run without failures; a
// failure during the recovery, or several at once, restart the whole group, saying why; each
// replacement counts against --max-restarts; the event log and the report say what happened. The
// same across two static nodes (two agents on this machine, the store on 127.0.0.2): the other
// node's workers keep running, and every node counts every node's replacements; and across two
// nodes of elastic rendezvous, whose verdict counts the replacements with the restarts.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "process_helpers.h"
#include "programs.h"
#include "test_ports.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using dist::agent::testing::Child;
using Json = nlohmann::json;

const std::string kWorker = DIST_INPLACE_WORKER_BIN;

class InPlace : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dist-inplace-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // What a test does while both nodes of a job run (their agents, by node).
  using Meanwhile = std::function<void(std::vector<std::unique_ptr<Child>>&)>;

  // A job of `nproc` workers, in-place, its worker files in `out` (made here), its event log
  // `out`.jsonl, `launcher_args` added to dist-launch's. Returns the exit code; the output in
  // `output`.
  int run(const std::string& out, int nproc, int max_restarts,
          const std::vector<std::string>& worker_args, std::string* output = nullptr,
          const std::vector<std::string>& launcher_args = {}) {
    const auto agent = start(out, nproc, max_restarts, worker_args, launcher_args);
    const int code = agent->wait(120s);
    if (output) *output = agent->output();
    return code;
  }
  // The same job, started: the caller waits for it.
  std::unique_ptr<Child> start(const std::string& out, int nproc, int max_restarts,
                               const std::vector<std::string>& worker_args,
                               const std::vector<std::string>& launcher_args = {}) {
    fs::create_directories(dir_ / out);
    std::vector<std::string> args = {"--nproc-per-node", std::to_string(nproc),
                                     "--max-restarts",   std::to_string(max_restarts),
                                     "--restart-policy", "in-place",
                                     "--event-log",      path(out + ".jsonl")};
    args.insert(args.end(), launcher_args.begin(), launcher_args.end());
    args.insert(args.end(), {"--no-python", kWorker, "--out", path(out)});
    args.insert(args.end(), worker_args.begin(), worker_args.end());
    return std::make_unique<Child>(DIST_LAUNCH_BIN, args, dir_ / (out + ".log"),
                                   std::map<std::string, std::string>{},
                                   std::vector<std::string>{"OMP_NUM_THREADS"});
  }
  // The pid rank `rank` wrote as it started in generation 0 of attempt 0 (within 60 s), else -1.
  long started_pid(const std::string& out, int rank) const {
    long pid = -1;
    dist::agent::testing::eventually(
        [&] {
          pid = start_pid(out, rank, 0, 0);
          return pid > 0;
        },
        60s);
    return pid;
  }

  std::string read(const std::string& file) const {
    std::ifstream in(path(file));
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  struct Final {
    long pid = -1;
    int step = -1;
    std::string digest;
    int generation = -1;
    int world = -1;  // the world of the end (a regrouped job's may differ from its start's)
  };
  std::optional<Final> final_of(const std::string& out, int rank) const {
    std::istringstream in(read(out + "/final_" + std::to_string(rank)));
    Final f;
    if (!(in >> f.pid >> f.step >> f.digest >> f.generation >> f.world)) return std::nullopt;
    return f;
  }
  long start_pid(const std::string& out, int rank, int attempt, int generation) const {
    long pid = -1;
    std::istringstream(read(out + "/start_" + std::to_string(rank) + "_" + std::to_string(attempt) +
                            "_" + std::to_string(generation))) >>
        pid;
    return pid;
  }
  bool any_signal_file(const std::string& out) const {
    for (const auto& entry : fs::directory_iterator(dir_ / out)) {
      if (entry.path().filename().string().starts_with("signal_")) return true;
    }
    return false;
  }
  // Job `out`'s events named `name` (every event, in order, when empty).
  std::vector<Json> events(const std::string& out, const std::string& name) const {
    std::vector<Json> found;
    std::ifstream in(path(out + ".jsonl"));
    std::string line;
    while (std::getline(in, line)) {
      Json e = Json::parse(line);
      if (name.empty() || e["event"] == name) found.push_back(std::move(e));
    }
    return found;
  }

  // The digest every rank of a run without a failure ends with.
  std::string clean_digest(int nproc, const std::vector<std::string>& args) {
    std::string output;
    EXPECT_EQ(run("clean", nproc, 0, args, &output), 0) << output;
    const auto f = final_of("clean", 0);
    EXPECT_TRUE(f.has_value()) << output;
    return f ? f->digest : "";
  }

  // Two agents of nproc_per_node_ in-place workers each (one unless the test says), on this
  // machine; `where(node)` gives each its rendezvous flags. With `first_hosts`, the first is waited
  // for until it hosts the store, so that the other joins as its client. Returns their exit codes,
  // their outputs in `outputs`.
  std::vector<int> run_two_nodes(const std::string& out, int max_restarts,
                                 const std::vector<std::string>& worker_args,
                                 std::vector<std::string>& outputs,
                                 const std::function<std::vector<std::string>(int)>& where,
                                 bool first_hosts, const Meanwhile& meanwhile = {}) {
    fs::create_directories(dir_ / out);
    std::vector<std::unique_ptr<Child>> agents;
    for (const int node : {0, 1}) {
      const std::string name = out + "_node" + std::to_string(node);
      std::vector<std::string> args = where(node);
      args.insert(args.end(),
                  {"--nproc-per-node", std::to_string(nproc_per_node_), "--max-restarts",
                   std::to_string(max_restarts), "--restart-policy", "in-place", "--event-log",
                   path(name + ".jsonl"), "--no-python", kWorker, "--out", path(out)});
      args.insert(args.end(), worker_args.begin(), worker_args.end());
      agents.push_back(std::make_unique<Child>(DIST_LAUNCH_BIN, args, dir_ / (name + ".log"),
                                               std::map<std::string, std::string>{},
                                               std::vector<std::string>{"OMP_NUM_THREADS"}));
      if (node == 0 && first_hosts) {
        EXPECT_TRUE(dist::agent::testing::eventually(
            [&] {
              return agents[0]->output().find("hosting the rendezvous store") != std::string::npos;
            },
            30s))
            << agents[0]->output();
      }
    }
    if (meanwhile) meanwhile(agents);
    std::vector<int> codes;
    outputs.clear();
    for (auto& agent : agents) {
      codes.push_back(agent->wait(120s));
      outputs.push_back(agent->output());
    }
    return codes;
  }

  // Every rank of job `out`, a world of `world`, ended at `clean` (in generation `generation`,
  // unless -1); the ranks in `kept` with the process they started with, the others replaced.
  // `log` is shown on a failure.
  void expect_ranks_at(const std::string& out, int world, const std::string& clean,
                       const std::vector<int>& kept, int generation, const std::string& log) const {
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE("rank " + std::to_string(rank));
      const auto f = final_of(out, rank);
      ASSERT_TRUE(f.has_value()) << log;
      EXPECT_EQ(f->digest, clean) << log;
      if (generation >= 0) {
        EXPECT_EQ(f->generation, generation);
      }
      const bool was_kept = std::find(kept.begin(), kept.end(), rank) != kept.end();
      EXPECT_EQ(f->pid == start_pid(out, rank, 0, 0), was_kept) << log;
    }
  }

  // Holds the agent (SIGSTOP), SIGKILLs `pids` and waits until each can be reaped (a zombie whose
  // threads have all exited: its leader is a zombie before them), then continues the agent: its
  // next reaping finds them all, one batch.
  // Stops the agent (every thread of it: a SIGSTOP is only queued when kill() returns), then
  // SIGKILLs `pids`: to the agent they died at once, however long this process was preempted
  // between its kill() calls. The agent is left stopped.
  static void hold_and_kill(const Child& agent, const std::vector<long>& pids) {
    ::kill(agent.pid(), SIGSTOP);
    const fs::path tasks = "/proc/" + std::to_string(agent.pid()) + "/task";
    EXPECT_TRUE(dist::agent::testing::eventually(
        [&] {
          std::error_code ec;
          for (const auto& task : fs::directory_iterator(tasks, ec)) {
            const auto t = dist::agent::testing::process_info(
                static_cast<pid_t>(std::stol(task.path().filename().string())));
            if (!t || t->state != 'T') return false;
          }
          return !ec;
        },
        10s))
        << "the agent never stopped";
    for (const long pid : pids) ::kill(static_cast<pid_t>(pid), SIGKILL);
  }

  // The workers `pids` SIGKILLed and exited before the agent runs again: it reaps them in one
  // batch.
  static void reap_together(const Child& agent, const std::vector<long>& pids) {
    hold_and_kill(agent, pids);
    for (const long pid : pids) {
      const fs::path tasks = "/proc/" + std::to_string(pid) + "/task";
      EXPECT_TRUE(dist::agent::testing::eventually(
          [&] {
            const auto p = dist::agent::testing::process_info(static_cast<pid_t>(pid));
            std::error_code ec;
            const auto threads = std::distance(fs::directory_iterator(tasks, ec), {});
            return p && p->state == 'Z' && !ec && threads == 1;
          },
          10s))
          << pid;
    }
    ::kill(agent.pid(), SIGCONT);
  }

  fs::path dir_;
  int nproc_per_node_ = 1;  // run_two_nodes'
};

TEST_F(InPlace, OneFailedWorkerIsReplacedAloneAndTheSurvivorsAreNotSignalled) {
  const std::string clean = clean_digest(3, {"--steps", "30"});
  std::string output;
  ASSERT_EQ(run("job", 3, 1, {"--steps", "30", "--crash", "1:10"}, &output), 0) << output;
  for (const int rank : {0, 2}) {  // the survivors: one process from start to end
    SCOPED_TRACE("rank " + std::to_string(rank));
    const auto f = final_of("job", rank);
    ASSERT_TRUE(f.has_value()) << output;
    EXPECT_EQ(f->pid, start_pid("job", rank, 0, 0)) << "the survivor kept its process";
    EXPECT_EQ(f->generation, 1);
    EXPECT_EQ(f->step, 30);
    EXPECT_EQ(f->digest, clean) << output;
  }
  const auto replaced = final_of("job", 1);
  ASSERT_TRUE(replaced.has_value()) << output;
  EXPECT_EQ(replaced->pid, start_pid("job", 1, 0, 1)) << "rank 1 ended as generation 1's process";
  EXPECT_NE(replaced->pid, start_pid("job", 1, 0, 0));
  EXPECT_EQ(replaced->digest, clean) << output;
  EXPECT_FALSE(any_signal_file("job")) << "no worker was sent SIGTERM or SIGINT:\n" << output;
  EXPECT_FALSE(fs::exists(path("job/start_0_1_0"))) << "no group restart";

  EXPECT_NE(output.find("replaced in place by pid " + std::to_string(replaced->pid) +
                        ": generation 1 (restart 1 of 1); ranks 0,2 keep running"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("dist-inplace-worker worker 1 FAILED, replaced in place"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("generation 1: the group is whole again"), std::string::npos) << output;
  EXPECT_NE(output.find("dist-sdk: rank 0 recovered in place: generation 1, state from rank 0 "
                        "(step=10)"),
            std::string::npos)
      << output;

  const auto restarts = events("job", "inplace_restart");
  ASSERT_EQ(restarts.size(), 1u);
  EXPECT_EQ(restarts[0]["rank"], 1);
  EXPECT_EQ(restarts[0]["local_rank"], 1);
  EXPECT_EQ(restarts[0]["generation"], 1);
  EXPECT_EQ(restarts[0]["exit_code"], 3);
  EXPECT_EQ(restarts[0]["new_pid"], replaced->pid);
  EXPECT_EQ(restarts[0]["survivors"], Json::array({0, 2}));
  EXPECT_EQ(restarts[0]["restarts"], 1);
  const auto recovered = events("job", "inplace_recovered");
  ASSERT_EQ(recovered.size(), 1u);
  EXPECT_EQ(recovered[0]["generation"], 1);
  EXPECT_EQ(recovered[0]["rank"], 1);
  EXPECT_EQ(recovered[0]["root"], 0);
  EXPECT_EQ(recovered[0]["first_step"], 10);
  EXPECT_GE(recovered[0]["stall_ms"].get<long>(), 0);
  EXPECT_TRUE(events("job", "restart").empty()) << "no group restart";
  const auto starts = events("job", "worker_start");
  ASSERT_EQ(starts.size(), 4u);
  EXPECT_EQ(starts[3]["rank"], 1);
  EXPECT_EQ(starts[3]["generation"], 1);
  const auto end = events("job", "job_end");
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0]["outcome"], "succeeded");
  EXPECT_EQ(end[0]["restarts"], 1);
}

// A worker held stopped (SIGSTOP) cannot go on until someone continues it, and its peers wait for
// it: proof from the agent's first looks, not after a hang timeout (30 s at least by default).
// It is ended and replaced alone; the job ends with the digest of a run without the stop.
TEST_F(InPlace, AWorkerHeldStoppedIsProofAndIsReplacedAloneWithinSeconds) {
  const std::vector<std::string> worker{"--steps", "200", "--step-ms", "20"};
  const std::string clean = clean_digest(2, worker);
  auto agent = start("job", 2, 1, worker);
  const long survivor = started_pid("job", 0), stopped = started_pid("job", 1);
  ASSERT_GT(stopped, 0) << agent->output();
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] { return agent->output().find("rank 1 step 5\n") != std::string::npos; }, 60s))
      << agent->output();
  ::kill(static_cast<pid_t>(stopped), SIGSTOP);
  ASSERT_EQ(agent->wait(120s), 0) << agent->output();
  const std::string out = agent->output();
  EXPECT_NE(out.find("rank 1 stopped (SIGSTOP or SIGTSTP): no progress until continued"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("replaced in place"), std::string::npos) << out;
  for (int rank = 0; rank < 2; ++rank) {
    const auto f = final_of("job", rank);
    ASSERT_TRUE(f.has_value()) << out;
    EXPECT_EQ(f->digest, clean) << "rank " << rank << "\n" << out;
  }
  EXPECT_EQ(final_of("job", 0)->pid, survivor) << "the survivor kept its process";
  const auto hangs = events("job", "hang");
  ASSERT_EQ(hangs.size(), 1u) << out;
  // Seen as it stood kStoppedProof (3 s), not after a hang timeout.
  EXPECT_GE(hangs[0]["silent_ms"].get<int>(), 3000) << hangs[0];
  EXPECT_LT(hangs[0]["silent_ms"].get<int>(), 20000) << hangs[0];
}

// Stops that are not faults: a stop continued within a moment, a debugger's (ptrace) stop held
// for longer than the proof's 3 s, and every worker of the node stopped together (a pause of the
// job) for as long. None is ended: with --max-restarts 0 an ended worker would fail the job.
TEST_F(InPlace, StopsThatAreNotFaultsAreLeftAlone) {
  auto agent = start("job", 2, 0, {"--steps", "300", "--step-ms", "20"});
  const pid_t first = static_cast<pid_t>(started_pid("job", 0));
  const pid_t second = static_cast<pid_t>(started_pid("job", 1));
  ASSERT_GT(second, 0) << agent->output();
  auto at_step = [&](int step) {
    return dist::agent::testing::eventually(
        [&] {
          return agent->output().find("rank 1 step " + std::to_string(step) + "\n") !=
                 std::string::npos;
        },
        60s);
  };
  ASSERT_TRUE(at_step(5)) << agent->output();
  ::kill(second, SIGSTOP);  // a moment's stop
  std::this_thread::sleep_for(500ms);
  ::kill(second, SIGCONT);

  ASSERT_TRUE(at_step(50)) << agent->output();
  // A debugger's stop: the tracee is in state t while the tracer holds it.
  bool traced = ::ptrace(PTRACE_SEIZE, second, nullptr, nullptr) == 0 &&
                ::ptrace(PTRACE_INTERRUPT, second, nullptr, nullptr) == 0;
  if (traced) {
    int status = 0;
    traced = ::waitpid(second, &status, __WALL) == second;
    std::this_thread::sleep_for(5s);
    ::ptrace(PTRACE_DETACH, second, nullptr, nullptr);
  }

  ASSERT_TRUE(at_step(100)) << agent->output();
  ::kill(first, SIGSTOP);  // the whole node's job paused
  ::kill(second, SIGSTOP);
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] { return agent->output().find("taken for a pause of the job") != std::string::npos; },
      30s))
      << agent->output();
  ::kill(first, SIGCONT);
  ::kill(second, SIGCONT);

  ASSERT_EQ(agent->wait(120s), 0) << agent->output();
  const std::string out = agent->output();
  EXPECT_EQ(out.find("held stopped for"), std::string::npos) << out;
  // The stops it said are said to be over too (the log ended on "held stopped").
  for (const pid_t pid : {first, second}) {
    EXPECT_NE(out.find("pid " + std::to_string(pid) + ") runs again (seen stopped for"),
              std::string::npos)
        << out;
  }
  EXPECT_EQ(out.find("SIGKILL"), std::string::npos) << out;
  EXPECT_TRUE(events("job", "hang").empty()) << out;
  EXPECT_EQ(final_of("job", 1)->pid, second);
  if (!traced) GTEST_SKIP() << "ptrace is not allowed here: the debugger's stop was not tried";
}

// One survivor lives through 100 recoveries (rank 1 fails every 5 steps, each replacement too):
// its threads and open descriptors are what they were after the first, its resident memory
// within 5% of it, and the workers' store holds about as many keys as after the first recovery
// (each generation's Gloo addresses, records and arrivals deleted once every rank is past them,
// a peer's of the moment aside). The
// job ends with the digest of a run without failures.
TEST_F(InPlace, OneSurvivorLivesThroughAHundredRecoveriesWithFlatResourcesAndStore) {
  const std::string clean = clean_digest(2, {"--steps", "501"});
  const std::vector<std::string> soak{"--steps", "501",         "--crash-every",
                                      "1:5",     "--resources", path("resources")};
  std::string out;
  ASSERT_EQ(run("job", 2, 200, soak, &out), 0) << out;
  for (int rank = 0; rank < 2; ++rank) {
    const auto f = final_of("job", rank);
    ASSERT_TRUE(f.has_value()) << out;
    EXPECT_EQ(f->digest, clean) << "rank " << rank;
    EXPECT_EQ(f->generation, 100) << out;
  }
  EXPECT_EQ(final_of("job", 0)->pid, start_pid("job", 0, 0, 0)) << "one survivor throughout";
  struct Reading {
    int generation;
    long rss_kb, threads, fds, keys, bytes;
  };
  std::vector<Reading> readings;
  std::ifstream in(path("resources"));
  for (Reading r{}; in >> r.generation >> r.rss_kb >> r.threads >> r.fds >> r.keys >> r.bytes;) {
    readings.push_back(r);
  }
  ASSERT_EQ(readings.size(), 101u) << read("resources");
  const Reading& first = readings[1];  // after the first recovery: what every later one keeps
  // A sanitized worker's allocator keeps freed memory in quarantine: its RSS says nothing here.
  const bool sanitized = std::getenv("DIST_TEST_PROGRAMS") != nullptr;
  for (const Reading& r : readings) {
    if (r.generation < 1) continue;
    EXPECT_EQ(r.threads, first.threads) << "generation " << r.generation;
    EXPECT_EQ(r.fds, first.fds) << "generation " << r.generation;
    // Bounded, not growing: at most a peer's own mesh keys of the moment (rank 1 deletes its
    // after its first collective, which may end just after rank 0 counts), where keeping a
    // generation's keys would add 11 keys and ~400 bytes each time.
    EXPECT_LE(r.keys, first.keys + 2) << "generation " << r.generation;
    EXPECT_LE(r.bytes, first.bytes + 1024) << "generation " << r.generation;
    if (!sanitized) {
      EXPECT_LE(r.rss_kb, first.rss_kb * 105 / 100) << "generation " << r.generation;
    }
  }
}

TEST_F(InPlace, AFailureDuringTheRecoveryRestartsTheWholeGroup) {
  const std::string clean = clean_digest(2, {"--steps", "20"});
  std::string output;
  // Rank 1 fails at step 5; rank 0 fails in turn once it has read generation 1 (the agent is then
  // REPLACING, and the group has not recovered: rank 0 is the root it waits for).
  ASSERT_EQ(
      run("job", 2, 2, {"--steps", "20", "--crash", "1:5", "--fail-in-recovery", "0"}, &output), 0)
      << output;
  EXPECT_NE(output.find("worker 0 failed during the in-place recovery of worker 1 (generation 1): "
                        "restarting the whole group"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("restarting the worker group (restart 2 of 2)"), std::string::npos)
      << output;
  const auto fallback = events("job", "inplace_fallback");
  ASSERT_EQ(fallback.size(), 1u);
  EXPECT_EQ(fallback[0]["generation"], 1);
  ASSERT_EQ(events("job", "restart").size(), 1u);
  EXPECT_TRUE(events("job", "inplace_recovered").empty());
  for (const int rank : {0, 1}) {  // attempt 1: both fresh, both at the clean digest
    const auto f = final_of("job", rank);
    ASSERT_TRUE(f.has_value()) << output;
    EXPECT_EQ(f->pid, start_pid("job", rank, 1, 0));
    EXPECT_EQ(f->digest, clean);
  }
}

// The same on one node of three workers: rank 2 fails in turn once it has read generation 1, while
// rank 0 keeps its state. The failure is folded into the recovery under way: generation 2 replaces
// ranks 1 and 2 and supersedes generation 1, whose set-up rank 0 and rank 1's replacement give up
// for it. No group restart; rank 0 keeps its process; every rank ends at the clean digest.
TEST_F(InPlace, AFailureDuringTheRecoveryIsFoldedIntoItWhileAWorkerKeepsItsState) {
  const std::string clean = clean_digest(3, {"--steps", "20"});
  std::string output;
  ASSERT_EQ(
      run("job", 3, 2, {"--steps", "20", "--crash", "1:5", "--fail-in-recovery", "2"}, &output), 0)
      << output;
  EXPECT_NE(output.find("worker 2 (local rank 2) replaced in place by pid "), std::string::npos)
      << output;
  EXPECT_NE(output.find(": generation 2 (restart 2 of 2), folded into the recovery under way "
                        "(generation 1, which it supersedes: ranks 1,2 replaced); rank 0 keeps "
                        "running"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("in-place: generation 1 was superseded by generation 2"), std::string::npos)
      << output;
  EXPECT_NE(output.find("generation 2: the group is whole again"), std::string::npos) << output;
  expect_ranks_at("job", 3, clean, {0}, 2, output);
  for (const int rank : {1, 2}) {  // replaced as generation 2's processes
    const auto f = final_of("job", rank);
    EXPECT_TRUE(f && f->pid == start_pid("job", rank, 0, 2)) << output;
  }
  EXPECT_FALSE(fs::exists(path("job/start_0_1_0"))) << "no group restart";
  EXPECT_FALSE(any_signal_file("job")) << output;
  EXPECT_TRUE(events("job", "restart").empty());
  EXPECT_TRUE(events("job", "inplace_fallback").empty());
  const auto restarts = events("job", "inplace_restart");
  ASSERT_EQ(restarts.size(), 2u);
  EXPECT_EQ(restarts[1]["rank"], 2);
  EXPECT_EQ(restarts[1]["generation"], 2);
  EXPECT_EQ(restarts[1]["supersedes"], 1);
  EXPECT_EQ(restarts[1]["survivors"], Json::array({0}));
  const auto recovered = events("job", "inplace_recovered");
  ASSERT_EQ(recovered.size(), 1u);
  EXPECT_EQ(recovered[0]["generation"], 2);
}

// The replacement itself dies as it starts (before it joins its generation): its failure is folded
// into the recovery too, and a second replacement of the same rank, generation 2, recovers the
// group; the survivors keep their processes.
TEST_F(InPlace, AReplacementDyingAsItStartsIsReplacedAgainInTheSameRecovery) {
  const std::string clean = clean_digest(3, {"--steps", "20"});
  std::string output;
  ASSERT_EQ(
      run("job", 3, 2, {"--steps", "20", "--crash", "1:5", "--fail-at-start", "1:1"}, &output), 0)
      << output;
  EXPECT_NE(output.find(": generation 2 (restart 2 of 2), folded into the recovery under way "
                        "(generation 1, which it supersedes: rank 1 replaced); ranks 0,2 keep "
                        "running"),
            std::string::npos)
      << output;
  expect_ranks_at("job", 3, clean, {0, 2}, 2, output);
  EXPECT_TRUE(events("job", "restart").empty()) << output;
  EXPECT_TRUE(events("job", "inplace_fallback").empty()) << output;
  EXPECT_EQ(events("job", "inplace_restart").size(), 2u);
}

// A replacement that dies between publishing its addresses and connecting to its peers (the SDK's
// fault injection: nothing else places a death in that window). A survivor on the listening side
// of its pair with it (the lower port listens: chance) waited for a connection that never came,
// five times the group's timeout, and the agent restarted the group when its --in-place-timeout
// passed. Now the agent folds the failure into generation 2 and each survivor gives up the set-up
// that generation supersedes at once: no restart, no fallback, the survivors keep their processes.
// Four survivors, so that one of them listens but once in 16 runs.
TEST_F(InPlace, AReplacementDyingBetweenPublishingItsAddressesAndConnectingIsFoldedAtOnce) {
  const std::string clean = clean_digest(5, {"--steps", "20"});
  std::string output;
  ASSERT_EQ(run("job", 5, 2, {"--steps", "20", "--crash", "4:5", "--exit-after-publishing", "4:1"},
                &output, {"--in-place-timeout", "60"}),
            0)
      << output;
  EXPECT_NE(output.find("exiting after publishing this rank's addresses"), std::string::npos)
      << output;
  EXPECT_NE(output.find(": generation 2 (restart 2 of 2), folded into the recovery under way "
                        "(generation 1, which it supersedes: rank 4 replaced); ranks 0,1,2,3 "
                        "keep running"),
            std::string::npos)
      << output;
  expect_ranks_at("job", 5, clean, {0, 1, 2, 3}, 2, output);
  const auto f = final_of("job", 4);
  EXPECT_TRUE(f && f->pid == start_pid("job", 4, 0, 2)) << output;
  EXPECT_FALSE(fs::exists(path("job/start_0_1_0"))) << "no group restart";
  EXPECT_TRUE(events("job", "restart").empty()) << output;
  EXPECT_TRUE(events("job", "inplace_fallback").empty()) << output;
  const auto recovered = events("job", "inplace_recovered");
  ASSERT_EQ(recovered.size(), 1u) << output;
  EXPECT_EQ(recovered[0]["generation"], 2);
}

// A recovery that never ends: the survivors and the replacement all stop for good where their
// recovery begins (nothing fails, nothing says it recovered). --in-place-timeout bounds the wait:
// 3 s after the generation is published the agent restarts the whole group, saying why, and the
// next attempt trains to the digest of a run without failures. (It was a constant of 5 minutes.)
TEST_F(InPlace, ARecoveryThatNeverEndsRestartsTheGroupAfterTheInPlaceTimeout) {
  const std::string clean = clean_digest(2, {"--steps", "20"});
  std::string output;
  const auto began = std::chrono::steady_clock::now();
  ASSERT_EQ(run("job", 2, 2, {"--steps", "20", "--crash", "1:5", "--stall-in-recovery"}, &output,
                {"--in-place-timeout", "3"}),
            0)
      << output;
  const auto took = std::chrono::steady_clock::now() - began;
  EXPECT_LT(took, 100s) << "the recovery's wait was bounded by --in-place-timeout, not 300 s";
  EXPECT_NE(output.find("rank 0: stalling as its recovery begins"), std::string::npos) << output;
  // The workers were told the timeout (the SDK bounds its wait for the new group by it).
  EXPECT_NE(
      output.find("rank 1: stalling as it starts as a replacement (in-place timeout 3000 ms)"),
      std::string::npos)
      << output;
  EXPECT_NE(output.find("the in-place recovery of generation 1 failed: the group did not say it "
                        "recovered within 3 s (--in-place-timeout) of generation 1"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("restarting the worker group (restart 2 of 2)"), std::string::npos)
      << output;
  const auto fallback = events("job", "inplace_fallback");
  ASSERT_EQ(fallback.size(), 1u) << output;
  EXPECT_EQ(fallback[0]["generation"], 1);
  EXPECT_EQ(events("job", "restart").size(), 1u);
  for (const int rank : {0, 1}) {  // attempt 1: both fresh, both at the clean digest
    const auto f = final_of("job", rank);
    ASSERT_TRUE(f.has_value()) << output;
    EXPECT_EQ(f->pid, start_pid("job", rank, 1, 0));
    EXPECT_EQ(f->digest, clean);
  }
}

// A worker that crashes at exit once every other worker of the job has finished (each reaped
// already) has nobody to rejoin: it is not replaced, and the job ends done, with the weights it
// trained, rather than waiting out --in-place-timeout for a group that is gone and then training
// everything again from the start (what a torch job under dist_launch.elastic did: 371 s against
// 36 s uninterrupted, issue 43).
TEST_F(InPlace, AWorkerCrashingAtExitAfterTheOthersFinishedEndsTheJobDone) {
  const std::string clean = clean_digest(2, {"--steps", "20"});
  std::string output;
  ASSERT_EQ(run("job", 2, 1, {"--steps", "20", "--crash-at-exit", "1:after"}, &output), 0)
      << output;
  EXPECT_NE(output.find("rank 1: crashing at exit"), std::string::npos) << output;
  EXPECT_NE(output.find("worker 1 (local rank 1) failed after every other worker of the job had "
                        "finished: nothing is left to recover in place, and the job is done"),
            std::string::npos)
      << output;
  EXPECT_FALSE(fs::exists(path("job/born_1_0_1"))) << "no replacement:\n" << output;
  EXPECT_FALSE(fs::exists(path("job/born_0_1_0"))) << "no group restart:\n" << output;
  for (const int rank : {0, 1}) {
    const auto f = final_of("job", rank);
    ASSERT_TRUE(f.has_value()) << output;
    EXPECT_EQ(f->digest, clean);
  }
  EXPECT_TRUE(events("job", "inplace_restart").empty());
  EXPECT_TRUE(events("job", "restart").empty());
  const auto done = events("job", "inplace_job_done");
  ASSERT_EQ(done.size(), 1u) << output;
  EXPECT_EQ(done[0]["rank"], 1);
  const auto end = events("job", "job_end");
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0]["outcome"], "succeeded");
}

// A world of one has no other worker to have finished: its worker's failure is never taken for
// the job's end (it has nobody to recover from either, so the group restarts).
TEST_F(InPlace, AWorldOfOnesFailureIsNeverTakenForTheJobsEnd) {
  const std::string clean = clean_digest(1, {"--steps", "20"});
  std::string output;
  ASSERT_EQ(run("job", 1, 2, {"--steps", "20", "--crash", "0:5"}, &output), 0) << output;
  EXPECT_EQ(output.find("the job is done"), std::string::npos) << output;
  EXPECT_TRUE(events("job", "inplace_job_done").empty()) << output;
  EXPECT_EQ(events("job", "restart").size(), 1u) << output;
  const auto f = final_of("job", 0);
  ASSERT_TRUE(f.has_value()) << output;
  EXPECT_EQ(f->digest, clean);
}

// The same crash while the other worker is still on its way out: rank 1 is replaced, and rank 0
// finishes after that (it waits for the replacement's start). The replacement, which waits for a
// group whose last member is gone, is stopped then, and the job ends done.
TEST_F(InPlace, AReplacementWhosePeersHaveAllFinishedIsStoppedAndTheJobEndsDone) {
  std::string output;
  const auto began = std::chrono::steady_clock::now();
  ASSERT_EQ(run("job", 2, 1, {"--steps", "20", "--crash-at-exit", "1:before"}, &output), 0)
      << output;
  EXPECT_LT(std::chrono::steady_clock::now() - began, 100s) << "not --in-place-timeout's 300 s";
  EXPECT_TRUE(fs::exists(path("job/born_1_0_1"))) << "rank 1 was replaced:\n" << output;
  EXPECT_NE(output.find("worker 1 (local rank 1) failed and every other worker of the job has "
                        "finished since: its replacement is stopped: nothing is left to recover "
                        "in place, and the job is done"),
            std::string::npos)
      << output;
  EXPECT_FALSE(fs::exists(path("job/born_0_1_0"))) << "no group restart:\n" << output;
  EXPECT_EQ(events("job", "inplace_restart").size(), 1u);
  EXPECT_TRUE(events("job", "restart").empty());
  ASSERT_EQ(events("job", "inplace_job_done").size(), 1u) << output;
  const auto end = events("job", "job_end");
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0]["outcome"], "succeeded");
}

TEST_F(InPlace, EveryReplacementCountsAgainstMaxRestarts) {
  // Rank 1 fails at step 5, then its replacement at step 12.
  const std::vector<std::string> twice = {"--steps", "20", "--crash", "1:5", "--crash", "1:12:1"};
  std::string output;
  EXPECT_EQ(run("one", 2, 1, twice, &output), 3) << "one restart: the second failure ends the job";
  // The replacement fails seven steps into generation 1: on a slow machine (TSan) that can come
  // before the agent has heard that generation 1 recovered, a failure during the recovery.
  const bool after = output.find(
                         "worker 1 failed: no restart left (--max-restarts 1, 1 used in "
                         "place)") != std::string::npos;
  const bool during = output.find(
                          "worker 1 failed during the in-place recovery of worker 1 "
                          "(generation 1): no restart left (--max-restarts 1, 1 used in "
                          "place)") != std::string::npos;
  EXPECT_TRUE(after || during) << output;
  EXPECT_NE(output.find("dist-inplace-worker FAILED"), std::string::npos) << output;
  EXPECT_NE(output.find("Replaced in place before (the job went on):"), std::string::npos)
      << output;
  EXPECT_NE(output.find("recovery  : replaced in place by pid"), std::string::npos) << output;
  EXPECT_EQ(events("one", "inplace_restart").size(), 1u);
  const auto end = events("one", "job_end");
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0]["restarts"], 1);

  const std::string clean = clean_digest(2, {"--steps", "20"});
  EXPECT_EQ(run("two", 2, 2, twice, &output), 0) << output;
  const auto restarts = events("two", "inplace_restart");
  // As above, on a slow machine (TSan) the second failure can come during generation 1's
  // recovery: then the whole group restarts (the second restart), and ends clean all the same.
  if (output.find("worker 1 failed during the in-place recovery of worker 1") !=
      std::string::npos) {
    EXPECT_EQ(restarts.size(), 1u) << output;
    EXPECT_NE(output.find("restarting the worker group (restart 2 of 2)"), std::string::npos)
        << output;
    for (const int rank : {0, 1}) {
      const auto f = final_of("two", rank);
      ASSERT_TRUE(f) << output;
      EXPECT_EQ(f->digest, clean);
    }
    return;
  }
  ASSERT_EQ(restarts.size(), 2u) << output;
  EXPECT_EQ(restarts[1]["generation"], 2);
  EXPECT_EQ(restarts[1]["restarts"], 2);
  const auto f0 = final_of("two", 0), f1 = final_of("two", 1);
  ASSERT_TRUE(f0 && f1) << output;
  EXPECT_EQ(f0->pid, start_pid("two", 0, 0, 0)) << "rank 0 kept its process through both";
  EXPECT_EQ(f0->generation, 2);
  EXPECT_EQ(f1->pid, start_pid("two", 1, 0, 2));
  EXPECT_EQ(f0->digest, clean);
  EXPECT_EQ(f1->digest, clean);
}

// Two of three workers failing at the same step are replaced in place, rank 0 keeping its
// process, whether they are reaped in one batch (one generation replaces both), or apart (the
// second is folded into the first's recovery: after its generation was counted, or queued while
// it was being counted). Every rank ends at the digest of a run without failures.
TEST_F(InPlace, SeveralWorkersFailingTogetherAreReplacedInPlaceWhetherReapedTogetherOrApart) {
  const std::string clean = clean_digest(3, {"--steps", "20"});
  std::string output;
  ASSERT_EQ(run("job", 3, 2, {"--steps", "20", "--crash", "1:5", "--crash", "2:5"}, &output), 0)
      << output;
  const bool together = output.find(
                            "generation 1 (restart 2 of 2) with ranks 1,2; rank 0 keeps "
                            "running") != std::string::npos;
  const bool folded = output.find(
                          "folded into the recovery under way (generation 1, which it supersedes: "
                          "ranks 1,2 replaced)") != std::string::npos;
  EXPECT_NE(together, folded) << output;
  EXPECT_TRUE(events("job", "inplace_fallback").empty()) << output;
  EXPECT_TRUE(events("job", "restart").empty()) << output;
  EXPECT_EQ(events("job", "inplace_restart").size(), 2u) << output;
  expect_ranks_at("job", 3, clean, {0}, -1, output);
}

// The agent held (SIGSTOP) while two of its workers are killed reaps both in one batch when
// continued: one generation replaces both, rank 0 keeping its process and giving them its state.
// Both count against --max-restarts. (Before: "2 workers failed at once: restarting the whole
// group".)
TEST_F(InPlace, TwoWorkersReapedInOneBatchAreReplacedTogetherInOneGeneration) {
  const std::vector<std::string> worker{"--steps", "200", "--step-ms", "10"};
  const std::string clean = clean_digest(3, worker);
  auto agent = start("job", 3, 2, worker);
  const long one = started_pid("job", 1), two = started_pid("job", 2);
  ASSERT_TRUE(one > 0 && two > 0) << agent->output();
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] { return agent->output().find("rank 2 step 5\n") != std::string::npos; }, 60s))
      << agent->output();
  reap_together(*agent, {one, two});
  ASSERT_EQ(agent->wait(120s), 0) << agent->output();
  const std::string out = agent->output();
  for (const int rank : {1, 2}) {
    EXPECT_NE(out.find("worker " + std::to_string(rank) + " (local rank " + std::to_string(rank) +
                       ") replaced in place by pid"),
              std::string::npos)
        << out;
  }
  EXPECT_NE(out.find("generation 1 (restart 2 of 2) with ranks 1,2; rank 0 keeps running"),
            std::string::npos)
      << out;
  EXPECT_TRUE(events("job", "restart").empty()) << out;
  EXPECT_TRUE(events("job", "inplace_fallback").empty()) << out;
  const auto restarts = events("job", "inplace_restart");
  ASSERT_EQ(restarts.size(), 2u) << out;
  for (const auto& r : restarts) EXPECT_EQ(r["generation"], 1) << out;
  expect_ranks_at("job", 3, clean, {0}, 1, out);
  for (const int rank : {1, 2}) {
    EXPECT_EQ(final_of("job", rank)->pid, start_pid("job", rank, 0, 1)) << "generation 1's";
  }
  const auto end = events("job", "job_end");
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0]["restarts"], 2);
}

// Failures reaped together that cannot be replaced in place restart the whole group, saying why:
// every worker (none kept its state), or more workers than restarts are left for.
TEST_F(InPlace, FailuresReapedTogetherThatCannotBeReplacedRestartTheGroupSayingWhy) {
  const std::vector<std::string> worker{"--steps", "200", "--step-ms", "10"};
  struct Case {
    int nproc, max_restarts;
    std::string why;
  };
  for (const Case& c : {Case{2, 2,
                             "2 workers failed at once, every worker of the group (none kept its "
                             "state to recover from): restarting the whole group"},
                        Case{3, 1,
                             "2 workers failed at once, more than the restarts left for "
                             "replacing them (1): restarting the whole group"}}) {
    const std::string out_dir = "job" + std::to_string(c.nproc);
    auto agent = start(out_dir, c.nproc, c.max_restarts, worker);
    const long zero = started_pid(out_dir, 0), one = started_pid(out_dir, 1);
    ASSERT_TRUE(zero > 0 && one > 0) << agent->output();
    ASSERT_TRUE(dist::agent::testing::eventually(
        [&] { return agent->output().find("rank 1 step 5\n") != std::string::npos; }, 60s))
        << agent->output();
    reap_together(*agent, {zero, one});
    ASSERT_EQ(agent->wait(120s), 0) << agent->output();
    const std::string out = agent->output();
    EXPECT_NE(out.find(c.why), std::string::npos) << out;
    EXPECT_EQ(out.find("replaced in place by pid"), std::string::npos) << out;
    EXPECT_EQ(events(out_dir, "restart").size(), 1u) << out;
    const auto fallback = events(out_dir, "inplace_fallback");
    ASSERT_EQ(fallback.size(), 1u) << out;
    EXPECT_NE(c.why.find(fallback[0]["reason"].get<std::string>()), std::string::npos)
        << fallback[0];
    const std::string clean = clean_digest(c.nproc, worker);
    std::vector<int> ranks(static_cast<std::size_t>(c.nproc));
    for (int rank = 0; rank < c.nproc; ++rank) ranks[static_cast<std::size_t>(rank)] = rank;
    for (const int rank : ranks) {
      const auto f = final_of(out_dir, rank);
      ASSERT_TRUE(f.has_value()) << out;
      EXPECT_EQ(f->digest, clean) << "rank " << rank << "\n" << out;
      EXPECT_EQ(f->pid, start_pid(out_dir, rank, 1, 0)) << "attempt 1's worker";
    }
  }
}

// Every worker SIGKILLed at once, the agent running as they die (not held until they are zombies:
// the kernel ends them one after the other, and each exit is reaped as it comes): one failure of
// the whole group, restarted
// once. The first exit used to be replaced in place alone (its restart spent, "rank 1 keeps
// running" of a dead rank), then the second ended the job: no restart left.
TEST_F(InPlace, EveryWorkerKilledAtOnceWhileTheAgentRunsIsOneGroupRestart) {
  const std::vector<std::string> worker{"--steps", "200", "--step-ms", "10"};
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    const std::string out_dir = "run" + std::to_string(run);
    auto agent = start(out_dir, 2, 1, worker);
    const long zero = started_pid(out_dir, 0), one = started_pid(out_dir, 1);
    ASSERT_TRUE(zero > 0 && one > 0) << agent->output();
    ASSERT_TRUE(dist::agent::testing::eventually(
        [&] { return agent->output().find("rank 1 step 5\n") != std::string::npos; }, 60s))
        << agent->output();
    // Killed while the agent is held, then let go at once: it runs again while the kernel is
    // still ending them (a preemption of this process between two kill() calls was two failures
    // 50 ms apart to the agent, rightly one replaced in place).
    hold_and_kill(*agent, {zero, one});
    ::kill(agent->pid(), SIGCONT);
    ASSERT_EQ(agent->wait(120s), 0) << agent->output();
    const std::string out = agent->output();
    EXPECT_NE(out.find("2 workers failed at once, every worker of the group"), std::string::npos)
        << out;
    EXPECT_EQ(out.find("replaced in place by pid"), std::string::npos) << out;
    EXPECT_EQ(events(out_dir, "restart").size(), 1u) << out;
  }
}

// Two static nodes of one worker each: node 0 hosts the job's store on 127.0.0.2.
class InPlaceStaticNodes : public InPlace {
 protected:
  // Both nodes of a job; returns their exit codes, their outputs in `outputs`.
  std::vector<int> run_nodes(const std::string& out, int max_restarts,
                             const std::vector<std::string>& worker_args,
                             std::vector<std::string>& outputs, const Meanwhile& meanwhile = {}) {
    const std::string port = std::to_string(dist::agent::testing::free_port("127.0.0.2"));
    return run_two_nodes(
        out, max_restarts, worker_args, outputs,
        [&](int node) {
          return std::vector<std::string>{
              "--nnodes",      "2",         "--node-rank",   std::to_string(node),
              "--master-addr", "127.0.0.2", "--master-port", port};
        },
        false, meanwhile);
  }
  // Rank 1 failed and its replacement (held as it starts: --hold-at-start 1:1) is born, while
  // node 0's survivor says it waits for generation 1 (in its set-up from before that line): the
  // replacement's pid, or -1 when that is not seen within the bound.
  long replacement_born_while_the_survivor_waits(const Child& node0) const {
    long born = -1;
    dist::agent::testing::eventually(
        [&] {
          std::istringstream(read("job/born_1_0_1")) >> born;
          return born > 0 &&
                 node0.output().find("waiting for generation 1 of the group") != std::string::npos;
        },
        60s);
    return born;
  }
};

// Node 1's only worker held stopped: every worker of that node is stopped, yet this is no pause of
// the job, for node 0's rank waits for it in a collective (the job view says so): proof, and the
// worker is replaced alone, not left to a hang timeout.
TEST_F(InPlaceStaticNodes, ANodesOnlyWorkerHeldStoppedWhileAnotherNodeWaitsIsReplacedAlone) {
  const std::vector<std::string> worker{"--steps", "200", "--step-ms", "20"};
  const std::string clean = clean_digest(2, worker);
  std::vector<std::string> out;
  const auto codes = run_nodes("job", 1, worker, out, [&](auto& agents) {
    const long stopped = started_pid("job", 1);
    ASSERT_GT(stopped, 0) << agents[1]->output();
    ASSERT_TRUE(dist::agent::testing::eventually(
        [&] { return agents[1]->output().find("rank 1 step 5\n") != std::string::npos; }, 60s))
        << agents[1]->output();
    ::kill(static_cast<pid_t>(stopped), SIGSTOP);
  });
  ASSERT_EQ(codes, (std::vector<int>{0, 0})) << out[0] << out[1];
  EXPECT_NE(out[1].find("rank 1 stopped (SIGSTOP or SIGTSTP): no progress until continued"),
            std::string::npos)
      << out[1];
  EXPECT_EQ(out[1].find("taken for a pause"), std::string::npos) << out[1];
  EXPECT_NE(out[1].find("replaced in place"), std::string::npos) << out[1];
  for (int rank = 0; rank < 2; ++rank) {
    const auto f = final_of("job", rank);
    ASSERT_TRUE(f.has_value()) << out[0] << out[1];
    EXPECT_EQ(f->digest, clean) << "rank " << rank << "\n" << out[0] << out[1];
  }
  EXPECT_EQ(final_of("job", 0)->pid, start_pid("job", 0, 0, 0)) << "node 0's worker kept running";
  const auto hangs = events("job_node1", "hang");
  ASSERT_EQ(hangs.size(), 1u) << out[1];
  // Proof from the job view, not the hang timeout's look (30 s at least by default).
  EXPECT_LT(hangs[0]["silent_ms"].get<int>(), 30000) << hangs[0];
}

// A pause of the whole job that reaches its nodes 5 s apart (a kill -STOP over ssh, node by node):
// meanwhile node 0's rank waits for node 1's stopped one, and is published as waiting. Neither
// node takes it for a fault: both say the pause, end nothing (--max-restarts 0: an ended worker
// would fail the job), and the job ends as it would have once continued.
TEST_F(InPlaceStaticNodes, APauseOfTheWholeJobReachingTheNodesApartIsLeftAlone) {
  const std::vector<std::string> worker{"--steps", "200", "--step-ms", "20"};
  std::vector<std::string> out;
  const auto codes = run_nodes("job", 0, worker, out, [&](auto& agents) {
    const long first = started_pid("job", 0), second = started_pid("job", 1);
    ASSERT_GT(first, 0) << agents[0]->output();
    ASSERT_GT(second, 0) << agents[1]->output();
    ASSERT_TRUE(dist::agent::testing::eventually(
        [&] { return agents[1]->output().find("rank 1 step 5\n") != std::string::npos; }, 60s))
        << agents[1]->output();
    ::kill(static_cast<pid_t>(second), SIGSTOP);
    std::this_thread::sleep_for(5s);  // the pause's spread between the nodes: the scenario
    ::kill(static_cast<pid_t>(first), SIGSTOP);
    for (auto& agent : agents) {
      EXPECT_TRUE(dist::agent::testing::eventually(
          [&] { return agent->output().find("taken for a pause of the job") != std::string::npos; },
          60s))
          << agent->output();
    }
    ::kill(static_cast<pid_t>(first), SIGCONT);
    ::kill(static_cast<pid_t>(second), SIGCONT);
  });
  ASSERT_EQ(codes, (std::vector<int>{0, 0})) << out[0] << out[1];
  for (const std::string& o : out) {
    EXPECT_EQ(o.find("held stopped for"), std::string::npos) << o;
    EXPECT_EQ(o.find("SIGKILL"), std::string::npos) << o;
  }
  EXPECT_TRUE(events("job_node0", "hang").empty()) << out[0];
  EXPECT_TRUE(events("job_node1", "hang").empty()) << out[1];
}

// Rank 1 fails; its replacement, slow to start (held before init()), is held stopped: node 1's
// only worker. Node 0's survivor has waited for it in the new generation's set-up since the
// failure, from before the stop: the job view lists it as waiting in its group's set-up, which is
// proof, and the replacement is ended (its failure during the recovery restarts the group), not
// taken for a pause of the job (no hang timeout applies to a worker that never stepped: it stayed
// stopped for good).
TEST_F(InPlaceStaticNodes, AStoppedReplacementThatASurvivorWaitsForInItsGroupsSetUpIsEnded) {
  const std::string clean = clean_digest(2, {"--steps", "30"});
  const std::vector<std::string> worker{"--steps",         "30", "--crash", "1:10",
                                        "--hold-at-start", "1:1"};
  std::vector<std::string> out;
  const auto codes = run_nodes("job", 2, worker, out, [&](auto& agents) {
    const long held = replacement_born_while_the_survivor_waits(*agents[0]);
    ASSERT_GT(held, 0) << agents[0]->output() << agents[1]->output();
    ::kill(static_cast<pid_t>(held), SIGSTOP);
  });
  ASSERT_EQ(codes, (std::vector<int>{0, 0})) << out[0] << out[1];
  EXPECT_NE(out[1].find("rank 1 stopped (SIGSTOP or SIGTSTP): no progress until continued"),
            std::string::npos)
      << out[1];
  EXPECT_EQ(out[1].find("taken for a pause"), std::string::npos) << out[1];
  const auto hangs = events("job_node1", "hang");
  ASSERT_EQ(hangs.size(), 1u) << out[1];
  EXPECT_LT(hangs[0]["silent_ms"].get<int>(), 30000) << hangs[0];
  for (int rank = 0; rank < 2; ++rank) {
    const auto f = final_of("job", rank);
    ASSERT_TRUE(f.has_value()) << out[0] << out[1];
    EXPECT_EQ(f->digest, clean) << "rank " << rank << "\n" << out[0] << out[1];
  }
}

// The same replacement and survivor, both held stopped: a pause of the whole job during the
// recovery. Neither node takes it for a fault (--max-restarts 1, spent on the replacement: an
// ended worker would fail the job); continued, the recovery completes and the job ends.
TEST_F(InPlaceStaticNodes, AWholeJobPausedDuringARecoveryIsLeftAlone) {
  const std::string clean = clean_digest(2, {"--steps", "30"});
  const std::string go = path("go");
  const std::vector<std::string> worker{"--steps",         "30",       "--crash", "1:10",
                                        "--hold-at-start", "1:1:" + go};
  std::vector<std::string> out;
  const auto codes = run_nodes("job", 1, worker, out, [&](auto& agents) {
    const long survivor = started_pid("job", 0);
    const long held = replacement_born_while_the_survivor_waits(*agents[0]);
    ASSERT_GT(held, 0) << agents[0]->output() << agents[1]->output();
    ::kill(static_cast<pid_t>(held), SIGSTOP);
    ::kill(static_cast<pid_t>(survivor), SIGSTOP);
    for (auto& agent : agents) {
      EXPECT_TRUE(dist::agent::testing::eventually(
          [&] { return agent->output().find("taken for a pause of the job") != std::string::npos; },
          60s))
          << agent->output();
    }
    ::kill(static_cast<pid_t>(survivor), SIGCONT);
    ::kill(static_cast<pid_t>(held), SIGCONT);
    std::ofstream{go} << "go\n";
  });
  ASSERT_EQ(codes, (std::vector<int>{0, 0})) << out[0] << out[1];
  for (const std::string& o : out) {
    EXPECT_EQ(o.find("held stopped for"), std::string::npos) << o;
    EXPECT_EQ(o.find("SIGKILL"), std::string::npos) << o;
  }
  EXPECT_TRUE(events("job_node0", "hang").empty()) << out[0];
  EXPECT_TRUE(events("job_node1", "hang").empty()) << out[1];
  for (int rank = 0; rank < 2; ++rank) {
    const auto f = final_of("job", rank);
    ASSERT_TRUE(f.has_value()) << out[0] << out[1];
    EXPECT_EQ(f->digest, clean) << "rank " << rank << "\n" << out[0] << out[1];
    EXPECT_EQ(f->generation, 1) << "recovered in place";
  }
}

// The survivor held stopped during the recovery, and only then rank 1's replacement starts and
// waits for it in the group's set-up: a failure brought the replacement, no pause of the job, so
// its wait is proof though it began after the stop (the fault mix's stop, then a kill of the
// other node's worker). Node 0 ends its stopped survivor instead of waiting out a hang timeout,
// and the job, restarted, ends with the digest of a run without failures.
TEST_F(InPlaceStaticNodes, AReplacementWaitingForASurvivorStoppedBeforeItCameIsProof) {
  const std::string clean = clean_digest(2, {"--steps", "30"});
  const std::string go = path("go");
  const std::vector<std::string> worker{"--steps",         "30",       "--crash", "1:10",
                                        "--hold-at-start", "1:1:" + go};
  std::vector<std::string> out;
  const auto codes = run_nodes("job", 3, worker, out, [&](auto& agents) {
    const long survivor = started_pid("job", 0);
    ASSERT_GT(replacement_born_while_the_survivor_waits(*agents[0]), 0)
        << agents[0]->output() << agents[1]->output();
    ::kill(static_cast<pid_t>(survivor), SIGSTOP);
    ASSERT_TRUE(dist::agent::testing::eventually(
        [&] { return agents[0]->output().find("is held stopped") != std::string::npos; }, 60s))
        << agents[0]->output();
    std::ofstream{go} << "go\n";  // the replacement goes on into the group's set-up, since
  });
  ASSERT_EQ(codes, (std::vector<int>{0, 0})) << out[0] << out[1];
  EXPECT_NE(out[0].find("rank 0 stopped (SIGSTOP or SIGTSTP): no progress until continued"),
            std::string::npos)
      << out[0];
  EXPECT_EQ(out[0].find("taken for a pause"), std::string::npos) << out[0];
  const auto hangs = events("job_node0", "hang");
  ASSERT_EQ(hangs.size(), 1u) << out[0];
  EXPECT_LT(hangs[0]["silent_ms"].get<int>(), 30000) << hangs[0];
  for (int rank = 0; rank < 2; ++rank) {
    const auto f = final_of("job", rank);
    ASSERT_TRUE(f.has_value()) << out[0] << out[1];
    EXPECT_EQ(f->digest, clean) << "rank " << rank << "\n" << out[0] << out[1];
  }
}

TEST_F(InPlaceStaticNodes, TheOtherNodesWorkerKeepsRunningAndTheReplacementGetsItsState) {
  const std::string clean = clean_digest(2, {"--steps", "30"});
  std::vector<std::string> out;
  const auto codes = run_nodes("job", 1, {"--steps", "30", "--crash", "1:10"}, out);
  ASSERT_EQ(codes, (std::vector<int>{0, 0})) << out[0] << out[1];
  const auto survivor = final_of("job", 0), replaced = final_of("job", 1);
  ASSERT_TRUE(survivor && replaced) << out[0] << out[1];
  EXPECT_EQ(survivor->pid, start_pid("job", 0, 0, 0)) << "node 0's worker kept its process";
  EXPECT_EQ(survivor->generation, 1);
  EXPECT_EQ(replaced->pid, start_pid("job", 1, 0, 1));
  EXPECT_EQ(survivor->digest, clean) << out[0];
  EXPECT_EQ(replaced->digest, clean) << out[1];
  EXPECT_FALSE(any_signal_file("job")) << out[0] << out[1];
  EXPECT_NE(out[1].find("replaced in place by pid " + std::to_string(replaced->pid) +
                        ": generation 1 (restart 1 of 1); rank 0 keeps running"),
            std::string::npos)
      << out[1];
  EXPECT_EQ(out[0].find("stopping the workers"), std::string::npos) << out[0];
  EXPECT_EQ(out[0].find("restarting"), std::string::npos) << out[0];
  EXPECT_TRUE(events("job_node0", "inplace_restart").empty());
  const auto restarts = events("job_node1", "inplace_restart");
  ASSERT_EQ(restarts.size(), 1u);
  EXPECT_EQ(restarts[0]["survivors"], Json::array({0}));
  const auto recovered = events("job_node1", "inplace_recovered");
  ASSERT_EQ(recovered.size(), 1u);
  EXPECT_EQ(recovered[0]["root"], 0);
  EXPECT_EQ(recovered[0]["first_step"], 10);
  // The job succeeded: both nodes count node 1's replacement among its restarts (node 0 read it
  // from the store once every worker was done; it had said 0).
  for (const char* node : {"job_node0", "job_node1"}) {
    const auto end = events(node, "job_end");
    ASSERT_EQ(end.size(), 1u) << node;
    EXPECT_EQ(end[0]["outcome"], "succeeded") << node;
    EXPECT_EQ(end[0]["restarts"], 1) << node << ": " << end[0].dump();
  }
}

// A node's only worker fails; what it started (a child in its process group, as a DataLoader's
// workers are) gets SIGTERM and dies as the replacement is being claimed. Its exit, reaped, found
// every worker of the node exited: "this node's workers are done", the failed one never replaced
// and the other node's survivor waiting for good (a reviewer's finding).
TEST_F(InPlaceStaticNodes, AFailedWorkersChildDyingIsNoSuccessOfItsNode) {
  std::vector<std::string> outputs;
  const auto codes = run_nodes("job", 2, {"--steps", "30", "--crash", "1:10", "--child"}, outputs);
  EXPECT_EQ(codes, (std::vector<int>{0, 0})) << outputs[0] << outputs[1];
  const auto replaced = outputs[1].find("replaced in place by pid");
  ASSERT_NE(replaced, std::string::npos) << outputs[1];
  EXPECT_GT(outputs[1].find("workers are done"), replaced) << outputs[1];
}

TEST_F(InPlaceStaticNodes, EveryNodeCountsTheOthersReplacements) {
  // Rank 1 (node 1) is replaced, then rank 0 (node 0) fails in generation 1: node 0 has replaced
  // nothing itself, yet its failure finds no restart left, and both nodes fail alike.
  std::vector<std::string> out;
  const auto codes =
      run_nodes("job", 1, {"--steps", "30", "--crash", "1:5", "--crash", "0:12:1"}, out);
  EXPECT_EQ(codes, (std::vector<int>{3, 3})) << out[0] << out[1];
  EXPECT_NE(out[0].find("worker 0 failed: no restart left (--max-restarts 1, 1 used in place by "
                        "the job's nodes)"),
            std::string::npos)
      << out[0];
  // Both nodes print the same report: node 1's replacement is in node 0's too, which read it from
  // the store (it had only its own before), and both count it among the job's restarts.
  const std::string replaced =
      "replaced in place by pid " + read("job/born_1_0_1") + " (generation 1)";
  for (const std::string& o : out) {
    EXPECT_NE(o.find("dist-inplace-worker FAILED"), std::string::npos) << o;
    EXPECT_EQ(o.find("restarting the worker group"), std::string::npos) << o;
    const auto before = o.find("Replaced in place before (the job went on):");
    ASSERT_NE(before, std::string::npos) << o;
    EXPECT_NE(o.find(replaced, before), std::string::npos) << replaced << "\n" << o;
  }
  EXPECT_EQ(events("job_node1", "inplace_restart").size(), 1u);
  EXPECT_EQ(events("job_node0", "inplace_fallback").size(), 1u);
  for (const char* node : {"job_node0", "job_node1"}) {
    const auto end = events(node, "job_end");
    ASSERT_EQ(end.size(), 1u) << node;
    EXPECT_EQ(end[0]["restarts"], 1) << node << ": " << end[0].dump();
  }
}

TEST_F(InPlaceStaticNodes, FailuresOnBothNodesAtOnceRestartTheWholeGroup) {
  // One node claims the job's one recovery; the other finds it under way: the group restarts.
  std::vector<std::string> out;
  const auto codes =
      run_nodes("job", 2, {"--steps", "20", "--crash", "0:5", "--crash", "1:5"}, out);
  ASSERT_EQ(codes, (std::vector<int>{0, 0})) << out[0] << out[1];
  const std::string both = out[0] + out[1];
  EXPECT_NE(both.find("failed while another node's worker is being replaced in place: "
                      "restarting the whole group"),
            std::string::npos)
      << both;
  for (const std::string& o : out) {
    EXPECT_NE(o.find("restarting the worker group (restart 2 of 2)"), std::string::npos) << o;
  }
  for (const int rank : {0, 1}) {
    const auto f = final_of("job", rank);
    ASSERT_TRUE(f.has_value()) << both;
    EXPECT_EQ(f->pid, start_pid("job", rank, 1, 0)) << "attempt 1's worker";
  }
}

// Two nodes of two workers: rank 2 (node 1) fails at step 10 and node 1 replaces it as generation
// 1; rank 1 (node 0) dies as it reads that generation, so generation 1's group can never form.
// Node 0 folds its failure into node 1's recovery: generation 2 replaces ranks 1 and 2 and
// supersedes generation 1, whose set-up the survivors (ranks 0 and 3) and rank 2's replacement
// give up for it. No group restart: the survivors keep their processes and every rank ends with
// the digest of a run without failures. (Before, node 0's claim was refused and the whole group
// restarted.)
// A worker failing while its node's claim of the recovery is still in flight (held here: node 0's
// agent, which hosts the job's store, is stopped) is queued, then folded into that recovery once
// its generation is out: one generation more replaces both, no group restart. (Before: the group
// restarted, "failed during the in-place recovery of worker 2".)
TEST_F(InPlaceStaticNodes, AFailureWhileTheClaimIsInFlightIsQueuedThenFolded) {
  const std::vector<std::string> worker{"--steps", "300", "--step-ms", "10"};
  const std::string clean = clean_digest(4, worker);
  nproc_per_node_ = 2;
  std::vector<std::string> out;
  const auto codes = run_nodes("job", 2, worker, out, [&](auto& agents) {
    const long two = started_pid("job", 2), three = started_pid("job", 3);
    ASSERT_TRUE(two > 0 && three > 0) << agents[1]->output();
    const auto node1_says = [&](const std::string& text, std::chrono::seconds within) {
      return dist::agent::testing::eventually(
          [&] { return agents[1]->output().find(text) != std::string::npos; }, within);
    };
    ASSERT_TRUE(node1_says("rank 3 step 5\n", 60s)) << agents[1]->output();
    ::kill(agents[0]->pid(), SIGSTOP);  // node 1's claim waits for the job's store
    ::kill(static_cast<pid_t>(two), SIGKILL);
    const bool claiming = node1_says("worker 2 (local rank 0, pid", 30s);
    ::kill(static_cast<pid_t>(three), SIGKILL);
    const bool queued =
        claiming && node1_says(
                        "worker 3 failed while this node's in-place recovery of worker 2 "
                        "is being claimed: folded into it once its generation is out",
                        30s);
    ::kill(agents[0]->pid(), SIGCONT);
    EXPECT_TRUE(claiming && queued) << agents[1]->output();
  });
  const std::string both = out[0] + out[1];
  ASSERT_EQ(codes, (std::vector<int>{0, 0})) << both;
  EXPECT_NE(out[1].find("worker 2 (local rank 0) replaced in place by pid "), std::string::npos)
      << out[1];
  EXPECT_NE(out[1].find(": generation 2 (restart 2 of 2), folded into the recovery under way "
                        "(generation 1, which it supersedes: ranks 2,3 replaced); ranks 0,1 keep "
                        "running"),
            std::string::npos)
      << out[1];
  expect_ranks_at("job", 4, clean, {0, 1}, 2, both);
  EXPECT_FALSE(fs::exists(path("job/start_0_1_0"))) << "no group restart";
  for (const char* node : {"job_node0", "job_node1"}) {
    SCOPED_TRACE(node);
    EXPECT_TRUE(events(node, "restart").empty());
    EXPECT_TRUE(events(node, "inplace_fallback").empty());
  }
  EXPECT_EQ(events("job_node1", "inplace_restart").size(), 2u);
}

// A stop signal while this node's claim of a recovery waits for a store that does not answer
// (node 0's agent, which hosts it, stopped): the agent stops its workers and leaves at once, 128 +
// the signal, its pending store calls cancelled. (Before: STOPPING waited for the claim and the
// watch, each until the store's timeout, 60 s, then said it lost the store and exited 1.)
TEST_F(InPlaceStaticNodes, ASignalWhileTheClaimWaitsForAStoreThatDoesNotAnswerLeavesAtOnce) {
  const std::vector<std::string> worker{"--steps", "3000", "--step-ms", "10"};
  nproc_per_node_ = 2;
  std::vector<std::string> out;
  const auto codes = run_nodes("job", 2, worker, out, [&](auto& agents) {
    const long two = started_pid("job", 2);
    ASSERT_GT(two, 0) << agents[1]->output();
    ASSERT_TRUE(dist::agent::testing::eventually(
        [&] { return agents[1]->output().find("rank 3 step 5\n") != std::string::npos; }, 60s))
        << agents[1]->output();
    ::kill(agents[0]->pid(), SIGSTOP);  // node 1's claim waits for the job's store
    ::kill(static_cast<pid_t>(two), SIGKILL);
    const bool claiming = dist::agent::testing::eventually(
        [&] {
          return agents[1]->output().find("worker 2 (local rank 0, pid") != std::string::npos;
        },
        30s);
    const auto signalled = std::chrono::steady_clock::now();
    ::kill(agents[1]->pid(), SIGTERM);
    const bool left = dist::agent::testing::eventually(
        [&] {
          const auto p = dist::agent::testing::process_info(agents[1]->pid());
          return !p || p->state == 'Z';
        },
        45s);
    const auto took = std::chrono::steady_clock::now() - signalled;
    ::kill(agents[0]->pid(), SIGCONT);
    ::kill(agents[0]->pid(), SIGTERM);  // (else it waits for node 1 to join its next round)
    EXPECT_TRUE(claiming) << agents[1]->output();
    EXPECT_TRUE(left) << agents[1]->output();
    // Its workers' grace period is 30 s; they leave on the signal at once.
    EXPECT_LT(took, 20s) << agents[1]->output();
  });
  ASSERT_EQ(codes.size(), 2u);
  EXPECT_EQ(codes[1], 128 + SIGTERM) << out[1];
  EXPECT_EQ(out[1].find("lost the rendezvous store"), std::string::npos) << out[1];
  EXPECT_NE(out[1].find("SIGTERM received: stopping the workers"), std::string::npos) << out[1];
  EXPECT_EQ(codes[0], 128 + SIGTERM) << out[0];
}

TEST_F(InPlaceStaticNodes, AFailureOnAnotherNodeDuringARecoveryIsFoldedIntoIt) {
  const std::vector<std::string> worker{"--steps", "30", "--crash", "2:10", "--fail-in-recovery",
                                        "1"};
  const std::string clean = clean_digest(4, {"--steps", "30"});
  nproc_per_node_ = 2;
  std::vector<std::string> out;
  const auto codes = run_nodes("job", 2, worker, out);
  const std::string both = out[0] + out[1];
  ASSERT_EQ(codes, (std::vector<int>{0, 0})) << both;
  EXPECT_NE(out[0].find("worker 1 (local rank 1) replaced in place by pid "), std::string::npos)
      << out[0];
  EXPECT_NE(out[0].find(": generation 2 (restart 2 of 2), folded into the recovery under way "
                        "(generation 1, which it supersedes: ranks 1,2 replaced); ranks 0,3 keep "
                        "running"),
            std::string::npos)
      << out[0];
  EXPECT_NE(out[1].find("in-place: generation 1 was superseded by generation 2"), std::string::npos)
      << out[1];
  EXPECT_NE(both.find("generation 1's group did not form"), std::string::npos) << both;
  for (const std::string& o : out) {
    EXPECT_NE(o.find("generation 2: the group is whole again"), std::string::npos) << o;
  }
  expect_ranks_at("job", 4, clean, {0, 3}, 2, both);
  for (const int rank : {1, 2}) {  // replaced, both as generation 2's processes at the end
    const auto f = final_of("job", rank);
    EXPECT_TRUE(f && f->pid == start_pid("job", rank, 0, 2)) << "rank " << rank << ": " << both;
  }
  long born_in_1 = -1;  // rank 2's replacement started as generation 1 and followed to 2
  std::istringstream(read("job/born_2_0_1")) >> born_in_1;
  EXPECT_EQ(born_in_1, start_pid("job", 2, 0, 2));
  EXPECT_FALSE(fs::exists(path("job/start_0_1_0"))) << "no group restart";
  EXPECT_FALSE(any_signal_file("job")) << both;
  for (const char* node : {"job_node0", "job_node1"}) {
    SCOPED_TRACE(node);
    EXPECT_TRUE(events(node, "restart").empty());
    EXPECT_TRUE(events(node, "inplace_fallback").empty());
    const auto recovered = events(node, "inplace_recovered");
    ASSERT_EQ(recovered.size(), 1u);
    EXPECT_EQ(recovered[0]["generation"], 2);
  }
  const auto folded = events("job_node0", "inplace_restart");
  ASSERT_EQ(folded.size(), 1u);
  EXPECT_EQ(folded[0]["rank"], 1);
  EXPECT_EQ(folded[0]["generation"], 2);
  EXPECT_EQ(folded[0]["supersedes"], 1);
  EXPECT_EQ(folded[0]["survivors"], Json::array({0, 3}));
  const auto first = events("job_node1", "inplace_restart");
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0]["generation"], 1);
  EXPECT_TRUE(first[0]["supersedes"].is_null());
}

// The same, rank 1 dying just after generation 1's group formed and it received its state: before
// or after the group said it recovered, node 0's failure is recovered in place (folded into
// generation 1's recovery, or claimed once that one is let go), never a group restart.
TEST_F(InPlaceStaticNodes, AFailureJustAfterTheGroupFormedAgainIsRecoveredInPlaceToo) {
  const std::vector<std::string> worker{"--steps", "30", "--crash", "2:10", "--fail-after-recovery",
                                        "1"};
  const std::string clean = clean_digest(4, {"--steps", "30"});
  nproc_per_node_ = 2;
  std::vector<std::string> out;
  const auto codes = run_nodes("job", 2, worker, out);
  const std::string both = out[0] + out[1];
  ASSERT_EQ(codes, (std::vector<int>{0, 0})) << both;
  EXPECT_NE(both.find("rank 1: failing once its group was rebuilt"), std::string::npos) << both;
  expect_ranks_at("job", 4, clean, {0, 3}, -1, both);
  EXPECT_FALSE(fs::exists(path("job/start_0_1_0"))) << "no group restart";
  EXPECT_FALSE(any_signal_file("job")) << both;
  for (const char* node : {"job_node0", "job_node1"}) {
    SCOPED_TRACE(node);
    EXPECT_TRUE(events(node, "restart").empty());
    EXPECT_TRUE(events(node, "inplace_fallback").empty());
    EXPECT_EQ(events(node, "inplace_restart").size(), 1u);
  }
}

}  // namespace

// Two nodes of one worker each behind elastic rendezvous (c10d, --nnodes 2, the store on
// 127.0.0.2): node ranks, hence which agent runs which global rank, are the rendezvous' choice.
class InPlaceElasticNodes : public InPlace {
 protected:
  std::vector<int> run_nodes(const std::string& out, int max_restarts,
                             const std::vector<std::string>& worker_args,
                             std::vector<std::string>& outputs) {
    const std::string endpoint =
        "127.0.0.2:" + std::to_string(dist::agent::testing::free_port("127.0.0.2"));
    return run_two_nodes(
        out, max_restarts, worker_args, outputs,
        [&](int) {
          return std::vector<std::string>{"--nnodes", "2",         "--rdzv-endpoint",
                                          endpoint,   "--rdzv-id", "job"};
        },
        true);
  }
  // Agent `i` ("job_node<i>") of an elastic in-place job (--nnodes `nnodes` at `endpoint`) of one
  // worker training 300 steps of about 10 ms, long enough to lose a node midway; its files in job/.
  std::unique_ptr<Child> training_agent(int i, const std::string& nnodes,
                                        const std::string& endpoint,
                                        const std::vector<std::string>& extra = {},
                                        const std::vector<std::string>& worker = {
                                            "--steps", "300", "--step-ms", "10"}) {
    const std::string name = "job_node" + std::to_string(i);
    std::vector<std::string> args{"--nnodes",         nnodes,
                                  "--rdzv-endpoint",  endpoint,
                                  "--rdzv-id",        "job",
                                  "--nproc-per-node", "1",
                                  "--max-restarts",   "1",
                                  "--restart-policy", "in-place",
                                  "--event-log",      path(name + ".jsonl")};
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {"--no-python", kWorker, "--out", path("job")});
    args.insert(args.end(), worker.begin(), worker.end());
    return std::make_unique<Child>(DIST_LAUNCH_BIN, std::move(args), dir_ / (name + ".log"),
                                   std::map<std::string, std::string>{},
                                   std::vector<std::string>{"OMP_NUM_THREADS"});
  }
  // Nodes 0 (it hosts the store) and 1 of `agent` training, then node 2 once rank 0 has taken
  // 5 steps: a newcomer to the running job.
  void start_two_then_a_newcomer(const std::function<std::unique_ptr<Child>(int)>& agent,
                                 std::vector<std::unique_ptr<Child>>& agents) {
    agents.push_back(agent(0));
    ASSERT_TRUE(dist::agent::testing::eventually(
        [&] {
          return agents[0]->output().find("hosting the rendezvous store") != std::string::npos;
        },
        30s))
        << agents[0]->output();
    agents.push_back(agent(1));
    ASSERT_TRUE(dist::agent::testing::eventually(
        [&] { return agents[0]->output().find("rank 0 step 5\n") != std::string::npos; }, 60s))
        << agents[0]->output() << agents[1]->output();
    agents.push_back(agent(2));
  }
  // Agents 0 (it hosts the store, so it is node 0) and 1 of `agent` training (node 1's worker 5
  // steps in); false, said, when that is not seen within the bounds.
  static ::testing::AssertionResult start_two(
      const std::function<std::unique_ptr<Child>(int)>& agent,
      std::vector<std::unique_ptr<Child>>& agents) {
    agents.push_back(agent(0));
    if (!dist::agent::testing::eventually(
            [&] {
              return agents[0]->output().find("hosting the rendezvous store") != std::string::npos;
            },
            30s)) {
      return ::testing::AssertionFailure() << agents[0]->output();
    }
    agents.push_back(agent(1));
    if (!dist::agent::testing::eventually(
            [&] { return agents[1]->output().find("rank 1 step 5\n") != std::string::npos; },
            60s)) {
      return ::testing::AssertionFailure() << agents[0]->output() << agents[1]->output();
    }
    return ::testing::AssertionSuccess();
  }
  // Node 1's agent SIGKILLed (its worker dies with it); true once node 0 says its workers wait in
  // place for a node to join (--nnodes 2, too few without one).
  static ::testing::AssertionResult lose_node_1_waited_for_in_place(
      std::vector<std::unique_ptr<Child>>& agents) {
    ::kill(agents[1]->pid(), SIGKILL);
    if (const int code = agents[1]->wait(10s); code != 128 + SIGKILL) {
      return ::testing::AssertionFailure() << "node 1's agent exited " << code;
    }
    if (!dist::agent::testing::eventually(
            [&] {
              return agents[0]->output().find("wait in place for nodes to join") !=
                     std::string::npos;
            },
            30s)) {
      return ::testing::AssertionFailure() << agents[0]->output();
    }
    return ::testing::AssertionSuccess();
  }
  // Agents 0 (it hosts the store, so it is node 0), 1 and 2 of `agent`: which of 1 and 2 the
  // rendezvous made node 1 of round 0, or -1 when that is not seen within the bounds.
  int start_three_find_node_1(const std::function<std::unique_ptr<Child>(int)>& agent,
                              std::vector<std::unique_ptr<Child>>& agents) {
    agents.push_back(agent(0));
    if (!dist::agent::testing::eventually(
            [&] {
              return agents[0]->output().find("hosting the rendezvous store") != std::string::npos;
            },
            30s)) {
      return -1;
    }
    agents.push_back(agent(1));
    agents.push_back(agent(2));
    int lost = -1;
    dist::agent::testing::eventually(
        [&] {
          for (int i = 1; i < 3; ++i) {
            if (agents[static_cast<std::size_t>(i)]->output().find("round 0: node 1 of 3") !=
                std::string::npos) {
              lost = i;
            }
          }
          return lost > 0;
        },
        60s);
    return lost;
  }
  // `dist-launch status` of the job at `endpoint` until `done` says yes of it (within 60 s); its
  // last answer in `seen`.
  static bool status_until(const std::string& endpoint, std::string& seen,
                           const std::function<bool(const std::string&)>& done) {
    const std::string status =
        std::string(DIST_LAUNCH_BIN) + " status --rdzv-endpoint " + endpoint + " --rdzv-id job";
    return dist::agent::testing::eventually(
        [&] {
          seen = dist::agent::testing::run_command(status).second;
          return done(seen);
        },
        60s);
  }
  // A fresh endpoint for an elastic job's store, on 127.0.0.2; the job's files go to job/.
  std::string job_endpoint() {
    fs::create_directories(dir_ / "job");
    return "127.0.0.2:" + std::to_string(dist::agent::testing::free_port("127.0.0.2"));
  }
  // Waits for every agent to exit (each within 120 s): their exit codes, and their outputs, one
  // after the other, into `all`.
  static std::vector<int> wait_all(std::vector<std::unique_ptr<Child>>& agents, std::string& all) {
    std::vector<int> codes;
    for (auto& a : agents) {
      codes.push_back(a->wait(120s));
      all += a->output();
    }
    return codes;
  }
  // Each of `ranks` ended at step 300 in a world of that many ranks, all with rank 0's digest.
  void expect_one_world_at_step_300(int ranks, const std::string& all) {
    std::string digest;
    for (int rank = 0; rank < ranks; ++rank) {
      const auto f = final_of("job", rank);
      ASSERT_TRUE(f.has_value()) << "rank " << rank << ": " << all;
      EXPECT_EQ(f->step, 300) << all;
      EXPECT_EQ(f->world, ranks) << all;
      if (rank == 0) digest = f->digest;
      EXPECT_EQ(f->digest, digest) << "every rank ends with the same state: " << all;
    }
  }
  // Agents 0 and 2 (node 1's gone) each exit 0 within 120 s: their outputs, one after the other.
  static std::string node_0_and_2_succeed(std::vector<std::unique_ptr<Child>>& agents) {
    std::string both;
    for (const std::size_t i : {std::size_t{0}, std::size_t{2}}) {
      const int code = agents[i]->wait(120s);
      both += agents[i]->output();
      EXPECT_EQ(code, 0) << agents[i]->output();
    }
    return both;
  }
  // Ranks 0 and 1 ended at step 300 in a world of two, each with `digest`.
  void expect_two_ranks_ended_with(const std::string& digest, const std::string& all) {
    for (const int rank : {0, 1}) {
      const auto f = final_of("job", rank);
      ASSERT_TRUE(f.has_value()) << all;
      EXPECT_EQ(f->step, 300) << all;
      EXPECT_EQ(f->world, 2) << all;
      EXPECT_EQ(f->digest, digest) << "rank " << rank << ": " << all;
    }
  }
  // Both nodes' events of one kind.
  std::vector<Json> node_events(const std::string& out, const std::string& name) const {
    auto found = events(out + "_node0", name);
    for (auto& e : events(out + "_node1", name)) found.push_back(std::move(e));
    return found;
  }
};

TEST_F(InPlaceElasticNodes, TheOtherNodesWorkerKeepsRunningAndTheReplacementGetsItsState) {
  const std::string clean = clean_digest(2, {"--steps", "30"});
  std::vector<std::string> out;
  const auto codes = run_nodes("job", 1, {"--steps", "30", "--crash", "1:10"}, out);
  ASSERT_EQ(codes, (std::vector<int>{0, 0})) << out[0] << out[1];
  const auto survivor = final_of("job", 0), replaced = final_of("job", 1);
  ASSERT_TRUE(survivor && replaced) << out[0] << out[1];
  EXPECT_EQ(survivor->pid, start_pid("job", 0, 0, 0)) << "rank 0 kept its process";
  EXPECT_EQ(survivor->generation, 1);
  EXPECT_EQ(replaced->pid, start_pid("job", 1, 0, 1));
  EXPECT_EQ(survivor->digest, clean) << out[0] << out[1];
  EXPECT_EQ(replaced->digest, clean) << out[0] << out[1];
  EXPECT_FALSE(any_signal_file("job")) << out[0] << out[1];
  const std::string both = out[0] + out[1];
  EXPECT_NE(both.find("replaced in place by pid " + std::to_string(replaced->pid) +
                      ": generation 1 (restart 1 of 1); rank 0 keeps running"),
            std::string::npos)
      << both;
  EXPECT_EQ(both.find("stopping the workers"), std::string::npos) << both;
  EXPECT_EQ(both.find("restarting"), std::string::npos) << both;
  EXPECT_EQ(both.find("round 1"), std::string::npos) << "one round: " << both;
  const auto restarts = node_events("job", "inplace_restart");
  ASSERT_EQ(restarts.size(), 1u) << both;
  EXPECT_EQ(restarts[0]["survivors"], Json::array({0}));
  const auto recovered = node_events("job", "inplace_recovered");
  ASSERT_EQ(recovered.size(), 1u);
  EXPECT_EQ(recovered[0]["root"], 0);
  EXPECT_EQ(recovered[0]["first_step"], 10);
}

TEST_F(InPlaceElasticNodes, TheJobsVerdictCountsTheReplacementsAgainstMaxRestarts) {
  // Rank 1 is replaced, then rank 0 fails in generation 1: no restart is left, and the job's
  // verdict, whichever node reaches it, says the replacement used it. Rank 0 fails seven steps
  // into generation 1: on a loaded machine that can come before node 1's agent has said the
  // replacement is over, and node 0 then finds it under way and asks for a group restart rather
  // than a replacement of its own; there is none left either way.
  std::vector<std::string> out;
  const auto codes =
      run_nodes("job", 1, {"--steps", "30", "--crash", "1:5", "--crash", "0:12:1"}, out);
  const std::string both = out[0] + out[1];
  EXPECT_NE(codes[0], 0) << both;
  EXPECT_NE(codes[1], 0) << both;
  const bool after_the_recovery =
      both.find(
          "worker 0 failed: no restart left (--max-restarts 1, 1 used in place by the job's "
          "nodes)") != std::string::npos;
  const bool during_it = both.find(
                             "worker 0 failed while another node's worker is being "
                             "replaced in place: restarting the whole group") != std::string::npos;
  EXPECT_TRUE(after_the_recovery || during_it) << both;
  // (A claim past the budget is refused uncounted: the job used its one replacement.)
  EXPECT_NE(both.find("round 0 ended: a worker failed after 0 restart(s) and 1 in-place "
                      "replacement(s), the most --max-restarts allows: the job fails"),
            std::string::npos)
      << both;
  const auto verdicts = node_events("job", "verdict");
  ASSERT_FALSE(verdicts.empty());
  for (const Json& v : verdicts) EXPECT_EQ(v["action"], "fail") << v;
  EXPECT_EQ(both.find("restarting the worker group"), std::string::npos) << both;
  for (const std::string& o : out) {
    EXPECT_NE(o.find("dist-inplace-worker FAILED"), std::string::npos) << o;
  }
  EXPECT_EQ(node_events("job", "inplace_restart").size(), 1u);
  EXPECT_EQ(node_events("job", "inplace_fallback").size(), 1u);
}

TEST_F(InPlaceElasticNodes, AFailureDuringTheRecoveryIsANewRoundOfTheWholeGroup) {
  // Rank 1 is replaced (1 of 2); rank 0, on the other node, fails as its recovery begins: its
  // node finds the job's recovery under way and ends the round; the verdict, one restart left
  // beside the replacement, restarts the group in a new round, which ends with the weights of a
  // run without failures.
  const std::string clean = clean_digest(2, {"--steps", "20"});
  std::vector<std::string> out;
  const auto codes =
      run_nodes("job", 2, {"--steps", "20", "--crash", "1:5", "--fail-in-recovery", "0"}, out);
  const std::string both = out[0] + out[1];
  ASSERT_EQ(codes, (std::vector<int>{0, 0})) << both;
  EXPECT_NE(both.find("worker 0 failed while another node's worker is being replaced in place: "
                      "restarting the whole group"),
            std::string::npos)
      << both;
  for (const std::string& o : out) {
    EXPECT_NE(o.find("round 1: node"), std::string::npos) << o;
  }
  for (const int rank : {0, 1}) {
    const auto f = final_of("job", rank);
    ASSERT_TRUE(f.has_value()) << both;
    EXPECT_EQ(f->digest, clean) << both;
    EXPECT_EQ(f->pid, start_pid("job", rank, 1, 0)) << "the new round's worker";
  }
}

// A failure folded into another node's recovery under elastic rendezvous too (the job's recovery
// claimed in the c10d store): two nodes of two workers, rank 2 failing at step 10, rank 1 (on the
// other node, whichever node rank the rendezvous gave each) as it reads generation 1.
TEST_F(InPlaceElasticNodes, AFailureOnAnotherNodeDuringARecoveryIsFoldedIntoIt) {
  const std::string clean = clean_digest(4, {"--steps", "30"});
  nproc_per_node_ = 2;
  std::vector<std::string> out;
  const auto codes =
      run_nodes("job", 2, {"--steps", "30", "--crash", "2:10", "--fail-in-recovery", "1"}, out);
  const std::string both = out[0] + out[1];
  ASSERT_EQ(codes, (std::vector<int>{0, 0})) << both;
  EXPECT_NE(both.find(": generation 2 (restart 2 of 2), folded into the recovery under way "
                      "(generation 1, which it supersedes: ranks 1,2 replaced); ranks 0,3 keep "
                      "running"),
            std::string::npos)
      << both;
  expect_ranks_at("job", 4, clean, {0, 3}, 2, both);
  EXPECT_EQ(both.find("restarting"), std::string::npos) << both;
  EXPECT_EQ(both.find("round 1: node"), std::string::npos) << "no new round: " << both;
}

// An elastic in-place job of three nodes of one worker (--nnodes 2:3), whose node 1 is lost
// mid-training (its agent SIGKILLed: its worker goes with it): the other two workers keep their
// processes and go on as ranks 0 and 1 of a world of two in the next round (node 2's worker
// renumbered from 2 to 1), without a restart, and end with the same state.
// `dist-launch status` after the regroup lists node 2's worker as rank 1: its agent's watchdogs
// are told its new rank (they went on publishing rank 2, which a newcomer could hold).
TEST_F(InPlaceElasticNodes, ALostNodesSurvivorsKeepTheirProcessesAndTrainOnInASmallerWorld) {
  const std::string endpoint = job_endpoint();
  const auto agent = [&](int i) {
    return training_agent(i, "2:3", endpoint, {}, {"--steps", "1000", "--step-ms", "10"});
  };
  std::vector<std::unique_ptr<Child>> agents;
  const int lost = start_three_find_node_1(agent, agents);
  ASSERT_GT(lost, 0) << agents[0]->output();
  const int last = 3 - lost;  // node 2: its worker is renumbered
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] {
        return agents[static_cast<std::size_t>(lost)]->output().find(" step 5\n") !=
               std::string::npos;
      },
      60s))
      << agents[static_cast<std::size_t>(lost)]->output();
  ::kill(agents[static_cast<std::size_t>(lost)]->pid(), SIGKILL);
  EXPECT_EQ(agents[static_cast<std::size_t>(lost)]->wait(10s), 128 + SIGKILL);
  std::string seen;
  EXPECT_TRUE(status_until(endpoint, seen, [](const std::string& s) {
    return s.find("round 1,") != std::string::npos &&
           s.find("2 running worker(s)") != std::string::npos;
  })) << seen;
  std::vector<std::string> rows;  // the rank table's: "<rank> <node> <local> ..."
  std::istringstream lines(seen);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string rank, node, local;
    if (words >> rank >> node >> local && local == "0" && rank != "node") {
      rows.push_back(rank + " " + node);
    }
  }
  EXPECT_EQ(rows, (std::vector<std::string>{"0 0", "1 1"})) << seen;

  std::string both;
  for (const int i : {0, last}) {
    const int code = agents[static_cast<std::size_t>(i)]->wait(120s);
    const std::string out = agents[static_cast<std::size_t>(i)]->output();
    both += out;
    EXPECT_EQ(code, 0) << out;
  }
  std::string digest;
  for (const int rank : {0, 1}) {
    const auto f = final_of("job", rank);
    ASSERT_TRUE(f.has_value()) << both;
    EXPECT_EQ(f->step, 1000) << both;
    EXPECT_EQ(f->world, 2) << both;
    EXPECT_EQ(f->generation, 1) << both;
    // Rank 0 was rank 0; rank 1 was node 2's rank 2, in the same process.
    EXPECT_EQ(f->pid, start_pid("job", rank == 0 ? 0 : 2, 0, 0)) << both;
    if (rank == 0) digest = f->digest;
    EXPECT_EQ(f->digest, digest) << "every survivor ends with the same state: " << both;
  }
  EXPECT_NE(both.find("round 1: node 1 of 2, global ranks 1..1 of 2 (were 2..2 of 3)"),
            std::string::npos)
      << both;
  EXPECT_NE(both.find("rank 2 is rank 1 of 2 from generation 1"), std::string::npos) << both;
  EXPECT_EQ(both.find("stopping the workers"), std::string::npos) << both;
  EXPECT_EQ(both.find("restarting"), std::string::npos) << both;
  EXPECT_FALSE(any_signal_file("job")) << both;
  const auto regrouped = events("job_node0", "inplace_regrouped");
  ASSERT_EQ(regrouped.size(), 1u) << both;
  EXPECT_EQ(regrouped[0]["round"], 0);
  EXPECT_EQ(regrouped[0]["new_round"], 1);
  EXPECT_EQ(regrouped[0]["world_size"], 2);
  EXPECT_EQ(regrouped[0]["generation"], 1);
  EXPECT_EQ(regrouped[0]["root"], 0);
  EXPECT_EQ(regrouped[0]["ranks"], Json::array({"0->0"}));
  const auto renumbered = events("job_node" + std::to_string(last), "inplace_regrouped");
  ASSERT_EQ(renumbered.size(), 1u) << both;
  EXPECT_EQ(renumbered[0]["ranks"], Json::array({"2->1"}));
  EXPECT_EQ(renumbered[0]["node_rank"], 1);
  for (const int i : {0, last}) {
    const std::string name = "job_node" + std::to_string(i);
    EXPECT_EQ(events(name, "node_lost").size(), 1u) << both;
    EXPECT_TRUE(events(name, "inplace_fallback").empty()) << both;
    EXPECT_TRUE(events(name, "restart").empty()) << both;
  }
}

// A straggler flagged before a regroup (node 2's rank sleeps 40 ms a step where the others sleep
// 10) is cleared as the job regroups, under the rank it was flagged as: the event log and the
// status page keep no flag of a rank that is no more (the renumbered worker is told again among
// the new round's ranks). Before, the flag was dropped without a word and the worker stayed
// flagged.
TEST_F(InPlaceElasticNodes, AStragglerFlaggedBeforeARegroupIsClearedAsTheJobRegroups) {
  const std::string endpoint = job_endpoint();
  const auto agent = [&](int i) {
    return training_agent(
        i, "2:3", endpoint, {},
        {"--steps", "100000", "--step-ms", "10", "--step-ms-of", "2:40", "--count-steps"});
  };
  std::vector<std::unique_ptr<Child>> agents;
  const int lost = start_three_find_node_1(agent, agents);
  ASSERT_GT(lost, 0) << agents[0]->output();
  const int last = 3 - lost;  // node 2: rank 2, the straggler
  const Child& straggling = *agents[static_cast<std::size_t>(last)];
  const std::string node2 = "job_node" + std::to_string(last);
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] { return straggling.output().find("is a straggler") != std::string::npos; }, 120s))
      << straggling.output();
  ::kill(agents[static_cast<std::size_t>(lost)]->pid(), SIGKILL);
  EXPECT_EQ(agents[static_cast<std::size_t>(lost)]->wait(10s), 128 + SIGKILL);
  const bool regrouped = dist::agent::testing::eventually(
      [&] { return !events(node2, "inplace_regrouped").empty(); }, 60s);
  std::string both;
  for (const int i : {last, 0}) {  // (the job would train on for minutes; node 0 hosts the store)
    ::kill(agents[static_cast<std::size_t>(i)]->pid(), SIGTERM);
    EXPECT_EQ(agents[static_cast<std::size_t>(i)]->wait(60s), 128 + SIGTERM);
    both += agents[static_cast<std::size_t>(i)]->output();
  }
  ASSERT_TRUE(regrouped) << both;
  EXPECT_NE(straggling.output().find("is no longer taken for a straggler: the job regrouped"),
            std::string::npos)
      << straggling.output();
  // Flagged as rank 2 of round 0, then cleared as rank 2 of round 0, before the regroup's event.
  const auto all = events(node2, "");
  int flagged = -1, cleared = -1, regroup = -1;
  for (int i = 0; i < static_cast<int>(all.size()); ++i) {
    const Json& e = all[static_cast<std::size_t>(i)];
    if (e["event"] == "inplace_regrouped" && regroup < 0) regroup = i;
    if (e["event"] != "straggler" || e["rank"] != 2 || e["round"] != 0) continue;
    if (e["straggler"] == true && flagged < 0) flagged = i;
    if (e["straggler"] == false && flagged >= 0 && cleared < 0) cleared = i;
  }
  EXPECT_GE(flagged, 0) << both;
  EXPECT_GT(cleared, flagged) << both;
  EXPECT_LT(cleared, regroup) << both;
}

// A worker failing while a lost node's survivors regroup (node 0 waiting for the regrouped
// group's word) cannot be replaced alone: one recovery at a time, job-wide. Node 0 holds the job's
// recovery from the regroup's generation to the group's word, so the failing worker's node finds
// the regroup under way and the whole group restarts at once. (Its node used to replace it, and
// the group went on to the replacement's generation; node 0 waited on for the regroup's word,
// which never came, until its workers finished the job or 5 minutes passed, then restarted the
// group: checked with the agent before the change.) The worker, node 2's, fails as its recovery
// begins, once its agent has been told of the regroup: the test waits for its agent's line.
TEST_F(InPlaceElasticNodes, AWorkerFailingWhileTheSurvivorsRegroupRestartsTheGroupAtOnce) {
  const std::string endpoint = job_endpoint();
  const std::string fail = path("fail");
  const auto agent = [&](int i) {
    return training_agent(i, "2:3", endpoint, {},
                          {"--steps", "300", "--step-ms", "10", "--fail-in-recovery", "2:" + fail});
  };
  std::vector<std::unique_ptr<Child>> agents;
  const int lost = start_three_find_node_1(agent, agents);
  ASSERT_GT(lost, 0) << agents[0]->output();
  const auto last = static_cast<std::size_t>(3 - lost);  // node 2: its worker fails
  auto& lost_agent = *agents[static_cast<std::size_t>(lost)];
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] { return lost_agent.output().find(" step 5\n") != std::string::npos; }, 60s))
      << lost_agent.output();
  ::kill(lost_agent.pid(), SIGKILL);
  EXPECT_EQ(lost_agent.wait(10s), 128 + SIGKILL);
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] {
        return agents[last]->output().find("in-place: regrouped in round 1") != std::string::npos;
      },
      60s))
      << agents[last]->output();
  std::ofstream(fail) << "1\n";

  std::string both;
  for (const std::size_t i : {std::size_t{0}, last}) {
    const int code = agents[i]->wait(120s);
    both += agents[i]->output();
    EXPECT_EQ(code, 0) << agents[i]->output();
  }
  EXPECT_NE(both.find("worker 1 failed while the group regroups in place: restarting the whole "
                      "group"),
            std::string::npos)
      << both;
  std::string digest;
  for (const int rank : {0, 1}) {
    const auto f = final_of("job", rank);
    ASSERT_TRUE(f.has_value()) << both;
    EXPECT_EQ(f->step, 300) << both;
    EXPECT_EQ(f->world, 2) << both;
    EXPECT_EQ(f->pid, start_pid("job", rank, 1, 0)) << "the restarted group's worker: " << both;
    if (rank == 0) digest = f->digest;
    EXPECT_EQ(f->digest, digest) << both;
  }
  EXPECT_TRUE(events("job_node0", "inplace_regrouped").empty()) << "the regroup never ended";
  EXPECT_EQ(events("job_node" + std::to_string(last), "inplace_fallback").size(), 1u) << both;
}

// A hot spare under in-place: 1:2 nodes training, a third waiting for a place. Node 1 is lost: the
// spare takes its place in the next round, its worker joining the survivor's (which keeps its
// process) at a step boundary with the survivor's state. The world is two ranks throughout, so
// both end with the weights of a run that lost nothing.
TEST_F(InPlaceElasticNodes,
       AHotSpareTakesALostNodesPlaceAndEndsWithTheWeightsOfARunThatLostNothing) {
  const std::string clean = clean_digest(2, {"--steps", "300"});
  const std::string endpoint = job_endpoint();
  const auto agent = [&](int i) { return training_agent(i, "1:2", endpoint); };
  std::vector<std::unique_ptr<Child>> agents;
  ASSERT_TRUE(start_two(agent, agents));
  agents.push_back(agent(2));
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] { return agents[2]->output().find("is full: waiting for a place") != std::string::npos; },
      30s))
      << agents[2]->output();
  ::kill(agents[1]->pid(), SIGKILL);
  EXPECT_EQ(agents[1]->wait(10s), 128 + SIGKILL);

  const std::string both = node_0_and_2_succeed(agents);
  expect_two_ranks_ended_with(clean, both);
  EXPECT_EQ(final_of("job", 0)->pid, start_pid("job", 0, 0, 0)) << "the survivor kept its process";
  EXPECT_EQ(final_of("job", 1)->pid, start_pid("job", 1, 0, 1))
      << "the spare's worker started as generation 1: " << both;
  EXPECT_EQ(both.find("restarting"), std::string::npos) << both;
  EXPECT_EQ(events("job_node2", "inplace_joined").size(), 1u) << both;
}

// --nnodes 2 (MIN = MAX) loses node 1's agent, and the agent is started again (as a cluster
// manager relaunches a lost pod) once the survivor's verdict said it waits in place: too few
// nodes to go on, with a restart left, the survivor keeps its worker running and waits in the
// next round; the relaunched agent joins that round as a newcomer, its worker joins the running
// one's group, and the job ends with the weights of a run that lost nothing. (It restarted the
// group before: only a hot spare already waiting kept the survivors.)
TEST_F(InPlaceElasticNodes, ARelaunchedNodeRejoinsTheSurvivorsWhoseWorkersWaitedInPlace) {
  const std::string clean = clean_digest(2, {"--steps", "300"});
  const std::string endpoint = job_endpoint();
  const auto agent = [&](int i) { return training_agent(i, "2", endpoint); };
  std::vector<std::unique_ptr<Child>> agents;
  ASSERT_TRUE(start_two(agent, agents));
  ASSERT_TRUE(lose_node_1_waited_for_in_place(agents));
  agents.push_back(agent(2));  // node 1's agent, relaunched

  const std::string both = node_0_and_2_succeed(agents);
  expect_two_ranks_ended_with(clean, both);
  EXPECT_EQ(final_of("job", 0)->pid, start_pid("job", 0, 0, 0)) << "the survivor kept its process";
  EXPECT_EQ(final_of("job", 1)->pid, start_pid("job", 1, 0, 1))
      << "the relaunched node's worker started as generation 1: " << both;
  EXPECT_EQ(both.find("restarting"), std::string::npos) << both;
  EXPECT_EQ(both.find("stopping the workers"), std::string::npos) << both;
  EXPECT_EQ(events("job_node0", "inplace_regrouped").size(), 1u) << both;
  EXPECT_TRUE(events("job_node0", "inplace_fallback").empty()) << both;
  EXPECT_EQ(events("job_node2", "inplace_joined").size(), 1u) << both;
}

// The survivors' wait in place spends a restart, as the restart it replaces would: with
// --max-restarts 1, node 1 lost and relaunched is taken back in place once, and lost again it
// ends the job, failed, saying why (a node that keeps crashing does not loop for ever).
TEST_F(InPlaceElasticNodes, ANodeWaitedForInPlaceSpendsARestart) {
  const std::string endpoint = job_endpoint();
  const auto agent = [&](int i) {
    return training_agent(i, "2", endpoint, {}, {"--steps", "3000", "--step-ms", "10"});
  };
  std::vector<std::unique_ptr<Child>> agents;
  ASSERT_TRUE(start_two(agent, agents));
  ASSERT_TRUE(lose_node_1_waited_for_in_place(agents));
  agents.push_back(agent(2));  // relaunched
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] {
        return agents[0]->output().find("in-place: regrouped in round 1") != std::string::npos;
      },
      60s))
      << agents[0]->output() << agents[2]->output();
  ::kill(agents[2]->pid(), SIGKILL);  // lost again
  EXPECT_EQ(agents[2]->wait(10s), 128 + SIGKILL);
  const int code = agents[0]->wait(120s);
  const std::string out = agents[0]->output();
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("fewer than the minimum 2"), std::string::npos) << out;
  EXPECT_EQ(events("job_node0", "inplace_regrouped").size(), 1u) << out;
}

// The same, but the lost node comes back only after --in-place-timeout: the survivor stops its
// worker then, and waits in the same round, as a restart's round waits for MIN nodes; the
// relaunched agent's arrival completes it (the survivor's first, withdrawn, record not counted
// twice), and the whole group trains afresh to the end.
TEST_F(InPlaceElasticNodes, ANodeBackOnlyAfterTheInPlaceTimeoutMeetsAGroupStartedAfresh) {
  const std::string clean = clean_digest(2, {"--steps", "300"});
  const std::string endpoint = job_endpoint();
  const auto agent = [&](int i) {
    return training_agent(i, "2", endpoint, {"--in-place-timeout", "2"});
  };
  std::vector<std::unique_ptr<Child>> agents;
  ASSERT_TRUE(start_two(agent, agents));
  const long first = start_pid("job", 0, 0, 0);  // (a fresh start writes the same file again)
  ::kill(agents[1]->pid(), SIGKILL);
  EXPECT_EQ(agents[1]->wait(10s), 128 + SIGKILL);
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] {
        return agents[0]->output().find("while this node's workers waited in place") !=
               std::string::npos;
      },
      60s))
      << agents[0]->output();
  agents.push_back(agent(2));  // node 1's agent, relaunched late

  const std::string both = node_0_and_2_succeed(agents);
  expect_two_ranks_ended_with(clean, both);
  EXPECT_GT(first, 0);
  EXPECT_NE(final_of("job", 0)->pid, first) << "the survivor's worker was stopped: " << both;
  EXPECT_NE(both.find("round 1: node 0 of 2, global ranks 0..0 of 2"), std::string::npos) << both;
  EXPECT_EQ(events("job_node0", "inplace_fallback").size(), 1u) << both;
  EXPECT_TRUE(events("job_node0", "inplace_regrouped").empty()) << both;
}

// The lost node hosted its round's workers' store (node 0; the rendezvous store is a
// dist-rendezvous of its own): the survivor's worker has nowhere to regroup, and the group
// restarts, saying why, then trains in a world of one.
TEST_F(InPlaceElasticNodes, ALostNodeThatHostedTheWorkersStoreRestartsTheGroupSayingWhy) {
  fs::create_directories(dir_ / "job");
  const std::string host = "127.0.0.2";
  const std::string port = std::to_string(dist::agent::testing::free_port(host));
  Child store(DIST_RENDEZVOUS_BIN, {"--host", host, "--port", port}, dir_ / "store.log");
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] { return store.output().find("listening on") != std::string::npos; }, 20s))
      << store.output();
  const auto agent = [&](int i) { return training_agent(i, "1:2", host + ":" + port); };
  std::vector<std::unique_ptr<Child>> agents;
  agents.push_back(agent(0));
  agents.push_back(agent(1));
  int lost = -1;
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] {
        for (int i = 0; i < 2; ++i) {
          const std::string out = agents[static_cast<std::size_t>(i)]->output();
          if (out.find("round 0: node 0 of 2") != std::string::npos &&
              out.find(" step 5\n") != std::string::npos) {
            lost = i;
          }
        }
        return lost >= 0;
      },
      60s));
  ::kill(agents[static_cast<std::size_t>(lost)]->pid(), SIGKILL);
  EXPECT_EQ(agents[static_cast<std::size_t>(lost)]->wait(10s), 128 + SIGKILL);
  Child& survivor = *agents[static_cast<std::size_t>(1 - lost)];
  ASSERT_EQ(survivor.wait(120s), 0) << survivor.output();
  const std::string out = survivor.output();
  // Said by the agent once in the next round ("round 1's workers' store is not round 0's"), or,
  // when the worker (whose connection to that store closed with node 0) failed first, by the
  // replacement that cannot be counted there: either way the group restarts, saying why. Or the
  // node's loss ends the round while that replacement is still being counted (a sanitized run's
  // order): a new round without node 0, said so, where a fresh group starts without a restart.
  const bool new_round = out.find(
                             "round 0 ended (node(s) [0] lost): a new round with the nodes "
                             "that are there (not a restart)") != std::string::npos;
  EXPECT_TRUE(out.find("round 1's workers' store is not round 0's: the workers cannot find each "
                       "other there: stopping the workers") != std::string::npos ||
              out.find(": restarting the whole group") != std::string::npos || new_round)
      << out;
  const bool restarted =
      out.find("restarting the worker group (restart 1 of 1)") != std::string::npos;
  EXPECT_TRUE(restarted || new_round) << out;
  // The last group's worker: the restart's (attempt 1), or the new round's, which is no restart
  // (attempt 0 again) and falls back from nothing.
  const auto f = final_of("job", 0);
  ASSERT_TRUE(f.has_value()) << out;
  EXPECT_EQ(f->pid, start_pid("job", 0, restarted ? 1 : 0, 0))
      << "the last group's worker: " << out;
  const std::string name = "job_node" + std::to_string(1 - lost);
  EXPECT_EQ(events(name, "inplace_fallback").size(), restarted ? 1u : 0u) << out;
  EXPECT_TRUE(events(name, "inplace_regrouped").empty()) << out;
}

// An elastic in-place job of two nodes of one worker (--nnodes 2:3) training; a third node's
// agent starts midway: the two workers keep their processes and take the new node's worker in at
// their next step, as ranks 0 and 1 of a world of three, without a restart; the newcomer's worker
// starts as the regroup's generation and receives their state, and all three end with the same.
TEST_F(InPlaceElasticNodes, ANewcomerJoinsTheRunningWorkersAtAStepBoundary) {
  const std::string endpoint = job_endpoint();
  // Round 0 closes with two nodes one second after the second joined.
  const auto agent = [&](int i) {
    return training_agent(i, "2:3", endpoint, {"--rdzv-conf", "last_call_timeout=1"});
  };
  std::vector<std::unique_ptr<Child>> agents;
  ASSERT_NO_FATAL_FAILURE(start_two_then_a_newcomer(agent, agents));

  std::string all;
  EXPECT_EQ(wait_all(agents, all), (std::vector<int>{0, 0, 0})) << all;
  ASSERT_NO_FATAL_FAILURE(expect_one_world_at_step_300(3, all));
  for (const int rank : {0, 1, 2}) {
    const auto f = final_of("job", rank);
    EXPECT_EQ(f->generation, 1) << all;
    // Ranks 0 and 1 kept the processes they started with; rank 2 started as generation 1.
    EXPECT_EQ(f->pid, start_pid("job", rank, 0, rank < 2 ? 0 : 1)) << all;
  }
  const std::string newcomer = agents[2]->output();
  EXPECT_NE(newcomer.find("round 1: node 2 of 3, global ranks 2..2 of 3"), std::string::npos)
      << newcomer;
  EXPECT_NE(newcomer.find("round 1: this node's workers joined the running workers as "
                          "generation 1"),
            std::string::npos)
      << newcomer;
  EXPECT_NE(all.find("rank 2 joined generation 1 as a newcomer: state from rank 0"),
            std::string::npos)
      << all;
  // Published once the newcomer's worker was there: the running workers trained meanwhile.
  EXPECT_NE(agents[0]->output().find("generation 1: every worker of the new world is ready after"),
            std::string::npos)
      << agents[0]->output();
  // The first worker to see its agent's request lets go of the group (the other's collective
  // fails then, unless it saw the request too).
  EXPECT_NE(all.find(": the job regroups in round 1; waiting for generation 1"), std::string::npos)
      << all;
  EXPECT_EQ(all.find("stopping the workers"), std::string::npos) << all;
  EXPECT_EQ(all.find("restarting"), std::string::npos) << all;
  EXPECT_FALSE(any_signal_file("job")) << all;
  const auto regrouped = events("job_node0", "inplace_regrouped");
  ASSERT_EQ(regrouped.size(), 1u) << all;
  EXPECT_EQ(regrouped[0]["new_round"], 1);
  EXPECT_EQ(regrouped[0]["world_size"], 3);
  EXPECT_EQ(regrouped[0]["generation"], 1);
  EXPECT_EQ(regrouped[0]["new_nodes"], 1);
  EXPECT_EQ(regrouped[0]["ranks"], Json::array({"0->0"}));
  const auto joined = events("job_node2", "inplace_joined");
  ASSERT_EQ(joined.size(), 1u) << all;
  EXPECT_EQ(joined[0]["round"], 1);
  EXPECT_EQ(joined[0]["generation"], 1);
  EXPECT_EQ(joined[0]["ranks"], Json::array({2}));
  for (const int i : {0, 1}) {
    const std::string name = "job_node" + std::to_string(i);
    EXPECT_EQ(events(name, "node_joined").size(), 1u) << all;
    EXPECT_TRUE(events(name, "inplace_fallback").empty()) << all;
    EXPECT_TRUE(events(name, "restart").empty()) << all;
  }
}

// Rank 1 (node 1) is replaced in place; a newcomer then regroups the job into round 1; rank 0
// fails there with no restart left. Every node's report lists rank 1's replacement: node 1
// published it again in round 1 (node 0 read nothing there before), and every node counts it.
TEST_F(InPlaceElasticNodes, AReplacementBeforeARegroupIsInEveryNodesReport) {
  const std::string endpoint = job_endpoint();
  const auto agent = [&](int i) {
    // (Rank 0 fails at step 250 of the regroup's generation, whichever number it has.)
    return training_agent(i, "2:3", endpoint, {"--rdzv-conf", "last_call_timeout=1"},
                          {"--steps", "300", "--step-ms", "10", "--crash", "1:2", "--crash",
                           "0:250:1", "--crash", "0:250:2"});
  };
  std::vector<std::unique_ptr<Child>> agents;
  ASSERT_NO_FATAL_FAILURE(start_two_then_a_newcomer(agent, agents));
  std::string all;
  const auto codes = wait_all(agents, all);
  for (const int code : codes) EXPECT_NE(code, 0) << all;
  const std::string replaced =
      "replaced in place by pid " + read("job/born_1_0_1") + " (generation 1)";
  for (const auto& a : agents) {
    const std::string o = a->output();
    const auto before = o.find("Replaced in place before (the job went on):");
    ASSERT_NE(before, std::string::npos) << o;
    EXPECT_NE(o.find(replaced, before), std::string::npos) << replaced << "\n" << o;
  }
  for (const char* node : {"job_node0", "job_node1", "job_node2"}) {
    const auto end = events(node, "job_end");
    ASSERT_EQ(end.size(), 1u) << node << "\n" << all;
    EXPECT_EQ(end[0]["restarts"], 1) << node << ": " << end[0].dump();
  }
}

// The whole job paused (both workers held stopped) when a newcomer comes: its worker waits for
// them in the regroup's set-up from after the stop, a process the pause could not reach, and no
// proof. Once `dist-launch status` shows it waiting there, nothing is ended for longer than a proof
// would take (its wait published after 3 s, a view made and read within 5 s each); continued, the
// job takes the newcomer in and ends as one world of three. (Stopped before their fifth step, the
// workers' hang timeout is the early one, 5 minutes: the pause outlasts no timeout.)
TEST_F(InPlaceElasticNodes, ANewcomerArrivingDuringAPauseOfTheJobIsNoProof) {
  const std::string endpoint = job_endpoint();
  const auto agent = [&](int i) {
    return training_agent(i, "2:3", endpoint, {"--rdzv-conf", "last_call_timeout=1"},
                          {"--steps", "20", "--step-ms", "1000"});
  };
  std::vector<std::unique_ptr<Child>> agents;
  agents.push_back(agent(0));
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] { return agents[0]->output().find("hosting the rendezvous store") != std::string::npos; },
      30s))
      << agents[0]->output();
  agents.push_back(agent(1));
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] {
        return agents[0]->output().find("rank 0 step 1\n") != std::string::npos &&
               agents[1]->output().find("rank 1 step 1\n") != std::string::npos;
      },
      60s))
      << agents[0]->output() << agents[1]->output();
  const pid_t first = static_cast<pid_t>(started_pid("job", 0));
  const pid_t second = static_cast<pid_t>(started_pid("job", 1));
  ::kill(first, SIGSTOP);
  ::kill(second, SIGSTOP);
  for (std::size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(dist::agent::testing::eventually(
        [&] { return agents[i]->output().find("is held stopped") != std::string::npos; }, 30s))
        << agents[i]->output();
  }
  agents.push_back(agent(2));
  std::string seen;
  EXPECT_TRUE(status_until(endpoint, seen,
                           [](const std::string& s) {
                             return s.find("waits in its group's set-up") != std::string::npos;
                           }))
      << seen << agents[2]->output();
  const bool ended = dist::agent::testing::eventually(
      [&] {
        return agents[0]->output().find("SIGKILL") != std::string::npos ||
               agents[1]->output().find("SIGKILL") != std::string::npos;
      },
      20s);
  EXPECT_FALSE(ended) << agents[0]->output() << agents[1]->output();
  ::kill(first, SIGCONT);
  ::kill(second, SIGCONT);

  std::string all;
  EXPECT_EQ(wait_all(agents, all), (std::vector<int>{0, 0, 0})) << all;
  for (const int rank : {0, 1, 2}) {
    const auto f = final_of("job", rank);
    ASSERT_TRUE(f.has_value()) << all;
    EXPECT_EQ(f->generation, 1) << all;
    EXPECT_EQ(f->pid, start_pid("job", rank, 0, rank < 2 ? 0 : 1)) << all;
  }
  EXPECT_TRUE(events("job_node0", "hang").empty()) << all;
  EXPECT_TRUE(events("job_node1", "hang").empty()) << all;
}

// A newcomer's worker that dies as it starts, before it says it arrived: the running workers
// cannot take it in, and node 0 does not wait minutes for it (arrival_timeout(): 4/5 of
// --in-place-timeout). Its agent says the worker failed before joining and ends the round (node 0,
// waiting for its arrival, hears it too), and the job restarts: its next attempt, on all three
// nodes, ends as one world of three.
TEST_F(InPlaceElasticNodes, ANewcomersWorkerDyingBeforeItJoinsIsAGroupRestartNotAWait) {
  const std::string endpoint = job_endpoint();
  const auto agent = [&](int i) {
    return training_agent(i, "2:3", endpoint, {"--rdzv-conf", "last_call_timeout=1"},
                          {"--steps", "300", "--step-ms", "10", "--fail-at-start", "2:1"});
  };
  std::vector<std::unique_ptr<Child>> agents;
  ASSERT_NO_FATAL_FAILURE(start_two_then_a_newcomer(agent, agents));

  std::string all;
  EXPECT_EQ(wait_all(agents, all), (std::vector<int>{0, 0, 0})) << all;
  EXPECT_NE(all.find("rank 2: failing as it starts, before it arrived"), std::string::npos) << all;
  EXPECT_NE(agents[2]->output().find("worker 2 failed before the running workers took it in as "
                                     "generation 1: restarting the whole group"),
            std::string::npos)
      << all;
  EXPECT_EQ(all.find("replaced in place"), std::string::npos) << all;
  EXPECT_EQ(all.find("publishing it anyway"), std::string::npos) << all;
  EXPECT_TRUE(events("job_node0", "inplace_regrouped").empty()) << "nothing published: " << all;
  const auto fallback = events("job_node2", "inplace_fallback");
  ASSERT_EQ(fallback.size(), 1u) << all;
  EXPECT_EQ(fallback[0]["round"], 1) << all;
  for (const int i : {0, 1, 2}) {
    EXPECT_EQ(events("job_node" + std::to_string(i), "restart").size(), 1u) << all;
  }
  expect_one_world_at_step_300(3, all);
}

// The running workers finish the job while the nodes regroup for a newcomer: they end their loop
// as soon as node 0's agent says a node waits to join. Whether that comes before node 0 names the
// regroup's generation (the newcomer then starts no worker), after it (its worker is stopped), or
// after the regroup (the newcomer's worker trained its last steps with them) is the machine's
// timing; every way, the job ends done on all three nodes, without a restart, and the ranks that
// trained agree. (The next test takes the second way every time.)
TEST_F(InPlaceElasticNodes, WorkersFinishingDuringANewcomersRegroupEndTheJobDone) {
  const std::string endpoint = job_endpoint();
  const fs::path finish = dir_ / "finish";
  const auto agent = [&](int i) {
    return training_agent(
        i, "2:4", endpoint, {"--rdzv-conf", "last_call_timeout=2"},
        {"--steps", "100000", "--step-ms", "10", "--finish-at-file", finish.string()});
  };
  std::vector<std::unique_ptr<Child>> agents;
  ASSERT_NO_FATAL_FAILURE(start_two_then_a_newcomer(agent, agents));
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] {
        return agents[0]->output().find("in-place: a node is waiting to join") != std::string::npos;
      },
      60s))
      << agents[0]->output();
  std::ofstream(finish) << "now\n";

  std::string all;
  EXPECT_EQ(wait_all(agents, all), (std::vector<int>{0, 0, 0})) << all;
  const auto first = final_of("job", 0), second = final_of("job", 1), third = final_of("job", 2);
  ASSERT_TRUE(first && second) << all;
  const int world = third ? 3 : 2;  // the newcomer's worker trained, or it never did
  for (const auto& f : {*first, *second}) {
    EXPECT_EQ(f.world, world) << all;
    EXPECT_EQ(f.step, first->step) << all;
    EXPECT_EQ(f.digest, first->digest) << all;
  }
  EXPECT_EQ(first->pid, start_pid("job", 0, 0, 0)) << all;
  EXPECT_EQ(second->pid, start_pid("job", 1, 0, 0)) << all;
  if (third) {
    EXPECT_EQ(third->step, first->step) << all;
    EXPECT_EQ(third->digest, first->digest) << all;
  } else {
    EXPECT_NE(agents[2]->output().find("the job finished: its other workers succeeded"),
              std::string::npos)
        << agents[2]->output();
    const auto finished = events("job_node2", "inplace_finished");
    ASSERT_EQ(finished.size(), 1u) << all;
    EXPECT_EQ(finished[0]["round"], 1);
  }
  EXPECT_EQ(all.find("restarting"), std::string::npos) << all;
  for (const int i : {0, 1, 2}) {
    const std::string name = "job_node" + std::to_string(i);
    EXPECT_TRUE(events(name, "restart").empty()) << all;
    const auto end = events(name, "job_end");
    ASSERT_EQ(end.size(), 1u) << all;
    EXPECT_EQ(end[0]["outcome"], "succeeded") << end[0];
  }
}

// The same, once the regroup's generation is out: the running workers, asked to regroup, end
// their loop instead (as a loop at its last step would). The newcomer's worker, started as that
// generation, has nobody left to join: its agent is told, stops it, and the job ends done. (When
// the request reaches a worker between its check and its next unit, the group regroups first and
// all three end a step later, in the world of three: the job ends done that way too.)
TEST_F(InPlaceElasticNodes, WorkersFinishingAfterTheGenerationIsNamedEndTheJobDone) {
  const std::string endpoint = job_endpoint();
  const auto agent = [&](int i) {
    return training_agent(i, "2:3", endpoint, {"--rdzv-conf", "last_call_timeout=1"},
                          {"--steps", "100000", "--step-ms", "10", "--finish-when-asked"});
  };
  std::vector<std::unique_ptr<Child>> agents;
  ASSERT_NO_FATAL_FAILURE(start_two_then_a_newcomer(agent, agents));

  std::string all;
  EXPECT_EQ(wait_all(agents, all), (std::vector<int>{0, 0, 0})) << all;
  const auto first = final_of("job", 0), second = final_of("job", 1), third = final_of("job", 2);
  ASSERT_TRUE(first && second) << all;
  for (const auto& f : {*first, *second}) {
    EXPECT_EQ(f.world, third ? 3 : 2) << all;
    EXPECT_EQ(f.step, first->step) << all;
    EXPECT_EQ(f.digest, first->digest) << all;
  }
  EXPECT_EQ(first->pid, start_pid("job", 0, 0, 0)) << all;
  EXPECT_EQ(second->pid, start_pid("job", 1, 0, 0)) << all;
  const auto joined = events("job_node2", "inplace_joined");
  ASSERT_EQ(joined.size(), 1u) << "the newcomer's worker started as generation 1: " << all;
  EXPECT_EQ(joined[0]["generation"], 1);
  EXPECT_EQ(all.find("restarting"), std::string::npos) << all;
  if (third) {  // regrouped first (above)
    EXPECT_EQ(third->digest, first->digest) << all;
  } else {
    EXPECT_NE(agents[2]->output().find("the job finished: its other workers succeeded"),
              std::string::npos)
        << agents[2]->output();
    const auto told = events("job_node0", "inplace_finished");
    ASSERT_EQ(told.size(), 1u) << all;
    EXPECT_EQ(told[0]["generation"], 1) << told[0];
    const auto stopped = events("job_node2", "inplace_finished");
    ASSERT_EQ(stopped.size(), 1u) << all;
    EXPECT_EQ(stopped[0]["generation"], 1) << stopped[0];
  }
  for (const int i : {0, 1, 2}) {
    const std::string name = "job_node" + std::to_string(i);
    EXPECT_TRUE(events(name, "restart").empty()) << all;
    const auto end = events(name, "job_end");
    ASSERT_EQ(end.size(), 1u) << all;
    EXPECT_EQ(end[0]["outcome"], "succeeded") << end[0];
  }
}
