#include "lifecycle/signal_watcher.h"

#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace dist::agent {
namespace {

constexpr std::size_t kSignalsPerRead = 16;

int open_signalfd(const std::vector<int>& signals) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : signals) sigaddset(&set, s);
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
  const int fd = ::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (fd < 0) throw std::runtime_error(std::string("signalfd: ") + std::strerror(errno));
  return fd;
}

}  // namespace

SignalWatcher::SignalWatcher(boost::asio::io_context& io, const std::vector<int>& signals)
    : fd_(io, open_signalfd(signals)), buffer_(kSignalsPerRead * sizeof(signalfd_siginfo)) {}

void SignalWatcher::start(std::function<void(Received)> handler) {
  handler_ = std::move(handler);
  read();
}

void SignalWatcher::cancel() {
  boost::system::error_code ignored;
  fd_.cancel(ignored);
  handler_ = nullptr;
}

void SignalWatcher::read() {
  fd_.async_read_some(boost::asio::buffer(buffer_), [this](const boost::system::error_code& ec,
                                                           std::size_t n) {
    if (ec) return;
    for (std::size_t at = 0; at + sizeof(signalfd_siginfo) <= n; at += sizeof(signalfd_siginfo)) {
      signalfd_siginfo info;
      std::memcpy(&info, buffer_.data() + at, sizeof info);
      if (handler_) {
        handler_(
            {static_cast<int>(info.ssi_signo), static_cast<pid_t>(info.ssi_pid), info.ssi_code});
      } else if (info.ssi_signo != SIGCHLD) {
        // Read, but its handler came after cancel() (a stop signal as the job ended, its
        // completion queued behind io_context::stop()): pending again, as if never read, for
        // whoever looks at exit (Console::drain: a stop ends its wait for the console).
        ::kill(::getpid(), static_cast<int>(info.ssi_signo));
      }
    }
    if (handler_) read();
  });
}

}  // namespace dist::agent
