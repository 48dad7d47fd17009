// The agent side of --warm-restart and snapshots (agent/src/warm/), with real interpreters and
// processes: the zygote (ready, refusing, dying, stale, forking workers that are this process's
// children and run their script), the scratch directory and its guardian (removed when its owner
// is SIGKILLed), and the snapshot store (variables, torn saves swept, --snapshot-dir copies). The
// zygote needs python3 on PATH (any Python 3.8+, no package).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "health/python_hook.h"
#include "processes/process.h"
#include "snapshot_file.h"
#include "warm/scratch.h"
#include "warm/snapshot_store.h"
#include "warm/zygote.h"

namespace dist::agent::warm {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

extern "C" char** environ;

std::vector<std::string> this_environment() {
  std::vector<std::string> env;
  for (char** e = ::environ; *e; ++e) env.emplace_back(*e);
  return env;
}

std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return out;
}

class ZygoteTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), 0);  // as the agent is
  }
  void SetUp() override {
    scratch_ = std::make_unique<Scratch>("test-" + std::to_string(::getpid()));
    script_dir_ = scratch_->path() / "scripts";
    fs::create_directories(script_dir_);
    const char* path = std::getenv("PATH");
    const SpawnPlan plan = plan_spawn("python3", path ? path : "");
    if (::access(plan.executable.c_str(), X_OK) != 0) GTEST_SKIP() << "no python3 on PATH";
    spec_.python = "python3";
    spec_.executable = plan.executable;
    spec_.flags = {"-u"};
    spec_.script = scratch_->write_file("zygote/_zygote.py", zygote_source()).string();
    spec_.preload = "";
    spec_.path0 = script_dir_.string();
    spec_.env = this_environment();
    spec_.log = (scratch_->path() / "zygote.log").string();
    spec_.command_line_room = 512;
  }

  static std::string zygote_source() {
    std::ifstream in(std::string(DIST_SOURCE_DIR) + "/python/dist_launch/_zygote.py");
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

  // Runs the io_context until the zygote leaves kStarting (or `state` if given).
  Zygote::State wait_for(Zygote& z, std::optional<Zygote::State> state = {}) {
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (std::chrono::steady_clock::now() < deadline) {
      io_.run_for(50ms);
      io_.restart();
      if (state ? z.state() == *state : z.state() != Zygote::State::kStarting) break;
    }
    // The listener hears of a state in a handler posted when it was set, which run_for may have
    // left queued (a CI run: the state kReady, nothing heard yet).
    io_.poll();
    io_.restart();
    return z.state();
  }

  fs::path script(const std::string& name, const std::string& code) const {
    std::ofstream(script_dir_ / name) << code;
    return script_dir_ / name;
  }

  // Forks `argv` from the zygote with stdout on a pipe; returns (pid, read end).
  std::pair<pid_t, int> spawn(Zygote& z, const std::vector<std::string>& argv) {
    int out[2];
    EXPECT_EQ(::pipe(out), 0);
    const int null = ::open("/dev/null", O_RDONLY);
    WorkerRequest r;
    r.argv = argv;
    r.env = this_environment();
    r.env.push_back("WARM_TEST=yes");
    r.cwd = script_dir_.string();
    r.fds = {{null, 0}, {out[1], 1}, {out[1], 2}};
    const pid_t pid = z.spawn(r, 30s);
    ::close(out[1]);
    ::close(null);
    return {pid, out[0]};
  }

  boost::asio::io_context io_;
  std::unique_ptr<Scratch> scratch_;
  fs::path script_dir_;
  ZygoteSpec spec_;
};

TEST_F(ZygoteTest, ForksWorkersThatAreThisProcesssChildrenAndRunTheirScript) {
  std::vector<Zygote::State> heard;
  Zygote z(io_, spec_, [&](Zygote::State s) { heard.push_back(s); });
  ASSERT_EQ(wait_for(z), Zygote::State::kReady) << z.failure();
  EXPECT_EQ(heard, std::vector<Zygote::State>{Zygote::State::kReady});
  const auto path = script("job.py",
                           "import os, sys\n"
                           "print(sys.argv[1:], os.environ['WARM_TEST'], os.getpgid(0) == "
                           "os.getpid(), os.getppid() == int(sys.argv[1]), flush=True)\n"
                           "sys.exit(3)\n");
  const auto [pid, out] = spawn(z, {"python3", "-u", path.string(), std::to_string(::getpid())});
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid) << "the worker is this process's child";
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3);
  EXPECT_EQ(read_all(out), "['" + std::to_string(::getpid()) + "'] yes True True\n");
  EXPECT_EQ(z.state(), Zygote::State::kReady) << "it serves the next one";
  const auto [again, out2] = spawn(z, {"python3", "-u", path.string(), "0"});
  ASSERT_EQ(::waitpid(again, &status, 0), again);
  EXPECT_EQ(WEXITSTATUS(status), 3);
  ::close(out2);
}

TEST_F(ZygoteTest, ForksStandbysAheadThatTakeTheNextRequestsAndGoWithIt) {
  spec_.standbys = 2;
  Zygote z(io_, spec_, nullptr);
  ASSERT_EQ(wait_for(z), Zygote::State::kReady) << z.failure();
  const auto deadline = std::chrono::steady_clock::now() + 60s;  // forked once it is idle
  while (z.standbys().size() < 2 && std::chrono::steady_clock::now() < deadline) {
    io_.run_for(20ms);
    io_.restart();
  }
  ASSERT_EQ(z.standbys().size(), 2u);
  const std::vector<pid_t> standbys = z.standbys();
  for (const pid_t s : standbys) {
    siginfo_t info{};
    EXPECT_EQ(::waitid(P_PID, static_cast<id_t>(s), &info, WEXITED | WNOHANG | WNOWAIT), 0)
        << "standby " << s << " is this process's child already";
  }
  const auto path = script("job.py",
                           "import os, sys\n"
                           "print(sys.argv[1:], os.getpgid(0) == os.getpid(), flush=True)\n"
                           "sys.exit(4)\n");
  const auto [pid, out] = spawn(z, {"python3", "-u", path.string(), "x"});
  EXPECT_NE(std::find(standbys.begin(), standbys.end(), pid), standbys.end())
      << "the request went to a standby";
  EXPECT_EQ(z.standbys().size(), 1u);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_EQ(WEXITSTATUS(status), 4);
  EXPECT_EQ(read_all(out), "['x'] True\n");
  // The zygote gone, its standby leaves too (and is this process's to reap).
  const pid_t left = z.standbys().front();
  ASSERT_EQ(::kill(z.pid(), SIGKILL), 0);
  ASSERT_EQ(::waitpid(left, &status, 0), left);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_TRUE(z.forget_standby(left));
}

TEST_F(ZygoteTest, RefusesWhenAPreloadFailsAndSaysWhy) {
  spec_.preload = "no_such_module_anywhere";
  Zygote z(io_, spec_, nullptr);
  ASSERT_EQ(wait_for(z), Zygote::State::kFailed);
  EXPECT_NE(z.failure().find("no_such_module_anywhere"), std::string::npos) << z.failure();
  EXPECT_THROW(spawn(z, {"python3", "-u", "x.py"}), ZygoteError);
}

TEST_F(ZygoteTest, AnInterpreterThatCannotRunIsAnError) {
  spec_.executable = "/nonexistent/python3";
  EXPECT_THROW(Zygote(io_, spec_, nullptr), ZygoteError);
}

TEST_F(ZygoteTest, ItsDeathIsHeard) {
  Zygote z(io_, spec_, nullptr);
  ASSERT_EQ(wait_for(z), Zygote::State::kReady) << z.failure();
  ASSERT_EQ(::kill(z.pid(), SIGKILL), 0);
  ASSERT_EQ(wait_for(z, Zygote::State::kExited), Zygote::State::kExited);
  EXPECT_NE(z.failure().find("SIGKILL"), std::string::npos) << z.failure();
  EXPECT_THROW(spawn(z, {"python3", "-u", "x.py"}), ZygoteError);
}

TEST_F(ZygoteTest, IsStaleOnceAPreloadedModuleChangesOnDisk) {
  script("warm_test_module.py", "VALUE = 1\n");
  spec_.preload = "warm_test_module";
  Zygote z(io_, spec_, nullptr);
  ASSERT_EQ(wait_for(z), Zygote::State::kReady) << z.failure();
  EXPECT_EQ(z.preloaded(), std::vector<std::string>{"warm_test_module"});
  EXPECT_FALSE(z.stale());
  script("warm_test_module.py", "VALUE = 22\n");  // (another size: whatever the mtime's grain)
  EXPECT_TRUE(z.stale());
}

TEST(ScratchTest, IsPrivateAndGoesWithItsOwner) {
  fs::path kept;
  {
    Scratch s("test-" + std::to_string(::getpid()));
    kept = s.path();
    struct stat st {};
    ASSERT_EQ(::stat(kept.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    EXPECT_GT(s.guardian(), 0);
    const auto file = s.write_file("a/b.txt", "content");
    EXPECT_EQ(file, kept / "a" / "b.txt");
  }
  EXPECT_FALSE(fs::exists(kept));
}

TEST(ScratchTest, ItsGuardianRemovesItWhenTheOwnerIsKilled) {
  int report[2];
  ASSERT_EQ(::pipe(report), 0);
  const pid_t owner = ::fork();
  if (owner == 0) {
    Scratch s("test-killed");
    const std::string path = s.path().string() + "\n";
    [[maybe_unused]] const auto n = ::write(report[1], path.data(), path.size());
    ::raise(SIGKILL);
  }
  ::close(report[1]);
  std::string path = read_all(report[0]);
  ASSERT_FALSE(path.empty());
  path.pop_back();
  int status = 0;
  ASSERT_EQ(::waitpid(owner, &status, 0), owner);
  ASSERT_TRUE(WIFSIGNALED(status));
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (fs::exists(path) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_FALSE(fs::exists(path)) << path << " outlived its SIGKILLed owner";
}

TEST(SnapshotStoreTest, GivesTheWorkersTheirVariablesAndSweepsTornSaves) {
  Scratch scratch("test-" + std::to_string(::getpid()));
  LaunchConfig config;
  config.python_workers = true;
  config.warm.snapshot_memory_bytes = 1 << 20;
  SnapshotStore store(config.warm, scratch, "job", "host/run");
  const auto& env = store.environment();
  EXPECT_EQ(env.at(kSnapshotDirVariable), (scratch.path() / "snapshots").string());
  EXPECT_EQ(env.at(kSnapshotMemoryVariable), "1048576");
  EXPECT_EQ(env.at(kSnapshotRunVariable), "host/run");
  EXPECT_FALSE(env.contains(kSnapshotPersistVariable));
  EXPECT_FALSE(env.contains("PYTHONPATH"))
      << "the worker group's, for every job (health/python_hook.h)";
  const fs::path rank = store.directory() / "rank_4";
  fs::create_directories(rank);
  std::ofstream(rank / ".tmp.step_00000000000000000020.snap.12345") << "torn";
  std::ofstream(rank / "step_00000000000000000010.snap") << "complete";
  store.begin_attempt(4, 2);
  EXPECT_FALSE(fs::exists(rank / ".tmp.step_00000000000000000020.snap.12345"));
  EXPECT_TRUE(fs::exists(rank / "step_00000000000000000010.snap"));
  std::ifstream ranks(store.directory() / ".ranks");
  std::stringstream listed;
  listed << ranks.rdbuf();
  EXPECT_EQ(listed.str(), "4\n5\n") << "the global ranks this node runs, for the writers";
  store.list_ranks(0, 2);  // an in-place regroup renumbered the running workers
  std::ifstream relisted(store.directory() / ".ranks");
  std::stringstream now;
  now << relisted.rdbuf();
  EXPECT_EQ(now.str(), "0\n1\n");
}

// A job's folder under --snapshot-dir is its --rdzv-id, safe as one file name.
TEST(SnapshotStoreTest, NamesAJobsFolderByItsRendezvousId) {
  EXPECT_EQ(job_folder("job7"), "job7");
  EXPECT_EQ(job_folder("a/b c:d"), "a%2Fb%20c%3Ad");
  EXPECT_NE(job_folder("a/b"), job_folder("a_b")) << "two ids, two folders";
  EXPECT_EQ(job_folder(".."), "%2E.");
  EXPECT_EQ(job_folder(""), "none");
}

// The stand-in package every job's workers get, after their own PYTHONPATH and the hook's
// directory before it; an empty path is left out.
TEST(StandInPackageTest, GoesAfterTheWorkersOwnPath) {
  Variables own{{"PYTHONPATH", "/mine"}};
  add_python_paths(own, "/hook", "/package", {"PYTHONPATH=/agents"});
  EXPECT_EQ(own.at("PYTHONPATH"), "/hook:/mine:/package");
  Variables inherited;
  add_python_paths(inherited, "", "/package", {"PYTHONPATH=/agents"});
  EXPECT_EQ(inherited.at("PYTHONPATH"), "/agents:/package");
  Variables none;
  add_python_paths(none, "", "", {});
  EXPECT_FALSE(none.contains("PYTHONPATH"));
}

// A snapshot file with `footer_id` in its footer: the header's save id for a whole one, another
// for one read while it was rewritten (snapshot_file.h).
void write_snapshot(const fs::path& path, std::uint64_t save_id, std::int64_t saved_at,
                    const std::string& payload, std::uint64_t footer_id = 0) {
  testing::write_snapshot_file(path, {{"format", 2}, {"save_id", save_id}, {"saved_at", saved_at}},
                               payload, footer_id);
}

std::string step_file(int step) {
  std::string digits = std::to_string(step);
  return "step_" + std::string(20 - digits.size(), '0') + digits + ".snap";
}

// The files of a folder, sorted.
std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Waits (bounded) until `done`, asking the persister to run first.
bool persisted(SnapshotStore& store, const std::function<bool()>& done) {
  store.persist_now();
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  return done();
}

TEST(SnapshotStoreTest, PersistsTheNewestSaveAtOnceWhenAWorkerFails) {
  Scratch scratch("test-" + std::to_string(::getpid()));
  const fs::path disk = scratch.path() / "disk";
  LaunchConfig config;
  config.warm.snapshot_dir = disk.string();
  SnapshotStore store(config.warm, scratch, "job/7", "run");
  EXPECT_EQ(store.environment().at(kSnapshotPersistVariable), (disk / "job%2F7").string())
      << "one folder per job: --snapshot-dir can be shared by jobs and nodes";
  EXPECT_GT(store.memory_limit(), 0u) << "half the free shared memory by default";
  const fs::path rank = store.directory() / "rank_1";
  const fs::path copies = disk / "job%2F7" / "rank_1";
  fs::create_directories(rank);
  // Saved in the order 5000, 10, 20 (a run that started afresh after an earlier one left step
  // 5000): the two newest saves stay on disk, whatever their steps.
  std::int64_t now = 1'000'000;
  for (const int step : {5000, 10, 20}) {
    if (step == 20) fs::remove(rank / step_file(5000));  // as a writer recycles its oldest
    write_snapshot(rank / step_file(step), static_cast<std::uint64_t>(step) + 1, now++,
                   "payload " + std::to_string(step));
    ASSERT_TRUE(persisted(store, [&] { return fs::exists(copies / step_file(step)); }))
        << step_file(step);
    EXPECT_TRUE(read_stamp(copies / step_file(step))) << "a whole copy";
  }
  EXPECT_EQ(files_in(copies), (std::vector<std::string>{step_file(10), step_file(20)}));
  // Step 20 saved again (another save id): copied again.
  write_snapshot(rank / step_file(20), 99, now++, "payload 20 again");
  ASSERT_TRUE(persisted(store, [&] {
    const auto stamp = read_stamp(copies / step_file(20));
    return stamp && stamp->save_id == 99;
  })) << "a re-saved step is persisted";
}

TEST(SnapshotStoreTest, NeverPersistsATornSnapshot) {
  Scratch scratch("test-" + std::to_string(::getpid()));
  const fs::path disk = scratch.path() / "disk";
  LaunchConfig config;
  config.warm.snapshot_dir = disk.string();
  SnapshotStore store(config.warm, scratch, "job", "run");
  const fs::path rank = store.directory() / "rank_0";
  fs::create_directories(rank);
  // The header of one save and the footer of another: what a copy reads while the writer
  // rewrites the file. Not a snapshot: never listed, never copied.
  write_snapshot(rank / step_file(30), 7, 1, "half old, half new", 8);
  EXPECT_FALSE(read_stamp(rank / step_file(30)));
  write_snapshot(rank / step_file(10), 5, 0, "whole");
  ASSERT_TRUE(
      persisted(store, [&] { return fs::exists(disk / "job" / "rank_0" / step_file(10)); }));
  EXPECT_EQ(files_in(disk / "job" / "rank_0"), (std::vector<std::string>{step_file(10)}));
}

}  // namespace
}  // namespace dist::agent::warm
