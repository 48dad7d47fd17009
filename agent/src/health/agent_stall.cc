#include "health/agent_stall.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>

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
      "the agent did not run for {:.1f} s (held stopped with its workers: Slurm's suspend, a "
      "kill -STOP of the job; a paused machine; or one too loaded to run it): that time is not "
      "counted in its workers' silences",
      std::chrono::duration<double>(now - due).count());
  return true;
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
