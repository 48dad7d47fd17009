#include "lifecycle/launcher_channel.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "dist/agent/agent_launch.h"
#include "dist/agent/signals.h"

namespace dist::agent {
namespace {

// Control lines are a few bytes; anything longer is not one (and is not kept).
constexpr std::size_t kMaxControlLineBytes = 256;

int duplicate(int fd) {
  const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (copy < 0) {
    throw std::runtime_error(std::string("cannot read the launcher's pipe: ") +
                             std::strerror(errno));
  }
  return copy;
}

}  // namespace

LauncherChannel::LauncherChannel(boost::asio::io_context& io, int fd) : pipe_(io, duplicate(fd)) {}

void LauncherChannel::start(std::function<void(int signal)> on_signal) {
  on_signal_ = std::move(on_signal);
  read();
}

void LauncherChannel::cancel() {
  boost::system::error_code ignored;
  pipe_.cancel(ignored);
  on_signal_ = nullptr;
}

void LauncherChannel::read() {
  pipe_.async_read_some(
      boost::asio::buffer(buffer_), [this](const boost::system::error_code& ec, std::size_t n) {
        if (!on_signal_ || ec == boost::asio::error::operation_aborted) return;
        if (ec) {  // the end of the pipe, or an error reading it: the launcher is gone either way
          spdlog::warn("lost the launcher (dist-launch --hosts): {}: stopping",
                       ec == boost::asio::error::eof ? "its pipe closed" : ec.message());
          const auto on_signal = std::exchange(on_signal_, nullptr);
          return on_signal(SIGHUP);
        }
        for (std::size_t i = 0; i < n && on_signal_; ++i) {
          if (buffer_[i] != '\n') {
            if (pending_.size() < kMaxControlLineBytes) pending_.push_back(buffer_[i]);
            continue;
          }
          on_line(std::exchange(pending_, {}));
        }
        if (on_signal_) read();
      });
}

void LauncherChannel::on_line(const std::string& line) {
  const auto signal = parse_signal_line(line);
  if (!signal) {
    spdlog::warn("ignoring a line from the launcher that is not a control line ({} bytes)",
                 line.size());
    return;
  }
  spdlog::info("the launcher forwards {}", signal_name(*signal));
  on_signal_(*signal);
}

}  // namespace dist::agent
