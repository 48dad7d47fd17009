// The agent's signals as events on its io_context: the handled signals and SIGCHLD are blocked
// and read from a signalfd, each with its sender's pid (a signal Slurm already sent to the whole
// step is then known as such). Construct it before any thread starts, so that every thread has
// them blocked; workers unblock them between fork and exec.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <functional>
#include <vector>

namespace dist::agent {

class SignalWatcher {
 public:
  struct Received {
    int signal = 0;
    pid_t sender = 0;  // 0 when the kernel sent it
    int code = 0;      // si_code: SI_USER for kill(), ...
  };

  SignalWatcher(boost::asio::io_context& io, const std::vector<int>& signals);
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

  // Calls `handler` for every signal received, until cancel().
  void start(std::function<void(Received)> handler);
  void cancel();

 private:
  void read();

  boost::asio::posix::stream_descriptor fd_;
  std::function<void(Received)> handler_;
  std::vector<char> buffer_;
};

}  // namespace dist::agent
