// The agent's whole-program tests: dist-launch run in the background with real worker processes
// (dist-test-worker), and the checks they share.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "process_helpers.h"
#include "programs.h"

namespace dist::agent::testing {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

inline const std::string kWorker = DIST_TEST_WORKER_BIN;

// dist-launch running in the background, its stdout and stderr in one file (removed afterwards).
class Launch {
 public:
  explicit Launch(std::vector<std::string> args, std::map<std::string, std::string> env = {})
      : log_(fs::temp_directory_path() / ("dist-launch-test-" + std::to_string(::getpid()) + "-" +
                                          std::to_string(counter_++) + ".log")),
        child_(DIST_LAUNCH_BIN, std::move(args), log_, env, {"OMP_NUM_THREADS"}) {}
  ~Launch() {
    std::error_code ec;
    if (child_.pid() > 0) remove_kept_directory(child_.output());
    fs::remove(log_, ec);
  }
  // The temporary directory a run without --log-dir kept (a worker failed, logs were written),
  // as its output says: a test leaves none behind (in /dev/shm: memory).
  static void remove_kept_directory(const std::string& output) {
    static const std::string kKept = "worker logs and error files kept in ";
    for (auto at = output.find(kKept); at != std::string::npos; at = output.find(kKept, at + 1)) {
      const auto start = at + kKept.size();
      const fs::path dir = output.substr(start, output.find_first_of(" \n", start) - start);
      std::error_code ec;
      if (dir.filename().string().starts_with("dist-launch-")) fs::remove_all(dir, ec);
    }
  }
  int wait(std::chrono::milliseconds timeout = 60s) { return child_.wait(timeout); }
  std::string output() const { return child_.output(); }
  pid_t pid() const { return child_.pid(); }

 private:
  static inline int counter_ = 0;
  fs::path log_;  // before child_: initialized first
  Child child_;
};

class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dist-launch-agent-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static std::map<std::string, std::string> read_env(const std::string& file) {
    std::map<std::string, std::string> env;
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line)) {
      const auto eq = line.find('=');
      if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return env;
  }

  static bool wait_for_output(const Launch& launch, const std::string& text,
                              std::chrono::milliseconds timeout) {
    const auto end = Clock::now() + timeout;
    do {
      if (launch.output().find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(10ms);
    } while (Clock::now() < end);
    return false;
  }

  static bool wait_for_file(const std::string& file, std::chrono::milliseconds timeout = 10s) {
    const auto end = Clock::now() + timeout;
    do {  // checked at least once, even with a zero timeout
      std::ifstream in(file);
      std::string content;
      if (in && std::getline(in, content) && !content.empty()) return true;
      std::this_thread::sleep_for(10ms);
    } while (Clock::now() < end);
    return false;
  }

  static pid_t read_pid(const std::string& file) {
    std::ifstream in(file);
    pid_t pid = -1;
    in >> pid;
    return pid;
  }

  static bool process_gone(pid_t pid, std::chrono::milliseconds timeout = 5s) {
    return testing::process_gone(pid, timeout);
  }

  fs::path dir_;
};

// The run directories under a --log-dir: <run id>_<random>, one per run.
inline std::vector<fs::path> run_dirs(const fs::path& log_dir, const std::string& run_id) {
  std::vector<fs::path> dirs;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(log_dir, ec)) {
    if (entry.path().filename().string().starts_with(run_id + "_")) dirs.push_back(entry.path());
  }
  return dirs;
}

}  // namespace dist::agent::testing
