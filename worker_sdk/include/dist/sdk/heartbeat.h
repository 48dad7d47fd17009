// A worker's heartbeat for dist-launch's hang watchdog (--worker-heartbeat-timeout S): call
// heartbeat() every step. A worker that has beaten once and then stays silent for S seconds is
// taken for hung (a deadlock, a stopped process): the agent kills it and the group restarts. A
// worker that never beats is never watched.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace dist::sdk {

// Records that this worker makes progress: a clock read and a store to memory the agent shares,
// no system call, so it is cheap enough for every step and never blocks. Does nothing when
// dist-launch watches no heartbeat. Safe from any thread.
void heartbeat();

// Whether heartbeat() reaches the agent (the worker was started with a heartbeat slot).
bool heartbeat_enabled();

// The channel, for workers in other languages. The agent gives each worker one page of shared
// memory (a memfd) open at the descriptor that kFdVariable names; the worker maps it shared and,
// at each beat, stores the CLOCK_MONOTONIC time in nanoseconds into last_beat_ns (beats counts
// them, for the metrics). The agent writes kMagic first: a descriptor without it is not a slot.
namespace heartbeat_slot {

inline constexpr char kFdVariable[] = "DIST_HEARTBEAT_FD";
inline constexpr std::uint64_t kMagic = 0x3130'4248'5453'4944;  // "DISTHB01", little-endian
inline constexpr std::size_t kBytes = 4096;

struct Slot {
  std::uint64_t magic;
  std::atomic<std::uint64_t> last_beat_ns;  // 0: not beaten yet
  std::atomic<std::uint64_t> beats;
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "the slot is shared by processes");
static_assert(sizeof(Slot) <= kBytes);

}  // namespace heartbeat_slot
}  // namespace dist::sdk
