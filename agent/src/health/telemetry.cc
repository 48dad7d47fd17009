#include "health/telemetry.h"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>

#include "dist/agent/signals.h"
#include "health/metrics_access.h"
#include "health/status_page.h"
#include "output/valid_text.h"
#include "rendezvous/schema.h"

namespace dist::agent {
namespace {

constexpr std::string_view kMetricsPath = "/metrics";
constexpr std::array<std::string_view, 3> kHealthPaths = {"/", "/health", "/healthz"};
constexpr std::string_view kPagePath = "/ui";
constexpr std::string_view kStatusPath = "/status.json";
constexpr std::chrono::seconds kSampleInterval{1};

// A label value: UTF-8 (Prometheus refuses a scrape that is not), quotes and newlines escaped.
std::string escape_label(std::string_view value) {
  std::string out;
  for (const char c : valid_utf8(value)) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

// Prometheus text format 0.0.4: each family's HELP and TYPE, then its samples.
class Exposition {
 public:
  using Labels = std::vector<std::pair<std::string_view, std::string>>;

  Exposition& family(std::string_view name, std::string_view type, std::string_view help) {
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
    name_ = name;
    return *this;
  }
  Exposition& sample(double value, const Labels& labels = {}) {
    out_ += name_;
    if (!labels.empty()) {
      out_.push_back('{');
      for (std::size_t i = 0; i < labels.size(); ++i) {
        out_ += fmt::format("{}{}=\"{}\"", i ? "," : "", labels[i].first,
                            escape_label(labels[i].second));
      }
      out_.push_back('}');
    }
    out_ += fmt::format(" {}\n", value);
    return *this;
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
  std::string_view name_;
};

double seconds(std::chrono::nanoseconds d) {
  return std::chrono::duration<double>(d).count();
}

double wall_clock() {
  return seconds(std::chrono::system_clock::now().time_since_epoch());
}

RankStatus rank_status(const WorkerProgress& p) {
  RankStatus r;
  r.worker.rank = p.worker.rank;
  r.worker.local_rank = p.worker.local_rank;
  if (p.steps > 0 || p.since_step) r.steps = p.steps;
  r.steps_per_second = p.steps_per_second;
  r.step_seconds = p.step_seconds;
  if (p.since_step) r.since_step_seconds = seconds(*p.since_step);
  if (p.silence) r.since_beat_seconds = seconds(*p.silence);
  r.beats = p.beats;
  r.hang_timeout_seconds = p.hang_timeout_s;
  r.straggler = p.straggler;
  r.pending_collective = p.pending_collective;
  r.suspect = p.suspect;
  r.paused = p.paused;
  r.doing = p.doing;
  r.work_seconds = p.work_seconds;
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

Telemetry::Telemetry(boost::asio::io_context& io, const LaunchConfig& config, std::string host)
    : config_(config), host_(std::move(host)), sampler_(io), started_(wall_clock()) {
  round_.num_nodes = 0;
  if (!config.telemetry.event_log.empty()) {
    event_log_.emplace(config.telemetry.event_log,
                       nlohmann::ordered_json{
                           {"run_id", config.run_id}, {"host", host_}, {"agent_pid", ::getpid()}});
  }
  const auto metrics_port = config.telemetry.metrics_port;
  const auto health_port = config.watchdogs.health_check_port;
  std::map<std::string, HttpEndpoint::Handler> health_routes;
  for (const auto path : kHealthPaths)
    health_routes[std::string(path)] = [this](const HttpRequest&) { return health(); };
  if (metrics_port) {
    const bool shared = health_port && *health_port == *metrics_port && *metrics_port != 0;
    const MetricsAccess access = metrics_access(config, config.telemetry, host_);
    auto routes = metrics_routes(shared, access);
    if (shared) routes.merge(health_routes);  // "/" stays the metrics' own
    try {
      metrics_endpoint_ = std::make_unique<HttpEndpoint>(io, access.listen, std::move(routes));
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("cannot serve the metrics (--metrics-port): ") +
                               e.what());
    }
    if (!access.warning.empty()) spdlog::warn("{}", access.warning);
    const std::string where =
        fmt::format("http://{}:{}", access.shown_host, metrics_endpoint_->port());
    const char* token = access.token.empty() ? "" : " (with the token of --metrics-token-file)";
    spdlog::info("serving Prometheus metrics at {}{}{}", where, kMetricsPath, token);
    spdlog::info("serving the status page at {}{}{}", where, shared ? kPagePath : "/", token);
    arm_sampler();
    if (shared) spdlog::info("serving the health check at {}/", where);
  }
  if (health_port && !(metrics_port && *health_port == *metrics_port && *metrics_port != 0)) {
    try {
      // Every interface, as torch's own server would: its clients (an orchestrator's liveness
      // probe) come from elsewhere, and it says no more than whether the workers are alive.
      health_endpoint_ = std::make_unique<HttpEndpoint>(io, HttpListen{{}, *health_port},
                                                        std::move(health_routes));
    } catch (const std::exception& e) {
      throw std::runtime_error(
          std::string("cannot serve the health check (TORCHELASTIC_HEALTH_CHECK_PORT): ") +
          e.what());
    }
    spdlog::info("serving the health check at http://{}:{}/", host_, health_endpoint_->port());
  }
}

// The metrics' port: the metrics, the status page and its data, guarded as `access` says (the
// token, the Host). `shared` with the health check, "/" stays the health check's for torch's
// clients and curl (no Accept: text/html), which are not asked for either.
std::map<std::string, HttpEndpoint::Handler> Telemetry::metrics_routes(
    bool shared, const MetricsAccess& access) {
  const HttpEndpoint::Handler page =
      guarded([this](const HttpRequest&) { return this->page(); }, access);
  return {{std::string(kMetricsPath),
           guarded([this](const HttpRequest&) { return metrics(); }, access)},
          {std::string(kPagePath), page},
          {std::string(kStatusPath),
           guarded([this](const HttpRequest& r) { return status_json(r); }, access)},
          {"/", [this, shared, page](const HttpRequest& r) {
             return shared && !r.accepts_html() ? health() : page(r);
           }}};
}

void Telemetry::set_progress_source(std::function<std::vector<WorkerProgress>()> source) {
  progress_source_ = std::move(source);
}

void Telemetry::set_snapshot_source(std::function<nlohmann::ordered_json()> source) {
  snapshot_source_ = std::move(source);
}

std::optional<std::uint16_t> Telemetry::metrics_port() const {
  if (!metrics_endpoint_) return std::nullopt;
  return metrics_endpoint_->port();
}

std::optional<std::uint16_t> Telemetry::health_check_port() const {
  if (health_endpoint_) return health_endpoint_->port();
  if (config_.watchdogs.health_check_port && metrics_endpoint_) return metrics_endpoint_->port();
  return std::nullopt;
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
  schema::NodeProgress p{wall_clock(), state_, {}, 0, {}};
  for (const auto& w : progress()) {
    p.ranks.push_back(rank_status(w));
    if (w.blocked) p.blocked.push_back(*w.blocked);
  }
  return p;
}

// Once a second while the page is served: a sample of every running worker for its plots.
void Telemetry::arm_sampler() {
  sampler_.expires_after(kSampleInterval);
  sampler_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;  // cancelled: this object is going
    history_.add(wall_clock(), round_.round, ranks());
    arm_sampler();
  });
}

void Telemetry::log(std::string_view event, const nlohmann::ordered_json& fields) {
  timeline_.add(wall_clock(), event, fields);
  if (event_log_) event_log_->write(event, fields);
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
  state_ = name;
}

void Telemetry::round_joined(const Round& a) {
  round_ = a;
  log("rendezvous", {{"round", a.round},
                     {"node_rank", a.node_rank},
                     {"num_nodes", a.num_nodes},
                     {"world_size", a.world_size},
                     {"rank_offset", a.rank_offset},
                     {"restart_count", a.restarts}});
}

void Telemetry::worker_started(const Worker& w) {
  ++workers_alive_;
  ++worker_starts_;
  auto fields = worker_fields(w);
  if (w.generation) fields["generation"] = *w.generation;
  log("worker_start", fields);
}

void Telemetry::worker_exited(const Worker& w, int code, bool failed, const std::string& reason) {
  --workers_alive_;
  if (failed) ++worker_failures_;
  auto fields = worker_fields(w);
  fields["exit_code"] = code >= 0 ? nlohmann::ordered_json(code) : nlohmann::ordered_json();
  fields["signal"] = signal_or_null(-code);
  fields["failed"] = failed;
  fields["reason"] = text_or_null(reason);
  log("worker_exit", fields);
}

void Telemetry::timer_expired(const Worker& w, const TimerExpiry& timer) {
  ++timer_expirations_;
  auto fields = worker_fields(w);
  fields["pid"] = timer.pid;
  fields["scope_id"] = timer.scope_id;
  fields["signal"] = signal_or_null(timer.signal);
  log("timer_expired", fields);
}

void Telemetry::worker_hung(const Worker& w, std::chrono::nanoseconds silent, int signal) {
  ++hung_workers_;
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
  if (report.acted)
    ++hangs_acted_;
  else
    ++hangs_suspected_;
  log(report.acted ? "hang" : "hang_suspected",
      {{"silent_ms", std::chrono::duration_cast<std::chrono::milliseconds>(report.silent).count()},
       {"timeout_ms",
        std::chrono::duration_cast<std::chrono::milliseconds>(report.timeout).count()},
       {"verdict", report.verdict},
       {"proof", report.proof ? nlohmann::ordered_json(*report.proof) : nlohmann::ordered_json()},
       {"ranks", std::move(list)}});
}

void Telemetry::hang_cleared(std::chrono::nanoseconds silent) {
  log("hang_cleared",
      {{"silent_ms", std::chrono::duration_cast<std::chrono::milliseconds>(silent).count()}});
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
  round_.restarts = restart_count;
  log("restart", {{"restart_count", restart_count}, {"max_restarts", config_.max_restarts}});
}

void Telemetry::in_place_restart(const InPlaceRestart& r) {
  ++in_place_restarts_;
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
  ++nodes_lost_;
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
                  {"restarts", round_.restarts + static_cast<int>(in_place_restarts_)},
                  {"reason", text_or_null(reason)},
                  {"stragglers", std::move(stragglers)}});
}

// ----------------------------------------------------------------------------------------------
// Endpoints

HttpResponse Telemetry::metrics() const {
  const auto workers = progress();
  Exposition m;
  m.family("dist_launch_info", "gauge", "The job this agent runs.")
      .sample(1, {{"run_id", config_.run_id},
                  {"role", config_.role},
                  {"host", host_},
                  {"version", DIST_VERSION}});
  m.family("dist_launch_state", "gauge", "The agent's lifecycle state: 1 for the current one.");
  for (const auto s : kAgentStateNames) m.sample(s == state_ ? 1 : 0, {{"state", std::string(s)}});
  m.family("dist_launch_round", "gauge", "The rendezvous round this node joined last.")
      .sample(round_.round);
  m.family("dist_launch_node_rank", "gauge", "This node's rank in that round.")
      .sample(round_.node_rank);
  m.family("dist_launch_nodes", "gauge", "Nodes in that round.").sample(round_.num_nodes);
  m.family("dist_launch_world_size", "gauge", "Workers in that round, all nodes.")
      .sample(round_.world_size);
  m.family("dist_launch_restarts_total", "counter",
           "Restarts of the worker group (job-wide in elastic jobs).")
      .sample(round_.restarts);
  m.family("dist_launch_in_place_restarts_total", "counter",
           "Workers of this node replaced alone (--restart-policy in-place).")
      .sample(static_cast<double>(in_place_restarts_));
  m.family("dist_launch_max_restarts", "gauge", "--max-restarts.").sample(config_.max_restarts);
  m.family("dist_launch_workers", "gauge", "Workers of this node per round (--nproc-per-node).")
      .sample(config_.nproc_per_node);
  m.family("dist_launch_workers_alive", "gauge", "Workers of this node started and not reaped.")
      .sample(workers_alive_);
  m.family("dist_launch_worker_starts_total", "counter", "Workers started on this node.")
      .sample(static_cast<double>(worker_starts_));
  m.family("dist_launch_worker_failures_total", "counter",
           "Worker exits on this node that failed their round.")
      .sample(static_cast<double>(worker_failures_));
  m.family("dist_launch_timer_expirations_total", "counter",
           "File timers (TORCHELASTIC_TIMER_FILE) that expired on this node.")
      .sample(static_cast<double>(timer_expirations_));
  m.family("dist_launch_hung_workers_total", "counter",
           "Workers of this node killed as hung (a silent heartbeat, or no progress).")
      .sample(static_cast<double>(hung_workers_));
  m.family("dist_launch_hangs_suspected_total", "counter",
           "Hang investigations that only reported (nothing proven: nothing ended).")
      .sample(static_cast<double>(hangs_suspected_));
  m.family("dist_launch_hangs_ended_total", "counter",
           "Hang investigations that ended ranks (proven, or past the timeout).")
      .sample(static_cast<double>(hangs_acted_));
  m.family("dist_launch_nodes_lost_total", "counter", "Other nodes this node saw vanish.")
      .sample(static_cast<double>(nodes_lost_));
  if (config_.watchdogs.worker_heartbeat_timeout.count() > 0) {
    m.family("dist_launch_worker_heartbeat_timeout_seconds", "gauge", "--worker-heartbeat-timeout.")
        .sample(seconds(config_.watchdogs.worker_heartbeat_timeout));
  }
  m.family("dist_launch_worker_heartbeat_age_seconds", "gauge",
           "Seconds since a running worker's last heartbeat (workers that beat).");
  for (const auto& p : workers) {
    if (!p.silence) continue;
    m.sample(seconds(*p.silence), {{"rank", std::to_string(p.worker.rank)},
                                   {"local_rank", std::to_string(p.worker.local_rank)}});
  }
  m.family("dist_launch_worker_heartbeats_total", "counter",
           "Heartbeats of a running worker (workers that beat).");
  for (const auto& p : workers) {
    if (!p.silence) continue;
    m.sample(static_cast<double>(p.beats), {{"rank", std::to_string(p.worker.rank)},
                                            {"local_rank", std::to_string(p.worker.local_rank)}});
  }
  // Progress (hang_detector.h), for workers that count steps.
  const auto per_worker = [&](const char* name, const char* type, const char* help, auto value) {
    m.family(name, type, help);
    for (const auto& p : workers) {
      const std::optional<double> v = value(p);
      if (!v) continue;
      m.sample(*v, {{"rank", std::to_string(p.worker.rank)},
                    {"local_rank", std::to_string(p.worker.local_rank)}});
    }
  };
  const auto counts_steps = [](const WorkerProgress& p) { return p.steps > 0 || p.since_step; };
  per_worker("dist_launch_worker_steps_total", "counter",
             "Training steps of a running worker (the SDK's step(), dist_launch.progress.step(), "
             "torch's optimizer steps).",
             [&](const WorkerProgress& p) -> std::optional<double> {
               if (!counts_steps(p)) return std::nullopt;
               return static_cast<double>(p.steps);
             });
  per_worker("dist_launch_worker_steps_per_second", "gauge",
             "A running worker's steps per second over the last 10 s.",
             [](const WorkerProgress& p) { return p.steps_per_second; });
  per_worker("dist_launch_worker_step_seconds", "gauge",
             "The median of a running worker's recent step times.",
             [](const WorkerProgress& p) { return p.step_seconds; });
  per_worker("dist_launch_worker_hang_timeout_seconds", "gauge",
             "How long a running worker may make no progress before it is taken for hung.",
             [](const WorkerProgress& p) { return p.hang_timeout_s; });
  per_worker("dist_launch_worker_straggler", "gauge",
             "1 while a running worker is slower than the others by more than noise.",
             [&](const WorkerProgress& p) -> std::optional<double> {
               if (!counts_steps(p)) return std::nullopt;
               return p.straggler ? 1.0 : 0.0;
             });
  per_worker("dist_launch_worker_hang_suspected", "gauge",
             "1 while the others wait for a running worker that does nothing (reported, not "
             "ended).",
             [&](const WorkerProgress& p) -> std::optional<double> {
               if (!counts_steps(p)) return std::nullopt;
               return p.suspect ? 1.0 : 0.0;
             });
  per_worker("dist_launch_worker_paused", "gauge",
             "1 while a running worker is in a pause it declared (dist_launch.progress.pause()).",
             [&](const WorkerProgress& p) -> std::optional<double> {
               if (!counts_steps(p) && !p.paused) return std::nullopt;
               return p.paused ? 1.0 : 0.0;
             });
  if (event_log_) {
    m.family("dist_launch_event_log_lost_total", "counter",
             "Event log lines that could not be written.")
        .sample(static_cast<double>(event_log_->lost()));
  }
  return {200, "text/plain; version=0.0.4; charset=utf-8", m.take()};
}

HttpResponse Telemetry::health() const {
  const auto now = std::chrono::system_clock::now();
  const WorkerProgress* most_silent = nullptr;
  const auto workers = progress();
  for (const auto& p : workers) {
    if (p.silence && (!most_silent || *p.silence > *most_silent->silence)) most_silent = &p;
  }
  const auto silence = most_silent ? *most_silent->silence : std::chrono::nanoseconds(0);
  const auto last_progress = std::chrono::duration_cast<std::chrono::seconds>(
      (now - std::chrono::duration_cast<std::chrono::system_clock::duration>(silence))
          .time_since_epoch());
  const bool alive = silence < kHealthCheckTimeout;
  nlohmann::ordered_json body = {{"alive", alive},
                                 {"last_progress_time", last_progress.count()},
                                 {"timeout_s", kHealthCheckTimeout.count()},
                                 {"state", state_},
                                 {"round", round_.round},
                                 {"workers_alive", workers_alive_}};
  if (most_silent) {
    body["most_silent_worker"] = {{"rank", most_silent->worker.rank},
                                  {"local_rank", most_silent->worker.local_rank},
                                  {"heartbeat_age_s", seconds(silence)}};
  }
  return {alive ? 200 : 503, "application/json", json_text(body) + "\n"};
}

nlohmann::ordered_json Telemetry::status(double since) const {
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (const auto& r : this->ranks()) ranks.push_back(schema::to_json(r));
  return {{"run_id", config_.run_id},
          {"host", host_},
          {"time", std::round(wall_clock() * 1000) / 1000},
          {"started", started_},
          {"state", state_},
          {"round", round_.round},
          {"node_rank", round_.node_rank},
          {"num_nodes", round_.num_nodes},
          {"world_size", round_.world_size},
          {"restarts", round_.restarts},
          {"max_restarts", config_.max_restarts},
          {"nproc_per_node", config_.nproc_per_node},
          {"workers_alive", workers_alive_},
          {"worker_failures", worker_failures_},
          {"hung_workers", hung_workers_},
          {"ranks", std::move(ranks)},
          {"snapshots", snapshot_source_ ? snapshot_source_() : nlohmann::ordered_json()},
          {"history",
           {{"interval_s", kSampleInterval.count()},
            {"window_s", kSampleInterval.count() * static_cast<long long>(kHistorySamples)},
            {"ranks", history_.to_json(since)}}},
          {"events", timeline_.to_json(since)}};
}

HttpResponse Telemetry::status_json(const HttpRequest& request) const {
  double since = 0;
  if (const auto value = request.parameter("since")) {
    try {
      since = std::stod(*value);
    } catch (const std::exception&) {
      return {400, "text/plain; charset=utf-8", "since must be a number of seconds\n"};
    }
  }
  return {200, "application/json", json_text(status(since)) + "\n"};
}

HttpResponse Telemetry::page() const {
  return {200, "text/html; charset=utf-8", status_page(status(0))};
}

}  // namespace dist::agent
