// Process checks shared by the agent's tests.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dist::agent::testing {

// True once `pid` has exited within `timeout`. A zombie counts as gone: it runs nothing, and an
// orphan's zombie waits for whoever reaps orphans here.
inline bool process_gone(pid_t pid,
                         std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  do {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string content;
    if (!stat || !std::getline(stat, content)) return true;
    const auto close = content.rfind(')');
    if (close != std::string::npos && content.size() > close + 2 && content[close + 2] == 'Z') {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } while (std::chrono::steady_clock::now() < end);
  return false;
}

// `condition()` true within `timeout` (checked at least once).
template <typename Condition>
bool eventually(Condition condition,
                std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// The pid a worker wrote to `file` (the test worker's `pidfile` action), once it is there: a worker
// writes it after whatever the test waited for before (its round's line), and the file exists a
// moment before its content. 0 when it is not there within `timeout`.
inline pid_t written_pid(const std::filesystem::path& file,
                         std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  pid_t pid = 0;
  eventually(
      [&] {
        pid = 0;
        std::ifstream(file) >> pid;
        return pid > 0;
      },
      timeout);
  return pid;
}

// A process as /proc/<pid>/stat describes it.
struct ProcessInfo {
  pid_t pid = -1;
  pid_t ppid = -1;
  pid_t pgrp = -1;
  char state = '?';  // 'Z': a zombie
  std::string comm;
};

inline std::optional<ProcessInfo> process_info(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  const auto open = line.find('('), close = line.rfind(')');
  if (open == std::string::npos || close == std::string::npos) return std::nullopt;
  ProcessInfo p;
  p.pid = pid;
  p.comm = line.substr(open + 1, close - open - 1);
  std::istringstream rest(line.substr(close + 1));
  rest >> p.state >> p.ppid >> p.pgrp;
  return p;
}

// Every process (kernel threads included) at the time of the call.
inline std::vector<ProcessInfo> all_processes() {
  std::vector<ProcessInfo> all;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    if (auto p = process_info(std::stoi(name))) all.push_back(std::move(*p));
  }
  return all;
}

// The live processes below `root` in the process tree (zombies left out).
inline std::vector<pid_t> descendants_of(pid_t root) {
  const auto all = all_processes();
  std::vector<pid_t> found{root};
  for (std::size_t i = 0; i < found.size(); ++i) {
    for (const auto& p : all) {
      if (p.ppid == found[i] && p.state != 'Z') found.push_back(p.pid);
    }
  }
  found.erase(found.begin());
  return found;
}

// The live processes whose environment lists `agent_id` in DIST_LAUNCH_AGENT_ID (a ':'-separated
// list): what a dist-launch agent started, and what those started, wherever they went in the
// process tree. Reads /proc/<pid>/environ: root sees every process, a user their own.
inline std::vector<pid_t> processes_with_agent_id(const std::string& agent_id) {
  const std::string name = "DIST_LAUNCH_AGENT_ID=";
  std::vector<pid_t> found;
  for (const auto& p : all_processes()) {
    if (p.state == 'Z') continue;
    std::ifstream in("/proc/" + std::to_string(p.pid) + "/environ");
    std::string entry;
    while (std::getline(in, entry, '\0')) {
      if (entry.rfind(name, 0) != 0) continue;
      std::istringstream ids(entry.substr(name.size()));
      std::string id;
      while (std::getline(ids, id, ':')) {
        if (id == agent_id) found.push_back(p.pid);
      }
    }
  }
  return found;
}

// Runs a shell command; its exit code and its stdout and stderr together.
inline std::pair<int, std::string> run_command(const std::string& command) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  std::string out;
  char buffer[512];
  while (pipe && std::fgets(buffer, sizeof buffer, pipe)) out += buffer;
  const int status = pipe ? ::pclose(pipe) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// A program run in the background with stdout and stderr in one log file; killed and reaped when
// the test is done with it.
class Child {
 public:
  Child(const std::string& program, std::vector<std::string> args, std::filesystem::path log,
        const std::map<std::string, std::string>& env = {},
        const std::vector<std::string>& unset = {})
      : log_(std::move(log)) {
    pid_ = ::fork();
    if (pid_ == 0) {
      const int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      for (const auto& name : unset) ::unsetenv(name.c_str());
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> argv{const_cast<char*>(program.c_str())};
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(program.c_str(), argv.data());
      ::_exit(127);
    }
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  // The exit code (128 + signal when killed), or -1 after `timeout` (then the child is killed).
  int wait(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    reaped_ = true;
    return -1;
  }
  std::string output() const {
    std::ifstream in(log_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  pid_t pid() const { return pid_; }

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
  bool reaped_ = false;
};

}  // namespace dist::agent::testing
