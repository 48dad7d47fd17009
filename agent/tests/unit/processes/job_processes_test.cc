// Finding a job's processes by the marker in their environment, signalling them safely, the
// janitor, and the leftovers of a stop that spare the agent's own helpers: with real processes
// (sleep) and real signals.
#include "processes/job_processes.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "process_helpers.h"
#include "processes/janitor.h"
#include "processes/leftovers.h"

namespace {

using namespace std::chrono_literals;
using dist::agent::carries_agent_id;
using dist::agent::group_is_jobs;
using dist::agent::has_children;
using dist::agent::Janitor;
using dist::agent::kill_marked_processes;
using dist::agent::ProcessRef;
using dist::agent::signal_process;
using dist::agent::testing::process_gone;

// Where a Sleeper runs: the test's process group, a session of its own, a group of its own, or
// (a positive pid) that process group.
constexpr pid_t kSameGroup = -1;
constexpr pid_t kOwnSession = -2;
constexpr pid_t kOwnGroup = 0;

// `sleep 30` with exactly `env`. Killed and reaped at the end of the test unless the test did.
class Sleeper {
 public:
  explicit Sleeper(std::vector<std::string> env, pid_t group = kSameGroup) {
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      if (group == kOwnSession) ::setsid();
      if (group >= 0) ::setpgid(0, group);
      char sleep[] = "sleep", seconds[] = "30";
      char* argv[] = {sleep, seconds, nullptr};
      ::execve("/bin/sleep", argv, envp.data());
      ::_exit(127);
    }
    // Until it has exec'd, it carries the test's environment: wait for the new one.
    const std::string marker = "SLEEPER_READY=1";
    dist::agent::testing::eventually(
        [&] { return environ_of(pid_).find(marker) != std::string::npos; });
  }
  ~Sleeper() {
    if (!reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Sleeper(const Sleeper&) = delete;
  Sleeper& operator=(const Sleeper&) = delete;

  pid_t pid() const { return pid_; }
  // The signal that ended it, once it ended (0: still running).
  int reap() {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) != pid_) return 0;
    reaped_ = true;
    return WIFSIGNALED(status) ? WTERMSIG(status) : -1;
  }

 private:
  static std::string environ_of(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/environ");
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  pid_t pid_ = -1;
  bool reaped_ = false;
};

// An agent id unique to this test process: tests that run at once must not kill each other's
// sleepers.
std::string id(const std::string& suffix) {
  return std::to_string(::getpid()) + "-" + suffix;
}

std::string marker(const std::string& ids) {
  return "DIST_LAUNCH_AGENT_ID=" + ids;
}

std::vector<std::string> env_with(const std::string& marker_entry) {
  return {"SLEEPER_READY=1", marker_entry};
}

unsigned long long start_time_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(in, line);
  std::istringstream fields(line.substr(line.rfind(')') + 2));
  std::string field;
  for (int i = 3; i <= 22; ++i) fields >> field;  // starttime is field 22
  return std::stoull(field);
}

TEST(JobProcessesTest, TheIdIsFoundAsOneElementAnywhereInALongEnvironment) {
  // The marker straddles the reader's 4096-byte blocks, after an entry longer than a block.
  const std::string first = "SLEEPER_READY=1", pad = "PAD=" + std::string(9000, 'x');
  const std::size_t marker_offset = 3 * 4096 - 10, pad_end = first.size() + 1 + pad.size() + 1;
  const std::string pad2 = "PAD2=" + std::string(marker_offset - pad_end - 6, 'y');
  Sleeper s({first, pad, pad2, marker(id("outer") + ":" + id("abc")), "AFTER=1"});
  EXPECT_TRUE(carries_agent_id(s.pid(), id("abc")));
  EXPECT_TRUE(carries_agent_id(s.pid(), id("outer")));
  EXPECT_FALSE(carries_agent_id(s.pid(), id("ab"))) << "a prefix of an id is another id";
  EXPECT_FALSE(carries_agent_id(s.pid(), "abc"));
  EXPECT_FALSE(carries_agent_id(s.pid(), id("outer") + ":" + id("abc")));

  Sleeper other_name(env_with("X_" + marker(id("abc"))));
  EXPECT_FALSE(carries_agent_id(other_name.pid(), id("abc")));
  Sleeper longer_name(env_with("DIST_LAUNCH_AGENT_IDS=" + id("abc")));
  EXPECT_FALSE(carries_agent_id(longer_name.pid(), id("abc")));
}

TEST(JobProcessesTest, KillMarkedProcessesKillsExactlyTheMarkedOnes) {
  Sleeper marked(env_with(marker(id("abc"))));
  Sleeper nested(env_with(marker(id("abc") + ":" + id("def"))), kOwnSession);
  Sleeper other_agent(env_with(marker(id("ghi"))));
  Sleeper unmarked(env_with("PATH=/bin"));

  EXPECT_EQ(kill_marked_processes(id("abc"), -1), 2);
  EXPECT_TRUE(dist::agent::testing::eventually([&] { return marked.reap() == SIGKILL; }));
  EXPECT_TRUE(dist::agent::testing::eventually([&] { return nested.reap() == SIGKILL; }));
  EXPECT_EQ(other_agent.reap(), 0) << "another agent's process was killed";
  EXPECT_EQ(unmarked.reap(), 0) << "an unmarked process was killed";
}

TEST(JobProcessesTest, SignalProcessSignalsOnlyTheProcessThatWasFound) {
  Sleeper s(env_with("PATH=/bin"));
  const unsigned long long start = start_time_of(s.pid());
  errno = 0;
  EXPECT_FALSE(signal_process(ProcessRef{s.pid(), start + 1}, SIGKILL))
      << "a later process with the same pid was signalled";
  EXPECT_EQ(errno, ESRCH);
  EXPECT_EQ(s.reap(), 0);
  EXPECT_TRUE(signal_process(ProcessRef{s.pid(), start}, SIGKILL));
  EXPECT_TRUE(dist::agent::testing::eventually([&] { return s.reap() == SIGKILL; }));
}

TEST(JobProcessesTest, AGroupIsTheJobsWhileItsLeaderIsOursOrGone) {
  Sleeper ours(env_with(marker(id("abc"))), kOwnSession);
  Sleeper not_ours(env_with("PATH=/bin"), kOwnSession);
  EXPECT_TRUE(group_is_jobs(ours.pid(), id("abc")));
  EXPECT_FALSE(group_is_jobs(not_ours.pid(), id("abc"))) << "a reused id must not be killed";
  ::kill(ours.pid(), SIGKILL);
  ASSERT_TRUE(dist::agent::testing::eventually([&] { return ours.reap() == SIGKILL; }));
  EXPECT_TRUE(group_is_jobs(ours.pid(), id("abc"))) << "a gone leader's group holds only ours";
}

// The state letter in /proc/<pid>/stat ('Z': exited, not reaped yet), or 0 when the pid is gone.
char process_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() ? 0 : stat[paren + 2];
}

TEST(JobProcessesTest, TheJanitorIsNoChildForTheReapingLoopAndADismissedOneKillsNothing) {
  std::optional<Janitor> owner;
  owner.emplace(id("abc"));
  Janitor& janitor = *owner;
  ASSERT_GT(janitor.pid(), 0);
  EXPECT_FALSE(has_children()) << "the janitor counts as a child";
  errno = 0;
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1) << "waitpid(-1) sees the janitor";
  EXPECT_EQ(errno, ECHILD);

  Sleeper marked(env_with(marker(id("abc"))), kOwnGroup);
  EXPECT_TRUE(has_children());
  janitor.track(marked.pid());
  const pid_t janitor_pid = janitor.pid();
  janitor.dismiss();
  // Dismissed, it exits on its own, while the agent tears down; the destructor reaps it.
  EXPECT_TRUE(dist::agent::testing::eventually([&] { return process_state(janitor_pid) == 'Z'; }))
      << "a dismissed janitor did not exit";
  owner.reset();
  EXPECT_EQ(process_state(janitor_pid), 0) << "~Janitor did not reap the janitor";
  EXPECT_EQ(marked.reap(), 0) << "a dismissed janitor killed the job";
}

// In an "agent" (see kill_agent_after): tells the test the pids to watch, then waits for the
// SIGKILL, keeping alive whatever the caller's frame holds (its janitor, its processes).
[[noreturn]] void report_and_wait(int report, const std::vector<pid_t>& pids) {
  const auto bytes = static_cast<ssize_t>(pids.size() * sizeof(pid_t));
  if (::write(report, pids.data(), static_cast<std::size_t>(bytes)) != bytes) ::_exit(1);
  while (true) ::pause();
}

// Forks an "agent" (a child of the test) that runs `agent` with the descriptor to report on
// (report_and_wait), reads the `count` pids it reports, SIGKILLs and reaps it, and returns them
// (none when it did not report). What the agent started has no PR_SET_PDEATHSIG: only its janitor
// can end it.
std::vector<pid_t> kill_agent_after(std::size_t count, const std::function<void(int)>& agent) {
  int report[2];
  if (::pipe(report) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(report[0]);
    agent(report[1]);
    ::_exit(1);
  }
  ::close(report[1]);
  std::vector<pid_t> pids(count);
  const auto bytes = static_cast<ssize_t>(count * sizeof(pid_t));
  const bool reported = ::read(report[0], pids.data(), static_cast<std::size_t>(bytes)) == bytes;
  ::close(report[0]);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return reported ? pids : std::vector<pid_t>{};
}

// The agent has a janitor, a marked daemon in a session of its own, and a worker's process group
// whose member carries no marker; once the agent is SIGKILLed the janitor kills the daemon (by the
// marker) and the member (by the group), then exits.
TEST(JobProcessesTest, TheJanitorKillsTheMarkedProcessesAndTheTrackedGroupsWhenTheAgentDies) {
  const auto pids = kill_agent_after(3, [](int report) {
    Janitor janitor(id("abc"));
    Sleeper daemon(env_with(marker(id("abc"))), kOwnSession);
    Sleeper worker(env_with(marker(id("abc"))), kOwnGroup);
    Sleeper member(env_with("PATH=/bin"), worker.pid());  // found by its group only
    janitor.track(worker.pid());
    report_and_wait(report, {janitor.pid(), daemon.pid(), member.pid()});
  });
  ASSERT_EQ(pids.size(), 3u) << "the agent did not report";
  EXPECT_TRUE(process_gone(pids[1], 10s)) << "the marked daemon outlived its agent";
  EXPECT_TRUE(process_gone(pids[2], 10s)) << "the tracked group's member outlived its agent";
  EXPECT_TRUE(process_gone(pids[0], 10s)) << "the janitor lingers after cleaning";
}

// The table the janitor reads after the agent's death holds the groups tracked then: a group
// untracked before (its worker reaped) is left alone, and its slot serves the next group.
TEST(JobProcessesTest, TheJanitorLeavesAnUntrackedGroupAndReusesItsSlot) {
  const auto pids = kill_agent_after(4, [](int report) {
    Janitor janitor(id("abc"));
    Sleeper first(env_with(marker(id("abc"))), kOwnGroup);
    Sleeper first_member(env_with("PATH=/bin"), first.pid());
    Sleeper second(env_with(marker(id("abc"))), kOwnGroup);
    Sleeper second_member(env_with("PATH=/bin"), second.pid());
    Sleeper third(env_with(marker(id("abc"))), kOwnGroup);
    Sleeper third_member(env_with("PATH=/bin"), third.pid());
    janitor.track(first.pid());
    janitor.track(second.pid());
    janitor.untrack(second.pid());
    janitor.untrack(first.pid());
    janitor.track(third.pid());  // in the first's slot
    report_and_wait(report,
                    {janitor.pid(), first_member.pid(), second_member.pid(), third_member.pid()});
  });
  ASSERT_EQ(pids.size(), 4u) << "the agent did not report";
  EXPECT_TRUE(process_gone(pids[3], 10s)) << "the tracked group's member outlived its agent";
  EXPECT_TRUE(process_gone(pids[0], 10s)) << "the janitor lingers after cleaning";
  for (const pid_t untracked : {pids[1], pids[2]}) {
    EXPECT_FALSE(process_gone(untracked, 0ms)) << "the janitor killed a group untracked before";
    ::kill(untracked, SIGKILL);  // an orphan now: init reaps it
  }
}

// The --warm-restart zygote and its standbys carry the job's marker and are the agent's children,
// as leftovers are: the stop spares them (no signal, even at the deadline) and ends once they are
// all that runs, while a marked leftover beside them gets SIGTERM once its grace (the workers
// ended by themselves: it may end by itself) is over.
TEST(LeftoversTest, SparedHelpersAreNeverSignalledAndNothingIsLeftWhenOnlyTheyRun) {
  Sleeper helper(env_with(marker(id("abc"))));
  Sleeper leftover(env_with(marker(id("abc"))));
  dist::agent::Leftovers leftovers(id("abc"), -1);
  leftovers.reset(/*grace=*/true);
  leftovers.spare({helper.pid()});
  EXPECT_FALSE(leftovers.gone()) << "a marked leftover was taken for a helper";
  EXPECT_TRUE(leftovers.in_grace());
  EXPECT_FALSE(leftovers.gone());
  EXPECT_EQ(leftover.reap(), 0) << "signalled during its grace";
  leftovers.grace_over();
  EXPECT_FALSE(leftovers.gone());
  EXPECT_TRUE(dist::agent::testing::eventually([&] { return leftover.reap() == SIGTERM; }));
  EXPECT_TRUE(leftovers.gone()) << "the spared helper alone counts as a leftover";
  EXPECT_EQ(leftovers.kill(), 0) << "the deadline's SIGKILL reached a spared helper";
  EXPECT_EQ(helper.reap(), 0) << "the spared helper was signalled";
}

// A stop signal's leftovers (the workers were stopped) get no grace: SIGTERM at the first look,
// within the stop's deadline.
TEST(LeftoversTest, AStopSignalsLeftoversGetSigtermAtOnce) {
  Sleeper leftover(env_with(marker(id("abc"))));
  dist::agent::Leftovers leftovers(id("abc"), -1);
  leftovers.reset(/*grace=*/false);
  EXPECT_FALSE(leftovers.gone());
  EXPECT_FALSE(leftovers.in_grace());
  EXPECT_TRUE(dist::agent::testing::eventually([&] { return leftover.reap() == SIGTERM; }));
}

}  // namespace
