// Runs one disabled test of this test binary as a child process (a rank that really exits, an
// abort whose CUDA context must not serve later tests), with environment variables set (over
// this process's own); returns
// its exit code and what it wrote on stdout and stderr. Killed (SIGKILL) past its timeout; always
// reaped.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

extern char** environ;

namespace dist::sdk::testing {

struct ChildResult {
  int exit_code = -1;  // 128 + signal when killed
  std::string output;  // stdout and stderr, interleaved
  bool timed_out = false;
};

class Child {
 public:
  // Starts `/proc/self/exe --gtest_filter=<test> --gtest_also_run_disabled_tests`.
  Child(const std::string& test, const std::vector<std::pair<std::string, std::string>>& env) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    std::vector<std::string> strings;
    for (char** e = environ; *e; ++e) {
      const std::string entry = *e;
      bool overridden = false;
      for (const auto& [name, value] : env) overridden |= entry.rfind(name + "=", 0) == 0;
      if (!overridden) strings.push_back(entry);
    }
    for (const auto& [name, value] : env) strings.push_back(name + "=" + value);
    std::vector<char*> envp;
    for (auto& s : strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string self = "/proc/self/exe", filter = "--gtest_filter=" + test,
                disabled = "--gtest_also_run_disabled_tests";
    char* argv[] = {self.data(), filter.data(), disabled.data(), nullptr};
    const int spawned = posix_spawn(&pid_, self.c_str(), &actions, nullptr, argv, envp.data());
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    if (spawned != 0) {
      ::close(fds[0]);
      throw std::runtime_error("posix_spawn of " + test);
    }
    reader_ = std::async(std::launch::async, [fd = fds[0]] {
      std::string text;
      char buffer[4096];
      for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) {
        text.append(buffer, static_cast<std::size_t>(n));
      }
      ::close(fd);
      return text;
    });
  }
  ~Child() {
    if (pid_ > 0) finish(std::chrono::seconds(0));
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  // Waits until the child closed its output (it exited) or `timeout` passed (then kills it),
  // and reaps it.
  ChildResult finish(std::chrono::milliseconds timeout) {
    ChildResult result;
    if (reader_.wait_for(timeout) != std::future_status::ready) {
      result.timed_out = true;
      ::kill(pid_, SIGKILL);
    }
    result.output = reader_.get();
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return result;
  }

 private:
  pid_t pid_ = -1;
  std::future<std::string> reader_;
};

}  // namespace dist::sdk::testing
