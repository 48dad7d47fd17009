// Worker output: a pipe read asynchronously, cut into whole lines, prefixed and written with one
// write() per line to the console and/or a file, so lines of different workers never interleave.
#pragma once

#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <functional>
#include <memory>
#include <string>

namespace dist::agent {

class LogPump : public std::enable_shared_from_this<LogPump> {
 public:
  struct Sink {
    int console_fd = -1;  // -1: not to the console
    int file_fd = -1;     // -1: no file
    std::string prefix;   // "[default0]:"
  };

  // Takes ownership of pipe_fd (and of sink.file_fd); on_eof runs once the worker closed it.
  static std::shared_ptr<LogPump> start(boost::asio::io_context& io, int pipe_fd, Sink sink,
                                        std::function<void()> on_eof);
  ~LogPump();
  // Stops reading and forgets on_eof: for an owner that goes away before the worker's pipe
  // closes.
  void abandon();

 private:
  LogPump(boost::asio::io_context& io, int pipe_fd, Sink sink, std::function<void()> on_eof);
  void read();
  void emit(const char* data, std::size_t size);  // one whole line, newline included
  void finish();

  boost::asio::posix::stream_descriptor pipe_;
  Sink sink_;
  std::function<void()> on_eof_;
  std::string partial_;
  std::array<char, 16 * 1024> buffer_{};
};

}  // namespace dist::agent
