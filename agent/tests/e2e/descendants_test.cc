// No descendant outlives the job: through the real dist-launch binary, with shell workers whose
// children ignore SIGTERM and leave the worker's process group (setsid), after success, failures
// with restarts, SIGTERM and SIGKILL of the agent. Checked by the process tree and by the marker
// every process of the job carries (DIST_LAUNCH_AGENT_ID).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "process_helpers.h"
#include "programs.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using dist::agent::testing::Child;
using dist::agent::testing::descendants_of;
using dist::agent::testing::eventually;
using dist::agent::testing::process_gone;
using dist::agent::testing::process_info;
using dist::agent::testing::processes_with_agent_id;

// A worker that leaves descendants behind: a child that stays in the worker's process group and a
// grandchild that leaves it (setsid), both ignoring SIGTERM, their pids in
// DIR/child_<attempt>_<rank> and DIR/grandchild_<attempt>_<rank>. Then: `exit CODE`, or `wait`:
// DIR/ready_<attempt>_<rank> (no process is starting or ending any more), and sleep until killed.
// From the second attempt on, it lists in DIR/survivors what attempt 0 left that still exists.
constexpr char kLeavesDescendants[] = R"sh(#!/bin/sh
dir=$1
tag=${TORCHELASTIC_RESTART_COUNT}_${LOCAL_RANK}
publish() { echo "$2" > "$dir/$1.tmp.$$" && mv "$dir/$1.tmp.$$" "$dir/$1"; }
publish agent_id "$DIST_LAUNCH_AGENT_ID"
if [ "$TORCHELASTIC_RESTART_COUNT" != 0 ]; then
  for f in "$dir"/child_0_* "$dir"/grandchild_0_*; do
    if [ -e "/proc/$(cat "$f")" ]; then echo "$f" >> "$dir/survivors"; fi
  done
fi
(
  trap '' TERM
  setsid sleep 1000 &
  publish "grandchild_$tag" $!
  exec sleep 1000
) &
publish "child_$tag" $!
while [ ! -s "$dir/grandchild_$tag" ]; do sleep 0.01; done
case $2 in
  exit) exit "$3" ;;
  wait) echo $$ > "$dir/ready_$tag" && exec sleep 1000 ;;
esac
)sh";

// A worker whose child exits at once, orphaning its own child (a sleep): DIR/orphan holds the
// orphan's pid. The worker exits 0 once DIR/go exists.
constexpr char kOrphansAChild[] = R"sh(#!/bin/sh
dir=$1
sh -c 'sleep 1000 & echo $! > "$1/orphan.tmp" && mv "$1/orphan.tmp" "$1/orphan"' sh "$dir"
while [ ! -e "$dir/go" ]; do sleep 0.01; done
)sh";

// A worker with a helper tied to it, as Python's multiprocessing resource tracker is: the helper
// (its pid in DIR/helper_<local rank>) reads a pipe the worker holds open and ends at its EOF, a
// moment after the worker ended. The worker exits 0 once the helper is reading.
constexpr char kHelperEndsWithIt[] = R"sh(#!/bin/sh
dir=$1
fifo="$dir/fifo_$LOCAL_RANK"
mkfifo "$fifo"
sh -c 'cat "$1" > /dev/null; sleep 0.05' sh "$fifo" &
echo $! > "$dir/helper.tmp.$$" && mv "$dir/helper.tmp.$$" "$dir/helper_$LOCAL_RANK"
exec 3> "$fifo"
)sh";

class DescendantsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dist-launch-descendants-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    write_script("leaves_descendants.sh", kLeavesDescendants);
    write_script("orphans_a_child.sh", kOrphansAChild);
    write_script("helper_ends_with_it.sh", kHelperEndsWithIt);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write_script(const std::string& name, const char* text) {
    std::ofstream(dir_ / name) << text;
    fs::permissions(dir_ / name, fs::perms::owner_all);
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // dist-launch with `args`, then the worker script and its arguments.
  std::unique_ptr<Child> launch(std::vector<std::string> args, const std::string& script,
                                const std::vector<std::string>& script_args,
                                const std::map<std::string, std::string>& env = {}) {
    args.insert(args.end(), {"--no-python", "/bin/sh", path(script), dir_.string()});
    args.insert(args.end(), script_args.begin(), script_args.end());
    return std::make_unique<Child>(DIST_LAUNCH_BIN, std::move(args), dir_ / "launch.log", env,
                                   std::vector<std::string>{"OMP_NUM_THREADS"});
  }

  std::string read(const std::string& name) const {
    std::ifstream in(path(name));
    std::string s;
    std::getline(in, s);
    return s;
  }

  pid_t read_pid(const std::string& name) const {
    const std::string s = read(name);
    return s.empty() ? -1 : std::stoi(s);
  }

  bool wait_for_file(const std::string& name, std::chrono::milliseconds timeout = 20s) const {
    return eventually([&] { return !read(name).empty(); }, timeout);
  }

  // The pids of the children and grandchildren the workers started, every attempt's.
  std::vector<pid_t> descendant_pids() const {
    std::vector<pid_t> pids;
    for (const auto& f : fs::directory_iterator(dir_)) {
      const std::string name = f.path().filename();
      if (name.starts_with("child_") || name.starts_with("grandchild_")) {
        pids.push_back(read_pid(name));
      }
    }
    return pids;
  }

  // The agent's janitor: its child named dist-janitor.
  static pid_t janitor_of(pid_t agent) {
    for (const auto& p : dist::agent::testing::all_processes()) {
      if (p.ppid == agent && p.comm == "dist-janitor") return p.pid;
    }
    return -1;
  }

  // After the agent returned: every descendant was reaped by it (no /proc entry, not even a
  // zombie's) and nothing carries the agent's id.
  void expect_all_reaped(const std::vector<pid_t>& pids, const std::string& agent_id) const {
    for (pid_t pid : pids) {
      ASSERT_GT(pid, 0);
      EXPECT_FALSE(fs::exists("/proc/" + std::to_string(pid)))
          << "pid " << pid << " outlived the job";
    }
    EXPECT_EQ(processes_with_agent_id(agent_id), std::vector<pid_t>{});
  }

  fs::path dir_;
};

TEST_F(DescendantsTest, AfterSuccessWhatTheWorkersLeftIsKilledAndReaped) {
  auto agent = launch({"--nproc-per-node", "2", "--shutdown-timeout", "0.5"},
                      "leaves_descendants.sh", {"exit", "0"});
  ASSERT_EQ(agent->wait(), 0) << agent->output();
  ASSERT_EQ(descendant_pids().size(), 4u);
  expect_all_reaped(descendant_pids(), read("agent_id"));
  // They ignored SIGTERM: SIGKILL ended them.
  EXPECT_NE(agent->output().find("processes the workers left still running 500 ms"),
            std::string::npos)
      << agent->output();
  // The warning names them (it said a count alone: nothing to look for).
  EXPECT_TRUE(std::regex_search(agent->output(),
                                std::regex("the workers left 4 process\\(es\\) running \\(pid "
                                           "[0-9]+ \\(sleep\\), pid [0-9]+ \\(sleep\\), pid")))
      << agent->output();
}

// What ends by itself as its worker ends is not a leftover: no warning, no signal (a healthy job
// using multiprocessing's spawn context was warned that it "left 1 process(es) running").
TEST_F(DescendantsTest, AHelperThatEndsWithItsWorkerIsNeitherWarnedAboutNorSignalled) {
  auto agent = launch({"--nproc-per-node", "2"}, "helper_ends_with_it.sh", {});
  ASSERT_EQ(agent->wait(), 0) << agent->output();
  EXPECT_EQ(agent->output().find("process(es) running"), std::string::npos) << agent->output();
  EXPECT_EQ(agent->output().find("SIGKILL"), std::string::npos) << agent->output();
  for (const char* name : {"helper_0", "helper_1"}) {
    const pid_t helper = read_pid(name);
    ASSERT_GT(helper, 0) << name;
    EXPECT_FALSE(fs::exists("/proc/" + std::to_string(helper))) << name << ": reaped by the agent";
  }
}

TEST_F(DescendantsTest, AfterFailuresWithRestartsNothingRemainsAndEachAttemptStartsClean) {
  // One worker: with two, the first failure stops the other before it has started its own.
  auto agent = launch({"--nproc-per-node", "1", "--max-restarts", "1", "--shutdown-timeout", "0.5"},
                      "leaves_descendants.sh", {"exit", "3"});
  ASSERT_EQ(agent->wait(), 3) << agent->output();
  EXPECT_FALSE(fs::exists(path("survivors")))
      << "attempt 1 started beside attempt 0's leftovers: " << read("survivors");
  ASSERT_EQ(descendant_pids().size(), 4u) << "2 attempts, a child and a grandchild each";
  expect_all_reaped(descendant_pids(), read("agent_id"));
}

TEST_F(DescendantsTest, AfterSigtermOfTheAgentNothingRemains) {
  auto agent = launch({"--nproc-per-node", "2", "--shutdown-timeout", "0.5"},
                      "leaves_descendants.sh", {"wait"});
  ASSERT_TRUE(wait_for_file("ready_0_0")) << agent->output();
  ASSERT_TRUE(wait_for_file("ready_0_1")) << agent->output();
  const std::string agent_id = read("agent_id");
  // Four descendants and two workers, found by the marker while they run.
  ASSERT_TRUE(eventually([&] { return processes_with_agent_id(agent_id).size() == 6; }))
      << processes_with_agent_id(agent_id).size();
  ::kill(agent->pid(), SIGTERM);
  ASSERT_EQ(agent->wait(), 128 + SIGTERM) << agent->output();
  ASSERT_EQ(descendant_pids().size(), 4u);
  expect_all_reaped(descendant_pids(), agent_id);
}

TEST_F(DescendantsTest, AfterSigkillOfTheAgentTheJanitorKillsEverythingAndLeaves) {
  auto agent = launch({"--nproc-per-node", "2"}, "leaves_descendants.sh", {"wait"});
  ASSERT_TRUE(wait_for_file("ready_0_0")) << agent->output();
  ASSERT_TRUE(wait_for_file("ready_0_1")) << agent->output();
  const std::string agent_id = read("agent_id");
  const pid_t janitor = janitor_of(agent->pid());
  ASSERT_GT(janitor, 0) << "no dist-janitor child of the agent";
  const std::vector<pid_t> tree = descendants_of(agent->pid());
  ASSERT_EQ(tree.size(), 7u) << "janitor, 2 workers, 2 children, 2 grandchildren";

  ::kill(agent->pid(), SIGKILL);
  ASSERT_EQ(agent->wait(), 128 + SIGKILL);
  // Orphans of a killed agent go to init, which reaps when it will: zombies count as gone.
  for (pid_t pid : tree) {
    EXPECT_TRUE(process_gone(pid, 10s)) << "pid " << pid << " outlived its agent";
  }
  EXPECT_TRUE(eventually([&] { return processes_with_agent_id(agent_id).empty(); }, 10s))
      << processes_with_agent_id(agent_id).size() << " processes still carry the agent's id";
}

// The janitor of a SIGKILLed agent tidies its temporary directory as the agent's own end does:
// the empty files and folders go, and the token file the agent wrote (they were left, in
// /dev/shm); a worker's file with something in it stays, and the directory with it.
TEST_F(DescendantsTest, TheJanitorOfASigkilledAgentTidiesItsTemporaryDirectory) {
  for (const bool something_to_keep : {false, true}) {
    const fs::path tmp = dir_ / (something_to_keep ? "tmp_kept" : "tmp");
    fs::create_directories(tmp);
    fs::remove(dir_ / "ready_0_0");
    auto agent =
        launch({"--nproc-per-node", "1", "--generate-token", "--redirects", "3"},
               "leaves_descendants.sh", {"wait"},
               // (relative, once: the janitor works from "/")
               {{"TMPDIR", something_to_keep ? tmp.string() : fs::relative(tmp).string()}});
    ASSERT_TRUE(wait_for_file("ready_0_0")) << agent->output();
    std::vector<fs::path> runs;
    for (const auto& e : fs::directory_iterator(tmp)) runs.push_back(e.path());
    ASSERT_EQ(runs.size(), 1u) << agent->output();
    ASSERT_TRUE(fs::exists(runs[0] / "token")) << "the token written in the run's directory";
    const fs::path log = runs[0] / "attempt_0" / "0" / "stdout.log";
    if (something_to_keep) std::ofstream(log) << "a worker's word\n";

    ::kill(agent->pid(), SIGKILL);
    ASSERT_EQ(agent->wait(), 128 + SIGKILL);
    if (!something_to_keep) {
      EXPECT_TRUE(eventually([&] { return fs::is_empty(tmp); }, 10s))
          << "left: " << fs::directory_iterator(tmp)->path();
      continue;
    }
    EXPECT_TRUE(
        eventually([&] { return !fs::exists(runs[0] / "attempt_0" / "0" / "stderr.log"); }, 10s))
        << "an empty log stays";
    EXPECT_FALSE(fs::exists(runs[0] / "token"));
    EXPECT_TRUE(fs::exists(log));
  }
}

TEST_F(DescendantsTest, TheJanitorHoldsOnlyItsSocketAndIsReapedByTheAgent) {
  auto agent = launch({"--nproc-per-node", "1", "--shutdown-timeout", "0.5"},
                      "leaves_descendants.sh", {"wait"});
  ASSERT_TRUE(wait_for_file("ready_0_0")) << agent->output();
  const pid_t janitor = janitor_of(agent->pid());
  ASSERT_GT(janitor, 0) << "no dist-janitor child of the agent";
  std::vector<std::string> fds;
  for (const auto& fd : fs::directory_iterator("/proc/" + std::to_string(janitor) + "/fd")) {
    fds.push_back(fs::read_symlink(fd.path()).string());
  }
  ASSERT_EQ(fds.size(), 1u) << "the janitor keeps the agent's sockets, pipes or console open";
  EXPECT_EQ(fds[0].rfind("socket:", 0), 0u) << fds[0];
  EXPECT_EQ(process_info(janitor)->pgrp, janitor) << "a ^C to the agent's group would reach it";

  ::kill(agent->pid(), SIGTERM);
  ASSERT_EQ(agent->wait(), 128 + SIGTERM) << agent->output();
  EXPECT_FALSE(fs::exists("/proc/" + std::to_string(janitor))) << "the janitor outlived its agent";
}

TEST_F(DescendantsTest, OrphansAreReparentedToTheAgentAndReapedWithoutDisturbingTheJob) {
  auto agent = launch({"--nproc-per-node", "1"}, "orphans_a_child.sh", {});
  ASSERT_TRUE(wait_for_file("orphan")) << agent->output();
  const pid_t orphan = read_pid("orphan");
  // Its parent exited: the agent, a subreaper, is its parent now (not init).
  ASSERT_TRUE(eventually([&] {
    const auto p = process_info(orphan);
    return p && p->ppid == agent->pid();
  })) << "orphan "
      << orphan << " was not reparented to the agent";
  ::kill(orphan, SIGKILL);
  EXPECT_TRUE(eventually([&] { return !fs::exists("/proc/" + std::to_string(orphan)); }))
      << "the agent left its adopted child a zombie";
  std::ofstream(path("go")) << "go\n";
  ASSERT_EQ(agent->wait(), 0) << agent->output();
  EXPECT_EQ(agent->output().find("failed"), std::string::npos) << agent->output();
}

// A worker that runs dist-launch itself: its agent's processes still carry the outer agent's id.
TEST_F(DescendantsTest, WorkersCarryTheAgentIdAfterTheEnclosingAgentsIds) {
  auto agent =
      launch({"--nproc-per-node", "1", "--shutdown-timeout", "0.5"}, "leaves_descendants.sh",
             {"exit", "0"}, {{"DIST_LAUNCH_AGENT_ID", "1-outer"}});
  ASSERT_EQ(agent->wait(), 0) << agent->output();
  const std::string value = read("agent_id");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(value, m, std::regex("1-outer:([0-9]+)-[0-9a-f]{12}"))) << value;
  EXPECT_EQ(std::stoi(m[1]), agent->pid()) << "the id starts with the agent's pid";
}

}  // namespace
