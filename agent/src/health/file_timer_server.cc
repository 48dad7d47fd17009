#include "health/file_timer_server.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <vector>

#include "health/agent_stall.h"
#include "health/step_stats.h"  // monotonic_now()

namespace dist::agent {
namespace {

// Clients write whole requests of at most PIPE_BUF bytes (torch's refuses longer ones).
constexpr std::size_t kMaxRequestBytes = PIPE_BUF;
// A worker that sends garbage in a loop must not flood the console.
constexpr int kMalformedRequestsReported = 5;

[[noreturn]] void fail(const std::string& path, const std::string& what, int error) {
  throw std::runtime_error("cannot serve the file timer pipe TORCHELASTIC_TIMER_FILE=" + path +
                           ": " + what + " (" + std::strerror(error) + ")");
}

void make_fifo(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISFIFO(st.st_mode)) {
      fail(path, "something that is not a named pipe is there; remove it or choose another path",
           EEXIST);
    }
    if (::unlink(path.c_str()) != 0) fail(path, "cannot replace the named pipe there", errno);
  }
  if (::mkfifo(path.c_str(), 0600) != 0) fail(path, "mkfifo", errno);
}

double wall_clock_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A request as torch's FileTimerRequest.to_json writes it; throws on anything else.
TimerExpiry parse_expiry(const std::string& line) {
  const nlohmann::json j = nlohmann::json::parse(line);
  TimerExpiry r;
  r.pid = j.at("pid").get<pid_t>();
  r.scope_id = j.at("scope_id").get<std::string>();
  r.expiration_time = j.at("expiration_time").get<double>();
  r.signal = j.at("signal").get<int>();
  if (r.pid <= 0) throw std::invalid_argument("pid must be positive");
  return r;
}

bool process_exists(pid_t pid) {
  return ::kill(pid, 0) == 0 || errno == EPERM;
}

}  // namespace

std::string default_timer_file_path() {
  std::random_device rd;
  char id[17];
  std::snprintf(id, sizeof id, "%08x%08x", rd(), rd());
  return (std::filesystem::temp_directory_path() / (std::string("watchdog_timer_") + id)).string();
}

FileTimerServer::FileTimerServer(boost::asio::io_context& io, std::string path,
                                 std::function<void(const TimerExpiry&)> on_expired)
    : path_(std::move(path)), on_expired_(std::move(on_expired)), pipe_(io), timer_(io) {
  make_fifo(path_);
  const int reader = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (reader < 0) fail(path_, "open for reading", errno);
  own_writer_ = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (own_writer_ < 0) {
    const int error = errno;
    ::close(reader);
    fail(path_, "open for writing", error);
  }
  pipe_.assign(reader);
  read();
}

FileTimerServer::~FileTimerServer() {
  boost::system::error_code ignored;
  pipe_.close(ignored);
  timer_.cancel();
  ::close(own_writer_);
  ::unlink(path_.c_str());
}

void FileTimerServer::clear() {
  timers_.clear();
  timer_.cancel();
}

void FileTimerServer::read() {
  pipe_.async_read_some(
      boost::asio::buffer(buffer_), [this, alive = std::weak_ptr<char>(alive_)](
                                        const boost::system::error_code& ec, std::size_t n) {
        if (alive.expired() || ec == boost::asio::error::operation_aborted) {
          return;
        }
        if (ec) {  // cannot happen while this holds a write end: said, not hidden
          spdlog::error("file timer pipe {}: {}: timers are no longer served", path_, ec.message());
          return;
        }
        take(std::string_view(buffer_.data(), n));
        read();
      });
}

void FileTimerServer::take(std::string_view bytes) {
  while (!bytes.empty()) {
    const auto newline = bytes.find('\n');
    const std::string_view piece = bytes.substr(0, newline);
    if (!skipping_) line_.append(piece);
    if (line_.size() > kMaxRequestBytes) {
      spdlog::warn("file timer pipe {}: a request longer than {} bytes: ignored", path_,
                   kMaxRequestBytes);
      line_.clear();
      skipping_ = true;
    }
    if (newline == std::string_view::npos) return;
    if (!skipping_ && !line_.empty()) handle(line_);
    line_.clear();
    skipping_ = false;
    bytes.remove_prefix(newline + 1);
  }
}

void FileTimerServer::handle(const std::string& line) {
  TimerExpiry request;
  try {
    request = parse_expiry(line);
  } catch (const std::exception& e) {
    if (malformed_reported_++ < kMalformedRequestsReported) {
      spdlog::warn("file timer pipe {}: ignored a malformed request ({}): {}", path_, e.what(),
                   line.substr(0, 200));
    }
    return;
  }
  const auto key = std::make_pair(request.pid, request.scope_id);
  // (Read first after a stall, it was most likely written before: it counts from the stall.)
  const auto now = monotonic_now();
  stall_seen_now(now);
  request.registered = unwatched_since(now);
  if (request.expiration_time < 0) {
    timers_.erase(key);
  } else {
    timers_[key] = std::move(request);
  }
  schedule();
}

// A timer's expiration (the wall clock's, as the clients write it), moved on by the agent's stalls
// since its request came.
double FileTimerServer::expiration(const TimerExpiry& t, std::chrono::nanoseconds now) {
  return t.expiration_time +
         std::chrono::duration<double>(agent_stalled_between(t.registered, now)).count();
}

// Wakes at the earliest expiration.
void FileTimerServer::schedule() {
  if (timers_.empty()) {
    timer_.cancel();
    return;
  }
  const auto now = monotonic_now();
  double earliest = expiration(timers_.begin()->second, now);
  for (const auto& [key, t] : timers_) earliest = std::min(earliest, expiration(t, now));
  const auto delay = std::chrono::duration<double>(std::max(0.0, earliest - wall_clock_seconds()));
  const auto after = std::chrono::duration_cast<std::chrono::nanoseconds>(delay);
  timer_.expires_after(after);
  timer_.async_wait(
      [this, alive = std::weak_ptr<char>(alive_)](const boost::system::error_code& ec) {
        if (alive.expired() || ec) return;
        stall_seen_now(monotonic_now());  // (noted: expiration() counts it)
        expire();
      });
}

void FileTimerServer::expire() {
  const double now = wall_clock_seconds();
  const auto monotonic = monotonic_now();
  std::map<pid_t, std::vector<TimerExpiry>> expired;
  for (const auto& [key, t] : timers_) {
    if (expiration(t, monotonic) <= now) expired[key.first].push_back(t);
  }
  for (auto& [pid, list] : expired) {
    std::erase_if(timers_, [pid = pid](const auto& entry) { return entry.first.first == pid; });
    if (!process_exists(pid)) continue;  // its timers died with it
    std::sort(list.begin(), list.end(), [](const TimerExpiry& a, const TimerExpiry& b) {
      return a.expiration_time < b.expiration_time;
    });
    const auto with_signal =
        std::find_if(list.begin(), list.end(), [](const TimerExpiry& t) { return t.signal > 0; });
    on_expired_(with_signal == list.end() ? list.front() : *with_signal);
  }
  schedule();
}

}  // namespace dist::agent
