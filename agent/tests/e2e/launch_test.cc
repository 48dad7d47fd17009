// The agent through the real dist-launch binary, with real worker processes and real signals.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dist/agent/signals.h"
#include "dist/store/server.h"
#include "launch_fixture.h"
#include "test_ports.h"

namespace {

using namespace dist::agent::testing;
using dist::agent::kSameSenderStopWindow;

TEST_F(LaunchTest, EveryWorkerGetsTorchrunsEnvironment) {
  Launch launch({"--nproc-per-node", "3", "--no-python", kWorker, "env", path("env_${local_rank}")},
                {{"DIST_TEST_INHERITED", "yes"}});
  ASSERT_EQ(launch.wait(), 0) << launch.output();
  std::string port;
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("local rank " + std::to_string(r));
    auto env = read_env(path("env_" + std::to_string(r)));
    const std::string rank = std::to_string(r);
    const std::map<std::string, std::string> expected = {
        {"RANK", rank},
        {"LOCAL_RANK", rank},
        {"GROUP_RANK", "0"},
        {"ROLE_RANK", rank},
        {"ROLE_NAME", "default"},
        {"LOCAL_WORLD_SIZE", "3"},
        {"WORLD_SIZE", "3"},
        {"GROUP_WORLD_SIZE", "1"},
        {"ROLE_WORLD_SIZE", "3"},
        {"MASTER_ADDR", "127.0.0.1"},
        {"TORCHELASTIC_RESTART_COUNT", "0"},
        {"TORCHELASTIC_MAX_RESTARTS", "0"},
        {"TORCHELASTIC_RUN_ID", "none"},
        {"TORCHELASTIC_USE_AGENT_STORE", "True"},
        {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
        {"OMP_NUM_THREADS", "1"},
        {"DIST_TEST_INHERITED", "yes"},
    };
    for (const auto& [key, value] : expected) EXPECT_EQ(env[key], value) << key;
    EXPECT_TRUE(env["TORCHELASTIC_ERROR_FILE"].ends_with("/attempt_0/" + rank + "/error.json"))
        << env["TORCHELASTIC_ERROR_FILE"];
    EXPECT_GT(std::stoi(env["MASTER_PORT"]), 0);
    if (r == 0) port = env["MASTER_PORT"];
    EXPECT_EQ(env["MASTER_PORT"], port) << "one store for the whole group";
  }
  EXPECT_NE(launch.output().find("OMP_NUM_THREADS is unset"), std::string::npos) << launch.output();
}

// Under the in-place policy the agent leaves TORCH_NCCL_ASYNC_ERROR_HANDLING to the user
// (torchrun's 1 would end a survivor when torch's watchdog sees the lost peer; dist_launch.elastic
// chooses 0 for its NCCL groups), and a value the user set still reaches every worker.
TEST_F(LaunchTest, InPlaceWorkersGetNoNcclErrorHandlingOfTheLaunchers) {
  Launch unset({"--nproc-per-node", "2", "--restart-policy", "in-place", "--no-python", kWorker,
                "env", path("unset_${local_rank}")});
  ASSERT_EQ(unset.wait(), 0) << unset.output();
  Launch set({"--nproc-per-node", "2", "--restart-policy", "in-place", "--no-python", kWorker,
              "env", path("set_${local_rank}")},
             {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "2"}});
  ASSERT_EQ(set.wait(), 0) << set.output();
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("local rank " + std::to_string(r));
    auto env = read_env(path("unset_" + std::to_string(r)));
    EXPECT_EQ(env["DIST_LAUNCH_RESTART_POLICY"], "in-place");
    EXPECT_EQ(env.count("TORCH_NCCL_ASYNC_ERROR_HANDLING"), 0u)
        << env["TORCH_NCCL_ASYNC_ERROR_HANDLING"];
    EXPECT_EQ(read_env(path("set_" + std::to_string(r)))["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "2");
  }
}

// A worker holds its stdin (the launcher's, as torchrun's workers do), stdout and stderr and the
// descriptors meant for it (the heartbeat slot), nothing of the agent's: not the store's listening
// socket, the metrics port, the event log, nor another worker's pipes. It has a session of its
// own (its process group is the session's), as torchrun's have: a worker reading the terminal is
// not a background job of the launcher's session (stopped by SIGTTIN).
// A host whose name does not resolve (a container's): a dynamic rendezvous publishes the
// address it reaches the endpoint from, the workers' MASTER_ADDR, saying so; its name would have
// held every torch worker in init_process_group. (Root: a UTS namespace with a name of its own.)
TEST_F(LaunchTest, AHostNameThatDoesNotResolveIsPublishedAsTheHostsAddress) {
  if (::geteuid() != 0 || std::system("unshare -u true >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "a UTS namespace (unshare -u) needs root; not available here";
  }
  const std::string command = "hostname dist-no-such-name-" + std::to_string(::getpid()) +
                              " && exec " + DIST_LAUNCH_BIN +
                              " --nnodes 1 --nproc-per-node 1 --rdzv-endpoint 127.0.0.1:0"
                              " --no-python " +
                              kWorker + " env " + path("env_0");
  Child launch("/usr/bin/unshare", {"-u", "sh", "-c", command}, path("unshare.log"));
  ASSERT_EQ(launch.wait(60s), 0) << launch.output();
  EXPECT_EQ(read_env(path("env_0"))["MASTER_ADDR"], "127.0.0.1") << launch.output();
  EXPECT_NE(launch.output().find("' does not resolve here: this node is published as 127.0.0.1 "
                                 "(its address toward 127.0.0.1)"),
            std::string::npos)
      << launch.output();
}

TEST_F(LaunchTest, AWorkerInheritsOnlyItsStandardStreamsAndItsHeartbeatSlot) {
  Launch launch({"--nproc-per-node", "2", "--metrics-port", "0", "--event-log", path("events"),
                 "--worker-heartbeat-timeout", "60", "--no-python", kWorker, "fds",
                 path("fds_${local_rank}"), "session", path("session_${local_rank}")});
  ASSERT_EQ(launch.wait(), 0) << launch.output();
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("local rank " + std::to_string(r));
    std::ifstream in(path("fds_" + std::to_string(r)));
    std::map<int, std::string> fds;
    for (std::string line; std::getline(in, line);) {
      const auto space = line.find(' ');
      const std::string target = line.substr(space + 1);
      if (target.starts_with("/proc/")) continue;  // the listing's own directory
      fds[std::stoi(line.substr(0, space))] = target;
    }
    ASSERT_GE(fds.size(), 3u);
    std::error_code no_stdin;  // (then the launcher's is /dev/null)
    const fs::path launchers_stdin = fs::read_symlink("/proc/self/fd/0", no_stdin);
    EXPECT_EQ(fds[0], no_stdin ? "/dev/null" : launchers_stdin.string());
    EXPECT_TRUE(fds[1].starts_with("pipe:")) << fds[1];
    EXPECT_TRUE(fds[2].starts_with("pipe:")) << fds[2];
    fds.erase(0);
    fds.erase(1);
    fds.erase(2);
    ASSERT_EQ(fds.size(), 1u) << "more than the heartbeat slot: " << fds.begin()->second;
    EXPECT_NE(fds.begin()->second.find("memfd:"), std::string::npos) << fds.begin()->second;
    pid_t pid = 0, group = 0, session = 0;
    std::ifstream(path("session_" + std::to_string(r))) >> pid >> group >> session;
    EXPECT_GT(pid, 0);
    EXPECT_EQ(group, pid);
    EXPECT_EQ(session, pid);
  }
}

// Workers are started side by side (each exec'ing while the agent starts the next): each reports
// its own exec failure, here an interpreter that is not there, as the one-line start error.
TEST_F(LaunchTest, AnExecThatFailsIsAOneLineStartErrorNamingTheCause) {
  const std::string script = path("bad_interpreter.sh");
  std::ofstream(script) << "#!/no/such/interpreter\necho never\n";
  fs::permissions(script, fs::perms::owner_all);
  Launch launch({"--nproc-per-node", "8", "--no-python", script});
  EXPECT_EQ(launch.wait(), 1) << launch.output();
  EXPECT_NE(launch.output().find("cannot start worker 0 (local rank 0): cannot run '" + script +
                                 "': No such file or directory"),
            std::string::npos)
      << launch.output();
  EXPECT_EQ(launch.output().find("never"), std::string::npos) << launch.output();
}

// A script without "#!" runs under /bin/sh, as execvp (and torchrun's Popen with a shell) run it.
TEST_F(LaunchTest, AScriptWithoutAnInterpreterLineRunsUnderTheShell) {
  const std::string script = path("plain.sh");
  std::ofstream(script) << "echo \"plain script rank $RANK args $*\"\n";
  fs::permissions(script, fs::perms::owner_all);
  Launch launch({"--nproc-per-node", "2", "--no-python", script, "a", "b"});
  ASSERT_EQ(launch.wait(), 0) << launch.output();
  for (const char* rank : {"0", "1"}) {
    EXPECT_NE(launch.output().find(std::string("plain script rank ") + rank + " args a b"),
              std::string::npos)
        << launch.output();
  }
}

// A worker gets the signal dispositions its launcher's caller gave: a signal ignored there stays
// ignored (exec keeps it, as under torchrun), while SIGPIPE, which the agent ignores for its
// console, and every signal the agent handles are back to the default.
TEST_F(LaunchTest, AWorkerKeepsTheCallersIgnoredSignalsButNotTheAgents) {
  const std::string status = path("status");
  Child launch("/bin/sh",
               {"-c", "trap '' PROF; exec \"$0\" \"$@\"", DIST_LAUNCH_BIN, "--nproc-per-node", "2",
                "--no-python", "/bin/sh", "-c", "cat /proc/self/status > " + status + "_$RANK"},
               path("launch.log"), {}, {"OMP_NUM_THREADS"});
  ASSERT_EQ(launch.wait(60s), 0) << launch.output();
  for (const char* rank : {"0", "1"}) {
    std::ifstream in(status + "_" + rank);
    std::string line;
    unsigned long long ignored = 0, caught = ~0ULL;
    while (std::getline(in, line)) {
      if (line.starts_with("SigIgn:")) ignored = std::stoull(line.substr(7), nullptr, 16);
      if (line.starts_with("SigCgt:")) caught = std::stoull(line.substr(7), nullptr, 16);
    }
    const auto bit = [](int signal) { return 1ULL << (signal - 1); };
    EXPECT_NE(ignored & bit(SIGPROF), 0u) << "rank " << rank << ": SigIgn " << std::hex << ignored;
    EXPECT_EQ(ignored & bit(SIGPIPE), 0u) << "rank " << rank << ": SigIgn " << std::hex << ignored;
    EXPECT_EQ(caught, 0u) << "rank " << rank;  // (cat installs no handler)
  }
}

// OpenSSL is loaded only for etcd's TLS (store/src/etcd/lazy_openssl.cc): an agent that
// never uses it has neither libssl nor libcrypto mapped, and neither is linked into dist-launch.
TEST_F(LaunchTest, AnAgentWithoutTlsLoadsNoOpenSsl) {
  Launch launch({"--no-python", "/bin/sh", "-c", "cat /proc/$PPID/maps > " + path("agent_maps")});
  ASSERT_EQ(launch.wait(), 0) << launch.output();
  std::ifstream in(path("agent_maps"));
  const std::string maps((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_NE(maps.find("dist-launch"), std::string::npos) << "not the agent's maps:\n" << maps;
  EXPECT_EQ(maps.find("libssl"), std::string::npos) << maps;
  EXPECT_EQ(maps.find("libcrypto"), std::string::npos) << maps;
  // Nor linked in: a static libssl brings its cipher suites' names.
  std::ifstream binary(DIST_LAUNCH_BIN, std::ios::binary);
  const std::string program((std::istreambuf_iterator<char>(binary)),
                            std::istreambuf_iterator<char>());
  ASSERT_GT(program.size(), 0u);
  EXPECT_EQ(program.find("TLS_AES_256_GCM_SHA384"), std::string::npos)
      << DIST_LAUNCH_BIN << " links OpenSSL";
}

// Rank 0 fails on its own; rank 1 fails a few milliseconds later only because rank 0 is gone
// ("Connection reset by peer"; it ignores SIGTERM, as a worker inside a long C call does, so that
// it fails whether the agent's stop reaches it first or not). Whichever exit the agent reaps first,
// the report names rank 0 as the root cause and lists rank 1; the job's exit code is rank 0's.
TEST_F(LaunchTest, TheRootCauseIsTheFirstFailureOfItsOwnNotTheCollateralOne) {
  for (int run = 0; run < 5; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    const std::string pid0 = path("pid_0_" + std::to_string(run));
    Launch launch({"--nproc-per-node",
                   "2",
                   "--no-python",
                   kWorker,
                   "ignore",
                   "15",
                   "pidfile",
                   path("pid_${local_rank}_" + std::to_string(run)),
                   "wait-file",
                   path("pid_1_" + std::to_string(run)),
                   "error-file-if-rank",
                   "0",
                   "ValueError: the checkpoint cannot be written",
                   "exit-if-rank",
                   "0",
                   "3",
                   "wait-gone",
                   pid0,
                   "error-file",
                   "RuntimeError: Connection reset by peer",
                   "exit",
                   "1"});
    ASSERT_EQ(launch.wait(), 3) << launch.output();
    const std::string out = launch.output();
    const auto root = out.find("Root Cause (first observed failure):");
    ASSERT_NE(root, std::string::npos) << out;
    EXPECT_NE(out.find("rank      : 0", root), std::string::npos) << out;
    EXPECT_NE(out.find("ValueError: the checkpoint cannot be written", root), std::string::npos)
        << out;
    // Reaped with rank 0, before the stop, it is a failure (listed); after the stop began, what
    // it wrote is the stop's doing: said as stopped.
    const auto failures = out.find("Failures:");
    ASSERT_NE(failures, std::string::npos) << out;
    const std::string others = out.substr(failures, root - failures);
    if (others.find("rank      : 1") != std::string::npos) {
      EXPECT_NE(others.find("Connection reset by peer"), std::string::npos) << out;
    } else {
      EXPECT_NE(out.find("stopped rank 1 (exit code 1)"), std::string::npos) << out;
    }
  }
}

// torchrun's own @record: a launcher started with TORCHELASTIC_ERROR_FILE (by a scheduler, or an
// outer launcher) writes its job's root cause there, errorCode the worker's exit code.
TEST_F(LaunchTest, TheRootCauseIsCopiedToTheLaunchersOwnErrorFile) {
  const std::string file = path("launcher_error.json");
  Launch launch({"--nproc-per-node", "2", "--no-python", kWorker, "error-file-if-rank", "1",
                 "ValueError: boom from rank 1", "exit-if-rank", "1", "3", "forever"},
                {{"TORCHELASTIC_ERROR_FILE", file}});
  ASSERT_EQ(launch.wait(), 3) << launch.output();
  std::ifstream in(file);
  ASSERT_TRUE(in) << "no error file written\n" << launch.output();
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  EXPECT_NE(text.find("\"message\":\"ValueError: boom from rank 1\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"errorCode\":3"), std::string::npos) << text;
}

// Rank 1 fails; rank 0 fails only in its SIGTERM handler (an emergency checkpoint that raises),
// its error file written after the stop began and in the same second as rank 1's (torch's @record
// writes whole seconds): it was named the root cause, every time, "before the stop reached it".
// Now rank 1 is the root cause, its exit code the job's, and rank 0 is said as stopped.
TEST_F(LaunchTest, ARankThatFailsOnlyInItsStopHandlerIsStoppedNotTheRootCause) {
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    const std::string pids = path("pid_" + std::to_string(run) + "_");
    Launch launch({"--nproc-per-node", "2", "--no-python", kWorker, "fail-on", "15",
                   "RuntimeError: cleanup failed after SIGTERM", "pidfile", pids + "${local_rank}",
                   "wait-file", pids + "0", "error-file-if-rank", "1",
                   "ValueError: the real root cause", "exit-if-rank", "1", "4", "forever"});
    ASSERT_EQ(launch.wait(), 4) << launch.output();
    const std::string out = launch.output();
    const auto root = out.find("Root Cause (first observed failure):");
    ASSERT_NE(root, std::string::npos) << out;
    EXPECT_NE(out.find("rank      : 1", root), std::string::npos) << out;
    EXPECT_NE(out.find("ValueError: the real root cause", root), std::string::npos) << out;
    EXPECT_NE(out.find("<NO_OTHER_FAILURES>"), std::string::npos) << out;
    EXPECT_EQ(out.find("cleanup failed after SIGTERM"), std::string::npos) << out;
    EXPECT_NE(out.find("stopped rank 0 (exit code 1)"), std::string::npos) << out;
  }
}

// In place, the group runs on after a failure: what the failed worker started (here a child in
// its process group, as a DataLoader's workers are) gets SIGTERM at once, as a stop would give
// it; it used to live until the job ended. Rank 0 ends once rank 1's child is gone (else after a
// minute, exit 65); rank 1's replacement finds its child's pid file and exits 0.
TEST_F(LaunchTest, InPlaceAFailedWorkersChildrenAreEndedWhileTheGroupRunsOn) {
  const std::string child = path("child_1");
  Launch launch({"--nproc-per-node", "2", "--restart-policy", "in-place", "--max-restarts", "1",
                 "--no-python", kWorker, "exit-if-file", path("child_${local_rank}"), "0",
                 "spawn-child-if-rank", "1", child, "exit-if-rank", "1", "3", "wait-gone", child});
  ASSERT_EQ(launch.wait(), 0) << launch.output();
  EXPECT_NE(launch.output().find("replaced in place"), std::string::npos) << launch.output();
}

TEST_F(LaunchTest, AWorkerThatFailsOnlyOnAttemptZeroSucceedsWithOneRestart) {
  Launch launch({"--nproc-per-node", "2", "--max-restarts", "1", "--no-python", kWorker, "env",
                 path("env_${local_rank}"), "fail-on-attempt", "0", "3"});
  ASSERT_EQ(launch.wait(), 0) << launch.output();
  for (int r = 0; r < 2; ++r) {
    auto env = read_env(path("env_" + std::to_string(r)));
    EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "1");
    EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "1");
    EXPECT_TRUE(env["TORCHELASTIC_ERROR_FILE"].ends_with("/attempt_1/" + std::to_string(r) +
                                                         "/error.json"));
  }
  EXPECT_NE(launch.output().find("restart 1 of 1"), std::string::npos) << launch.output();
}

TEST_F(LaunchTest, RestartsAreBoundedByMaxRestarts) {
  Launch launch({"--nproc-per-node", "1", "--max-restarts", "2", "--no-python", kWorker, "env",
                 path("env_${local_rank}"), "exit", "5"});
  EXPECT_EQ(launch.wait(), 5) << launch.output();
  EXPECT_EQ(read_env(path("env_0"))["TORCHELASTIC_RESTART_COUNT"], "2");
  const std::string out = launch.output();
  EXPECT_NE(out.find("restart 2 of 2"), std::string::npos) << out;
  EXPECT_EQ(out.find("restart 3"), std::string::npos) << out;
}

TEST_F(LaunchTest, FailureReportNamesTheRootCauseAndTheAgentExitsWithItsCode) {
  Launch launch({"--nproc-per-node", "2", "--no-python", kWorker, "exit-if-rank", "0", "0",
                 "error-file", "ValueError: learning rate must be positive", "exit-if-rank", "1",
                 "7"});
  EXPECT_EQ(launch.wait(), 7) << launch.output();
  const std::string out = launch.output();
  EXPECT_NE(out.find("dist-test-worker FAILED"), std::string::npos) << out;
  EXPECT_NE(out.find("Root Cause (first observed failure):"), std::string::npos) << out;
  EXPECT_NE(out.find("rank      : 1 (local_rank: 1)"), std::string::npos) << out;
  EXPECT_NE(out.find("exitcode  : 7"), std::string::npos) << out;
  EXPECT_NE(out.find("message   : ValueError: learning rate must be positive"), std::string::npos)
      << out;
  EXPECT_NE(out.find("Traceback (most recent call last):"), std::string::npos) << out;
  EXPECT_NE(out.find("<NO_OTHER_FAILURES>"), std::string::npos) << out;
}

TEST_F(LaunchTest, AWorkerKilledByASignalIsReportedAs128PlusTheSignal) {
  Launch launch(
      {"--nproc-per-node", "1", "--no-python", kWorker, "kill-self", std::to_string(SIGSEGV)});
  EXPECT_EQ(launch.wait(), 128 + SIGSEGV) << launch.output();
  EXPECT_NE(launch.output().find("Signal 11 (SIGSEGV) received by PID"), std::string::npos)
      << launch.output();
}

TEST_F(LaunchTest, SigkillOfTheAgentLeavesNoWorkerAlive) {
  Launch launch({"--nproc-per-node", "2", "--no-python", kWorker, "pidfile",
                 path("pid_${local_rank}"), "forever"});
  ASSERT_TRUE(wait_for_file(path("pid_0")));
  ASSERT_TRUE(wait_for_file(path("pid_1")));
  const pid_t w0 = read_pid(path("pid_0")), w1 = read_pid(path("pid_1"));
  ASSERT_GT(w0, 0);
  ASSERT_FALSE(process_gone(w0, 0ms));
  ::kill(launch.pid(), SIGKILL);
  EXPECT_EQ(launch.wait(), 128 + SIGKILL);
  EXPECT_TRUE(process_gone(w0)) << "worker " << w0 << " outlived its agent";
  EXPECT_TRUE(process_gone(w1)) << "worker " << w1 << " outlived its agent";
}

TEST_F(LaunchTest, SigtermIsForwardedAndTheGracePeriodHonoured) {
  Launch launch({"--nproc-per-node", "2", "--shutdown-timeout", "10", "--no-python", kWorker,
                 "trap", std::to_string(SIGTERM), path("got_${local_rank}"), "400", "pidfile",
                 path("pid_${local_rank}"), "forever"});
  ASSERT_TRUE(wait_for_file(path("pid_0")));
  ASSERT_TRUE(wait_for_file(path("pid_1")));
  const auto start = Clock::now();
  ::kill(launch.pid(), SIGTERM);
  EXPECT_EQ(launch.wait(), 128 + SIGTERM) << launch.output();
  const auto elapsed = Clock::now() - start;
  EXPECT_GE(elapsed, 400ms) << "the workers' own shutdown (400 ms) must be waited for";
  EXPECT_LT(elapsed, 5s) << "the agent exits once the workers are done, not after the timeout";
  for (int r = 0; r < 2; ++r) {
    std::ifstream in(path("got_" + std::to_string(r)));
    int signal = 0;
    in >> signal;
    EXPECT_EQ(signal, SIGTERM) << "worker " << r;
  }
}

TEST_F(LaunchTest, AWorkerIgnoringSigtermIsKilledAfterTheShutdownTimeout) {
  Launch launch({"--nproc-per-node", "1", "--shutdown-timeout", "0.5", "--no-python", kWorker,
                 "ignore", std::to_string(SIGTERM), "pidfile", path("pid_0"), "forever"});
  ASSERT_TRUE(wait_for_file(path("pid_0")));
  const pid_t worker = read_pid(path("pid_0"));
  const auto start = Clock::now();
  ::kill(launch.pid(), SIGTERM);
  EXPECT_EQ(launch.wait(10s), 128 + SIGTERM) << launch.output();
  EXPECT_GE(Clock::now() - start, 500ms);
  EXPECT_TRUE(process_gone(worker));
  EXPECT_NE(launch.output().find("sending SIGKILL"), std::string::npos) << launch.output();
}

// One Ctrl-C under a wrapper (`timeout`, a script's trap) reaches the agent twice: from the
// terminal and passed on. The second, moments later from another sender, is the same stop: the
// workers' graceful shutdown goes on. A second stop from the same sender kills them at once.
TEST_F(LaunchTest, AStopSignalPassedOnByAWrapperIsOneStopAndASecondRequestKills) {
  for (const bool passed_on : {true, false}) {
    SCOPED_TRACE(passed_on ? "passed on by another process" : "sent twice by this one");
    const std::string dir = path(passed_on ? "passed_on" : "twice");
    fs::create_directories(dir);
    Launch launch({"--nproc-per-node", "2", "--shutdown-timeout", "30", "--no-python", kWorker,
                   "trap", std::to_string(SIGINT), dir + "/got_${local_rank}", "1500", "pidfile",
                   dir + "/pid_${local_rank}", "forever"});
    ASSERT_TRUE(wait_for_file(dir + "/pid_0"));
    ASSERT_TRUE(wait_for_file(dir + "/pid_1"));
    const auto start = Clock::now();
    ::kill(launch.pid(), SIGINT);
    // The first one taken before the second is sent (two pending at once are one).
    const auto said = Clock::now() + 10s;
    while (launch.output().find("SIGINT received") == std::string::npos && Clock::now() < said) {
      std::this_thread::sleep_for(5ms);
    }
    if (passed_on) {  // (the shell's own kill: another sender)
      ASSERT_EQ(std::system(("kill -INT " + std::to_string(launch.pid())).c_str()), 0);
    } else {  // a person's second request: the same sender, later than one sender's burst
      std::this_thread::sleep_for(kSameSenderStopWindow + 50ms);
      ::kill(launch.pid(), SIGINT);
    }
    EXPECT_EQ(launch.wait(), 128 + SIGINT) << launch.output();
    const std::string output = launch.output();
    if (passed_on) {
      EXPECT_GE(Clock::now() - start, 1500ms) << "the workers' own shutdown must be waited for";
      EXPECT_NE(output.find("the same stop passed on, not a second one"), std::string::npos)
          << output;
      EXPECT_EQ(output.find("killing the workers now"), std::string::npos) << output;
    } else {
      EXPECT_NE(output.find("SIGINT again: killing the workers now"), std::string::npos) << output;
    }
  }
}

// Started ignoring SIGINT and SIGQUIT (a shell script's background job) and SIGHUP (nohup): the
// agent acts on SIGINT as torchrun does, and its workers get it at its default action, so that it
// stops them; SIGHUP stays ignored by the agent and the workers: the job goes on.
TEST_F(LaunchTest, AnIgnoredSigintStillStopsTheJobAndAnIgnoredSighupIsLeftAlone) {
  const std::string status = path("status");
  Child launch("/bin/sh",
               {"-c", "trap '' INT QUIT HUP; exec \"$0\" \"$@\"", DIST_LAUNCH_BIN,
                "--nproc-per-node", "2", "--no-python", "/bin/sh", "-c",
                "cat /proc/self/status > " + status + "_$RANK.part && mv " + status +
                    "_$RANK.part " + status + "_$RANK && exec sleep 1000"},
               path("launch.log"), {}, {"OMP_NUM_THREADS"});
  ASSERT_TRUE(wait_for_file(status + "_0"));
  ASSERT_TRUE(wait_for_file(status + "_1"));
  for (const char* rank : {"0", "1"}) {
    std::ifstream in(status + "_" + rank);
    std::string line;
    unsigned long long ignored = 0;
    while (std::getline(in, line)) {
      if (line.starts_with("SigIgn:")) ignored = std::stoull(line.substr(7), nullptr, 16);
    }
    const auto bit = [](int signal) { return 1ULL << (signal - 1); };
    EXPECT_EQ(ignored & (bit(SIGINT) | bit(SIGQUIT)), 0u) << "rank " << rank << std::hex << ignored;
    EXPECT_NE(ignored & bit(SIGHUP), 0u) << "rank " << rank << ": SigIgn " << std::hex << ignored;
  }
  ::kill(launch.pid(), SIGHUP);  // (discarded: ignored and not blocked; else the exit were 129)
  ::kill(launch.pid(), SIGINT);
  EXPECT_EQ(launch.wait(60s), 128 + SIGINT) << launch.output();
  const std::string output = launch.output();
  EXPECT_EQ(output.find("SIGHUP received"), std::string::npos) << output;
  // (workers that ignored it would be killed once the grace period ran out)
  EXPECT_EQ(output.find("sending SIGKILL"), std::string::npos) << output;
}

TEST_F(LaunchTest, Sigusr1IsForwardedWithoutStoppingTheJob) {
  Launch launch({"--nproc-per-node", "2", "--signals-to-handle", "SIGTERM,SIGUSR1", "--no-python",
                 kWorker, "note", std::to_string(SIGUSR1), path("usr1_${local_rank}"), "pidfile",
                 path("pid_${local_rank}"), "sleep", "1500"});
  ASSERT_TRUE(wait_for_file(path("pid_0")));
  ASSERT_TRUE(wait_for_file(path("pid_1")));
  ::kill(launch.pid(), SIGUSR1);
  EXPECT_EQ(launch.wait(), 0) << launch.output();
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(wait_for_file(path("usr1_" + std::to_string(r)), 0ms)) << "worker " << r;
  }
}

TEST_F(LaunchTest, WorkerLinesReachTheConsoleWholeAndPrefixed) {
  constexpr int kLines = 300;
  Launch launch({"--nproc-per-node", "2", "--no-python", kWorker, "lines", std::to_string(kLines)});
  ASSERT_EQ(launch.wait(), 0) << launch.output();
  const std::regex whole(R"(\[default([01])\]:(out|err) line (\d+) of rank ([01]) end)");
  std::istringstream lines(launch.output());
  std::string line;
  int matched = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("[dist-launch]", 0) == 0) continue;  // the agent's own messages
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, whole)) << "split or unprefixed line: '" << line << "'";
    EXPECT_EQ(m[1], m[4]) << "prefix names the wrong rank: " << line;
    ++matched;
  }
  EXPECT_EQ(matched, 2 * 2 * kLines);
}

TEST_F(LaunchTest, LogDirAndTeeWriteFilesAndFilterLimitsTheConsole) {
  Launch launch({"--nproc-per-node", "2", "--log-dir", path("logs"), "--rdzv-id", "job7", "--tee",
                 "3", "--local-ranks-filter", "1", "--no-python", kWorker, "lines", "3"});
  ASSERT_EQ(launch.wait(), 0) << launch.output();
  const auto dirs = run_dirs(path("logs"), "job7");
  ASSERT_EQ(dirs.size(), 1u);
  for (int r = 0; r < 2; ++r) {
    std::ifstream out(dirs[0] / "attempt_0" / std::to_string(r) / "stdout.log");
    std::stringstream s;
    s << out.rdbuf();
    EXPECT_EQ(s.str(), "out line 0 of rank " + std::to_string(r) + " end\nout line 1 of rank " +
                           std::to_string(r) + " end\nout line 2 of rank " + std::to_string(r) +
                           " end\n");
  }
  EXPECT_EQ(launch.output().find("[default0]:"), std::string::npos) << "rank 0 is filtered out";
  EXPECT_NE(launch.output().find("[default1]:out line 2 of rank 1 end"), std::string::npos);
}

TEST_F(LaunchTest, EachRunGetsItsOwnDirectoryUnderTheLogDir) {
  for (const char* line_count : {"1", "2"}) {
    Launch launch({"--nproc-per-node", "1", "--log-dir", path("logs"), "--rdzv-id", "again",
                   "--redirects", "3", "--no-python", kWorker, "lines", line_count});
    ASSERT_EQ(launch.wait(), 0) << launch.output();
  }
  const auto dirs = run_dirs(path("logs"), "again");
  ASSERT_EQ(dirs.size(), 2u) << "the second run overwrote the first";
  std::set<std::string> contents;
  for (const auto& dir : dirs) {
    std::ifstream out(dir / "attempt_0" / "0" / "stdout.log");
    std::stringstream s;
    s << out.rdbuf();
    contents.insert(s.str());
  }
  EXPECT_EQ(contents, (std::set<std::string>{"out line 0 of rank 0 end\n",
                                             "out line 0 of rank 0 end\nout line 1 of rank 0 "
                                             "end\n"}));
}

// Without --log-dir, the files of a run whose worker failed are kept, and where they are is said.
TEST_F(LaunchTest, WithoutALogDirAFailedRunKeepsItsFilesAndSaysWhere) {
  Launch launch({"--nproc-per-node", "1", "--redirects", "3", "--no-python", kWorker, "lines", "2",
                 "exit", "3"});
  ASSERT_EQ(launch.wait(), 3) << launch.output();
  const std::regex kept("worker logs and error files kept in (\\S+)");
  std::smatch m;
  const std::string out = launch.output();
  ASSERT_TRUE(std::regex_search(out, m, kept)) << out;
  const fs::path dir = m[1].str();
  std::ifstream log(dir / "attempt_0" / "0" / "stdout.log");
  std::stringstream s;
  s << log.rdbuf();
  EXPECT_EQ(s.str(), "out line 0 of rank 0 end\nout line 1 of rank 0 end\n");
  fs::remove_all(dir);
}

// A stop signal while the agent waits for other nodes: it leaves at once, cleanly, removing its
// temporary directory (no worker ran, nothing to keep).
TEST_F(LaunchTest, ASignalDuringTheRendezvousLeavesCleanly) {
  const std::string port = std::to_string(dist::agent::testing::free_port("127.0.0.1"));
  Launch launch({"--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port",
                 port, "--no-python", kWorker, "lines", "1"},
                {{"LOGLEVEL", "DEBUG"}});
  ASSERT_TRUE(wait_for_output(launch, "store listening", 10s)) << launch.output();
  ::kill(launch.pid(), SIGTERM);
  EXPECT_EQ(launch.wait(10s), 128 + SIGTERM) << launch.output();
  EXPECT_NE(launch.output().find("SIGTERM received: leaving the job"), std::string::npos)
      << launch.output();
}

// --cpu-bind: each worker runs on its own CPUs (read back from /proc/self/status), with
// OMP_NUM_THREADS its core count.
TEST_F(LaunchTest, CpuBindingGivesEachWorkerItsOwnCpus) {
  const unsigned cpus = std::thread::hardware_concurrency();
  if (cpus < 2) GTEST_SKIP() << "needs two CPUs";
  Launch launch({"--nproc-per-node", "2", "--cpu-bind", "0;1", "--no-python", kWorker, "status",
                 path("status_${local_rank}"), "env", path("env_${local_rank}")});
  ASSERT_EQ(launch.wait(), 0) << launch.output();
  for (int r = 0; r < 2; ++r) {
    std::string allowed;
    std::ifstream in(path("status_" + std::to_string(r)));
    for (std::string line; std::getline(in, line);) {
      if (line.starts_with("Cpus_allowed_list:"))
        allowed = line.substr(line.find_last_of('\t') + 1);
    }
    EXPECT_EQ(allowed, std::to_string(r)) << "worker " << r;
    EXPECT_EQ(read_env(path("env_" + std::to_string(r)))["OMP_NUM_THREADS"], "1");
  }
}

TEST_F(LaunchTest, RedirectsSendOutputToFilesOnly) {
  Launch launch({"--nproc-per-node", "1", "--log-dir", path("logs"), "--redirects", "1",
                 "--no-python", kWorker, "lines", "2"});
  ASSERT_EQ(launch.wait(), 0) << launch.output();
  EXPECT_EQ(launch.output().find("out line"), std::string::npos) << launch.output();
  EXPECT_NE(launch.output().find("[default0]:err line 1 of rank 0 end"), std::string::npos);
}

TEST_F(LaunchTest, BadInputIsAOneLineErrorWithExitTwo) {
  struct Case {
    const char* name;
    std::vector<std::string> args;
    const char* message;
  };
  const Case cases[] = {
      {"nproc 0", {"--nproc-per-node", "0", "x.py"}, "--nproc-per-node must be a positive"},
      {"nproc word", {"--nproc-per-node", "many", "x.py"}, "--nproc-per-node must be"},
      {"bad MIN:MAX", {"--nnodes", "3:2", "x.py"}, "MIN must not exceed MAX"},
      {"bad nnodes", {"--nnodes", "a:b", "x.py"}, "--nnodes (MIN) must be"},
      {"missing script", {"--nproc-per-node", "1", "no_such_script.py"}, "not found"},
      {"missing executable", {"--no-python", "/no/such/binary"}, "not found"},
      {"unknown flag", {"--frobnicate", "x.py"}, "--frobnicate"},
      {"no script", {"--nproc-per-node", "2"}, "no training script"},
      {"bad signal", {"--signals-to-handle", "SIGNOPE", "x.py"}, "unknown signal"},
      {"bad redirects", {"--redirects", "7", "x.py"}, "--redirects takes"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Launch launch(c.args, {{"PYTHON_EXEC", "/bin/true"}});
    EXPECT_EQ(launch.wait(10s), 2);
    const std::string out = launch.output();
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
    EXPECT_NE(out.find("dist-launch: error:"), std::string::npos) << out;
    EXPECT_NE(out.find(c.message), std::string::npos) << out;
  }
}

TEST_F(LaunchTest, PetVariablesWorkLikeFlags) {
  Launch launch({"--no-python", kWorker, "env", path("env_${local_rank}")},
                {{"PET_NPROC_PER_NODE", "2"}, {"PET_MAX_RESTARTS", "3"}});
  ASSERT_EQ(launch.wait(), 0) << launch.output();
  EXPECT_EQ(read_env(path("env_1"))["WORLD_SIZE"], "2");
  EXPECT_EQ(read_env(path("env_1"))["TORCHELASTIC_MAX_RESTARTS"], "3");
}

TEST_F(LaunchTest, AnExplicitMasterPortIsBoundByTheAgentAndATakenOneIsAClearError) {
  dist::store::StoreServerThread holder;
  Launch launch({"--master-port", std::to_string(holder.port()), "--no-python", kWorker});
  EXPECT_EQ(launch.wait(), 1);
  const std::string out = launch.output();
  EXPECT_NE(out.find("Address already in use"), std::string::npos) << out;
  EXPECT_NE(out.find(std::to_string(holder.port())), std::string::npos) << out;
}

TEST_F(LaunchTest, LocalRankIsSubstitutedInWorkerArguments) {
  Launch launch({"--nproc-per-node", "2", "--no-python", kWorker, "pidfile",
                 path("rank-${local_rank}-of-${local_rank}")});
  ASSERT_EQ(launch.wait(), 0) << launch.output();
  EXPECT_TRUE(fs::exists(path("rank-0-of-0")));
  EXPECT_TRUE(fs::exists(path("rank-1-of-1")));
}

}  // namespace
