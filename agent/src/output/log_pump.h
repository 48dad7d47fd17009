// Worker output: a pipe read asynchronously; every byte to the worker's log file exactly as the
// worker wrote it, and to the console cut into records, each started by the worker's prefix.
//
// Console records (RecordCutter):
//   - a record ends at '\n' or '\r'; a '\n' right after a '\r' ends that same record ("\r\n");
//   - once a line has had a '\r' (a progress bar redrawing itself), what follows the '\r' is
//     forwarded as soon as it arrives, so progress is live; the '\r' or '\n' that ends it later
//     continues that record without a prefix;
//   - a line longer than kMaxRecordBytes is forwarded in pieces of that size, the prefix on the
//     first only, with nothing added between them (memory stays bounded, the line stays one line);
//   - a line left open with nothing more arriving for kOpenLineWait (a prompt: "(Pdb) ", input()'s)
//     is forwarded then, and what follows continues its record without a prefix: its end may not
//     come before someone answers it;
//   - at the end of the output, a line left open is ended with a '\n' on the console only.
// The records cut from one read go to the console as one batch, one write: records of different
// workers never mix within a record, but the pieces of one long line or a live progress update may
// have another worker's records between them (on lines of their own, Console::write: the piece
// after them prefixed again). When the console drops a batch, the rest of a line it left open is
// dropped too (counted, never shown with a hole in the middle).
//
// A log file that cannot be written (ENOSPC, EIO, or not opened) is given up: one warning naming
// the file, then the pump goes on with the console alone; file_error() and on_file_error say so.
#pragma once

#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "dist/agent/console.h"
#include "output/duplicate_log.h"

namespace dist::agent {

// Past this, a line is forwarded to the console in pieces.
constexpr std::size_t kMaxRecordBytes = 1 << 20;
// A line left open this long with nothing more arriving is forwarded as it is. (What a buffered
// writer cut at a block's end follows it within a moment.)
constexpr std::chrono::milliseconds kOpenLineWait{250};

// Cuts a byte stream into console records by the rules above.
class RecordCutter {
 public:
  // A record or a piece of one; starts_record: the prefix goes before it.
  using Emit = std::function<void(std::string_view bytes, bool starts_record)>;

  explicit RecordCutter(std::size_t max_record_bytes = kMaxRecordBytes)
      : max_record_bytes_(max_record_bytes) {}

  void feed(std::string_view data, const Emit& emit);
  void finish(const Emit& emit);  // the end of the output
  // Whether the start of a record waits for its end.
  bool holds_open_line() const { return !pending_.empty(); }
  // Forwards that start now (the record stays open: what follows continues it).
  void forward_open_line(const Emit& emit);

 private:
  void emit_pending(const Emit& emit);

  const std::size_t max_record_bytes_;
  std::string pending_;    // the start of a record not forwarded yet
  bool open_ = false;      // a record was started and not ended: what follows continues it
  bool cr_line_ = false;   // this line has had a '\r': forward what arrives at once
  bool after_cr_ = false;  // the last record ended with '\r': a '\n' now belongs to it
};

// A log file given up on.
struct LogFileError {
  std::string path;
  std::string error;                // "No space left on device"
  std::uint64_t bytes_written = 0;  // the file holds the output up to here
};

class LogPump : public std::enable_shared_from_this<LogPump> {
 public:
  struct Sink {
    std::shared_ptr<Console> console;  // null: not to the console
    ConsoleStream stream = ConsoleStream::kStdout;
    std::string prefix;     // "[default0]:"
    std::string file_path;  // empty: no file; created (truncated) by the pump
    std::function<void(const LogFileError&)> on_file_error;  // once, when the file is given up
    // The lines selected by --duplicate-*-filters go there too, prefixed; null: none.
    std::shared_ptr<DuplicateLog> duplicate;
    std::string duplicate_prefix;
  };

  // Takes ownership of pipe_fd; on_eof runs once the worker (and whoever inherited the pipe)
  // closed it.
  static std::shared_ptr<LogPump> start(boost::asio::io_context& io, int pipe_fd, Sink sink,
                                        std::function<void()> on_eof);
  ~LogPump();
  // Stops reading and forgets on_eof: for an owner that goes away before the worker's pipe
  // closes.
  void abandon();

  // Set once the log file was given up: from then on it misses output.
  const std::optional<LogFileError>& file_error() const { return file_error_; }

 private:
  LogPump(boost::asio::io_context& io, int pipe_fd, Sink sink, std::function<void()> on_eof);
  void open_file();
  void read();
  void to_file(std::string_view bytes);
  void give_up_file(int error);
  void to_console(std::string_view bytes, bool starts_record);
  void flush_batch();
  void wait_for_open_line();
  void finish();

  boost::asio::posix::stream_descriptor pipe_;
  Sink sink_;
  std::function<void()> on_eof_;
  int file_fd_ = -1;
  std::uint64_t file_bytes_ = 0;
  std::optional<LogFileError> file_error_;
  RecordCutter cutter_;
  RecordCutter::Emit emit_;
  std::optional<DuplicateLog::Writer> duplicate_;
  bool line_dropped_ = false;  // the console dropped this line's start: drop the rest of it
  boost::asio::steady_timer open_line_timer_;
  bool open_line_timer_armed_ = false;
  std::uint64_t reads_ = 0;  // counted for the timer: did more arrive while it ran?
  std::uint64_t reads_when_armed_ = 0;
  std::string batch_;             // this read's records, prefixed
  bool batch_continues_ = false;  // it starts with the rest of a line already (partly) written
  // Not zeroed: 16 pumps of 8 workers would memset a MiB at every launch, and make it resident.
  static constexpr std::size_t kReadBytes = 64 * 1024;
  std::unique_ptr<char[]> buffer_ = std::make_unique_for_overwrite<char[]>(kReadBytes);
};

}  // namespace dist::agent
