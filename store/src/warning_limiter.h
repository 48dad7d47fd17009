// Warnings that a flood could repeat thousands of times a second (refused connections, accept
// failures at the file-descriptor limit, connections closed for the same reason) are logged once
// per interval and kind; the rest are counted and summed up in one line when the interval ends:
//   store: refused connections: 5,702 more in the last 10 s (the last: ...)
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace dist::store {

class WarningLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  explicit WarningLimiter(std::chrono::milliseconds interval) : interval_(interval) {}

  // Logs `message` at once when no warning of `kind` was logged in the current interval, else
  // counts it. The message is logged as given: callers escape what came from the network.
  void warn(const std::string& kind, const std::string& message, Clock::time_point now);
  // Logs the summary of every interval that has ended with warnings counted but not logged.
  void flush(Clock::time_point now);

 private:
  struct Interval {
    Clock::time_point start;
    std::uint64_t suppressed = 0;
    std::string last;  // the last suppressed message
  };
  void summarize(const std::string& kind, Interval& interval);

  std::chrono::milliseconds interval_;
  std::map<std::string, Interval> intervals_;
};

}  // namespace dist::store
