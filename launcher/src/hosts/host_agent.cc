#include "hosts/host_agent.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "dist/agent/agent_launch.h"
#include "hosts/ssh_command.h"
#include "processes/process.h"

extern char** environ;

namespace dist::launcher {
using agent::Console;
using agent::ConsoleStream;
using agent::kAgentExitLine;
using agent::kAgentReadyLine;
using agent::make_pipe;
using agent::Pipe;
using agent::RecordCutter;
using agent::signal_line;
namespace asio = boost::asio;

namespace {

// What ssh or the remote shell said before the agent ran: enough lines to explain a failure.
constexpr std::size_t kEarlyLinesKept = 20;
// Reads from one output per turn of the io_context, so that a host that floods its output cannot
// hold up the others, the signals or the store.
constexpr int kReadsPerTurn = 16;

bool is_line(std::string_view record, std::string_view line) {
  return record.size() == line.size() + 1 && record.starts_with(line) && record.back() == '\n';
}

std::string trimmed(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) {
    s.remove_suffix(1);
  }
  return std::string(s);
}

// The launcher's descriptors other than these pipes (its store's sockets, its signalfd) must not
// reach the children: a local agent holding the store's listening socket would keep the port
// open after the launcher died, and the other agents would wait on it instead of seeing it gone.
struct SpawnActions {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attributes;
  SpawnActions(int in, int out, int err) {
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in, STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, out, STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, err, STDERR_FILENO);
    posix_spawn_file_actions_addclosefrom_np(&actions, STDERR_FILENO + 1);
    posix_spawnattr_init(&attributes);
    // A process group of its own: a Ctrl-C at the terminal reaches the launcher alone, which
    // forwards it to every host in order (an ssh client that got it would just drop the host).
    posix_spawnattr_setpgroup(&attributes, 0);
    // The launcher blocks its signals (signalfd) and ignores SIGPIPE: the child gets neither.
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attributes, &none);
    posix_spawnattr_setsigdefault(&attributes, &all);
    posix_spawnattr_setflags(
        &attributes, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  }
  ~SpawnActions() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
  }
  SpawnActions(const SpawnActions&) = delete;
  SpawnActions& operator=(const SpawnActions&) = delete;
};

}  // namespace

// One output pipe: read when readable, without blocking, cut into whole records. Reading happens
// only here, so that the output drained at the process's exit keeps its order.
class HostAgent::Output {
 public:
  using OnRecords = std::function<void(std::string_view record, bool starts, std::string& batch)>;

  // `agents_own`: what is read is the agent's own records (its log, its failure report), said as
  // the launcher's own are (Console::say); otherwise the workers' lines.
  Output(asio::io_context& io, int fd, ConsoleStream stream, std::shared_ptr<Console> console,
         bool agents_own, OnRecords on_record)
      : pipe_(io, fd),
        stream_(stream),
        console_(std::move(console)),
        agents_own_(agents_own),
        on_record_(std::move(on_record)) {
    pipe_.non_blocking(true);
  }

  void start() { wait(); }

  // The process is gone: what it wrote is in the pipe now. Reads it and stops, even if something
  // else still holds the pipe open (an ssh ControlPersist master keeps stderr).
  void drain_and_close() {
    if (closed_) return;
    while (read_available(-1)) {
    }
    close();
  }

 private:
  void wait() {
    pipe_.async_wait(asio::posix::descriptor_base::wait_read,
                     [this](const boost::system::error_code& ec) {
                       if (closed_ || ec) return;
                       if (read_available(kReadsPerTurn)) wait();
                     });
  }

  // Reads what is there, at most `reads` times (-1: until none is left); false once the pipe
  // ended (then closed).
  bool read_available(int reads) {
    for (int i = 0; reads < 0 || i < reads; ++i) {
      const ssize_t n = ::read(pipe_.native_handle(), buffer_.data(), buffer_.size());
      if (n > 0) {
        feed(std::string_view(buffer_.data(), static_cast<std::size_t>(n)));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return reads >= 0;
      close();
      return false;
    }
    return true;
  }

  void feed(std::string_view data) {
    std::string batch;
    cutter_.feed(data,
                 [&](std::string_view record, bool starts) { on_record_(record, starts, batch); });
    if (!batch.empty()) show(batch);
  }

  void show(const std::string& batch) {
    if (agents_own_) {
      console_->say(stream_, batch);
    } else {
      console_->write(stream_, batch);
    }
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    std::string batch;
    cutter_.finish(
        [&](std::string_view record, bool starts) { on_record_(record, starts, batch); });
    if (!batch.empty()) show(batch);
    boost::system::error_code ignored;
    pipe_.close(ignored);
  }

  asio::posix::stream_descriptor pipe_;
  ConsoleStream stream_;
  std::shared_ptr<Console> console_;
  bool agents_own_;
  OnRecords on_record_;
  RecordCutter cutter_;
  bool closed_ = false;
  std::array<char, 64 * 1024> buffer_{};
};

HostAgent::HostAgent(asio::io_context& io, std::shared_ptr<Console> console, std::string host,
                     bool over_ssh)
    : io_(io), console_(std::move(console)), host_(std::move(host)), over_ssh_(over_ssh) {}

HostAgent::~HostAgent() = default;

void HostAgent::start(const std::vector<std::string>& argv, std::string launch_message,
                      std::function<void()> on_end) {
  on_end_ = std::move(on_end);
  Pipe in = make_pipe(), out, err;
  try {
    out = make_pipe();
    err = make_pipe();
  } catch (...) {
    in.close();
    out.close();
    throw;
  }
  std::vector<char*> c_argv;
  for (const auto& a : argv) c_argv.push_back(const_cast<char*>(a.c_str()));
  c_argv.push_back(nullptr);
  int error = 0;
  {
    SpawnActions spawn(in.read, out.write, err.write);
    error =
        ::posix_spawnp(&pid_, c_argv[0], &spawn.actions, &spawn.attributes, c_argv.data(), environ);
  }
  ::close(in.read);
  ::close(out.write);
  ::close(err.write);
  if (error != 0) {
    ::close(in.write);
    ::close(out.read);
    ::close(err.read);
    pid_ = -1;
    throw std::runtime_error("cannot run '" + argv.front() + "' for host " + host_ + ": " +
                             std::strerror(error));
  }
  stdin_.emplace(io_, in.write);
  // On a console of one stream the agent writes its workers' lines, both streams, to its stdout
  // (the launch says so: AgentLaunch::console), and its stderr is its own records alone.
  const bool stderr_is_agents_own = console_->one_stream();
  stdout_ = std::make_unique<Output>(
      io_, out.read, ConsoleStream::kStdout, console_, false,
      [](std::string_view record, bool, std::string& batch) { batch.append(record); });
  stderr_ = std::make_unique<Output>(
      io_, err.read, ConsoleStream::kStderr, console_, stderr_is_agents_own,
      [this](std::string_view record, bool starts, std::string& batch) {
        if (starts) return on_stderr_record(record, batch);
        if (ready_) batch.append(record);
      });
  stdout_->start();
  stderr_->start();
  to_write_.push_back(std::move(launch_message));
  write_next();
}

void HostAgent::on_stderr_record(std::string_view record, std::string& batch) {
  if (!ready_) {
    if (is_line(record, kAgentReadyLine)) {
      ready_ = true;
      for (const auto& line : early_lines_) batch.append(line).push_back('\n');  // ssh's notes
      return;
    }
    early_lines_.push_back(trimmed(record));
    if (early_lines_.size() > kEarlyLinesKept) early_lines_.pop_front();
    return;
  }
  const std::string_view exit_word = kAgentExitLine;
  if (record.starts_with(exit_word) && record.back() == '\n') {
    int code = 0;
    const auto digits = record.substr(exit_word.size(), record.size() - exit_word.size() - 1);
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), code);
    if (ec == std::errc() && end == digits.data() + digits.size()) {
      agent_exit_ = code;
      return;
    }
  }
  batch.append(record);
}

void HostAgent::write_next() {
  if (writing_ || to_write_.empty() || !stdin_) return;
  writing_ = true;
  asio::async_write(*stdin_, asio::buffer(to_write_.front()),
                    [this](const boost::system::error_code& ec, std::size_t) {
                      writing_ = false;
                      if (ec) {  // the process is gone (EPIPE): nothing more can reach it
                        to_write_.clear();
                        return;
                      }
                      to_write_.pop_front();
                      write_next();
                    });
}

void HostAgent::forward(int signal) {
  if (!running() || !stdin_) return;
  to_write_.push_back(signal_line(signal));
  write_next();
}

void HostAgent::hang_up() {
  if (!stdin_) return;
  boost::system::error_code ignored;
  stdin_->close(ignored);
  stdin_.reset();
  to_write_.clear();
}

void HostAgent::kill() {
  if (running()) ::kill(-pid_, SIGKILL);
}

void HostAgent::reaped(int status) {
  exited_ = true;
  status_ = status;
  hang_up();
  if (stdout_) stdout_->drain_and_close();
  if (stderr_) stderr_->drain_and_close();
  ended_ = true;
  if (on_end_) asio::post(io_, std::exchange(on_end_, nullptr));
}

std::string HostAgent::last_words() const {
  std::string words;
  for (const auto& line : early_lines_) {
    if (line.empty()) continue;
    if (!words.empty()) words += "; ";
    words += line;
  }
  return words;
}

std::string HostAgent::start_failure(const std::string& remote_command) const {
  return explain_start_failure(host_, over_ssh_, status_, last_words(), remote_command);
}

}  // namespace dist::launcher
