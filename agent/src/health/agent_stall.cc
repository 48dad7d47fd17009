#include "health/agent_stall.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>
#include <optional>

namespace dist::agent {

namespace {

using std::chrono::nanoseconds;

constexpr std::size_t kKeptStalls = 16;

struct Stall {
  nanoseconds begin{0}, end{0};
};

// The agent's loop notes and reads them; a mutex, in case a thread of its ever does.
std::mutex mutex;
std::array<Stall, kKeptStalls> stalls;  // a ring, the latest at `next - 1`
std::size_t next = 0;
std::optional<nanoseconds> tick_due;
// A stall that ended within this of a read: what was read was written before it.
constexpr std::chrono::seconds kJustBack{1};

}  // namespace

bool agent_stalled(nanoseconds due, nanoseconds now) {
  if (now - due < kAgentStall) return false;
  std::lock_guard lock(mutex);
  Stall& last = stalls[(next + kKeptStalls - 1) % kKeptStalls];
  if (last.end != nanoseconds(0) && due <= last.end) {  // one stall, seen by several timers
    last.begin = std::min(last.begin, due);
    last.end = std::max(last.end, now);
    return true;
  }
  stalls[next] = Stall{due, now};
  next = (next + 1) % kKeptStalls;
  spdlog::warn(
      "the agent did not run for {:.1f} s (held stopped: Slurm's suspend or a kill -STOP of the "
      "job, or of the agent alone; a paused machine; or one too loaded to run it): that time is "
      "not counted in its workers' silences",
      std::chrono::duration<double>(now - due).count());
  return true;
}

void expect_tick(std::optional<nanoseconds> due) {
  std::lock_guard lock(mutex);
  tick_due = due;
}

bool stall_seen_now(nanoseconds now) {
  std::optional<nanoseconds> due;
  {
    std::lock_guard lock(mutex);
    due = tick_due;
  }
  return due && agent_stalled(*due, now);
}

nanoseconds unwatched_since(nanoseconds now) {
  std::lock_guard lock(mutex);
  const Stall& last = stalls[(next + kKeptStalls - 1) % kKeptStalls];
  return last.end != nanoseconds(0) && now - last.end <= kJustBack ? last.begin : now;
}

nanoseconds agent_stalled_between(nanoseconds from, nanoseconds to) {
  std::lock_guard lock(mutex);
  nanoseconds total{0};
  for (const Stall& s : stalls) {
    const auto begin = std::max(s.begin, from), end = std::min(s.end, to);
    if (end > begin) total += end - begin;
  }
  return total;
}

nanoseconds ran_since(nanoseconds since, nanoseconds now) {
  return now - since - agent_stalled_between(since, now);
}

}  // namespace dist::agent
