#include "daemon_process.h"

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

namespace dist::store::testing {

DaemonProcess::DaemonProcess(std::vector<std::string> args, std::uint64_t max_open_files) {
  int out[2];
  if (::pipe(out) != 0) return;
  args.insert(args.begin(), {DIST_RENDEZVOUS_BIN, "--host", "127.0.0.1", "--port", "0"});
  pid_ = ::fork();
  if (pid_ == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(out[1], STDERR_FILENO);
    ::close(out[0]);
    ::close(out[1]);
    if (max_open_files > 0) {
      const rlimit limit{max_open_files, max_open_files};
      ::setrlimit(RLIMIT_NOFILE, &limit);
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(DIST_RENDEZVOUS_BIN, argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  fd_ = out[0];
  const std::regex listening("listening on 127\\.0\\.0\\.1:(\\d+)");
  std::smatch m;
  if (wait_for(listening, std::chrono::seconds(20)) && std::regex_search(output_, m, listening)) {
    port_ = static_cast<std::uint16_t>(std::stoi(m[1]));
  }
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) stop();
  if (fd_ >= 0) ::close(fd_);
}

bool DaemonProcess::wait_for(const std::regex& pattern, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!std::regex_search(output_, pattern)) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd_, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) != 1) return false;
    char buffer[4096];
    const ssize_t n = ::read(fd_, buffer, sizeof buffer);
    if (n <= 0) return false;
    output_.append(buffer, static_cast<std::size_t>(n));
  }
  return true;
}

int DaemonProcess::stop() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(fd_, buffer, sizeof buffer)) > 0) output_.append(buffer, n);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::uint64_t resident_bytes(pid_t pid, const std::string& field) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}

}  // namespace dist::store::testing
