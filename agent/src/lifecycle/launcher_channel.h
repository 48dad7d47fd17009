// The agent's end of the pipe from the launcher that started it (dist-launch --hosts; the protocol
// is in dist/agent/agent_launch.h): each control line is a signal the launcher forwards, and the
// end of the pipe (the launcher killed, its ssh connection dropped) is a SIGHUP, so that no agent
// outlives the command that started it.
#pragma once

#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <functional>
#include <string>

namespace dist::agent {

class LauncherChannel {
 public:
  // Reads a duplicate of `fd` (the caller's stays open).
  LauncherChannel(boost::asio::io_context& io, int fd);
  LauncherChannel(const LauncherChannel&) = delete;
  LauncherChannel& operator=(const LauncherChannel&) = delete;

  // Calls `on_signal` for every signal the launcher forwards, and with SIGHUP once the pipe ends
  // (then reads no more), until cancel().
  void start(std::function<void(int signal)> on_signal);
  void cancel();

 private:
  void read();
  void on_line(const std::string& line);

  boost::asio::posix::stream_descriptor pipe_;
  std::function<void(int)> on_signal_;
  std::string pending_;  // the start of a line
  std::array<char, 4096> buffer_{};
};

}  // namespace dist::agent
