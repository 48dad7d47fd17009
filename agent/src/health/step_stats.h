// What the agent makes of its workers' progress slots (dist/contract/worker_contract.h), read
// about once a second by the hang detector (hang_detector.h): each worker's step times and their
// p99, its steps per second, its own work per step, when it would be taken for hung; and which
// ranks are stragglers. Plain values in, plain answers out: nothing here touches a process.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dist/contract/worker_contract.h"

namespace dist::agent {

// One reading of a slot, at `at` (CLOCK_MONOTONIC, the clock the slot's stamps use).
struct SlotReading {
  std::chrono::nanoseconds at{0};
  std::uint64_t beats = 0;
  std::uint64_t last_beat_ns = 0;
  std::uint64_t steps = 0;
  std::uint64_t last_step_ns = 0;
  std::uint64_t collectives_issued = 0;
  std::uint64_t collectives_done = 0;
  std::uint64_t pending_since_ns = 0;
  std::uint32_t pending_op = 0;
  std::uint32_t features = 0;
  std::uint64_t work_ns = 0;
  std::uint32_t dump_pid = 0;
  // torch workers' sampler (worker_contract.h): its last pass, the collective the main thread is
  // blocked in (pending_group, pending_seq; 0: none, or the SDK's one sequence), every process
  // group's sequence number, what the main thread is in.
  std::uint64_t sampled_ns = 0;
  std::uint64_t wait_ns = 0;
  std::uint64_t pending_group = 0;
  std::uint64_t pending_seq = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> groups;  // id, seq
  std::map<std::uint64_t, std::uint32_t> group_sizes;           // id -> ranks in it (0: unknown)
  std::uint32_t activity = 0;
  // A pause the worker declared (dist_launch.progress.pause(), dist::sdk::Pause).
  std::uint64_t paused_since_ns = 0;
  std::uint64_t resumed_ns = 0;
  std::string pause_reason;
  std::uint64_t collective_timeout_ms = 0;
  std::uint64_t setup_since_ns = 0;  // waiting for its peers in a group's set-up since; 0: not
  // Not the slot's: the agent's reading of the kernel's counts (read_cpu_use), the time the
  // worker's main thread ran on a CPU and waited for one; 0 where they are not kept.
  std::uint64_t on_cpu_ns = 0;
  std::uint64_t run_queue_ns = 0;

  // The last step, beat or end of a pause, whichever came later; none before the first.
  std::optional<std::chrono::nanoseconds> last_progress() const;
  bool paused() const { return paused_since_ns != 0; }
};
SlotReading read_slot(const worker_contract::heartbeat_slot::Slot& slot,
                      std::chrono::nanoseconds now);
std::chrono::nanoseconds monotonic_now();

// --hang-timeout: automatic (10 x the p99 of the worker's own step times, at least kMinHangTimeout,
// once it made kStepsBeforeAutoTimeout steps; before, kEarlyHangTimeout from its first step or
// beat: a job that stops at its second step is looked at too), fixed (from the first step or
// beat), or off.
struct HangTimeoutRule {
  std::optional<std::chrono::milliseconds> fixed;  // none: automatic
  bool off = false;
};
inline constexpr std::chrono::seconds kMinHangTimeout{30};
inline constexpr double kHangTimeoutP99Factor = 10;
inline constexpr std::uint64_t kStepsBeforeAutoTimeout = 5;
// Longer than a healthy job's early steps take (compiling, a first evaluation or checkpoint): the
// automatic rule's only look, and report, before it knows a step's time.
inline constexpr std::chrono::minutes kEarlyHangTimeout{5};

// One worker's recent steps.
class StepHistory {
 public:
  void add(const SlotReading& r);
  const SlotReading& last() const { return last_; }

  // Step times seen between readings (each reading's steps share the time since the previous
  // step); the first step is not one of them (it carries the start-up).
  std::optional<double> step_seconds_p50() const;
  std::optional<double> step_seconds_p99() const;
  // Over the readings of the last kRateWindow.
  std::optional<double> steps_per_second() const;
  // The work each step did rather than wait for its peers (work_ns): the median, over the
  // readings of the last kRateWindow that saw steps, of each one's work per step (a reading
  // that carries a long pause of the rank's own is one of them, not the measure); none when the
  // worker does not measure it, or fewer than kMinWorkReadings saw steps.
  std::optional<double> work_seconds_per_step() const;
  // Whether the worker measures its work at all (its work_ns counts): one that does but made no
  // step lately (out of data under DDP's join, waiting in a barrier while others train) has no
  // measure now, and is left out of the comparison rather than compared by its step time.
  bool measures_work() const { return last_.work_ns > 0; }
  // The share of the time the worker's main thread could run (on_cpu_ns + run_queue_ns, and at
  // least half the wall-clock time) that it waited for a CPU, over the readings of the last
  // kRateWindow that saw steps; none before kMinWorkReadings of them. (At least half the
  // wall-clock time: a thread that mostly sleeps waits a moment at each wake-up, as long as it
  // then runs, on an idle machine too; and not the wall-clock time alone: a main thread that
  // waits for its own process's threads, as torch 2's does for gloo's, sleeps part of it.)
  std::optional<double> cpu_wait_share() const;
  // The same, only while it measures the present: the worker stepped in the readings of the last
  // `within` (0: the latest reading saw steps). A measure that a pause froze (no step since) is not
  // compared again at each reading, as if it were a new one.
  std::optional<double> recent_work_seconds_per_step(std::chrono::nanoseconds within) const;

  // How long without progress makes this worker hung; none while it cannot be (no progress yet,
  // too few steps for the automatic rule, or off).
  std::optional<std::chrono::nanoseconds> hang_timeout(const HangTimeoutRule& rule) const;

  static constexpr std::size_t kDurations = 256;  // step times kept
  // A step this many times the median, with a pause or a checkpoint in it, is not kept.
  static constexpr double kOutlierFactor = 3;
  static constexpr std::chrono::seconds kRateWindow{10};
  static constexpr std::size_t kMinWorkReadings = 3;

 private:
  std::optional<double> percentile(double p) const;

  SlotReading last_;
  std::chrono::nanoseconds stepped_at_{-1};  // the time (SlotReading::at) of the last reading
                                             // that saw steps
  std::deque<double> durations_;             // seconds
  bool own_work_since_step_ = false;         // a pause or a checkpoint seen since the last step
  std::deque<SlotReading> window_;           // the readings of the last kRateWindow
};

// Stragglers: each rank's own work per step (or, for workers that do not measure it, its step
// time) against the median of the other ranks'. A rank is flagged once it is slower by kMargin in
// kFlagAfter consecutive readings, and cleared once within kClearMargin for kClearAfter: a
// passing hiccup of a loaded machine does not flag it, a flag does not flicker.
class StragglerWatch {
 public:
  static constexpr double kMargin = 1.2;
  static constexpr double kClearMargin = 1.1;
  static constexpr int kFlagAfter = 5;
  static constexpr int kClearAfter = 10;

  struct Change {
    int rank;
    bool straggler;  // flagged, or cleared
    double ratio;    // its time over the others' median
  };
  // One reading per rank: its seconds per step (none: not measurable now). Returns the ranks
  // flagged or cleared by this reading.
  std::vector<Change> update(const std::map<int, std::optional<double>>& seconds_per_step);
  bool straggler(int rank) const;
  std::optional<double> ratio(int rank) const;
  void clear() { ranks_.clear(); }

 private:
  struct Rank {
    int slow = 0, fast = 0;
    bool flagged = false;
    std::optional<double> ratio;
  };
  std::map<int, Rank> ranks_;
};

}  // namespace dist::agent
