#include "health/telemetry.h"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>

#include "dist/agent/signals.h"
#include "rendezvous/schema.h"

namespace dist::agent {
namespace {

RankStatus rank_status(const WorkerProgress& p) {
  RankStatus r;
  r.worker.rank = p.worker.rank;
  r.worker.local_rank = p.worker.local_rank;
  if (p.steps > 0 || p.since_step) r.steps = p.steps;
  r.steps_per_second = p.steps_per_second;
  r.step_seconds = p.step_seconds;
  if (p.since_step) r.since_step_seconds = in_seconds(*p.since_step);
  if (p.silence) r.since_beat_seconds = in_seconds(*p.silence);
  r.beats = p.beats;
  r.hang_timeout_seconds = p.hang_timeout_s;
  r.straggler = p.straggler;
  r.pending_collective = p.pending_collective;
  r.suspect = p.suspect;
  r.paused = p.paused;
  r.doing = p.doing;
  r.work_seconds = p.work_seconds;
  r.cpu_wait = p.cpu_wait;
  return r;
}

nlohmann::ordered_json worker_fields(const Worker& w) {
  return {{"round", w.round}, {"rank", w.rank}, {"local_rank", w.local_rank}, {"pid", w.pid}};
}

// "root=0 wall_ns=... step=320" (the recovered key's record) as JSON: numbers where they are.
nlohmann::ordered_json record_fields(const std::string& record) {
  nlohmann::ordered_json fields = nlohmann::ordered_json::object();
  std::size_t at = 0;
  while (at < record.size()) {
    const std::size_t end = std::min(record.find(' ', at), record.size());
    const std::string item = record.substr(at, end - at);
    at = end + 1;
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos) continue;
    const std::string value = item.substr(eq + 1);
    try {
      std::size_t used = 0;
      const long long number = std::stoll(value, &used);
      if (used == value.size()) {
        fields[item.substr(0, eq)] = number;
        continue;
      }
    } catch (const std::exception&) {
    }
    fields[item.substr(0, eq)] = value;
  }
  return fields;
}

nlohmann::ordered_json signal_or_null(int signal) {
  return signal > 0 ? nlohmann::ordered_json(signal_name(signal)) : nlohmann::ordered_json();
}

nlohmann::ordered_json text_or_null(const std::string& text) {
  return text.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(text);
}

}  // namespace

Telemetry::Telemetry(const LaunchConfig& config, std::string host)
    : config_(config), host_(std::move(host)) {
  record_.started = wall_clock_seconds();
  record_.round.num_nodes = 0;
  if (!config.telemetry.event_log.empty()) {
    event_log_.emplace(config.telemetry.event_log,
                       nlohmann::ordered_json{
                           {"run_id", config.run_id}, {"host", host_}, {"agent_pid", ::getpid()}});
    record_.event_log_lost = 0;
  }
}

void Telemetry::set_progress_source(std::function<std::vector<WorkerProgress>()> source) {
  progress_source_ = std::move(source);
}

std::vector<WorkerProgress> Telemetry::progress() const {
  return progress_source_ ? progress_source_() : std::vector<WorkerProgress>{};
}

std::vector<RankStatus> Telemetry::ranks() const {
  std::vector<RankStatus> ranks;
  for (const auto& p : progress()) ranks.push_back(rank_status(p));
  return ranks;
}

schema::NodeProgress Telemetry::node_progress() const {
  schema::NodeProgress p{wall_clock_seconds(), record_.state, {}, 0, {}, 0};
  for (const auto& w : progress()) {
    p.ranks.push_back(rank_status(w));
    if (w.blocked) p.blocked.push_back(*w.blocked);
    p.collective_timeout_ms = std::max(p.collective_timeout_ms, w.collective_timeout_ms);
  }
  return p;
}

void Telemetry::log(std::string_view event, const nlohmann::ordered_json& fields) {
  record_.timeline.add(wall_clock_seconds(), event, fields);
  if (!event_log_) return;
  event_log_->write(event, fields);
  record_.event_log_lost = event_log_->lost();
}

// ----------------------------------------------------------------------------------------------
// Events

void Telemetry::job_started() {
  const std::string nnodes = config_.min_nodes == config_.max_nodes
                                 ? std::to_string(config_.max_nodes)
                                 : fmt::format("{}:{}", config_.min_nodes, config_.max_nodes);
  log("job_start", {{"nnodes", nnodes},
                    {"nproc_per_node", config_.nproc_per_node},
                    {"max_restarts", config_.max_restarts},
                    {"rdzv_backend", backend_name(config_.rdzv_backend)},
                    {"role", config_.role},
                    {"entrypoint", config_.script_name},
                    {"version", DIST_VERSION}});
}

void Telemetry::state(std::string_view name) {
  record_.state = name;
}

void Telemetry::round_joined(const Round& a) {
  record_.round = a;
  log("rendezvous", {{"round", a.round},
                     {"node_rank", a.node_rank},
                     {"num_nodes", a.num_nodes},
                     {"world_size", a.world_size},
                     {"rank_offset", a.rank_offset},
                     {"restart_count", a.restarts}});
}

void Telemetry::worker_started(const Worker& w) {
  ++record_.workers_alive;
  ++record_.worker_starts;
  auto fields = worker_fields(w);
  if (w.generation) fields["generation"] = *w.generation;
  log("worker_start", fields);
}

void Telemetry::worker_exited(const Worker& w, int code, bool failed, const std::string& reason) {
  --record_.workers_alive;
  if (failed) ++record_.worker_failures;
  auto fields = worker_fields(w);
  fields["exit_code"] = code >= 0 ? nlohmann::ordered_json(code) : nlohmann::ordered_json();
  fields["signal"] = signal_or_null(-code);
  fields["failed"] = failed;
  fields["reason"] = text_or_null(reason);
  log("worker_exit", fields);
}

void Telemetry::timer_expired(const Worker& w, const TimerExpiry& timer) {
  ++record_.timer_expirations;
  auto fields = worker_fields(w);
  fields["pid"] = timer.pid;
  fields["scope_id"] = timer.scope_id;
  fields["signal"] = signal_or_null(timer.signal);
  log("timer_expired", fields);
}

void Telemetry::worker_hung(const Worker& w, std::chrono::nanoseconds silent, int signal) {
  ++record_.hung_workers;
  auto fields = worker_fields(w);
  fields["silent_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(silent).count();
  fields["signal"] = signal_name(signal);
  log("worker_hung", fields);
}

void Telemetry::hang(const HangReport& report) {
  auto list = nlohmann::ordered_json::array();
  for (const auto& r : report.ranks) {
    list.push_back({{"rank", r.worker.rank},
                    {"local_rank", r.worker.local_rank},
                    {"pid", r.worker.pid},
                    {"cause", r.cause},
                    {"waiting", r.waiting},
                    {"where", r.where},
                    {"doing", r.doing},
                    {"suspect", r.suspect},
                    {"active", r.active},
                    {"paused", r.paused},
                    {"proven", r.proven}});
  }
  if (report.acted) {
    ++record_.hangs_acted;
  } else {
    ++record_.hangs_suspected;
    if (report.warned) ++record_.hangs_warned;
  }
  log(report.acted ? "hang" : "hang_suspected",
      {{"silent_ms", std::chrono::duration_cast<std::chrono::milliseconds>(report.silent).count()},
       {"timeout_ms",
        std::chrono::duration_cast<std::chrono::milliseconds>(report.timeout).count()},
       {"verdict", report.verdict},
       {"proof", report.proof ? nlohmann::ordered_json(*report.proof) : nlohmann::ordered_json()},
       {"ranks", std::move(list)}});
}

void Telemetry::hang_cleared(std::chrono::nanoseconds silent, bool ended) {
  log("hang_cleared",
      {{"silent_ms", std::chrono::duration_cast<std::chrono::milliseconds>(silent).count()},
       {"ended", ended}});
}

void Telemetry::straggler(const Worker& w, bool flagged, double ratio, std::string_view measure) {
  auto fields = worker_fields(w);
  fields["straggler"] = flagged;
  fields["ratio"] = ratio;
  fields["measure"] = measure;
  log("straggler", fields);
  if (flagged) {
    StragglerRecord& r = stragglers_[w.rank];
    ++r.flags;
    r.worst = std::max(r.worst, ratio);
    r.measure = measure;
  }
}

std::vector<std::string> Telemetry::straggler_summary() const {
  std::vector<std::string> lines;
  for (const auto& [rank, r] : stragglers_) {
    lines.push_back(
        fmt::format("rank {} was a straggler{}: its {} up to {:.2f}x the other ranks' median", rank,
                    r.flags > 1 ? fmt::format(" ({} times)", r.flags) : "", r.measure, r.worst));
  }
  return lines;
}

void Telemetry::restarting(int restart_count) {
  record_.round.restarts = restart_count;
  log("restart", {{"restart_count", restart_count}, {"max_restarts", config_.max_restarts}});
}

void Telemetry::in_place_restart(const InPlaceRestart& r) {
  ++record_.in_place_restarts;
  auto fields = worker_fields(r.failed);
  fields.erase("round");
  nlohmann::ordered_json event = {{"round", r.round}, {"generation", r.generation}};
  event.update(fields);
  event["exit_code"] =
      r.exit_code >= 0 ? nlohmann::ordered_json(r.exit_code) : nlohmann::ordered_json();
  event["signal"] = signal_or_null(-r.exit_code);
  event["new_pid"] = r.new_pid;
  event["survivors"] = r.survivors;
  event["restarts"] = r.restarts;
  event["max_restarts"] = config_.max_restarts;
  event["supersedes"] =
      r.supersedes ? nlohmann::ordered_json(*r.supersedes) : nlohmann::ordered_json();
  log("inplace_restart", event);
}

void Telemetry::in_place_recovered(int round, int generation, int rank,
                                   std::chrono::milliseconds stall, const std::string& record) {
  auto counters = record_fields(record);
  const auto root = counters.contains("root") ? counters["root"] : nlohmann::ordered_json();
  counters.erase("root");
  counters.erase("wall_ns");
  log("inplace_recovered",
      {{"round", round},
       {"generation", generation},
       {"rank", rank},
       {"root", root},
       {"stall_ms", stall.count()},
       {"first_step", counters.contains("step") ? counters["step"] : nlohmann::ordered_json()},
       {"counters", counters}});
}

void Telemetry::in_place_joined(int round, int generation, const std::vector<int>& ranks) {
  log("inplace_joined", {{"round", round}, {"generation", generation}, {"ranks", ranks}});
}

void Telemetry::in_place_finished(int round, std::optional<int> generation,
                                  const std::string& reason) {
  log("inplace_finished",
      {{"round", round},
       {"generation", generation ? nlohmann::ordered_json(*generation) : nlohmann::ordered_json()},
       {"reason", reason}});
}

void Telemetry::in_place_fallback(int round, std::optional<int> generation,
                                  const std::string& reason) {
  log("inplace_fallback",
      {{"round", round},
       {"generation", generation ? nlohmann::ordered_json(*generation) : nlohmann::ordered_json()},
       {"reason", reason}});
}

void Telemetry::in_place_job_done(int round, int rank, const std::string& reason) {
  log("inplace_job_done", {{"round", round}, {"rank", rank}, {"reason", reason}});
}

void Telemetry::in_place_regrouped(const InPlaceRegroup& r) {
  auto counters = record_fields(r.record);
  const auto root = counters.contains("root") ? counters["root"] : nlohmann::ordered_json();
  counters.erase("root");
  counters.erase("wall_ns");
  auto ranks = nlohmann::ordered_json::array();
  for (const auto& [from, to] : r.ranks)
    ranks.push_back(std::to_string(from) + "->" + std::to_string(to));
  log("inplace_regrouped",
      {{"round", r.round},
       {"new_round", r.new_round},
       {"generation",
        r.generation ? nlohmann::ordered_json(*r.generation) : nlohmann::ordered_json()},
       {"node_rank", r.node_rank},
       {"world_size", r.world_size},
       {"ranks", ranks},
       {"stall_ms", r.stall.count()},
       {"root", root},
       {"first_step", counters.contains("step") ? counters["step"] : nlohmann::ordered_json()},
       {"counters", counters},
       {"new_nodes", r.new_nodes}});
}

void Telemetry::verdict(int round, const Verdict& v) {
  log("verdict", {{"round", round},
                  {"action", schema::action_name(v.action)},
                  {"restarts", v.restarts},
                  {"reason", v.reason}});
}

void Telemetry::node_lost(int round, int node_rank) {
  ++record_.nodes_lost;
  log("node_lost", {{"round", round}, {"node_rank", node_rank}});
}

void Telemetry::node_joined(int round) {
  log("node_joined", {{"round", round}});
}

void Telemetry::job_ended(int exit_code, std::string_view outcome, const std::string& reason) {
  auto stragglers = nlohmann::ordered_json::array();
  for (const auto& [rank, _] : stragglers_) stragglers.push_back(rank);
  log("job_end", {{"outcome", outcome},
                  {"exit_code", exit_code},
                  {"restarts", record_.round.restarts + job_replacements_.value_or(static_cast<int>(
                                                            record_.in_place_restarts))},
                  {"reason", text_or_null(reason)},
                  {"stragglers", std::move(stragglers)}});
}

void Telemetry::rejoining(const std::string& reason, std::chrono::seconds within) {
  log("rejoin", {{"reason", text_or_null(reason)}, {"within_s", within.count()}});
}

}  // namespace dist::agent
