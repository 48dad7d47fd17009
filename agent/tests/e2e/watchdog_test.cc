// Watchdogs, events and metrics through the real dist-launch: torch's file timer protocol (the
// SDK's C++ client; torch's own client is tests/torch/file_timer_test.py), the SDK's heartbeat
// with real SIGSTOP and SIGABRT, the health check and the metrics over real sockets, the event log.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "http_client.h"
#include "process_helpers.h"
#include "programs.h"
#include "test_ports.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using dist::agent::testing::Child;
using dist::agent::testing::eventually;
using dist::agent::testing::http_request;
using Json = nlohmann::json;

const std::string kWorker = DIST_WATCHDOG_WORKER_BIN;
const std::string kTestWorker = DIST_TEST_WORKER_BIN;

class Watchdogs : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dist-watchdogs-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // dist-launch with `args`, its output in the test's directory (`log`: agents side by side).
  std::unique_ptr<Child> launch(const std::vector<std::string>& args,
                                const std::map<std::string, std::string>& env = {},
                                const std::string& log = "launch.log") {
    return std::make_unique<Child>(DIST_LAUNCH_BIN, args, dir_ / log, env,
                                   std::vector<std::string>{"OMP_NUM_THREADS"});
  }

  // The port in the agent's "serving <what> at http://host:PORT" line, once it is there.
  static int served_port(const Child& agent, const std::string& what) {
    const std::regex line("serving " + what + " at http://[^ ]*:([0-9]+)");
    std::smatch m;
    std::string out;
    const bool found = eventually(
        [&] {
          out = agent.output();
          return std::regex_search(out, m, line);
        },
        20s);
    return found ? std::stoi(m[1]) : -1;
  }

  static pid_t read_pid(const std::string& file) {
    const pid_t pid = dist::agent::testing::written_pid(file, 20s);
    return pid > 0 ? pid : -1;
  }

  std::vector<Json> events(const std::string& file) const {
    std::vector<Json> lines;
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line)) lines.push_back(Json::parse(line));
    return lines;
  }

  fs::path dir_;
};

std::map<std::string, std::string> file_timer_env(const std::string& pipe) {
  return {{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}, {"TORCHELASTIC_TIMER_FILE", pipe}};
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// ------------------------------------------------------------------------------------------------
// File timer (the SDK's client, the same requests as torch's)

TEST_F(Watchdogs, AnExpiredFileTimerKillsTheWorkerAndTheGroupRestarts) {
  // Each worker sets a timer it releases, then one it does not; attempt 1 succeeds at once. Were
  // the release lost, 'released' (the earlier expiration) would be the one reported.
  const std::string pipe = path("timer");
  auto agent = launch({"--nproc-per-node",
                       "2",
                       "--max-restarts",
                       "1",
                       "--event-log",
                       path("events.jsonl"),
                       "--no-python",
                       kWorker,
                       "exit-on-attempt",
                       "1",
                       "0",
                       "timer",
                       "released",
                       "200",
                       "release",
                       "released",
                       "timer",
                       "step_${local_rank}",
                       "400",
                       "hang"},
                      file_timer_env(pipe));
  ASSERT_EQ(agent->wait(), 0) << agent->output();
  const std::string out = agent->output();
  EXPECT_NE(out.find("timer expired (scope 'step_"), std::string::npos) << out;
  EXPECT_EQ(out.find("scope 'released'"), std::string::npos) << out;
  EXPECT_NE(out.find("restarting the worker group (restart 1 of 1)"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(pipe)) << "the pipe is removed when the agent ends";
  int expired = 0;
  for (const Json& e : events(path("events.jsonl"))) {
    if (e["event"] != "timer_expired") continue;
    ++expired;
    EXPECT_EQ(e["scope_id"], "step_" + std::to_string(e["local_rank"].get<int>())) << e;
    EXPECT_EQ(e["signal"], "SIGKILL") << e;
  }
  EXPECT_GE(expired, 1);
}

TEST_F(Watchdogs, TheReportNamesTheTimerAndTheRequestsSignalIsTheOneSent) {
  auto agent = launch(
      {"--no-python", kWorker, "timer", "train_step", "300", std::to_string(SIGTERM), "hang"},
      file_timer_env(path("timer")));
  EXPECT_EQ(agent->wait(), 128 + SIGTERM) << agent->output();
  const std::string out = agent->output();
  EXPECT_NE(out.find("message   : timer expired (scope 'train_step')"), std::string::npos) << out;
  EXPECT_NE(out.find("(SIGTERM)"), std::string::npos) << out;
}

TEST_F(Watchdogs, ATimerOfAProcessOutsideTheJobSignalsNothing) {
  const std::string pipe = path("timer");
  auto agent =
      launch({"--no-python", kWorker, "pidfile", path("pid"), "hang"}, file_timer_env(pipe));
  ASSERT_GT(read_pid(path("pid")), 0) << agent->output();
  Child bystander("/bin/sleep", {"60"}, dir_ / "sleep.log");
  {  // as a FileTimerClient would write it, already expired
    std::ofstream request(pipe);
    request << Json{{"version", 1},
                    {"pid", bystander.pid()},
                    {"scope_id", "stray"},
                    {"expiration_time", 1.0},
                    {"signal", SIGKILL}}
                   .dump()
            << "\n";
  }
  EXPECT_TRUE(eventually(
      [&] {
        return agent->output().find("is not in a running worker's process group") !=
               std::string::npos;
      },
      20s))
      << agent->output();
  EXPECT_FALSE(dist::agent::testing::process_gone(bystander.pid(), 0ms));
  ::kill(agent->pid(), SIGTERM);
  EXPECT_EQ(agent->wait(), 128 + SIGTERM) << agent->output();
}

TEST_F(Watchdogs, WithoutTheFileTimerTheClientSaysNobodyServesThePipe) {
  auto agent = launch({"--no-python", kWorker, "timer", "step", "1000"},
                      {{"TORCHELASTIC_TIMER_FILE", path("nobody")}});
  EXPECT_EQ(agent->wait(), 65) << agent->output();
  EXPECT_NE(agent->output().find("TORCHELASTIC_ENABLE_FILE_TIMER=1"), std::string::npos)
      << agent->output();
}

// ------------------------------------------------------------------------------------------------
// Heartbeat

TEST_F(Watchdogs, AStoppedWorkerIsKilledForItsSilenceAndTheGroupRestarts) {
  auto agent =
      launch({"--nproc-per-node", "2", "--max-restarts", "1", "--worker-heartbeat-timeout", "1",
              "--event-log", path("events.jsonl"), "--no-python", kWorker, "exit-on-attempt", "1",
              "0", "beat-every", "10", "pidfile", path("pid_${local_rank}"), "hang"});
  const pid_t stopped = read_pid(path("pid_0"));
  ASSERT_GT(stopped, 0) << agent->output();
  ::kill(stopped, SIGSTOP);
  ASSERT_EQ(agent->wait(), 0) << agent->output();
  const std::string out = agent->output();
  EXPECT_NE(out.find("worker 0 (local rank 0, pid " + std::to_string(stopped) +
                     "): no heartbeat for 1 s (hung?)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("process stopped; sending SIGKILL"), std::string::npos) << out;
  EXPECT_FALSE(std::regex_search(out, std::regex(R"(worker 1 \(local rank 1, pid [0-9]+\): no)")))
      << "the beating worker is not taken for hung\n"
      << out;
  EXPECT_TRUE(dist::agent::testing::process_gone(stopped, 0ms));
  bool hung = false, exit_reported = false;
  for (const Json& e : events(path("events.jsonl"))) {
    if (e["event"] == "worker_hung") {
      hung = true;
      EXPECT_EQ(e["pid"], stopped) << e;
      EXPECT_EQ(e["signal"], "SIGKILL") << e;
      EXPECT_GE(e["silent_ms"].get<int>(), 1000) << e;
    }
    if (e["event"] == "worker_exit" && e["pid"] == stopped) {
      exit_reported = true;
      EXPECT_EQ(e["reason"], "no heartbeat for 1 s (hung?)") << e;
      EXPECT_EQ(e["signal"], "SIGKILL") << e;
      EXPECT_TRUE(e["failed"].get<bool>()) << e;
    }
  }
  EXPECT_TRUE(hung && exit_reported);
}

// A worker held stopped keeps a stop signal pending until it is continued: the group's stop
// continues it, so that it ends by the signal now, not by SIGKILL after the shutdown timeout.
TEST_F(Watchdogs, AWorkerHeldStoppedEndsByTheStopSignalNotAfterTheShutdownTimeout) {
  auto agent = launch({"--nproc-per-node", "2", "--hang-timeout", "0", "--shutdown-timeout", "600",
                       "--no-python", kWorker, "pidfile", path("pid_${local_rank}"), "stop-if-rank",
                       "0", "hang"});
  const pid_t stopped = read_pid(path("pid_0"));
  ASSERT_GT(stopped, 0) << agent->output();
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] {
        std::ifstream stat("/proc/" + std::to_string(stopped) + "/stat");
        std::string text((std::istreambuf_iterator<char>(stat)), {});
        const auto paren = text.rfind(')');
        return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] == 'T';
      },
      20s))
      << agent->output();
  ::kill(agent->pid(), SIGTERM);
  EXPECT_NE(agent->wait(60s), -1) << "the launcher waits on after its workers' stop signal";
  const std::string out = agent->output();
  EXPECT_EQ(out.find("after the stop signal: sending SIGKILL"), std::string::npos) << out;
  EXPECT_TRUE(dist::agent::testing::process_gone(stopped, 0ms)) << out;
}

// A job suspended and resumed (Slurm's `scontrol suspend`, a kill -STOP of its processes: the
// agent and its workers held together, here for 8 s) is not taken for hung: the agent's own stall
// is not counted in its workers' silences (--hang-timeout 3), against their heartbeats
// (--worker-heartbeat-timeout 3) or torch's file timers (an 11 s budget for about 5 s of work).
// All three used to end the workers as soon as the agent was continued. Then again without the
// hang detector (--hang-timeout 0), whose sampler is the timer that sees most stalls.
TEST_F(Watchdogs, AJobSuspendedAndResumedWithItsAgentIsNotTakenForHung) {
  for (const std::string hang_timeout : {"3", "0"}) {
    SCOPED_TRACE("--hang-timeout " + hang_timeout);
    fs::remove_all(path("events.jsonl"));
    auto agent = launch({"--nproc-per-node",
                         "2",
                         "--hang-timeout",
                         hang_timeout,
                         "--worker-heartbeat-timeout",
                         "3",
                         "--event-log",
                         path("events.jsonl"),
                         "--no-python",
                         kWorker,
                         "beat-every",
                         "10",
                         "timer",
                         "budget",
                         "11000",
                         "steps",
                         "10",
                         "20",
                         "pidfile",
                         path("pid_${local_rank}"),
                         "steps",
                         "200",
                         "20",
                         "release",
                         "budget"},
                        file_timer_env(path("timer")));
    const std::vector<pid_t> held{agent->pid(), read_pid(path("pid_0")), read_pid(path("pid_1"))};
    fs::remove(path("pid_0"));
    fs::remove(path("pid_1"));
    ASSERT_GT(held[1], 0) << agent->output();
    ASSERT_GT(held[2], 0) << agent->output();
    for (const pid_t pid : held) ::kill(pid, SIGSTOP);  // as Slurm holds a job: all of it
    std::this_thread::sleep_for(8s);                    // (the suspension itself)
    for (auto pid = held.rbegin(); pid != held.rend(); ++pid) ::kill(*pid, SIGCONT);
    ASSERT_EQ(agent->wait(), 0) << agent->output();
    const std::string out = agent->output();
    EXPECT_NE(out.find("the agent did not run for"), std::string::npos) << out;
    for (const char* harm :
         {"no heartbeat", "timer expired", "hang on ", "looking at where every rank is"}) {
      EXPECT_EQ(out.find(harm), std::string::npos) << harm << "\n" << out;
    }
    for (const Json& e : events(path("events.jsonl"))) {
      EXPECT_NE(e["event"], "worker_hung") << e;
      EXPECT_NE(e["event"], "timer_expired") << e;
      EXPECT_NE(e["event"], "hang") << e;
    }
  }
}

// The same suspension, continued in the order Slurm may continue it: the worker first, which
// ends (its file is there) while the agent is still held. The first thing the agent then sees is
// its worker's exit, not a timer: the stall is still said. It used to be said only when a timer
// came first (the worker's exit stopped the timers that would have seen it): the real-Slurm
// suspend test failed one run in three.
TEST_F(Watchdogs, AStallSeenFirstThroughAWorkersExitIsStillSaid) {
  auto agent = launch({"--nproc-per-node", "1", "--hang-timeout", "3", "--no-python", kTestWorker,
                       "pidfile", path("pid_0"), "wait-file", path("go"), "exit", "0"});
  const pid_t worker = read_pid(path("pid_0"));
  ASSERT_GT(worker, 0) << agent->output();
  ::kill(agent->pid(), SIGSTOP);
  ::kill(worker, SIGSTOP);
  std::this_thread::sleep_for(8s);  // (the suspension itself)
  std::ofstream(path("go")) << "go\n";
  ::kill(worker, SIGCONT);
  ASSERT_TRUE(eventually(
      [&] {
        const auto p = dist::agent::testing::process_info(worker);
        return !p || p->state == 'Z';
      },
      20s))
      << "the worker ends while its agent is held\n"
      << agent->output();
  ::kill(agent->pid(), SIGCONT);
  ASSERT_EQ(agent->wait(), 0) << agent->output();
  const std::string out = agent->output();
  EXPECT_NE(out.find("the agent did not run for"), std::string::npos) << out;
  for (const char* harm : {"hang on ", "looking at where every rank is"}) {
    EXPECT_EQ(out.find(harm), std::string::npos) << harm << "\n" << out;
  }
}

// Every worker of the job held stopped by its user (kill -STOP of the workers, the agent left
// running) for longer than the automatic hang timeout (30 s at least): a pause of the job, said
// and left alone, as the agent says it will be; continued, the job ends well. It used to be
// ended at the hang timeout's look (33 s), a stopped rank taken for proof.
TEST_F(Watchdogs, AWholeJobPausedLongerThanTheHangTimeoutIsNotEnded) {
  auto agent =
      launch({"--nproc-per-node", "2", "--event-log", path("events.jsonl"), "--no-python", kWorker,
              "steps", "20", "20", "pidfile", path("pid_${local_rank}"), "steps", "100", "20"});
  const std::vector<pid_t> workers{read_pid(path("pid_0")), read_pid(path("pid_1"))};
  ASSERT_GT(workers[0], 0) << agent->output();
  ASSERT_GT(workers[1], 0) << agent->output();
  for (const pid_t pid : workers) ::kill(pid, SIGSTOP);
  ASSERT_TRUE(eventually(
      [&] { return agent->output().find("a pause of the job: not ended") != std::string::npos; },
      60s))
      << agent->output();
  for (const pid_t pid : workers) ::kill(pid, SIGCONT);
  ASSERT_EQ(agent->wait(), 0) << agent->output();
  const std::string out = agent->output();
  EXPECT_NE(out.find("taken for a pause of the job"), std::string::npos) << out;
  EXPECT_EQ(out.find("hang on "), std::string::npos) << out;
  EXPECT_EQ(out.find("SIGKILL"), std::string::npos) << out;
  for (const Json& e : events(path("events.jsonl"))) {
    EXPECT_NE(e["event"], "hang") << e;
  }
}

TEST_F(Watchdogs, ARunningSilentWorkerGetsSIGABRT) {
  auto agent = launch(
      {"--worker-heartbeat-timeout", "0.3", "--no-python", kWorker, "no-core", "beat", "hang"});
  EXPECT_EQ(agent->wait(), 128 + SIGABRT) << agent->output();
  const std::string out = agent->output();
  EXPECT_NE(out.find("no heartbeat for 0.3 s (hung?)"), std::string::npos) << out;
  EXPECT_NE(out.find("sending SIGABRT"), std::string::npos) << out;
  EXPECT_NE(out.find("message   : no heartbeat for 0.3 s (hung?)"), std::string::npos) << out;
}

TEST_F(Watchdogs, ASilentWorkerThatIgnoresSIGABRTIsKilledAfterTheGrace) {
  auto agent = launch({"--worker-heartbeat-timeout", "0.3", "--no-python", kWorker, "ignore",
                       std::to_string(SIGABRT), "beat", "hang"});
  EXPECT_EQ(agent->wait(), 128 + SIGKILL) << agent->output();
  EXPECT_NE(agent->output().find("ms after SIGABRT: sending SIGKILL"), std::string::npos)
      << agent->output();
}

TEST_F(Watchdogs, AWorkerThatNeverBeatsIsNotWatched) {
  auto agent =
      launch({"--worker-heartbeat-timeout", "0.2", "--no-python", kWorker, "sleep", "700"});
  EXPECT_EQ(agent->wait(), 0) << agent->output();
  EXPECT_EQ(agent->output().find("no heartbeat"), std::string::npos) << agent->output();
}

// ------------------------------------------------------------------------------------------------
// Hangs of C++ workers (the SDK's step() and Pause)

TEST_F(Watchdogs, ASilenceLongerThanTheHangTimeoutEndsTheWorker) {
  auto agent = launch({"--hang-timeout", "1", "--event-log", path("events.jsonl"), "--no-python",
                       kWorker, "steps", "10", "20", "sleep", "4000", "steps", "5", "20"});
  EXPECT_NE(agent->wait(), 0) << agent->output();
  EXPECT_NE(agent->output().find("hang on "), std::string::npos) << agent->output();
}

// Steps of 1.2 s (a reading sees each alone) and a declared pause of 6 s between two (a
// checkpoint): the pause is no step's time, so the automatic timeout after it is still the floor,
// 30 s, not 10 x the 7.2 s step it made of it, and a hang after it is looked at 30 s in.
TEST_F(Watchdogs, ADeclaredPauseLeavesTheAutomaticTimeoutAsTheStepsMadeIt) {
  auto agent = launch({"--no-python", kWorker, "steps", "6", "1200", "pause", "6000", "checkpoint",
                       "steps", "3", "1200", "hang"});
  EXPECT_TRUE(eventually(
      [&] {
        return agent->output().find("(hang timeout 30.0 s): looking at where every rank is") !=
               std::string::npos;
      },
      75s))
      << agent->output();
  EXPECT_EQ(agent->output().find("(hang timeout 6"), std::string::npos) << agent->output();
  ::kill(agent->pid(), SIGTERM);
  EXPECT_EQ(agent->wait(), 128 + SIGTERM) << agent->output();
}

TEST_F(Watchdogs, ADeclaredPauseIsNoSilenceWhateverTheHangTimeout) {
  // The same silence as above, said: nothing is looked at, nothing ended.
  auto agent =
      launch({"--hang-timeout", "1", "--event-log", path("events.jsonl"), "--no-python", kWorker,
              "steps", "10", "20", "pause", "4000", "checkpoint", "steps", "5", "20"});
  ASSERT_EQ(agent->wait(), 0) << agent->output();
  EXPECT_EQ(agent->output().find("hang on "), std::string::npos) << agent->output();
  EXPECT_EQ(agent->output().find("looking at where every rank is"), std::string::npos)
      << agent->output();
  for (const Json& e : events(path("events.jsonl"))) {
    EXPECT_NE(e["event"], "worker_hung") << e;
    EXPECT_NE(e["event"], "hang") << e;
  }
}

TEST_F(Watchdogs, APythonWorkerWithoutTheHookIsSaidOnce) {
  // An interpreter that ignores PYTHONPATH (python -I, through PYTHON_EXEC's wrapper): no hook.
  const std::string wrapper = path("python-isolated");
  {
    std::ofstream out(wrapper);
    out << "#!/bin/sh\nexec python3 -I \"$@\"\n";
  }
  fs::permissions(wrapper, fs::perms::owner_all);
  const std::string script = path("train.py");
  std::ofstream(script) << "import time\ntime.sleep(20)\n";
  // The four jobs run side by side: each lasts well past the hook's grace (20 s against 10 s:
  // a sanitized agent's reading among eight interpreters' start-up comes late).
  auto agent = launch({"--nproc-per-node", "2", script}, {{"PYTHON_EXEC", wrapper}});
  auto hooked = launch({"--nproc-per-node", "2", script}, {}, "hooked.log");  // the same, hooked
  // --no-python naming the interpreter itself: the same (it said nothing: not "Python workers").
  auto isolated =
      launch({"--nproc-per-node", "2", "--no-python", "python3", "-I", script}, {}, "isolated.log");
  auto plain = launch({"--nproc-per-node", "2", "--no-python", "python3", script}, {}, "plain.log");

  ASSERT_EQ(agent->wait(), 0) << agent->output();
  const std::string out = agent->output();
  EXPECT_EQ(count(out, "dist-launch's progress hook is not in this Python worker"), 1U) << out;
  ASSERT_EQ(hooked->wait(), 0) << hooked->output();
  EXPECT_EQ(hooked->output().find("progress hook is not"), std::string::npos) << hooked->output();
  ASSERT_EQ(isolated->wait(), 0) << isolated->output();
  EXPECT_EQ(count(isolated->output(), "dist-launch's progress hook is not in this Python worker"),
            1U)
      << isolated->output();
  ASSERT_EQ(plain->wait(), 0) << plain->output();
  EXPECT_EQ(plain->output().find("progress hook is not"), std::string::npos) << plain->output();
}

// ------------------------------------------------------------------------------------------------
// Health check and metrics

TEST_F(Watchdogs, TheHealthCheckAnswersWithTheMostSilentWorkersProgress) {
  // One beat, then the worker stops itself: no heartbeat timeout, so it stays, ever more silent.
  auto agent = launch({"--no-python", kWorker, "beat", "pidfile", path("pid"), "stop-if-rank", "0"},
                      {{"TORCHELASTIC_HEALTH_CHECK_PORT", "0"}});
  const int port = served_port(*agent, "the health check");
  ASSERT_GT(port, 0) << agent->output();
  const pid_t worker = read_pid(path("pid"));
  ASSERT_GT(worker, 0);
  Json body;
  ASSERT_TRUE(eventually(
      [&] {
        const auto r = http_request(port, "GET / HTTP/1.1");
        if (r.status != 200) return false;
        body = Json::parse(r.body);
        return body.contains("most_silent_worker") &&
               body["most_silent_worker"]["heartbeat_age_s"].get<double>() >= 0.3;
      },
      20s))
      << body.dump() << agent->output();
  EXPECT_EQ(body["alive"], true);
  EXPECT_EQ(body["state"], "running");
  EXPECT_EQ(body["workers_alive"], 1);
  EXPECT_EQ(body["timeout_s"], 60);
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  EXPECT_LE(body["last_progress_time"].get<long long>(), now);
  EXPECT_GE(body["last_progress_time"].get<long long>(), now - 30);
  EXPECT_EQ(http_request(port, "GET /healthz HTTP/1.1").status, 200);
  const auto head = http_request(port, "HEAD / HTTP/1.1");
  EXPECT_EQ(head.status, 200);
  EXPECT_TRUE(head.body.empty());
  EXPECT_EQ(http_request(port, "GET /nothing HTTP/1.1").status, 404);
  EXPECT_EQ(http_request(port, "POST / HTTP/1.1").status, 405);
  // The agent stops first; the worker, continued before, could end its script (exit 0) and be
  // reaped as a success before the agent's SIGTERM came.
  ::kill(agent->pid(), SIGTERM);
  EXPECT_TRUE(eventually(
      [&] { return agent->output().find("SIGTERM received") != std::string::npos; }, 20s))
      << agent->output();
  ::kill(worker, SIGCONT);
  EXPECT_EQ(agent->wait(), 128 + SIGTERM) << agent->output();
}

// One sample line: name{labels} value.
const std::regex kSample(R"(([a-z_]+)(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? (-?[0-9.e+-]+))");

TEST_F(Watchdogs, TheMetricsAreValidPrometheusTextWithTheWorkersHeartbeats) {
  auto agent = launch({"--nproc-per-node", "2", "--metrics-port", "0", "--no-python", kWorker,
                       "beat-every", "10", "pidfile", path("pid_${local_rank}"), "hang"});
  const int port = served_port(*agent, "Prometheus metrics");
  ASSERT_GT(port, 0) << agent->output();
  ASSERT_GT(read_pid(path("pid_0")), 0);
  ASSERT_GT(read_pid(path("pid_1")), 0);
  dist::agent::testing::HttpReply r;
  ASSERT_TRUE(eventually(
      [&] {
        r = http_request(port, "GET /metrics HTTP/1.1");
        // Both workers alive and both past their first heartbeat (the pid files come before it).
        return r.body.find("dist_launch_workers_alive 2\n") != std::string::npos &&
               r.body.find("heartbeats_total{rank=\"0\"") != std::string::npos &&
               r.body.find("heartbeats_total{rank=\"1\"") != std::string::npos;
      },
      20s))
      << r.body;
  EXPECT_NE(r.head.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << r.head;
  std::set<std::string> typed;
  std::istringstream lines(r.body);
  std::string line;
  while (std::getline(lines, line)) {
    SCOPED_TRACE(line);
    std::smatch m;
    if (std::regex_match(line, m, std::regex("# TYPE ([a-z_]+) (gauge|counter)"))) {
      EXPECT_TRUE(typed.insert(m[1]).second) << "one TYPE per family";
      continue;
    }
    if (line.rfind("# HELP ", 0) == 0) continue;
    ASSERT_TRUE(std::regex_match(line, m, kSample));
    EXPECT_TRUE(typed.contains(m[1])) << "a sample after its family's TYPE";
  }
  EXPECT_NE(r.body.find("dist_launch_state{state=\"running\"} 1\n"), std::string::npos);
  for (const char* rank : {"0", "1"}) {
    const std::regex age(std::string(R"(dist_launch_worker_heartbeat_age_seconds\{rank=")") + rank +
                         R"(",local_rank=")" + rank + R"("\} ([0-9.e-]+))");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.body, m, age)) << r.body;
    EXPECT_LT(std::stod(m[1]), 10.0);
  }
  ::kill(agent->pid(), SIGTERM);
  EXPECT_EQ(agent->wait(), 128 + SIGTERM) << agent->output();
}

// ------------------------------------------------------------------------------------------------
// Event log

TEST_F(Watchdogs, TheEventLogOfAJobWithOneRestart) {
  // Attempt 0: rank 1 exits 3, rank 0 is stopped (SIGTERM); attempt 1: both succeed.
  auto agent = launch({"--nproc-per-node", "2", "--max-restarts", "1", "--rdzv-id", "evjob",
                       "--event-log", path("events.jsonl"), "--no-python", kTestWorker,
                       "fail-on-attempt", "1", "0", "exit-if-rank", "1", "3", "forever"});
  ASSERT_EQ(agent->wait(), 0) << agent->output();
  const auto lines = events(path("events.jsonl"));
  std::vector<std::string> names;
  for (const Json& e : lines) {
    names.push_back(e["event"]);
    for (const char* field : {"time", "ts_ms", "run_id", "host", "agent_pid"}) {
      EXPECT_TRUE(e.contains(field)) << field << " in " << e;
    }
    EXPECT_EQ(e["run_id"], "evjob");
    EXPECT_EQ(e["agent_pid"], agent->pid());
  }
  const std::vector<std::string> expected = {
      "job_start",   "rendezvous",  "worker_start", "worker_start", "worker_exit",
      "worker_exit", "restart",     "rendezvous",   "worker_start", "worker_start",
      "worker_exit", "worker_exit", "job_end"};
  ASSERT_EQ(names, expected);
  EXPECT_EQ(lines[0]["nproc_per_node"], 2);
  EXPECT_EQ(lines[0]["max_restarts"], 1);
  EXPECT_EQ(lines[1]["round"], 0);
  EXPECT_EQ(lines[1]["world_size"], 2);
  const Json& failed = lines[4]["rank"] == 1 ? lines[4] : lines[5];
  const Json& stopped = lines[4]["rank"] == 1 ? lines[5] : lines[4];
  EXPECT_EQ(failed["exit_code"], 3);
  EXPECT_TRUE(failed["signal"].is_null());
  EXPECT_EQ(failed["failed"], true);
  EXPECT_TRUE(stopped["exit_code"].is_null());
  EXPECT_EQ(stopped["signal"], "SIGTERM");
  EXPECT_EQ(stopped["failed"], false);
  EXPECT_EQ(lines[6]["restart_count"], 1);
  EXPECT_EQ(lines[7]["round"], 1);
  EXPECT_EQ(lines[7]["restart_count"], 1);
  for (int i : {10, 11}) {
    EXPECT_EQ(lines[i]["exit_code"], 0);
    EXPECT_EQ(lines[i]["round"], 1);
  }
  EXPECT_EQ(lines[12]["outcome"], "succeeded");
  EXPECT_EQ(lines[12]["exit_code"], 0);
  EXPECT_EQ(lines[12]["restarts"], 1);
  for (std::size_t i = 1; i < lines.size(); ++i) {
    EXPECT_LE(lines[i - 1]["ts_ms"].get<long long>(), lines[i]["ts_ms"].get<long long>());
  }
}

TEST_F(Watchdogs, TheEventLogOfAnElasticJobThatLosesANode) {
  // 1:2 nodes around an external store; once both run, the node of rank 1 is killed: the other
  // sees it lost, the job's verdict goes on with one node, whose workers then succeed.
  const std::string host = "127.0.0.2";
  const std::string endpoint = host + ":" + std::to_string(dist::agent::testing::free_port(host));
  Child store(DIST_RENDEZVOUS_BIN,
              {"--host", host, "--port", endpoint.substr(endpoint.rfind(':') + 1)},
              dir_ / "store.log");
  ASSERT_TRUE(
      eventually([&] { return store.output().find("listening on") != std::string::npos; }, 20s))
      << store.output();
  std::vector<std::unique_ptr<Child>> agents;
  for (const std::string name : {"a", "b"}) {
    agents.push_back(std::make_unique<Child>(
        DIST_LAUNCH_BIN,
        std::vector<std::string>{"--nnodes", "1:2", "--rdzv-endpoint", endpoint, "--rdzv-id",
                                 "lost", "--event-log", path(name + ".jsonl"), "--no-python",
                                 kTestWorker, "exit-if-world", "1", "0", "forever"},
        dir_ / (name + ".log")));
  }
  // Whole lines only: a reader may catch a line being written.
  const auto round_of_two = [&](const std::string& name) -> std::optional<Json> {
    std::ifstream in(path(name + ".jsonl"));
    std::string line;
    while (std::getline(in, line) && !in.eof()) {
      const Json e = Json::parse(line);
      if (e["event"] == "rendezvous" && e["num_nodes"] == 2) return e;
    }
    return std::nullopt;
  };
  ASSERT_TRUE(eventually([&] { return round_of_two("a") && round_of_two("b"); }, 60s))
      << agents[0]->output() << agents[1]->output();
  const std::size_t victim = (*round_of_two("a"))["node_rank"] == 1 ? 0 : 1;
  const std::string survivor = victim == 0 ? "b" : "a";
  ::kill(agents[victim]->pid(), SIGKILL);
  EXPECT_EQ(agents[victim]->wait(), 128 + SIGKILL);
  ASSERT_EQ(agents[1 - victim]->wait(), 0) << agents[1 - victim]->output();

  const auto lines = events(path(survivor + ".jsonl"));
  std::vector<std::string> names;
  for (const Json& e : lines) names.push_back(e["event"]);
  const auto at = [&](const std::string& name) {
    return std::find(names.begin(), names.end(), name) - names.begin();
  };
  ASSERT_LT(at("node_lost"), at("verdict")) << lines.size();
  ASSERT_LT(at("verdict"), static_cast<long>(names.size()));
  EXPECT_EQ(lines[at("node_lost")]["node_rank"], 1);
  EXPECT_EQ(lines[at("node_lost")]["round"], (*round_of_two(survivor))["round"]);
  const Json& verdict = lines[at("verdict")];
  EXPECT_TRUE(verdict["action"] == "reshape" || verdict["action"] == "restart") << verdict;
  const Json& last_round = lines[names.size() - 4];  // rendezvous, worker_start, worker_exit
  EXPECT_EQ(last_round["event"], "rendezvous");
  EXPECT_EQ(last_round["num_nodes"], 1);
  EXPECT_EQ(lines.back()["event"], "job_end");
  EXPECT_EQ(lines.back()["outcome"], "succeeded");
}

TEST_F(Watchdogs, AnEventLogThatCannotBeWrittenIsAWarningOnly) {
  auto agent = launch({"--nproc-per-node", "2", "--event-log", "/dev/full", "--no-python",
                       kTestWorker, "exit", "0"});
  EXPECT_EQ(agent->wait(), 0) << agent->output();
  EXPECT_EQ(count(agent->output(), "event log /dev/full: cannot write (No space left on device)"),
            1u)
      << agent->output();
}

TEST_F(Watchdogs, AnEventLogThatCannotBeOpenedStopsTheLaunchAtOnce) {
  auto agent = launch({"--event-log", path("missing/dir/events.jsonl"), "--no-python", kTestWorker,
                       "pidfile", path("pid")});
  EXPECT_EQ(agent->wait(), 1) << agent->output();
  EXPECT_NE(agent->output().find("cannot open the event log --event-log"), std::string::npos)
      << agent->output();
  EXPECT_FALSE(fs::exists(path("pid"))) << "no worker started";
}

}  // namespace
