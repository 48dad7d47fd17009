#include "health/step_stats.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace dist::agent {

namespace slot = worker_contract::heartbeat_slot;

std::chrono::nanoseconds monotonic_now() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return std::chrono::seconds(now.tv_sec) + std::chrono::nanoseconds(now.tv_nsec);
}

std::optional<std::chrono::nanoseconds> SlotReading::last_progress() const {
  const std::uint64_t last = std::max({last_step_ns, last_beat_ns, resumed_ns});
  if (last == 0) return std::nullopt;
  return std::chrono::nanoseconds(last);
}

SlotReading read_slot(const slot::Slot& s, std::chrono::nanoseconds now) {
  SlotReading r;
  r.at = now;
  r.beats = s.beats.load(std::memory_order_relaxed);
  r.last_beat_ns = s.last_beat_ns.load(std::memory_order_acquire);
  r.steps = s.steps.load(std::memory_order_relaxed);
  r.last_step_ns = s.last_step_ns.load(std::memory_order_acquire);
  r.collectives_issued = s.collectives_issued.load(std::memory_order_relaxed);
  r.collectives_done = s.collectives_done.load(std::memory_order_relaxed);
  r.pending_since_ns = s.pending_since_ns.load(std::memory_order_acquire);
  r.pending_op = s.pending_op.load(std::memory_order_relaxed);
  r.features = s.features.load(std::memory_order_acquire);
  r.work_ns = s.work_ns.load(std::memory_order_relaxed);
  r.dump_pid = s.dump_pid.load(std::memory_order_relaxed);
  r.sampled_ns = s.sampled_ns.load(std::memory_order_relaxed);
  r.wait_ns = s.wait_ns.load(std::memory_order_relaxed);
  r.pending_group = s.pending_group.load(std::memory_order_relaxed);
  r.pending_seq = s.pending_seq.load(std::memory_order_relaxed);
  r.activity = s.activity.load(std::memory_order_relaxed);
  const std::size_t groups =
      std::min<std::size_t>(s.group_count.load(std::memory_order_acquire), slot::kMaxGroups);
  for (std::size_t i = 0; i < groups; ++i) {
    const std::uint64_t id = s.groups[i].id.load(std::memory_order_relaxed);
    if (id == 0) continue;
    r.groups.emplace_back(id, s.groups[i].seq.load(std::memory_order_relaxed));
    r.group_sizes[id] = s.group_sizes[i].load(std::memory_order_relaxed);
  }
  r.paused_since_ns = s.paused_since_ns.load(std::memory_order_acquire);
  r.resumed_ns = s.resumed_ns.load(std::memory_order_relaxed);
  if (r.paused_since_ns != 0) {
    // The worker writes the reason before it stamps the pause: NUL-padded UTF-8, made valid.
    char reason[slot::kPauseReasonBytes];
    std::memcpy(reason, s.pause_reason, sizeof reason);
    r.pause_reason.assign(reason, ::strnlen(reason, sizeof reason));
  }
  r.collective_timeout_ms = s.collective_timeout_ms.load(std::memory_order_relaxed);
  r.setup_since_ns = s.setup_since_ns.load(std::memory_order_acquire);
  return r;
}

void StepHistory::add(const SlotReading& r) {
  if (r.steps < last_.steps) {  // a new worker in this slot: start afresh
    *this = StepHistory{};
  }
  // Time since the last step spent in a pause the worker declared, or seen in work of its own
  // that is no step (a checkpoint's torch.save or torch.distributed.checkpoint, a recompile),
  // that made the step an outlier: not a step's time. (A 45 s checkpoint counted as one made the
  // automatic timeout 450 s for the next hundred readings.) A step that loads or saves every
  // time, as long as the others, is one.
  constexpr std::uint32_t kNotAStep = slot::kActivitySave | slot::kActivityCheckpoint |
                                      slot::kActivityCheckpointThread | slot::kActivityCompile;
  const bool own_work_now = r.paused_since_ns != 0 || (r.activity & kNotAStep);
  if (own_work_now || r.resumed_ns > last_.last_step_ns) own_work_since_step_ = true;
  if (r.steps > last_.steps && last_.last_step_ns != 0 && r.last_step_ns > last_.last_step_ns) {
    const double span = static_cast<double>(r.last_step_ns - last_.last_step_ns) / 1e9;
    const double each = span / static_cast<double>(r.steps - last_.steps);
    const std::optional<double> usual = step_seconds_p50();
    if (!own_work_since_step_ || !usual || each <= kOutlierFactor * *usual) {
      durations_.push_back(each);
      if (durations_.size() > kDurations) durations_.pop_front();
    }
  }
  if (r.steps > last_.steps) {
    stepped_at_ = r.at;
    // (Work of its own seen at this reading may be after its last step: it counts for the next.)
    own_work_since_step_ = own_work_now;
  }
  last_ = r;
  window_.push_back(r);
  while (window_.size() > 2 && r.at - window_.front().at > kRateWindow) window_.pop_front();
}

std::optional<double> StepHistory::percentile(double p) const {
  if (durations_.empty()) return std::nullopt;
  std::vector<double> sorted(durations_.begin(), durations_.end());
  std::sort(sorted.begin(), sorted.end());
  const auto index =
      static_cast<std::size_t>(std::ceil(p * static_cast<double>(sorted.size())) - 1);
  return sorted[std::min(index, sorted.size() - 1)];
}

std::optional<double> StepHistory::step_seconds_p50() const {
  return percentile(0.5);
}

std::optional<double> StepHistory::step_seconds_p99() const {
  return percentile(0.99);
}

std::optional<double> StepHistory::steps_per_second() const {
  if (window_.size() < 2) return std::nullopt;
  const SlotReading& first = window_.front();
  const double seconds = std::chrono::duration<double>(last_.at - first.at).count();
  if (seconds <= 0 || last_.steps < first.steps) return std::nullopt;
  return static_cast<double>(last_.steps - first.steps) / seconds;
}

std::optional<double> StepHistory::work_seconds_per_step() const {
  // The median over the window's readings of each one's work per step: one reading that carries a
  // long pause of the rank's own (a checkpoint, an evaluation, a data stall) is not a straggler.
  std::vector<double> per_reading;
  for (std::size_t i = 1; i < window_.size(); ++i) {
    const SlotReading& a = window_[i - 1];
    const SlotReading& b = window_[i];
    if (b.steps <= a.steps || b.work_ns <= a.work_ns) continue;
    per_reading.push_back(static_cast<double>(b.work_ns - a.work_ns) / 1e9 /
                          static_cast<double>(b.steps - a.steps));
  }
  if (per_reading.size() < kMinWorkReadings) return std::nullopt;
  std::sort(per_reading.begin(), per_reading.end());
  const std::size_t n = per_reading.size();
  return n % 2 ? per_reading[n / 2] : (per_reading[n / 2 - 1] + per_reading[n / 2]) / 2;
}

std::optional<double> StepHistory::cpu_wait_share() const {
  std::uint64_t ran = 0, queued = 0;
  std::chrono::nanoseconds elapsed{0};
  std::size_t readings = 0;
  for (std::size_t i = 1; i < window_.size(); ++i) {
    const SlotReading& a = window_[i - 1];
    const SlotReading& b = window_[i];
    if (b.steps <= a.steps || b.on_cpu_ns < a.on_cpu_ns || b.run_queue_ns < a.run_queue_ns ||
        b.at <= a.at) {
      continue;
    }
    ran += b.on_cpu_ns - a.on_cpu_ns;
    queued += b.run_queue_ns - a.run_queue_ns;
    elapsed += b.at - a.at;
    ++readings;
  }
  if (readings < kMinWorkReadings) return std::nullopt;
  const auto runnable =
      std::max<double>(static_cast<double>(ran + queued), static_cast<double>(elapsed.count()) / 2);
  return std::min(1.0, static_cast<double>(queued) / runnable);
}

std::optional<double> StepHistory::recent_work_seconds_per_step(
    std::chrono::nanoseconds within) const {
  if (stepped_at_.count() < 0 || last_.at - stepped_at_ > within) return std::nullopt;
  return work_seconds_per_step();
}

std::optional<std::chrono::nanoseconds> StepHistory::hang_timeout(
    const HangTimeoutRule& rule) const {
  if (rule.off || !last_.last_progress()) return std::nullopt;
  if (rule.fixed) return *rule.fixed;
  if (last_.steps < kStepsBeforeAutoTimeout) return kEarlyHangTimeout;
  const std::optional<double> p99 = step_seconds_p99();
  // No step time yet with enough steps: they all came between two readings (a second apart), so
  // each took well under the floor's tenth.
  if (!p99) return kMinHangTimeout;
  const auto derived = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(kHangTimeoutP99Factor * *p99));
  return std::max<std::chrono::nanoseconds>(kMinHangTimeout, derived);
}

std::vector<StragglerWatch::Change> StragglerWatch::update(
    const std::map<int, std::optional<double>>& seconds_per_step) {
  std::vector<Change> changes;
  for (const auto& [rank, mine] : seconds_per_step) {
    Rank& r = ranks_[rank];
    std::vector<double> others;
    for (const auto& [other, theirs] : seconds_per_step) {
      if (other != rank && theirs && *theirs > 0) others.push_back(*theirs);
    }
    if (!mine || others.empty()) {  // nothing to compare this time: the counts stand
      r.ratio.reset();
      continue;
    }
    std::sort(others.begin(), others.end());
    const std::size_t n = others.size();
    const double median = n % 2 ? others[n / 2] : (others[n / 2 - 1] + others[n / 2]) / 2;
    r.ratio = *mine / median;
    r.slow = *r.ratio > kMargin ? r.slow + 1 : 0;
    r.fast = *r.ratio <= kClearMargin ? r.fast + 1 : 0;
    if (!r.flagged && r.slow >= kFlagAfter) {
      r.flagged = true;
      changes.push_back({rank, true, *r.ratio});
    } else if (r.flagged && r.fast >= kClearAfter) {
      r.flagged = false;
      changes.push_back({rank, false, *r.ratio});
    }
  }
  return changes;
}

bool StragglerWatch::straggler(int rank) const {
  const auto it = ranks_.find(rank);
  return it != ranks_.end() && it->second.flagged;
}

std::optional<double> StragglerWatch::ratio(int rank) const {
  const auto it = ranks_.find(rank);
  return it == ranks_.end() ? std::nullopt : it->second.ratio;
}

}  // namespace dist::agent
