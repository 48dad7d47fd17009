// What the status page draws (telemetry.h serves it): each running worker's progress, one sample a
// second for the last ten minutes, and the job's recent events. Both bounded: a ring of samples per
// rank for at most kMaxHistoryRanks ranks, and the last kMaxTimelineEvents events.
//
// A sample's step time is measured, not reported: between two samples in which a worker's step
// count grew, the time from its previous counted step to its latest (each placed by "since its
// last step") over the steps in between; the same for heartbeats (a worker that reports no steps
// but beats once a step, dist::sdk::heartbeat()). A count that falls (a new worker in that rank)
// or a new round starts the measure afresh.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <vector>

#include "dist/agent/job_status.h"

namespace dist::agent {

inline constexpr std::size_t kHistorySamples = 600;  // one a second: ten minutes
inline constexpr std::size_t kMaxHistoryRanks = 256;
inline constexpr std::size_t kMaxTimelineEvents = 512;

struct ProgressSample {
  double time = 0;  // wall-clock seconds
  int round = 0;
  std::optional<double> step_seconds;  // the mean step time since the previous counted step
  std::optional<double> beat_seconds;  // the same for heartbeats
};

class ProgressHistory {
 public:
  explicit ProgressHistory(std::size_t samples_per_rank = kHistorySamples,
                           std::size_t max_ranks = kMaxHistoryRanks);

  // One sample of each worker at `now` (wall-clock seconds) in `round`. A rank beyond max_ranks
  // takes the place of the rank sampled longest ago.
  void add(double now, int round, const std::vector<RankStatus>& workers);

  // Every rank's samples taken after `since`, by rank, in columns:
  //   {"<rank>": {"t": [...], "round": [...], "step_s": [... or null], "beat_s": [...]}}
  nlohmann::ordered_json to_json(double since) const;

  std::size_t size() const { return ranks_.size(); }
  const std::deque<ProgressSample>* samples(int rank) const;

 private:
  // Where a counter stood at its last change: its value and when that change happened.
  struct Counter {
    std::uint64_t value = 0;
    double at = 0;
    bool known = false;
  };
  struct Rank {
    std::deque<ProgressSample> samples;
    int round = 0;
    Counter steps, beats;
  };
  // The mean time per count since the counter's previous change, when it changed; `fresh`: a new
  // round, nothing to measure against.
  static std::optional<double> measure(Counter& c, bool fresh, std::optional<std::uint64_t> value,
                                       std::optional<double> since, double now);

  std::size_t samples_per_rank_;
  std::size_t max_ranks_;
  std::map<int, Rank> ranks_;
};

// The job's recent events as the event log writes them (event, t, and their own fields).
class EventTimeline {
 public:
  explicit EventTimeline(std::size_t capacity = kMaxTimelineEvents);

  void add(double time, std::string_view event, const nlohmann::ordered_json& fields);
  // Those after `since`, oldest first: [{"t": ..., "event": ..., <fields>}, ...].
  nlohmann::ordered_json to_json(double since) const;
  std::size_t size() const { return events_.size(); }
  std::uint64_t dropped() const { return dropped_; }

 private:
  std::size_t capacity_;
  std::deque<std::pair<double, nlohmann::ordered_json>> events_;
  std::uint64_t dropped_ = 0;
};

}  // namespace dist::agent
