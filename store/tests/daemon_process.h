// dist-rendezvous as a child process for whole-program tests: started on a free port, its
// output (stdout and stderr) collected, stopped with SIGTERM and always reaped.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <regex>
#include <string>
#include <vector>

namespace dist::store::testing {

class DaemonProcess {
 public:
  // Starts dist-rendezvous with `args` (plus --host 127.0.0.1 --port 0) and waits for the port
  // it prints. max_open_files > 0: the child's RLIMIT_NOFILE, hard and soft.
  explicit DaemonProcess(std::vector<std::string> args, std::uint64_t max_open_files = 0);
  ~DaemonProcess();  // stops it if still running
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  pid_t pid() const { return pid_; }
  std::uint16_t port() const { return port_; }  // 0 when it did not start
  // Reads output until `pattern` matches all of it so far, or `timeout` passes.
  bool wait_for(const std::regex& pattern, std::chrono::milliseconds timeout);
  const std::string& output() const { return output_; }
  // SIGTERM, then the exit code (-1 unless it exited normally); the rest of its output is read.
  int stop();

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::string output_;
};

// The child's resident memory from /proc/<pid>/status, in bytes: "VmRSS" (now) or "VmHWM" (peak).
std::uint64_t resident_bytes(pid_t pid, const std::string& field);

}  // namespace dist::store::testing
