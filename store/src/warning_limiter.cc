#include "warning_limiter.h"

#include <spdlog/spdlog.h>

#include "text.h"

namespace dist::store {

void WarningLimiter::warn(const std::string& kind, const std::string& message,
                          Clock::time_point now) {
  auto it = intervals_.find(kind);
  if (it != intervals_.end() && now - it->second.start >= interval_) {
    summarize(kind, it->second);
    intervals_.erase(it);
    it = intervals_.end();
  }
  if (it == intervals_.end()) {
    spdlog::warn("store: {}", message);
    intervals_.emplace(kind, Interval{now, 0, {}});
    return;
  }
  ++it->second.suppressed;
  it->second.last = message;
}

void WarningLimiter::flush(Clock::time_point now) {
  for (auto it = intervals_.begin(); it != intervals_.end();) {
    if (now - it->second.start < interval_) {
      ++it;
      continue;
    }
    if (it->second.suppressed == 0) {
      it = intervals_.erase(it);
      continue;
    }
    // The flood goes on: a new interval starts with the summary, so one line per interval.
    summarize(it->first, it->second);
    it->second = Interval{now, 0, {}};
    ++it;
  }
}

void WarningLimiter::summarize(const std::string& kind, Interval& interval) {
  if (interval.suppressed == 0) return;
  const auto seconds = std::chrono::duration<double>(interval_).count();
  spdlog::warn("store: {}: {} more in the last {:g} s (the last: {})", kind,
               group_digits(interval.suppressed), seconds, interval.last);
}

}  // namespace dist::store
