#include "log_pump.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dist::agent {
namespace {

constexpr std::size_t kMaxLineBytes = 64 * 1024;  // longer lines are cut here

void write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the console or file is gone: drop the output, never block the agent
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

}  // namespace

std::shared_ptr<LogPump> LogPump::start(boost::asio::io_context& io, int pipe_fd, Sink sink,
                                        std::function<void()> on_eof) {
  std::shared_ptr<LogPump> pump(new LogPump(io, pipe_fd, std::move(sink), std::move(on_eof)));
  pump->read();
  return pump;
}

LogPump::LogPump(boost::asio::io_context& io, int pipe_fd, Sink sink, std::function<void()> on_eof)
    : pipe_(io, pipe_fd), sink_(std::move(sink)), on_eof_(std::move(on_eof)) {}

LogPump::~LogPump() {
  if (sink_.file_fd >= 0) ::close(sink_.file_fd);
}

void LogPump::abandon() {
  on_eof_ = nullptr;
  boost::system::error_code ignored;
  pipe_.close(ignored);
}

void LogPump::read() {
  pipe_.async_read_some(
      boost::asio::buffer(buffer_),
      [self = shared_from_this()](const boost::system::error_code& ec, std::size_t n) {
        if (ec) {
          self->finish();
          return;
        }
        const char* p = self->buffer_.data();
        const char* end = p + n;
        while (p < end) {
          const char* nl =
              static_cast<const char*>(std::memchr(p, '\n', static_cast<std::size_t>(end - p)));
          if (!nl) {
            self->partial_.append(p, end);
            if (self->partial_.size() >= kMaxLineBytes) {
              self->partial_.push_back('\n');
              self->emit(self->partial_.data(), self->partial_.size());
              self->partial_.clear();
            }
            break;
          }
          if (self->partial_.empty()) {
            self->emit(p, static_cast<std::size_t>(nl + 1 - p));
          } else {
            self->partial_.append(p, nl + 1);
            self->emit(self->partial_.data(), self->partial_.size());
            self->partial_.clear();
          }
          p = nl + 1;
        }
        self->read();
      });
}

void LogPump::emit(const char* data, std::size_t size) {
  if (sink_.file_fd >= 0) write_all(sink_.file_fd, data, size);
  if (sink_.console_fd >= 0) {
    std::string line;
    line.reserve(sink_.prefix.size() + size);
    line.append(sink_.prefix).append(data, size);
    write_all(sink_.console_fd, line.data(), line.size());
  }
}

void LogPump::finish() {
  if (!partial_.empty()) {
    partial_.push_back('\n');  // the last line, unterminated
    emit(partial_.data(), partial_.size());
    partial_.clear();
  }
  boost::system::error_code ignored;
  pipe_.close(ignored);
  if (on_eof_) std::exchange(on_eof_, nullptr)();
}

}  // namespace dist::agent
