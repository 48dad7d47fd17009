#include "health/telemetry_endpoints.h"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <array>
#include <cmath>
#include <stdexcept>

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

}  // namespace

TelemetryEndpoints::TelemetryEndpoints(boost::asio::io_context& io, const LaunchConfig& config,
                                       std::string host, const Telemetry& telemetry)
    : config_(config), host_(std::move(host)), telemetry_(telemetry), sampler_(io) {
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
std::map<std::string, HttpEndpoint::Handler> TelemetryEndpoints::metrics_routes(
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

void TelemetryEndpoints::set_snapshot_source(std::function<nlohmann::ordered_json()> source) {
  snapshot_source_ = std::move(source);
}

std::optional<std::uint16_t> TelemetryEndpoints::metrics_port() const {
  if (!metrics_endpoint_) return std::nullopt;
  return metrics_endpoint_->port();
}

std::optional<std::uint16_t> TelemetryEndpoints::health_check_port() const {
  if (health_endpoint_) return health_endpoint_->port();
  if (config_.watchdogs.health_check_port && metrics_endpoint_) return metrics_endpoint_->port();
  return std::nullopt;
}

// Once a second while the page is served: a sample of every running worker for its plots.
void TelemetryEndpoints::arm_sampler() {
  sampler_.expires_after(kSampleInterval);
  sampler_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;  // cancelled: this object is going
    history_.add(wall_clock_seconds(), telemetry_.record().round.round, telemetry_.ranks());
    arm_sampler();
  });
}

// ----------------------------------------------------------------------------------------------
// Endpoints

HttpResponse TelemetryEndpoints::metrics() const {
  const TelemetryRecord& c = telemetry_.record();
  const auto workers = telemetry_.progress();
  Exposition m;
  m.family("dist_launch_info", "gauge", "The job this agent runs.")
      .sample(1, {{"run_id", config_.run_id},
                  {"role", config_.role},
                  {"host", host_},
                  {"version", DIST_VERSION}});
  m.family("dist_launch_state", "gauge", "The agent's lifecycle state: 1 for the current one.");
  for (const auto s : kAgentStateNames) m.sample(s == c.state ? 1 : 0, {{"state", std::string(s)}});
  m.family("dist_launch_round", "gauge", "The rendezvous round this node joined last.")
      .sample(c.round.round);
  m.family("dist_launch_node_rank", "gauge", "This node's rank in that round.")
      .sample(c.round.node_rank);
  m.family("dist_launch_nodes", "gauge", "Nodes in that round.").sample(c.round.num_nodes);
  m.family("dist_launch_world_size", "gauge", "Workers in that round, all nodes.")
      .sample(c.round.world_size);
  m.family("dist_launch_restarts_total", "counter",
           "Restarts of the worker group (job-wide in elastic jobs).")
      .sample(c.round.restarts);
  m.family("dist_launch_in_place_restarts_total", "counter",
           "Workers of this node replaced alone (--restart-policy in-place).")
      .sample(static_cast<double>(c.in_place_restarts));
  m.family("dist_launch_max_restarts", "gauge", "--max-restarts.").sample(config_.max_restarts);
  m.family("dist_launch_workers", "gauge", "Workers of this node per round (--nproc-per-node).")
      .sample(config_.nproc_per_node);
  m.family("dist_launch_workers_alive", "gauge", "Workers of this node started and not reaped.")
      .sample(c.workers_alive);
  m.family("dist_launch_worker_starts_total", "counter", "Workers started on this node.")
      .sample(static_cast<double>(c.worker_starts));
  m.family("dist_launch_worker_failures_total", "counter",
           "Worker exits on this node that failed their round.")
      .sample(static_cast<double>(c.worker_failures));
  m.family("dist_launch_timer_expirations_total", "counter",
           "File timers (TORCHELASTIC_TIMER_FILE) that expired on this node.")
      .sample(static_cast<double>(c.timer_expirations));
  m.family("dist_launch_hung_workers_total", "counter",
           "Workers of this node killed as hung (a silent heartbeat, or no progress).")
      .sample(static_cast<double>(c.hung_workers));
  m.family("dist_launch_hangs_suspected_total", "counter",
           "Hang investigations that only reported (nothing proven: nothing ended).")
      .sample(static_cast<double>(c.hangs_suspected));
  m.family("dist_launch_hangs_ended_total", "counter",
           "Hang investigations that ended ranks (proven, or past the timeout).")
      .sample(static_cast<double>(c.hangs_acted));
  m.family("dist_launch_nodes_lost_total", "counter", "Other nodes this node saw vanish.")
      .sample(static_cast<double>(c.nodes_lost));
  if (config_.watchdogs.worker_heartbeat_timeout.count() > 0) {
    m.family("dist_launch_worker_heartbeat_timeout_seconds", "gauge", "--worker-heartbeat-timeout.")
        .sample(in_seconds(config_.watchdogs.worker_heartbeat_timeout));
  }
  m.family("dist_launch_worker_heartbeat_age_seconds", "gauge",
           "Seconds since a running worker's last heartbeat (workers that beat).");
  for (const auto& p : workers) {
    if (!p.silence) continue;
    m.sample(in_seconds(*p.silence), {{"rank", std::to_string(p.worker.rank)},
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
  if (const auto lost = c.event_log_lost) {
    m.family("dist_launch_event_log_lost_total", "counter",
             "Event log lines that could not be written.")
        .sample(static_cast<double>(*lost));
  }
  return {200, "text/plain; version=0.0.4; charset=utf-8", m.take()};
}

HttpResponse TelemetryEndpoints::health() const {
  const TelemetryRecord& c = telemetry_.record();
  const auto now = std::chrono::system_clock::now();
  const WorkerProgress* most_silent = nullptr;
  const auto workers = telemetry_.progress();
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
                                 {"state", c.state},
                                 {"round", c.round.round},
                                 {"workers_alive", c.workers_alive}};
  if (most_silent) {
    body["most_silent_worker"] = {{"rank", most_silent->worker.rank},
                                  {"local_rank", most_silent->worker.local_rank},
                                  {"heartbeat_age_s", in_seconds(silence)}};
  }
  return {alive ? 200 : 503, "application/json", json_text(body) + "\n"};
}

nlohmann::ordered_json TelemetryEndpoints::status(double since) const {
  const TelemetryRecord& c = telemetry_.record();
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (const auto& r : telemetry_.ranks()) ranks.push_back(schema::to_json(r));
  return {{"run_id", config_.run_id},
          {"host", host_},
          {"time", std::round(wall_clock_seconds() * 1000) / 1000},
          {"started", c.started},
          {"state", c.state},
          {"round", c.round.round},
          {"node_rank", c.round.node_rank},
          {"num_nodes", c.round.num_nodes},
          {"world_size", c.round.world_size},
          {"restarts", c.round.restarts},
          {"max_restarts", config_.max_restarts},
          {"nproc_per_node", config_.nproc_per_node},
          {"workers_alive", c.workers_alive},
          {"worker_failures", c.worker_failures},
          {"hung_workers", c.hung_workers},
          {"ranks", std::move(ranks)},
          {"snapshots", snapshot_source_ ? snapshot_source_() : nlohmann::ordered_json()},
          {"history",
           {{"interval_s", kSampleInterval.count()},
            {"window_s", kSampleInterval.count() * static_cast<long long>(kHistorySamples)},
            {"ranks", history_.to_json(since)}}},
          {"events", c.timeline.to_json(since)}};
}

HttpResponse TelemetryEndpoints::status_json(const HttpRequest& request) const {
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

HttpResponse TelemetryEndpoints::page() const {
  return {200, "text/html; charset=utf-8", status_page(status(0))};
}

}  // namespace dist::agent
