#include "warm/zygote.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dist/agent/signals.h"
#include "warm/clone_exec.h"

namespace dist::agent::warm {
namespace {

constexpr int kControlFd = 3;  // the zygote's end of the socket
constexpr std::size_t kMaxReply = 64 * 1024;
constexpr std::size_t kMaxZygoteDescriptors = 64;  // as _zygote.py's MAX_FDS
constexpr std::size_t kLogTailBytes = 4096;
constexpr std::size_t kLogTailLines = 6;
constexpr char kRequestMagic[4] = {'D', 'L', 'Z', '1'};

void append_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string describe_status(int status) {
  if (status < 0) return "an unknown status";
  if (WIFSIGNALED(status)) return signal_name(WTERMSIG(status));
  return "exit code " + std::to_string(WEXITSTATUS(status));
}

int remaining_ms(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::max<long long>(0, left.count()));
}

// Waits for `events` on `fd` until the deadline; false on timeout.
bool wait_for(int fd, short events, std::chrono::steady_clock::time_point deadline) {
  pollfd p{fd, events, 0};
  while (true) {
    const int n = ::poll(&p, 1, remaining_ms(deadline));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return false;
  }
}

}  // namespace

const char* to_string(Zygote::State state) {
  switch (state) {
    case Zygote::State::kStarting:
      return "starting";
    case Zygote::State::kReady:
      return "ready";
    case Zygote::State::kFailed:
      return "failed";
    case Zygote::State::kExited:
      return "exited";
  }
  return "?";
}

Zygote::Zygote(boost::asio::io_context& io, ZygoteSpec spec, Listener listener)
    : io_(io), spec_(std::move(spec)), listener_(std::move(listener)) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    throw ZygoteError(std::string("cannot create the zygote's socket: ") + std::strerror(errno));
  }
  const int log = ::open(spec_.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ExecSpec exec;
  exec.executable = spec_.executable;
  exec.argv = {spec_.python};
  exec.argv.insert(exec.argv.end(), spec_.flags.begin(), spec_.flags.end());
  exec.argv.insert(exec.argv.end(), {spec_.script, "--control-fd", std::to_string(kControlFd),
                                     "--path0", spec_.path0});
  if (spec_.preload) exec.argv.insert(exec.argv.end(), {"--preload", *spec_.preload});
  if (!spec_.env_file.empty()) {
    std::ofstream given(spec_.env_file, std::ios::binary | std::ios::trunc);
    for (const auto& entry : spec_.env) given.write(entry.c_str(), entry.size() + 1);
    if (given) exec.argv.insert(exec.argv.end(), {"--given-env", spec_.env_file});
  }
  // Room in the zygote's argument area for a worker's command line, which each worker writes
  // there (what ps shows); the zygote shows its own without this.
  if (spec_.standbys > 0) {
    exec.argv.insert(exec.argv.end(), {"--standbys", std::to_string(spec_.standbys)});
  }
  if (spec_.command_line_room > 0) {
    exec.argv.insert(exec.argv.end(), {"--room", std::string(spec_.command_line_room, '.')});
  }
  exec.env = spec_.env;
  exec.fds = {
      {null, 0}, {log < 0 ? null : log, 1}, {log < 0 ? null : log, 2}, {fds[1], kControlFd}};
  exec.reset_signals = spec_.reset_signals;
  exec.die_with_agent = true;
  Cloned cloned;
  try {
    cloned = clone_exec(exec);
  } catch (const std::exception& e) {
    for (const int fd : {fds[0], fds[1], log, null}) {
      if (fd >= 0) ::close(fd);
    }
    throw ZygoteError(e.what());
  }
  for (const int fd : {fds[1], log, null}) {
    if (fd >= 0) ::close(fd);
  }
  pid_ = cloned.pid;
  control_ = fds[0];
  control_wait_ = std::make_unique<boost::asio::posix::stream_descriptor>(io_, ::dup(control_));
  if (cloned.pidfd >= 0) {
    pidfd_wait_ = std::make_unique<boost::asio::posix::stream_descriptor>(io_, cloned.pidfd);
    await_exit();
  }
  await_message();
}

Zygote::~Zygote() {
  alive_.reset();
  control_wait_.reset();
  pidfd_wait_.reset();
  if (control_ >= 0) ::close(control_);
  if (!reaped_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);  // our unreaped child: the pid cannot have been reused
    reap_cloned(pid_);
  }
  for (const pid_t standby : standbys_) {  // our children too, not reaped yet
    ::kill(standby, SIGKILL);
    reap_cloned(standby);
  }
}

void Zygote::await_message() {
  std::weak_ptr<char> alive = alive_;
  control_wait_->async_wait(boost::asio::posix::stream_descriptor::wait_read,
                            [this, alive](const boost::system::error_code& ec) {
                              if (ec || alive.expired()) return;
                              on_message();
                            });
}

void Zygote::await_exit() {
  std::weak_ptr<char> alive = alive_;
  pidfd_wait_->async_wait(boost::asio::posix::stream_descriptor::wait_read,
                          [this, alive](const boost::system::error_code& ec) {
                            if (ec || alive.expired()) return;
                            on_exit();
                          });
}

// "standby <pid>": a worker forked ahead, the agent's child, to spare until it gets a request.
bool Zygote::take_notice(const std::string& message) {
  if (!message.starts_with("standby ")) return false;
  const long pid = std::strtol(message.c_str() + 8, nullptr, 10);
  if (pid > 0) standbys_.push_back(static_cast<pid_t>(pid));
  return true;
}

bool Zygote::forget_standby(pid_t pid) {
  const auto it = std::find(standbys_.begin(), standbys_.end(), pid);
  if (it == standbys_.end()) return false;
  standbys_.erase(it);
  return true;
}

void Zygote::on_message() {
  std::string buffer(kMaxReply, '\0');
  const ssize_t n = ::recv(control_, buffer.data(), buffer.size(), MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return await_message();
  if (n <= 0) return;  // EOF: it is exiting (the pidfd, or the reaping loop, tells when it did)
  buffer.resize(static_cast<std::size_t>(n));
  if (state_ == State::kReady && take_notice(buffer)) return await_message();
  if (state_ != State::kStarting) return;  // a late word from a zygote already given up on
  if (buffer.rfind("failed ", 0) == 0) return fail(buffer.substr(7));
  if (buffer.rfind("ready ", 0) != 0) return fail("unexpected message: " + buffer.substr(0, 80));
  try {
    const auto ready = nlohmann::json::parse(buffer.substr(6));
    preloaded_ = ready.at("preloaded").get<std::vector<std::string>>();
    preload_seconds_ = ready.at("seconds").get<double>();
    for (const auto& path : ready.at("files").get<std::vector<std::string>>()) {
      if (auto id = identify(path)) files_.push_back(*id);
    }
  } catch (const std::exception& e) {
    return fail(std::string("unreadable readiness message: ") + e.what());
  }
  notify(State::kReady);
  await_message();  // its standbys' notices
}

void Zygote::on_exit() {
  if (reaped_) return;
  int status = -1;
  const pid_t reaped = ::waitpid(pid_, &status, WNOHANG | __WALL);
  if (reaped == 0) return await_exit();  // not yet (a spurious wakeup)
  exited(reaped == pid_ ? status : -1);  // -1: reaped elsewhere, reaped() tells
}

void Zygote::reaped(int status) {
  if (!reaped_) exited(status);
}

void Zygote::exited(int status) {
  reaped_ = true;
  const State before = state_;
  if (before == State::kFailed || before == State::kExited) return;
  failure_ = "the zygote (pid " + std::to_string(pid_) + ") exited with " + describe_status(status);
  if (before == State::kStarting) {
    failure_ += " before it was ready";
    const std::string tail = log_tail();
    if (!tail.empty()) failure_ += ": " + tail;
    return notify(State::kFailed);
  }
  notify(State::kExited);
}

void Zygote::fail(std::string why) {
  failure_ = std::move(why);
  if (!reaped_ && pid_ > 0) ::kill(pid_, SIGKILL);
  notify(State::kFailed);
}

void Zygote::notify(State state) {
  state_ = state;
  if (!listener_) return;
  // Never from inside a call of ours (spawn() may be failing in the caller's hands).
  std::weak_ptr<char> alive = alive_;
  boost::asio::post(io_, [this, alive, state] {
    if (!alive.expired() && state_ == state) listener_(state);
  });
}

std::string Zygote::log_tail() const {
  std::ifstream in(spec_.log, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::size_t>(std::max<std::streamoff>(0, in.tellg()));
  in.seekg(static_cast<std::streamoff>(size > kLogTailBytes ? size - kLogTailBytes : 0));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  const std::size_t first = lines.size() > kLogTailLines ? lines.size() - kLogTailLines : 0;
  std::string tail;
  for (std::size_t i = first; i < lines.size(); ++i) tail += (tail.empty() ? "" : " | ") + lines[i];
  return tail;
}

std::optional<Zygote::FileIdentity> Zygote::identify(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileIdentity{
      path, st.st_dev, st.st_ino,
      static_cast<long long>(st.st_mtim.tv_sec) * 1'000'000'000LL + st.st_mtim.tv_nsec,
      static_cast<long long>(st.st_size)};
}

bool Zygote::stale() const {
  return std::any_of(files_.begin(), files_.end(),
                     [](const FileIdentity& f) { return identify(f.path) != f; });
}

pid_t Zygote::spawn(const WorkerRequest& request, std::chrono::milliseconds timeout) {
  if (state_ != State::kReady) throw ZygoteError(std::string("the zygote is ") + to_string(state_));
  if (request.fds.size() > kMaxZygoteDescriptors) throw ZygoteError("too many descriptors to pass");
  std::string message(kRequestMagic, sizeof kRequestMagic);
  append_u32(message, static_cast<std::uint32_t>(request.argv.size()));
  append_u32(message, static_cast<std::uint32_t>(request.env.size()));
  append_u32(message, static_cast<std::uint32_t>(request.fds.size()));
  append_u32(message, static_cast<std::uint32_t>(::getpid()));
  for (const auto* list : {&request.argv, &request.env}) {
    for (const auto& s : *list) message.append(s.c_str(), s.size() + 1);
  }
  message.append(request.cwd.c_str(), request.cwd.size() + 1);
  std::vector<int> fds;
  for (const auto& [fd, target] : request.fds) {
    fds.push_back(fd);
    append_u32(message, static_cast<std::uint32_t>(target));
  }

  iovec iov{message.data(), message.size()};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()), 0);
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());

  const auto deadline = std::chrono::steady_clock::now() + timeout;
  if (!wait_for(control_, POLLOUT, deadline)) {
    fail("the zygote did not take a request within " + std::to_string(timeout.count()) + " ms");
    throw ZygoteError(failure_);
  }
  if (::sendmsg(control_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
    const int error = errno;
    if (error == EMSGSIZE) throw ZygoteError("the worker's environment is too large to pass");
    fail(std::string("cannot reach the zygote: ") + std::strerror(error));
    throw ZygoteError(failure_);
  }
  std::string reply;
  do {  // a standby's notice may come first
    if (!wait_for(control_, POLLIN, deadline)) {
      fail("the zygote did not fork a worker within " + std::to_string(timeout.count()) + " ms");
      throw ZygoteError(failure_);
    }
    reply.assign(kMaxReply, '\0');
    const ssize_t n = ::recv(control_, reply.data(), reply.size(), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) {  // its exit is reported by on_exit()
      throw ZygoteError("the zygote (pid " + std::to_string(pid_) + ") is gone");
    }
    reply.resize(static_cast<std::size_t>(n));
  } while (take_notice(reply));
  if (reply.rfind("error ", 0) == 0) throw ZygoteError(reply.substr(6));
  if (reply.rfind("pid ", 0) != 0) {
    fail("unexpected reply: " + reply.substr(0, 80));
    throw ZygoteError(failure_);
  }
  const pid_t pid = static_cast<pid_t>(std::strtol(reply.c_str() + 4, nullptr, 10));
  if (pid <= 0) {
    fail("unexpected reply: " + reply.substr(0, 80));
    throw ZygoteError(failure_);
  }
  forget_standby(pid);  // a worker now
  // The worker must be this process's child now (reparented): its exit comes to the agent.
  siginfo_t info{};
  // (One that is not kills itself: it checks its parent is the agent.)
  if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
    fail("the worker the zygote forked (pid " + std::to_string(pid) +
         ") is not this agent's child: is the agent a child subreaper?");
    throw ZygoteError(failure_);
  }
  return pid;
}

}  // namespace dist::agent::warm
