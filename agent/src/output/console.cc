#include "dist/agent/console.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <iterator>
#include <mutex>
#include <thread>

namespace dist::agent {
namespace {

enum class Mode { kNone, kPlain, kSocket, kPolled };

struct Record {
  std::string bytes;
  bool note = false;  // the console's own: never counted as dropped output
};

// A line left open on the console (a prompt, a piece of a long line) and whose it is: a record of
// anyone else's starts on a line of its own, and the owner's continuation after that starts with
// its prefix again. The two streams share one when they are the same terminal.
struct OpenLine {
  bool open = false;
  const void* writer = nullptr;
};

struct Stream {
  const char* name = "";
  int fd = -1;
  Mode mode = Mode::kNone;  // kNone: not open; everything is dropped silently
  bool terminal = false;
  int open_error = 0;  // EPIPE: the pipe had no reader any more when it was reopened
  std::deque<Record> queue;
  std::size_t head_offset = 0;  // bytes of queue.front() already written
  std::size_t queued_bytes = 0;
  std::uint64_t dropped_since_note = 0;
  char last_byte = '\n';  // a note starts on a line of its own
  ConsoleStats stats;
};

// Whether two descriptors are the same file (a terminal both streams write to).
bool same_file(int a, int b) {
  struct stat sa {};
  struct stat sb {};
  return ::fstat(a, &sa) == 0 && ::fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

Stream open_stream(int fd, const char* name) {
  Stream s;
  s.name = name;
  struct stat st {};
  if (::fstat(fd, &st) != 0) return s;
  s.terminal = ::isatty(fd) == 1;
  if (S_ISREG(st.st_mode) || S_ISSOCK(st.st_mode)) {
    s.fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
    s.mode = s.fd < 0 ? Mode::kNone : S_ISREG(st.st_mode) ? Mode::kPlain : Mode::kSocket;
    return s;
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  s.fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (s.fd >= 0) {
    s.mode = Mode::kPlain;
  } else if (errno == ENXIO) {  // a pipe or FIFO whose reader is gone
    s.open_error = EPIPE;
  } else {
    s.fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
    s.mode = s.fd < 0 ? Mode::kNone : Mode::kPolled;
  }
  return s;
}

// One write attempt that never blocks: the byte count, or -1 with errno (EAGAIN: not now).
long write_some(const Stream& s, std::string_view bytes) {
  switch (s.mode) {
    case Mode::kNone:
      errno = EBADF;
      return -1;
    case Mode::kSocket:
      return ::send(s.fd, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    case Mode::kPolled: {
      // A blocking descriptor: a pipe that polls writable has room for PIPE_BUF bytes.
      pollfd p{s.fd, POLLOUT, 0};
      if (::poll(&p, 1, 0) == 0) {
        errno = EAGAIN;
        return -1;
      }
      bytes = bytes.substr(0, std::min<std::size_t>(bytes.size(), PIPE_BUF));
      break;
    }
    case Mode::kPlain:
      break;
  }
  long n;
  do {
    n = ::write(s.fd, bytes.data(), bytes.size());
  } while (n < 0 && errno == EINTR);
  return n;
}

// What starts a note: a newline when the stream was left in the middle of a line.
std::string note_start(const Stream& s) {
  return s.last_byte == '\n' || s.last_byte == '\r' ? "" : "\n";
}

constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

constexpr std::string_view kLogFilesKeepAll =
    " (log files keep everything: --log-dir with --tee or --redirects)\n";

// SIGINT, SIGTERM, SIGHUP or SIGQUIT pending for this thread or the process (blocked: the agent's
// signal watcher blocks them for good).
bool stop_signal_pending() {
  sigset_t pending;
  if (::sigpending(&pending) != 0) return false;
  return std::any_of(std::begin(kStopSignals), std::end(kStopSignals),
                     [&](int s) { return ::sigismember(&pending, s) == 1; });
}

void ignore_sigpipe() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace

struct Console::Impl {
  explicit Impl(std::size_t limit) : queue_limit_bytes(limit) {}

  // The two streams are one when they are the same file (a terminal, `2>&1` into a pipe or a
  // file): one queue keeps their records in the order they were written, each whole.
  Stream& stream(ConsoleStream s) { return s == ConsoleStream::kStdout || shared ? out : err; }
  Stream& other(const Stream& s) { return &s == &out ? err : out; }

  // Writes what the reader takes now; the rest waits for the writer thread. Mutex held.
  void flush_queue(Stream& s) {
    while (!s.queue.empty()) {
      Record& r = s.queue.front();
      const std::string_view rest = std::string_view(r.bytes).substr(s.head_offset);
      const long n = write_some(s, rest);
      if (n > 0) {
        const auto written = static_cast<std::size_t>(n);
        s.head_offset += written;
        s.stats.written_bytes += written;
        s.last_byte = rest[written - 1];
        if (s.head_offset < r.bytes.size()) continue;
        pop(s);
        if (s.queue.empty() && s.dropped_since_note > 0) queue_dropped_note(s);
        continue;
      }
      const int error = n == 0 ? EAGAIN : errno;
      if (error == EAGAIN || error == EWOULDBLOCK) break;
      if (error == EPIPE || error == ECONNRESET) return close_stream(s, error);
      // Another error (ENOSPC, EIO): this record is lost, the next one is tried.
      if (!r.note) count(s, r.bytes.size() - s.head_offset);
      pop(s);
    }
    if (s.queue.empty()) {
      drained.notify_all();
    } else if (writer.get_id() != std::this_thread::get_id()) {
      wake_writer();  // (the writer thread itself polls the stream next)
    }
  }

  void pop(Stream& s) {
    s.queued_bytes -= s.queue.front().bytes.size();
    s.queue.pop_front();
    s.head_offset = 0;
  }

  void count(Stream& s, std::uint64_t bytes) {
    s.stats.dropped_bytes += bytes;
    s.dropped_since_note += bytes;
  }

  void queue_note(Stream& s, std::string note) {
    s.queued_bytes += note.size();
    s.queue.push_back({std::move(note), true});
  }

  // How much was dropped since the stream last drained, said on the stream itself.
  void queue_dropped_note(Stream& s) {
    queue_note(s, note_start(s) + "[dist-launch] warning: the console's " + s.name +
                      " could not keep up: " + std::to_string(s.dropped_since_note) +
                      " bytes of output were dropped" + std::string(kLogFilesKeepAll));
    s.dropped_since_note = 0;
  }

  // EPIPE: said once, on the other stream, and nothing is written to this one any more.
  void close_stream(Stream& s, int error) {
    s.stats.closed = true;
    s.mode = Mode::kNone;
    s.queue.clear();
    s.queued_bytes = 0;
    s.head_offset = 0;
    drained.notify_all();  // (a drain() waiting for this stream waits no more)
    Stream& o = other(s);
    if (o.mode == Mode::kNone) return;
    queue_note(o, note_start(o) + "[dist-launch] warning: " + s.name + " is closed (" +
                      std::strerror(error) +
                      "): its output is dropped from now on; the job goes on, and log files "
                      "keep everything\n");
    if (o.queue.size() == 1) flush_queue(o);
  }

  void wake_writer() {
    if (!writer.joinable()) writer = std::thread([this] { run_writer(); });
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd, &one, sizeof one);
  }

  // Waits for the streams with queued records to take more, until stopped.
  void run_writer() {
    std::unique_lock lock(mutex);
    while (!stopping) {
      pollfd fds[3] = {{wake_fd, POLLIN, 0}, {-1, POLLOUT, 0}, {-1, POLLOUT, 0}};
      if (!out.queue.empty()) fds[1].fd = out.fd;
      if (!err.queue.empty()) fds[2].fd = err.fd;
      lock.unlock();
      const int ready = ::poll(fds, 3, -1);
      if (fds[0].revents != 0) {
        std::uint64_t count = 0;
        [[maybe_unused]] const ssize_t n = ::read(wake_fd, &count, sizeof count);
      }
      lock.lock();
      if (ready <= 0) continue;
      if (fds[1].revents != 0) flush_queue(out);
      if (fds[2].revents != 0) flush_queue(err);
    }
  }

  // Console::write() and say(); mutex held.
  bool write(ConsoleStream which, std::string_view record, const void* writer,
             std::string_view resume_prefix, bool own) {
    if (!own) which = workers_stream(which);
    Stream& s = stream(which);
    if (s.mode == Mode::kNone) return false;
    if (record.empty()) return true;
    OpenLine& line = line_of(which);
    // Nobody else wrote on this line since `writer` did.
    const bool writers_line = writer != nullptr && line.writer == writer;
    const bool ends_other = line.open && !writers_line;  // someone else's line: end it first
    const bool resumes = !resume_prefix.empty() && !writers_line;
    if (resumes && record == "\n") return true;  // the line it ends was ended by the other record
    std::string joined;
    if (ends_other || resumes) {
      joined.append(ends_other ? "\n" : "").append(resumes ? resume_prefix : "").append(record);
      record = joined;
    }
    // The agent's own records have a reserve beyond the limit: what failed is said while the
    // workers' output is dropped, and a reader that stopped for good cannot grow it forever.
    const std::size_t limit = queue_limit_bytes + (own ? kConsoleOwnReserveBytes : 0);
    if (!s.queue.empty() && s.queued_bytes + record.size() > limit) {
      count(s, record.size());
      return false;
    }
    const std::uint64_t dropped_before = s.stats.dropped_bytes;
    line.open = record.back() != '\n' && record.back() != '\r';
    line.writer = writer;
    s.queued_bytes += record.size();
    s.queue.push_back({std::string(record)});
    if (s.queue.size() == 1) flush_queue(s);  // else the writer thread waits for the reader
    return !s.stats.closed && s.stats.dropped_bytes == dropped_before;
  }

  // What was dropped since a drained stream last drained, said on it. Mutex held.
  void note_dropped() {
    for (Stream* s : {&out, &err}) {
      if (s->mode == Mode::kNone || !s->queue.empty() || s->dropped_since_note == 0) continue;
      queue_dropped_note(*s);
      flush_queue(*s);
    }
  }

  // Bytes the streams took so far. Mutex held.
  std::uint64_t taken() const { return out.stats.written_bytes + err.stats.written_bytes; }

  // Until both queues are empty (true), hurry() is called while waiting, or `timeout`. `lock`
  // holds the mutex.
  bool wait_drained(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds timeout) {
    const bool was_hurried = hurried;
    return drained.wait_for(lock, timeout,
                            [&] {
                              return (out.queue.empty() && err.queue.empty()) ||
                                     hurried != was_hurried;
                            }) &&
           out.queue.empty() && err.queue.empty();
  }

  // What is still queued is lost, said on the other stream when that one takes it now. Mutex
  // held.
  void give_up() {
    drained.notify_all();  // (queues emptied here: whoever waits for them waits no more)
    for (Stream* s : {&out, &err}) {
      if (s->queue.empty()) continue;
      for (const Record& r : s->queue) {
        const std::size_t unwritten =
            r.bytes.size() - (&r == &s->queue.front() ? s->head_offset : 0);
        if (!r.note) count(*s, unwritten);
      }
      s->queue.clear();
      s->queued_bytes = s->head_offset = 0;
      Stream& o = other(*s);
      if (o.mode == Mode::kNone || !o.queue.empty()) continue;
      queue_note(o, note_start(o) + "[dist-launch] warning: the console's " + s->name +
                        " is blocked: " + std::to_string(s->dropped_since_note) +
                        " bytes of output were dropped" + std::string(kLogFilesKeepAll));
      s->dropped_since_note = 0;
      flush_queue(o);
    }
  }

  ConsoleStream workers_stream(ConsoleStream s) const {
    return workers_to_stdout ? ConsoleStream::kStdout : s;
  }

  OpenLine& line_of(ConsoleStream s) {
    return shared || s == ConsoleStream::kStdout ? out_line : err_line;
  }

  const std::size_t queue_limit_bytes;
  std::mutex mutex;
  bool hurried = false;  // hurry(): drain() waits no longer than kConsoleExitFlushTimeout
  OpenLine out_line, err_line;
  bool shared = false;             // stdout and stderr are the same file: `err` is not used
  bool workers_to_stdout = false;  // workers_on_stdout()
  std::condition_variable drained;
  Stream out, err;
  int wake_fd = -1;
  bool stopping = false;
  std::thread writer;  // started when a record first has to wait for the reader
};

std::shared_ptr<Console> Console::process() {
  static const std::shared_ptr<Console> console =
      std::make_shared<Console>(STDOUT_FILENO, STDERR_FILENO);
  return console;
}

Console::Console(int stdout_fd, int stderr_fd, std::size_t queue_limit_bytes)
    : impl_(std::make_unique<Impl>(queue_limit_bytes)) {
  ignore_sigpipe();
  impl_->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  impl_->shared = same_file(stdout_fd, stderr_fd);
  impl_->out = open_stream(stdout_fd, impl_->shared ? "stdout and stderr" : "stdout");
  if (!impl_->shared) impl_->err = open_stream(stderr_fd, "stderr");
  std::lock_guard lock(impl_->mutex);
  for (Stream* s : {&impl_->out, &impl_->err}) {
    if (s->open_error != 0) impl_->close_stream(*s, s->open_error);
  }
}

Console::~Console() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  if (impl_->writer.joinable()) {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(impl_->wake_fd, &one, sizeof one);
    impl_->writer.join();
  }
  for (int fd : {impl_->out.fd, impl_->err.fd, impl_->wake_fd}) {
    if (fd >= 0) ::close(fd);
  }
}

bool Console::write(ConsoleStream which, std::string_view record, const void* writer,
                    std::string_view resume_prefix) {
  std::lock_guard lock(impl_->mutex);
  return impl_->write(which, record, writer, resume_prefix, /*own=*/false);
}

bool Console::say(ConsoleStream which, std::string_view record) {
  std::lock_guard lock(impl_->mutex);
  return impl_->write(which, record, nullptr, {}, /*own=*/true);
}

void Console::count_dropped(ConsoleStream which, std::size_t bytes) {
  std::lock_guard lock(impl_->mutex);
  Stream& s = impl_->stream(impl_->workers_stream(which));
  if (s.mode != Mode::kNone) impl_->count(s, bytes);
}

bool Console::flush_for(std::chrono::milliseconds timeout) {
  std::unique_lock lock(impl_->mutex);
  impl_->note_dropped();
  if (impl_->wait_drained(lock, timeout)) return true;
  impl_->give_up();
  return false;
}

bool Console::drain(std::chrono::milliseconds stall) {
  using Clock = std::chrono::steady_clock;
  constexpr std::chrono::milliseconds kSlice{100};
  std::unique_lock lock(impl_->mutex);
  impl_->note_dropped();
  std::uint64_t taken = impl_->taken();
  Clock::time_point progressed = Clock::now();
  while (!impl_->hurried) {
    if (impl_->wait_drained(lock, kSlice)) return true;
    // The agent's stop signals stay blocked after it ended (its watcher read them): one that
    // came since is pending, and ends the wait as hurry() would have.
    if (stop_signal_pending()) impl_->hurried = true;
    if (impl_->taken() != taken) {
      taken = impl_->taken();
      progressed = Clock::now();
    } else if (Clock::now() - progressed >= stall) {
      break;  // the reader took nothing for `stall`
    }
  }
  if (impl_->hurried && impl_->wait_drained(lock, kConsoleExitFlushTimeout)) return true;
  impl_->give_up();
  return false;
}

void Console::hurry() {
  std::lock_guard lock(impl_->mutex);
  impl_->hurried = true;
  impl_->drained.notify_all();  // a drain() under way gives up now
}

void Console::workers_on_stdout() {
  std::lock_guard lock(impl_->mutex);
  impl_->workers_to_stdout = true;
}

bool Console::one_stream() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->shared || impl_->workers_to_stdout;
}

bool Console::is_terminal(ConsoleStream which) const {
  return impl_->stream(which).terminal;
}

ConsoleStats Console::stats(ConsoleStream which) const {
  std::lock_guard lock(impl_->mutex);
  return impl_->stream(which).stats;
}

}  // namespace dist::agent
