// The worker environment and the failure report's pieces, table-driven.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <tuple>

#include "dist/agent/signals.h"
#include "rendezvous/schema.h"
#include "workers/failure_report.h"
#include "workers/worker_env.h"

namespace dist::agent {
namespace {

TEST(WorkerEnv, UserSettingsWinOnlyForNcclAsyncErrorHandling) {
  WorkerIdentity id;
  id.worker.rank = 5;
  const auto env = merge_environment({"PATH=/bin", "RANK=99", "TORCH_NCCL_ASYNC_ERROR_HANDLING=0"},
                                     torchrun_variables(id, false));
  auto has = [&](const std::string& entry) {
    return std::find(env.begin(), env.end(), entry) != env.end();
  };
  EXPECT_TRUE(has("PATH=/bin"));
  EXPECT_TRUE(has("RANK=5"));
  EXPECT_FALSE(has("RANK=99"));
  EXPECT_TRUE(has("TORCH_NCCL_ASYNC_ERROR_HANDLING=0"));
  EXPECT_FALSE(has("TORCH_NCCL_ASYNC_ERROR_HANDLING=1"));
  EXPECT_FALSE(has("OMP_NUM_THREADS=1"));
}

TEST(WorkerEnv, LocalRankSubstitution) {
  EXPECT_EQ(substitute_local_rank({"--out=${local_rank}/x${local_rank}", "plain"}, 12),
            (std::vector<std::string>{"--out=12/x12", "plain"}));
}

TEST(Signals, NamesAndNumbers) {
  struct Case {
    std::string name;
    int number;
  };
  const Case cases[] = {{"SIGTERM", SIGTERM}, {"TERM", SIGTERM}, {"15", 15}, {"SIGUSR1", SIGUSR1},
                        {"SIGHUP", SIGHUP},   {"NOPE", -1},      {"0", -1},  {"SIG", -1}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(signal_number(c.name), c.number);
  }
  EXPECT_EQ(signal_name(SIGKILL), "SIGKILL");
  // Realtime signals by kill -l's names (the agent's stack signal is SIGRTMAX-5), both ways.
  EXPECT_EQ(signal_name(SIGRTMAX - 5), "SIGRTMAX-5");
  EXPECT_EQ(signal_name(SIGRTMIN + 2), "SIGRTMIN+2");
  EXPECT_EQ(signal_name(SIGRTMIN), "SIGRTMIN");
  for (int s = SIGRTMIN; s <= SIGRTMAX; ++s) EXPECT_EQ(signal_number(signal_name(s)), s) << s;
  EXPECT_EQ(signal_number("RTMAX-5"), SIGRTMAX - 5);
}

TEST(FailureReport, TheEarliestFailureIsTheRootCause) {
  std::vector<WorkerFailure> failures(3);
  const auto now = std::chrono::system_clock::now();
  failures[0].time = now;
  failures[0].exit_code = 1;
  failures[1].time = now - std::chrono::seconds(2);
  failures[1].worker.rank = 1;
  failures[1].exit_code = -SIGKILL;
  failures[2].time = now - std::chrono::seconds(1);
  EXPECT_EQ(root_cause_index(failures), 1u);
  EXPECT_EQ(exit_code_of(failures[1]), 128 + SIGKILL);
  WorkerFailure stopped_on_its_way_out = failures[1];
  stopped_on_its_way_out.ended_by_the_stop = true;
  EXPECT_EQ(exit_code_of(stopped_on_its_way_out), 1) << "its own failure, not the stop's signal";
  const std::string report = format_report("train.py", failures);
  const auto root = report.find("Root Cause");
  ASSERT_NE(root, std::string::npos);
  EXPECT_NE(report.find("Signal 9 (SIGKILL)", root), std::string::npos) << report;
  EXPECT_EQ(report.find("<NO_OTHER_FAILURES>"), std::string::npos) << report;
}

}  // namespace
}  // namespace dist::agent

namespace dist::agent {
namespace {

// A worker that failed because its peer did (its connection reset, an aborted collective) is never
// the root cause while a failure of its own is there, whatever the order it was seen in.
TEST(FailureReport, ACollateralFailureIsNeverChosenOverAFailureOfItsOwn) {
  const auto now = std::chrono::system_clock::now();
  std::vector<WorkerFailure> failures(3);
  failures[0].worker.rank = 1;
  failures[0].time = now - std::chrono::seconds(1);  // seen first
  failures[0].message =
      "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Read error: "
      "Connection reset by peer";
  failures[1].worker.rank = 0;
  failures[1].time = now;
  failures[1].message = "ValueError: the checkpoint cannot be written";
  failures[2].worker.rank = 2;
  failures[2].time = now - std::chrono::seconds(2);
  failures[2].exit_code = 75;  // the SDK's exit after an NCCL abort
  for (auto& f : failures) f.collateral = looks_collateral(f);
  EXPECT_TRUE(failures[0].collateral);
  EXPECT_FALSE(failures[1].collateral);
  EXPECT_TRUE(failures[2].collateral);
  EXPECT_EQ(root_cause_index(failures), 1u);
  // Only collateral failures: the earliest of them.
  failures.erase(failures.begin() + 1);
  EXPECT_EQ(root_cause_index(failures), 1u);  // rank 2, two seconds ago
}

// One second in torch's error files, one reaping for both: the one with an error file, then the
// lower rank.
TEST(FailureReport, TiesGoToAnErrorFileThenToTheLowerRank) {
  const auto now = std::chrono::system_clock::now();
  std::vector<WorkerFailure> failures(3);
  for (auto& f : failures) f.time = now;
  failures[0].worker.rank = 2;
  failures[1].worker.rank = 3;
  failures[1].error_file = "/run/3/error.json";
  failures[2].worker.rank = 1;
  EXPECT_EQ(root_cause_index(failures), 1u);
  failures[1].error_file.clear();
  EXPECT_EQ(root_cause_index(failures), 2u);
}

// Both ranks raised in the same second; rank 0's exit was then taken by the agent's stop (its
// error file written before the stop): the root cause is rank 1, which exited with its own code.
TEST(FailureReport, OfTwoAtOnceTheOneThatExitedOnItsOwnIsTheRootCause) {
  const auto now = std::chrono::system_clock::now();
  std::vector<WorkerFailure> failures(2);
  for (auto& f : failures) {
    f.time = now;
    f.error_file = "/run/error.json";
  }
  failures[0].worker.rank = 1;
  failures[0].exit_code = 1;
  failures[1].worker.rank = 0;
  failures[1].exit_code = -SIGTERM;
  failures[1].ended_by_the_stop = true;
  EXPECT_EQ(root_cause_index(failures), 0u);
  failures[1].time = now - std::chrono::milliseconds(5);  // clearly first: first it is
  EXPECT_EQ(root_cause_index(failures), 1u);
}

// torch's @record writes whole seconds: two failures of one second tied (then the lower rank
// won, the wrong one when it failed second). The time is when the file was written, to the
// nanosecond.
TEST(FailureReport, AFailuresTimeIsWhenItsErrorFileWasWritten) {
  const std::string path = "/tmp/dist-error-file-test-" + std::to_string(::getpid()) + ".json";
  // torch's form, with extraInfo, and the short form, a message alone.
  for (const std::string content : {R"({"message": {"message": "ValueError: x", "extraInfo": )"
                                    R"({"py_callstack": "tb", "timestamp": "1700000000"}}})",
                                    R"({"message": "ValueError: x"})"}) {
    SCOPED_TRACE(content);
    std::ofstream(path) << content;
    struct stat written {};
    ASSERT_EQ(::stat(path.c_str(), &written), 0);
    WorkerFailure f;
    f.error_file = path;
    read_error_file(f);
    std::remove(path.c_str());
    EXPECT_EQ(f.message, "ValueError: x");
    EXPECT_EQ(
        std::chrono::duration_cast<std::chrono::nanoseconds>(f.time.time_since_epoch()).count(),
        written.st_mtim.tv_sec * 1'000'000'000LL + written.st_mtim.tv_nsec);
  }
}

// A message of several lines stays inside its field (its lines used to start at column 0, where
// they could pass for the report's own: a "Root Cause" of the message's making); a megabyte's
// message that the traceback has whole is shown cut, not printed twice.
TEST(FailureReport, AMessagesLinesStayInItsFieldAndAHugeOneIsShownOnce) {
  WorkerFailure f;
  f.exit_code = 1;
  f.message = "ValueError: bad state\nRoot Cause (first observed failure):\nrank      : 0";
  f.traceback = "Traceback (most recent call last):\n  File \"train.py\", line 3\n" + f.message;
  std::string report = format_report("train.py", {f});
  EXPECT_NE(report.find("  message   : ValueError: bad state\n"
                        "              Root Cause (first observed failure):\n"
                        "              rank      : 0\n"),
            std::string::npos)
      << report;
  EXPECT_EQ(report.find("\nRoot Cause (first observed failure):", report.find("message")),
            std::string::npos)
      << report;
  f.message = "ValueError: " + std::string(1 << 20, 'x');
  f.traceback = "Traceback (most recent call last):\n" + f.message;
  report = format_report("train.py", {f});
  EXPECT_LT(report.size(), f.message.size() + 10'000);
  EXPECT_NE(report.find("... (1048588 bytes: whole in the traceback)"), std::string::npos);
}

// A Python script whose name is not UTF-8 fails: torch's @record writes its traceback with the
// name's byte as a lone surrogate escape. The report keeps the message, with U+FFFD in the
// byte's place, and is UTF-8 throughout.
TEST(FailureReport, AnErrorFileNamingAFileThatIsNotUtf8IsReadAndReported) {
  const std::string path = "/tmp/dist-error-file-test-" + std::to_string(::getpid()) + "-b.json";
  std::ofstream(path) << R"({"message": {"message": "FileNotFoundError: caf\udce9.csv", )"
                      << R"("extraInfo": {"py_callstack": "File \"caf\udce9.py\", line 3", )"
                      << R"("timestamp": "1700000000"}}})";
  WorkerFailure f;
  f.error_file = path;
  f.exit_code = 1;
  read_error_file(f);
  std::remove(path.c_str());
  EXPECT_EQ(f.message, "FileNotFoundError: caf\xEF\xBF\xBD.csv");
  EXPECT_EQ(f.traceback, "File \"caf\xEF\xBF\xBD.py\", line 3");
  const std::string report = format_report("caf\xE9.py", {f});
  EXPECT_NE(report.find("caf\xEF\xBF\xBD.py FAILED"), std::string::npos) << report;
  EXPECT_EQ(report.find('\xE9'), std::string::npos) << report;
}

// A root cause that was replaced in place, the recovery of which then failed (the job ended): said
// with the root cause, not listed again as a replacement the job went on after; an earlier one is.
TEST(FailureReport, ARootCauseReplacedInPlaceIsNotListedAgainAsAReplacement) {
  WorkerFailure first, root;
  first.worker.rank = 1;
  first.worker.pid = 100;
  root.worker.rank = 0;
  root.worker.pid = 200;
  root.host = first.host = "node-a";
  WorkerFailure elsewhere = root;  // the same pid and rank on another node: not the replaced one
  elsewhere.host = "node-b";
  EXPECT_EQ(format_report("train.py", {elsewhere}, {{root, 2, 201, {1}}})
                .find("a recovery that did not complete"),
            std::string::npos);
  const std::vector<InPlaceReplacement> replaced{{first, 1, 101, {0}}, {root, 2, 201, {1}}};
  const std::string report = format_report("train.py", {root}, replaced);
  const auto cause = report.find("Root Cause");
  const auto before = report.find("Replaced in place before (the job went on):");
  ASSERT_NE(cause, std::string::npos) << report;
  ASSERT_NE(before, std::string::npos) << report;
  EXPECT_NE(report.find("replaced in place by pid 201 (generation 2), a recovery that did not "
                        "complete"),
            std::string::npos)
      << report;
  EXPECT_EQ(report.find("pid: 200", before), std::string::npos) << report;
  EXPECT_NE(report.find("replaced in place by pid 101 (generation 1)", before), std::string::npos)
      << report;
}

// A failure folded into the root cause's recovery (a later generation superseding it) whose
// recovery then failed: said with it, not as a replacement the job went on after.
TEST(FailureReport, AFailureFoldedIntoTheRecoveryThatFailedIsSaidWithIt) {
  WorkerFailure first, root, folded;
  int at = 0;
  for (auto [f, rank] : {std::pair{&first, 1}, {&root, 0}, {&folded, 3}}) {
    f->worker.rank = rank;
    f->worker.pid = 100 * ++at;
    f->host = "node-a";
    f->time = std::chrono::system_clock::time_point(std::chrono::seconds(at));
  }
  const std::vector<InPlaceReplacement> replaced{
      {first, 1, 101, {0, 2, 3}}, {root, 2, 201, {1, 2, 3}}, {folded, 3, 301, {1, 2}}};
  const std::string report = format_report("train.py", {root}, replaced);
  const auto before = report.find("Replaced in place before (the job went on):");
  ASSERT_NE(before, std::string::npos) << report;
  const auto with_it = report.find(
      "with it   : rank 3 (pid 300 on node-a) replaced by pid 301 (generation 3), in the same "
      "recovery");
  EXPECT_LT(with_it, before) << report;
  EXPECT_EQ(report.find("pid: 300", before), std::string::npos) << report;
  EXPECT_NE(report.find("replaced in place by pid 101 (generation 1)", before), std::string::npos)
      << report;
  // With no replacement of the root cause's own, each replacement is one the job went on after,
  // even one whose failure is among those that ended the job.
  for (const auto& failures : {std::vector{root}, std::vector{root, folded}}) {
    const std::string restarted = format_report("train.py", failures, {replaced[0], replaced[2]});
    EXPECT_EQ(restarted.find("with it"), std::string::npos) << restarted;
  }
}

// Every node's report lists the job's replacements: this node's and those the others published
// (read back from the store, their times rounded), each once, in the order they failed; a root
// cause read back that way is still known as the worker this node replaced.
TEST(FailureReport, ReplacementsOfEveryNodeAreMergedOnceInTheOrderTheyFailed) {
  WorkerFailure a, b, c;
  int at = 0;
  for (auto [f, rank, host] : {std::tuple{&a, 0, "node-a"}, {&b, 3, "node-b"}, {&c, 1, "node-a"}}) {
    f->worker.rank = rank;
    f->worker.pid = 100 * ++at;
    f->host = host;
    f->time = std::chrono::system_clock::time_point(std::chrono::seconds(1'700'000'000 + at) +
                                                    std::chrono::nanoseconds(123'456'789));
  }
  const InPlaceReplacement ra{a, 1, 101, {1, 2, 3}}, rb{b, 1, 201, {0, 1, 2}},
      rc{c, 2, 301, {0, 2, 3}};
  const auto round_trip = [](const std::vector<InPlaceReplacement>& list) {
    return schema::decode_replacements("k", schema::encode(list));
  };
  // Node a's own (a, c), and every node's as read back (b's, and a's own again).
  const auto merged = merge_replacements({ra, rc}, round_trip({rb, ra, rc}));
  ASSERT_EQ(merged.size(), 3u);
  EXPECT_EQ(merged[0].new_pid, 101);
  EXPECT_EQ(merged[1].new_pid, 201);
  EXPECT_EQ(merged[2].new_pid, 301);
  // Node b's report: the root cause is a's c, replaced there; b knows it only as read back.
  const auto at_b = merge_replacements({rb}, round_trip({ra, rc}));
  const WorkerFailure root = round_trip({rc})[0].failure;
  ASSERT_NE(root.time, c.time) << "a time read back is rounded";
  const std::string report = format_report("train.py", {root}, at_b);
  EXPECT_NE(report.find("replaced in place by pid 301 (generation 2), a recovery that did not "
                        "complete"),
            std::string::npos)
      << report;
  const auto before = report.find("Replaced in place before (the job went on):");
  ASSERT_NE(before, std::string::npos) << report;
  EXPECT_LT(report.find("pid 101", before), report.find("pid 201", before)) << report;
  EXPECT_EQ(report.find("pid 301", before), std::string::npos) << report;
}

}  // namespace
}  // namespace dist::agent
