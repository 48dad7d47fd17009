#include "output/log_pump.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace dist::agent {
namespace {

// A buffer that held a long line is given back rather than kept for the pump's lifetime.
constexpr std::size_t kKeptBufferBytes = 64 * 1024;

void release_if_large(std::string& s) {
  if (s.capacity() > kKeptBufferBytes) std::string().swap(s);
}

bool ends_record(std::string_view bytes) {
  return !bytes.empty() && (bytes.back() == '\n' || bytes.back() == '\r');
}

}  // namespace

void RecordCutter::feed(std::string_view data, const Emit& emit) {
  const char* p = data.data();
  const char* const end = p + data.size();
  // The next '\r' and '\n' at or after p (end: none), each searched for again once passed.
  const auto find = [&](char c) {
    const void* at = std::memchr(p, c, static_cast<std::size_t>(end - p));
    return at ? static_cast<const char*>(at) : end;
  };
  const char* cr = find('\r');
  const char* nl = find('\n');
  while (p < end) {
    if (after_cr_) {
      after_cr_ = false;
      if (*p == '\n') {  // "\r\n": one record
        emit("\n", false);
        cr_line_ = false;
        ++p;
        continue;
      }
    }
    if (cr < p) cr = find('\r');
    if (nl < p) nl = find('\n');
    const char* terminator = std::min(cr, nl);
    const auto segment = static_cast<std::size_t>((terminator == end ? end : terminator + 1) - p);
    const std::size_t room = max_record_bytes_ - pending_.size();
    if (terminator != end && segment <= room) {  // a record ends here
      if (pending_.empty()) {
        emit(std::string_view(p, segment), !open_);
      } else {
        pending_.append(p, segment);
        emit_pending(emit);
      }
      open_ = false;
      cr_line_ = after_cr_ = *terminator == '\r';
      p += segment;
      continue;
    }
    const std::size_t take = std::min(segment, room);
    pending_.append(p, take);
    p += take;
    if (pending_.size() == max_record_bytes_) {
      emit_pending(emit);  // a piece of a long line
      open_ = true;
    }
  }
  if (cr_line_ && !pending_.empty()) {  // progress: shown now, not when the line ends
    emit_pending(emit);
    open_ = true;
  }
}

void RecordCutter::finish(const Emit& emit) {
  if (pending_.empty() && !open_) return;
  pending_.push_back('\n');  // the output ended in the middle of a line
  emit_pending(emit);
  open_ = cr_line_ = after_cr_ = false;
}

void RecordCutter::forward_open_line(const Emit& emit) {
  if (pending_.empty()) return;
  emit_pending(emit);
  open_ = true;
}

void RecordCutter::emit_pending(const Emit& emit) {
  emit(pending_, !open_);
  pending_.clear();
  release_if_large(pending_);
}

std::shared_ptr<LogPump> LogPump::start(boost::asio::io_context& io, int pipe_fd, Sink sink,
                                        std::function<void()> on_eof) {
  std::shared_ptr<LogPump> pump(new LogPump(io, pipe_fd, std::move(sink), std::move(on_eof)));
  pump->open_file();
  pump->read();
  return pump;
}

LogPump::LogPump(boost::asio::io_context& io, int pipe_fd, Sink sink, std::function<void()> on_eof)
    : pipe_(io, pipe_fd),
      sink_(std::move(sink)),
      on_eof_(std::move(on_eof)),
      emit_([this](std::string_view bytes, bool starts) { to_console(bytes, starts); }),
      open_line_timer_(io) {
  if (sink_.duplicate) duplicate_.emplace(sink_.duplicate, sink_.duplicate_prefix);
}

LogPump::~LogPump() {
  if (file_fd_ >= 0) ::close(file_fd_);
}

void LogPump::open_file() {
  if (sink_.file_path.empty()) return;
  file_fd_ = ::open(sink_.file_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (file_fd_ < 0) give_up_file(errno);
}

void LogPump::abandon() {
  on_eof_ = nullptr;
  open_line_timer_.cancel();
  boost::system::error_code ignored;
  pipe_.close(ignored);
}

void LogPump::read() {
  pipe_.async_read_some(
      boost::asio::buffer(buffer_.get(), kReadBytes),
      [self = shared_from_this()](const boost::system::error_code& ec, std::size_t n) {
        if (ec) return self->finish();
        const std::string_view bytes(self->buffer_.get(), n);
        self->to_file(bytes);
        if (self->duplicate_) self->duplicate_->feed(bytes);
        if (self->sink_.console) {
          ++self->reads_;
          self->cutter_.feed(bytes, self->emit_);
          self->flush_batch();
          if (self->cutter_.holds_open_line()) self->wait_for_open_line();
        }
        self->read();
      });
}

void LogPump::to_file(std::string_view bytes) {
  while (file_fd_ >= 0 && !bytes.empty()) {
    const ssize_t n = ::write(file_fd_, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return give_up_file(n < 0 ? errno : EIO);
    file_bytes_ += static_cast<std::uint64_t>(n);
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

void LogPump::give_up_file(int error) {
  if (file_fd_ >= 0) ::close(file_fd_);
  file_fd_ = -1;
  file_error_ = LogFileError{sink_.file_path, std::strerror(error), file_bytes_};
  spdlog::warn("cannot write worker log {}: {}; it holds the first {} bytes only (the job goes on)",
               sink_.file_path, file_error_->error, file_bytes_);
  if (sink_.on_file_error) sink_.on_file_error(*file_error_);
}

void LogPump::to_console(std::string_view bytes, bool starts_record) {
  if (!starts_record && batch_.empty() && line_dropped_) {  // its start was in a dropped batch
    sink_.console->count_dropped(sink_.stream, bytes.size());
    line_dropped_ = !ends_record(bytes);
    return;
  }
  if (batch_.empty()) batch_continues_ = !starts_record;
  if (starts_record) batch_.append(sink_.prefix);
  batch_.append(bytes);
}

void LogPump::flush_batch() {
  if (batch_.empty()) return;
  const bool taken = sink_.console->write(sink_.stream, batch_, this,
                                          batch_continues_ ? sink_.prefix : std::string_view());
  line_dropped_ = !taken && !ends_record(batch_);
  batch_.clear();
  release_if_large(batch_);
}

// A line left open is forwarded once nothing more arrived for kOpenLineWait (one timer, armed
// again while output keeps coming: a long line arriving read after read is not cut).
void LogPump::wait_for_open_line() {
  if (open_line_timer_armed_) return;
  open_line_timer_armed_ = true;
  reads_when_armed_ = reads_;
  open_line_timer_.expires_after(kOpenLineWait);
  open_line_timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
    self->open_line_timer_armed_ = false;
    if (ec || !self->pipe_.is_open() || !self->cutter_.holds_open_line()) return;
    if (self->reads_ != self->reads_when_armed_) return self->wait_for_open_line();
    self->cutter_.forward_open_line(self->emit_);
    self->flush_batch();
  });
}

void LogPump::finish() {
  open_line_timer_.cancel();
  if (duplicate_) duplicate_->finish();
  if (sink_.console) {
    cutter_.finish(emit_);
    flush_batch();
  }
  if (file_fd_ >= 0) {
    ::close(file_fd_);
    file_fd_ = -1;
  }
  boost::system::error_code ignored;
  pipe_.close(ignored);
  if (on_eof_) std::exchange(on_eof_, nullptr)();
}

}  // namespace dist::agent
