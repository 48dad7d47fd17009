// torch's FileTimerServer (torch/distributed/elastic/timer/file_based_local_timer.py), served on
// the agent's io_context: workers send countdown timers through a named pipe, one JSON line per
// request, {"version": 1, "pid", "scope_id", "expiration_time" (seconds since the epoch),
// "signal"}; a negative expiration_time releases the timer on (pid, scope_id).
//
// As torch's: when a process's timers expire, the first of them (in expiration order) that names a
// signal is the one reported, and every timer of that process is then dropped; a timer whose
// process is gone never fires. Unlike torch's, which polls the pipe every 100 ms and, after killing
// the worker, kills its own process (the agent, and so the job), this one fires at the expiration
// time itself and only reports: the caller kills the worker and the group restarts.
//
// The pipe is created 0600 (torch's takes the umask): only this user's processes can send timers.
// The server keeps a write end open itself, so the read end never sees end-of-file between
// clients, which open, write one line and close.
#pragma once

#include <sys/types.h>

#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

namespace dist::agent {

struct TimerExpiry {
  pid_t pid = -1;
  std::string scope_id;
  int signal = 0;  // 0: the request named none (torch then only logs)
  double expiration_time = 0;
  // monotonic_now() when the request came: the agent's stalls since then extend the expiration
  // (agent_stall.h; torch's server counts them, and a job suspended and resumed was killed).
  std::chrono::nanoseconds registered{0};
};

class FileTimerServer {
 public:
  // Creates the named pipe at `path` (a named pipe left there by an earlier run is replaced) and
  // serves it until destroyed, when the pipe is removed. Throws std::runtime_error naming the path
  // when it cannot (anything but a named pipe already there, a directory that does not exist).
  FileTimerServer(boost::asio::io_context& io, std::string path,
                  std::function<void(const TimerExpiry&)> on_expired);
  ~FileTimerServer();
  FileTimerServer(const FileTimerServer&) = delete;
  FileTimerServer& operator=(const FileTimerServer&) = delete;

  const std::string& path() const { return path_; }
  // Drops every timer (the workers that set them are being stopped).
  void clear();
  std::size_t active_timers() const { return timers_.size(); }

 private:
  void read();
  void take(std::string_view bytes);
  void handle(const std::string& line);
  static double expiration(const TimerExpiry& t, std::chrono::nanoseconds now);
  void schedule();
  void expire();

  std::string path_;
  std::function<void(const TimerExpiry&)> on_expired_;
  boost::asio::posix::stream_descriptor pipe_;
  int own_writer_ = -1;
  boost::asio::steady_timer timer_;
  std::map<std::pair<pid_t, std::string>, TimerExpiry> timers_;
  std::string line_;
  bool skipping_ = false;  // discarding the rest of an oversized line
  int malformed_reported_ = 0;
  std::array<char, 4096> buffer_{};
  std::shared_ptr<char> alive_ = std::make_shared<char>();  // handlers outliving this see it gone
};

// torch's default path when TORCHELASTIC_TIMER_FILE is unset: <temporary dir>/watchdog_timer_<id>.
std::string default_timer_file_path();

}  // namespace dist::agent
