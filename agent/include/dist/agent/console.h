// The agent's console (its stdout and stderr), written without ever blocking the caller.
//
// How a stream is written is decided once, from what the inherited descriptor is:
//   - a regular file: plain write() on a duplicate (the same open file description, so O_APPEND and
//     the offset shared with the other stream are kept; a regular file is never reopened);
//   - a socket (journald, a log shipper): send() with MSG_DONTWAIT | MSG_NOSIGNAL on a duplicate;
//   - a pipe, FIFO, terminal or other device: reopened through /proc/self/fd/N with O_NONBLOCK, a
//     new open file description, so the shell's own stays blocking (O_NOCTTY: a terminal never
//     becomes the agent's controlling one). When the reopen is refused (a pipe made by another
//     user), writes of at most PIPE_BUF bytes once poll() says the descriptor is writable.
// A record (a line, or a piece of one) that cannot be written at once waits in a bounded queue per
// stream, written by the console's thread as the reader drains. When the queue is full, whole
// records of the workers' output are dropped and counted; once the stream has drained, a note says
// how many bytes were dropped. The agent's own records (say(): its log, a failure report) have a
// reserve beyond the limit (kConsoleOwnReserveBytes): what failed is said while the workers' output
// is dropped. A closed stream (EPIPE) drops everything from then on, said once on the other
// stream. At exit (drain()), what is queued is written for as long as the reader keeps taking it,
// as torchrun's console would be, until a stop signal.
//
// Constructing a Console ignores SIGPIPE in this process when it is at its default, so that a
// closed console is an EPIPE the console handles (workers get every default back at spawn).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace spdlog {
class logger;
}

namespace dist::agent {

enum class ConsoleStream { kStdout, kStderr };

// What is queued per stream, at most, before the workers' records are dropped (a record that
// arrives when the queue is empty is always taken, so a stream holds at most this plus one record
// and the agent's own). Enough for a reader that is slow (a log shipper, ssh, `| (sleep 2; cat)`)
// to lose nothing; a reader that stops (a paused pager, a pipe nobody reads) costs the rest.
constexpr std::size_t kConsoleQueueLimitBytes = std::size_t{32} << 20;
// Beyond the limit, for the agent's own records (say()) alone.
constexpr std::size_t kConsoleOwnReserveBytes = std::size_t{4} << 20;
// When spdlog is flushed, and at exit once the agent was told to stop (a signal): how long to
// wait for the console to take what is queued.
constexpr std::chrono::milliseconds kConsoleExitFlushTimeout{300};
// At exit otherwise (drain()): how long the console may take nothing before what it holds is
// given up.
constexpr std::chrono::milliseconds kConsoleExitStallTimeout{10'000};

struct ConsoleStats {
  std::uint64_t written_bytes = 0;  // taken by the stream
  std::uint64_t dropped_bytes = 0;  // records dropped (queue full, write error), since the start
  bool closed = false;              // EPIPE: nothing is written any more
};

class Console {
 public:
  // The process's console (descriptors 1 and 2), made on first use.
  static std::shared_ptr<Console> process();

  // Takes its own descriptors for stdout_fd and stderr_fd (the caller keeps and may close its
  // own); a descriptor that is not open is a stream that drops everything silently.
  Console(int stdout_fd, int stderr_fd, std::size_t queue_limit_bytes = kConsoleQueueLimitBytes);
  ~Console();  // what is still queued is dropped; never waits for the reader
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

  // Writes one record whole, behind the ones queued before it; never blocks. False when the record
  // was dropped (the queue is full, or the stream is closed). A record that leaves its line open
  // (no '\n' or '\r' at its end: a prompt) keeps it `writer`'s: a record of anyone else's (the
  // agent's own: no writer) starts on a new line, and `writer`'s next record, when it continues
  // that line (`resume_prefix` given), starts with resume_prefix once someone else wrote.
  bool write(ConsoleStream stream, std::string_view record, const void* writer = nullptr,
             std::string_view resume_prefix = {});
  // The agent's own record (a log line, a failure report): as write() with no writer, but never
  // dropped because the queue is full.
  bool say(ConsoleStream stream, std::string_view record);
  // Counts bytes the caller chose not to write (the rest of a line whose start was dropped), so
  // that the note about dropped output has them.
  void count_dropped(ConsoleStream stream, std::size_t bytes);
  // Waits until every queue is empty, at most `timeout`; true when everything was written. What
  // is still queued then is dropped, said on the other stream when it can take it.
  bool flush_for(std::chrono::milliseconds timeout);
  // At exit: waits until every queue is empty for as long as the streams take bytes, giving up
  // (as flush_for) once they took none for `stall`, or after kConsoleExitFlushTimeout once
  // hurry() was called or a stop signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) is pending.
  bool drain(std::chrono::milliseconds stall = kConsoleExitStallTimeout);
  // The process was told to stop (a signal): drain() does not wait for a slow reader.
  void hurry();

  // The workers' records of both streams go to stdout from now on, the agent's own (say()) stay
  // on stderr: the console they end on is one stream, read from this process's two (dist-launch
  // --hosts reads a host's agent's stdout and stderr apart and shows them on one console: the
  // workers' lines keep their order, and its stderr carries only the agent's records).
  void workers_on_stdout();

  bool is_terminal(ConsoleStream stream) const;
  // stdout and stderr are one file (a terminal, `2>&1`), or the workers' records all go to stdout
  // (workers_on_stdout()): one stream, whose records keep their order.
  bool one_stream() const;
  ConsoleStats stats(ConsoleStream stream) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A logger whose messages go to the console's stderr, colored (the pattern's %^...%$) when that is
// a terminal. Flushing it waits at most kConsoleExitFlushTimeout.
std::shared_ptr<spdlog::logger> make_console_logger(const std::string& name,
                                                    std::shared_ptr<Console> console);

}  // namespace dist::agent
