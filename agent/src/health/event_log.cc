#include "health/event_log.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <stdexcept>

#include "output/valid_text.h"

namespace dist::agent {
namespace {

// "2026-11-22T10:31:07.123Z"
std::string utc_time(std::chrono::system_clock::time_point t) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch());
  const std::time_t secs = static_cast<std::time_t>(ms.count() / 1000);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[40];
  const std::size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%03dZ", static_cast<int>(ms.count() % 1000));
  return buf;
}

}  // namespace

EventLog::EventLog(std::string path, nlohmann::ordered_json common)
    : path_(std::move(path)), common_(std::move(common)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw std::runtime_error("cannot open the event log --event-log " + path_ + ": " +
                             std::strerror(errno));
  }
}

EventLog::~EventLog() {
  ::close(fd_);
}

void EventLog::write(std::string_view event, const nlohmann::ordered_json& fields) {
  const auto now = std::chrono::system_clock::now();
  nlohmann::ordered_json line = {
      {"event", event},
      {"time", utc_time(now)},
      {"ts_ms",
       std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count()}};
  for (const auto& [key, value] : common_.items()) line[key] = value;
  for (const auto& [key, value] : fields.items()) line[key] = value;
  if (failing_) line["lost_before"] = lost_in_a_row_;
  const std::string text = json_text(line) + "\n";

  const off_t before = ::lseek(fd_, 0, SEEK_END);
  const ssize_t n = ::write(fd_, text.data(), text.size());
  if (n == static_cast<ssize_t>(text.size())) {
    if (failing_)
      spdlog::info("event log {}: written again ({} lines lost)", path_, lost_in_a_row_);
    failing_ = false;
    lost_in_a_row_ = 0;
    return;
  }
  const int error = n < 0 ? errno : ENOSPC;  // a short write: the disk filled up under it
  if (n > 0 && before >= 0 && ::ftruncate(fd_, before) != 0) {
    spdlog::warn("event log {}: cannot remove a partly written line ({})", path_,
                 std::strerror(errno));
  }
  ++lost_;
  ++lost_in_a_row_;
  if (!failing_) {
    spdlog::warn("event log {}: cannot write ({}): events are lost until it can be written again",
                 path_, std::strerror(error));
  }
  failing_ = true;
}

}  // namespace dist::agent
