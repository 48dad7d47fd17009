// torch's FileTimerClient in C++ (torch.distributed.elastic.timer.FileTimerClient): countdown
// timers on scopes of a worker's work, kept by the agent that serves the named pipe in
// TORCHELASTIC_TIMER_FILE (dist-launch and torchrun do with TORCHELASTIC_ENABLE_FILE_TIMER=1). A
// timer that expires before it is released gets this process killed with the client's signal, and
// the agent restarts the worker group. The same requests as torch's client: one JSON line each,
// {"version": 1, "pid", "scope_id", "expiration_time" (seconds since the epoch; -1 releases),
// "signal"}, written in one write no longer than PIPE_BUF.
#pragma once

#include <signal.h>

#include <chrono>
#include <stdexcept>
#include <string>

namespace dist::sdk {

// A request that could not be sent: nobody serves the pipe, the variable is unset, the pipe is
// full. The message says which and what to do.
class FileTimerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class FileTimerClient {
 public:
  // $TORCHELASTIC_TIMER_FILE, or FileTimerError when it is unset.
  static std::string path_from_environment();

  // `signal`: what the agent sends this process when one of its timers expires (torch's default
  // SIGKILL); 0 or less: the expiry is only reported.
  explicit FileTimerClient(std::string file_path = path_from_environment(), int signal = SIGKILL);

  // A timer on `scope_id` for this process, expiring at `expiration` (replaces one on the same
  // scope). Throws FileTimerError.
  void acquire(const std::string& scope_id, std::chrono::system_clock::time_point expiration);
  // Ends the timer on `scope_id`, if any. Throws FileTimerError.
  void release(const std::string& scope_id);

  const std::string& file_path() const { return file_path_; }

 private:
  void send(const std::string& scope_id, double expiration_time, int signal) const;

  std::string file_path_;
  int signal_;
};

// torch's `expires(after, scope)`: a timer for the enclosing block, released when it ends.
class TimerScope {
 public:
  TimerScope(FileTimerClient& client, std::string scope_id,
             std::chrono::system_clock::duration after);
  ~TimerScope();  // a release that fails is said on stderr (the timer then expires on its own)
  TimerScope(const TimerScope&) = delete;
  TimerScope& operator=(const TimerScope&) = delete;

 private:
  FileTimerClient& client_;
  std::string scope_id_;
};

}  // namespace dist::sdk
