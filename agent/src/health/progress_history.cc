#include "health/progress_history.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace dist::agent {
namespace {

double rounded(double v) {
  return std::round(v * 1000) / 1000;
}

nlohmann::ordered_json or_null(const std::optional<double>& v) {
  return v ? nlohmann::ordered_json(rounded(*v)) : nlohmann::ordered_json();
}

}  // namespace

ProgressHistory::ProgressHistory(std::size_t samples_per_rank, std::size_t max_ranks)
    : samples_per_rank_(std::max<std::size_t>(1, samples_per_rank)),
      max_ranks_(std::max<std::size_t>(1, max_ranks)) {}

std::optional<double> ProgressHistory::measure(Counter& c, bool fresh,
                                               std::optional<std::uint64_t> value,
                                               std::optional<double> since, double now) {
  if (!value) return std::nullopt;
  const double at = now - since.value_or(0);  // when the latest count happened
  std::optional<double> mean;
  if (c.known && !fresh && *value > c.value && at > c.at) {
    mean = (at - c.at) / static_cast<double>(*value - c.value);
  }
  if (!c.known || fresh || *value != c.value) c = Counter{*value, at, true};
  return mean;
}

void ProgressHistory::add(double now, int round, const std::vector<RankStatus>& workers) {
  for (const auto& w : workers) {
    auto it = ranks_.find(w.worker.rank);
    if (it == ranks_.end()) {
      if (ranks_.size() >= max_ranks_) {  // make room: the rank sampled longest ago goes
        const auto oldest = std::min_element(ranks_.begin(), ranks_.end(), [](auto& a, auto& b) {
          return a.second.samples.back().time < b.second.samples.back().time;
        });
        ranks_.erase(oldest);
      }
      it = ranks_.emplace(w.worker.rank, Rank{}).first;
      it->second.round = round;
    }
    Rank& r = it->second;
    const bool fresh = r.round != round;
    r.round = round;
    ProgressSample s;
    s.time = now;
    s.round = round;
    s.step_seconds = measure(r.steps, fresh, w.steps, w.since_step_seconds, now);
    s.beat_seconds = measure(r.beats, fresh, w.beats ? std::optional(w.beats) : std::nullopt,
                             w.since_beat_seconds, now);
    r.samples.push_back(s);
    while (r.samples.size() > samples_per_rank_) r.samples.pop_front();
  }
}

nlohmann::ordered_json ProgressHistory::to_json(double since) const {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& [rank, r] : ranks_) {
    nlohmann::ordered_json t = nlohmann::ordered_json::array(), rounds = t, steps = t, beats = t;
    for (const auto& s : r.samples) {
      if (rounded(s.time) <= since) continue;
      t.push_back(rounded(s.time));
      rounds.push_back(s.round);
      steps.push_back(or_null(s.step_seconds));
      beats.push_back(or_null(s.beat_seconds));
    }
    if (t.empty()) continue;
    out[std::to_string(rank)] = {{"t", std::move(t)},
                                 {"round", std::move(rounds)},
                                 {"step_s", std::move(steps)},
                                 {"beat_s", std::move(beats)}};
  }
  return out;
}

const std::deque<ProgressSample>* ProgressHistory::samples(int rank) const {
  const auto it = ranks_.find(rank);
  return it == ranks_.end() ? nullptr : &it->second.samples;
}

EventTimeline::EventTimeline(std::size_t capacity)
    : capacity_(std::max<std::size_t>(1, capacity)) {}

void EventTimeline::add(double time, std::string_view event, const nlohmann::ordered_json& fields) {
  nlohmann::ordered_json e = {{"t", rounded(time)}, {"event", event}};
  for (const auto& [name, value] : fields.items()) e[name] = value;
  events_.emplace_back(time, std::move(e));
  if (events_.size() > capacity_) {
    events_.pop_front();
    ++dropped_;
  }
}

nlohmann::ordered_json EventTimeline::to_json(double since) const {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& [time, e] : events_) {
    if (rounded(time) > since) out.push_back(e);
  }
  return out;
}

}  // namespace dist::agent
