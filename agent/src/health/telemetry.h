// What the agent tells the outside about its job, all on its io_context:
//   - the event log (--event-log FILE, event_log.h): one JSON object per line;
//   - Prometheus metrics (--metrics-port P): text format 0.0.4 at /metrics;
//   - the status page (--metrics-port P): at / and /ui one self-contained HTML page (status_page.h)
//     that polls /status.json every second: this node's workers (steps, rates, last progress,
//     stragglers, hangs), their step times over the last ten minutes (progress_history.h) and a
//     timeline of the job's events;
//   - torch's health check (TORCHELASTIC_HEALTH_CHECK_PORT): HTTP at / (also /health, /healthz).
// Where the metrics' port listens and what it asks of a client (--metrics-addr, the token of
// --metrics-token-file): metrics_access.h; the health check asks nothing.
// The agent and the worker group report what happens through Telemetry's calls below;
// TelemetryEndpoints (telemetry_endpoints.h) serves the HTTP side from what Telemetry counted. The
// same port for both endpoints serves both, and then / is the health check's unless the client asks
// for HTML (a browser's Accept: text/html): torch's clients, and curl, get the JSON as before; /ui
// is always the page.
//
// /status.json: {run_id, host, time, started (wall-clock seconds), state, round, node_rank,
// num_nodes, world_size, restarts, max_restarts, nproc_per_node, workers_alive, worker_failures,
// hung_workers, ranks: [schema::to_json(RankStatus)...], snapshots: {memory_used_bytes,
// memory_limit_bytes, persisted_to, ranks: [{rank, step, saved_at}...]} (null without snapshots),
// history: {interval_s, window_s, ranks: ProgressHistory::to_json}, events:
// EventTimeline::to_json}; ?since=T leaves out the samples and events up to T (the page passes the
// last answer's time).
//
// Event log schema, version 1 (fields are added, never renamed or removed; a reader ignores what
// it does not know). Every line:
//   event (string), time (UTC, ISO 8601 with milliseconds), ts_ms (the same, Unix milliseconds),
//   run_id, host, agent_pid, and lost_before (lines lost just before this one) when some were.
// Events and their own fields:
//   job_start      nnodes ("2" or "1:4"), nproc_per_node, max_restarts, rdzv_backend, role,
//                  entrypoint, version
//   rendezvous     round, node_rank, num_nodes, world_size, rank_offset, restart_count
//   worker_start   round, rank, local_rank, pid
//   worker_exit    round, rank, local_rank, pid, exit_code (null when killed by a signal), signal
//                  ("SIGKILL", or null), failed (the exit failed the round), reason (why a
//                  watchdog killed it, or null)
//   timer_expired  round, rank, local_rank, pid (the request's), scope_id, signal (or null: the
//                  request named none and nothing is killed)
//   worker_hung    round, rank, local_rank, pid, silent_ms, signal (what it is sent first)
//   hang           silent_ms, timeout_ms, verdict, proof (or null), ranks: [{rank, local_rank,
//                  pid, cause, waiting, where, doing, suspect, active, paused, proven}] (what a
//                  hang investigation found, before the hung ranks are killed)
//   hang_suspected the same fields, for a finding only reported (--hang-timeout auto ends no
//                  rank without proof): said once until it changes
//   hang_cleared   silent_ms, ended (every rank made progress again after a reported hang, or
//                  ended with 0: ended true when one did)
//   straggler      round, rank, local_rank, pid, straggler (flagged or cleared), ratio (its time
//                  over the other ranks' median), measure ("work per step" or "step time")
//   restart        restart_count, max_restarts
//   verdict        round, action (restart, reshape, fail, done), restarts, reason (elastic jobs:
//                  the job-wide decision after a round ended)
//   node_lost      round, node_rank (-1: unknown)
//   node_joined    round (a node asked to join: the round ends for a new one; in place, the
//                  running nodes regroup with it)
//   inplace_restart  round, generation, rank, local_rank, pid (the failed worker's), exit_code
//                  (null when killed by a signal), signal, new_pid (its replacement's),
//                  survivors (the ranks that keep running), restarts (used, replacements
//                  included), max_restarts (--restart-policy in-place: one worker replaced alone)
//   inplace_recovered  round, generation, rank (the replaced one), root (the rank whose state
//                  every rank took), stall_ms (from the failure's reaping to the group's word
//                  that it is whole again: how long the survivors did not train), first_step
//                  (the step the replacement trains first, when the workers register one; null
//                  otherwise), counters (every counter the workers registered, as they reported
//                  them)
//   inplace_fallback  round, generation (or null), reason (why a failure restarts the group
//                  although the policy is in-place)
//   inplace_regrouped  round (the one a node was lost from), new_round, generation (or null on
//                  the nodes that did not publish it), node_rank (this node's in the new round),
//                  world_size (the new, smaller world), ranks (this node's workers, "old->new"),
//                  stall_ms (from the watch's finding the node lost to this node's workers
//                  told their new ranks; the publishing node: to the group's word that it is
//                  whole again), root,
//                  first_step, counters (as in inplace_recovered; the publishing node only),
//                  new_nodes (the nodes that joined the job in the new round)
//   inplace_joined  round, generation, ranks (a node new to a running in-place job: its workers
//                  started as the regroup's generation, with the running workers' state)
//   inplace_finished  round, generation (or null), reason (the job's workers finished while the
//                  nodes regrouped in that round: a node whose workers finished told its newcomers,
//                  or a newcomer's workers, with nothing left to join, were stopped)
//   job_end        outcome (succeeded, failed, stopped), exit_code, restarts (group restarts and
//                  in-place replacements), reason (or null), stragglers (the ranks flagged as
//                  stragglers during the job)
//   rejoin         reason, within_s (this node, cut off from the job's store, stopped its workers
//                  to rejoin the job when the store answers again, for up to within_s: written in
//                  place of its first agent's job_end; its next agent writes no job_start)
//
// Health check: torch 2.x reads TORCHELASTIC_HEALTH_CHECK_PORT and builds a server whose alive
// callback is the file timer's last progress time (or the current time), with a 60 s timeout, but
// its open-source HealthCheckServer.start() serves nothing (only Meta's internal one does). Here
// the same answer is served over HTTP: last_progress_time is the current time, except while workers
// run that beat (dist::sdk::heartbeat()): then the last beat of the most silent one. 200 while
// that is less than kHealthCheckTimeout old, 503 after; the body is a JSON object saying why.
#pragma once

#include <sys/types.h>

#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dist/agent/config.h"
#include "health/event_log.h"
#include "health/file_timer_server.h"
#include "health/http_endpoint.h"
#include "health/progress_history.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/schema.h"

namespace dist::agent {

inline constexpr std::chrono::seconds kHealthCheckTimeout{60};  // torch's

struct MetricsAccess;  // health/metrics_access.h

// The agent's lifecycle states (agent.cc's State, in its order), as the metrics name them.
inline constexpr std::array<std::string_view, 12> kAgentStateNames = {
    "init",         "rendezvous",  "running",    "replacing", "regrouping", "stopping",
    "exit_barrier", "round_ended", "restarting", "succeeded", "failed",     "exit"};

// A running worker's progress, as its slot says (dist/contract/worker_contract.h): for the
// metrics, the health check, the status page and `dist-launch status`.
struct WorkerProgress {
  Worker worker;
  std::optional<std::chrono::nanoseconds> silence;  // since its last beat; none before the first
  std::uint64_t beats = 0;
  // Training steps (dist::sdk::step(), dist_launch.progress.step(), torch's optimizer-step hook).
  std::uint64_t steps = 0;
  std::optional<std::chrono::nanoseconds> since_step;  // since its last step; none before the first
  std::optional<double> step_seconds;                  // the median of its recent steps
  std::optional<double> steps_per_second;              // over the last few seconds
  std::optional<double> hang_timeout_s;                // when it would be taken for hung
  bool straggler = false;                              // slower than its group by more than noise
  std::string pending_collective;      // the collective it is blocked in ("all_reduce #12")
  bool suspect = false;                // a hang investigation found the others wait for it, idle
  bool paused = false;                 // it declared a pause of its own
  std::string doing;                   // what the last investigation (or its pause) says it does
  std::optional<double> work_seconds;  // its own work per step (the straggler measure)
  std::optional<double> cpu_wait;      // the share of the time it waited for a CPU
  std::optional<schema::BlockedRank> blocked;  // stably blocked in a collective, idle
  std::uint64_t collective_timeout_ms = 0;     // the longest it said (the hang bound's)
};

// One rank of a hang investigation (hang_detector.h): where it was, what it was doing, and
// whether it is the cause.
struct HangRank {
  Worker worker;
  bool cause = false;
  bool waiting = false;
  std::string where;
  std::string doing;
  bool suspect = false;
  bool active = false;
  bool paused = false;
  bool proven = false;
};

// What a hang investigation found: acted upon (ranks ended: the `hang` event) or only reported
// (`hang_suspected`).
struct HangReport {
  std::vector<HangRank> ranks;
  std::chrono::nanoseconds silent{0};
  std::chrono::nanoseconds timeout{0};
  bool acted = false;
  bool warned = false;  // said as a warning ("hang suspected"), not in passing ("no step")
  std::string verdict;
  std::optional<std::string> proof;
};

// Durations and times as the events and the endpoints write them: seconds, as a double.
inline double in_seconds(std::chrono::nanoseconds d) {
  return std::chrono::duration<double>(d).count();
}
inline double wall_clock_seconds() {
  return in_seconds(std::chrono::system_clock::now().time_since_epoch());
}

// What the events recorded so far: the endpoints' metrics, health check and status.json read it.
struct TelemetryRecord {
  double started = 0;          // wall-clock seconds
  std::string state = "init";  // the agent's lifecycle state (kAgentStateNames)
  Round round;                 // the round joined last (before one: num_nodes 0)
  int workers_alive = 0;
  std::uint64_t worker_starts = 0;
  std::uint64_t worker_failures = 0;
  std::uint64_t timer_expirations = 0;
  std::uint64_t hung_workers = 0;
  std::uint64_t hangs_acted = 0;      // investigations that ended ranks
  std::uint64_t hangs_suspected = 0;  // and that only reported
  std::uint64_t hangs_warned = 0;     // of these, as a warning
  std::uint64_t nodes_lost = 0;
  std::uint64_t in_place_restarts = 0;
  std::optional<std::uint64_t> event_log_lost;  // lines not written; none without an event log
  EventTimeline timeline;                       // the recent events, for the status page
};

// The events of the job: each is counted, written to the event log (--event-log) and kept for
// the status page's timeline. What is served over HTTP is TelemetryEndpoints'
// (telemetry_endpoints.h), which reads this.
class Telemetry {
 public:
  // Opens the event log the configuration asks for. Throws std::runtime_error naming the file
  // when it cannot be.
  Telemetry(const LaunchConfig& config, std::string host);
  Telemetry(const Telemetry&) = delete;
  Telemetry& operator=(const Telemetry&) = delete;

  // Where the running workers' heartbeats are read (the worker group).
  void set_progress_source(std::function<std::vector<WorkerProgress>()> source);
  // The running workers' progress, from that source (none before it is set).
  std::vector<WorkerProgress> progress() const;
  // This node's running workers as `dist-launch status` and the status page show them.
  std::vector<RankStatus> ranks() const;
  // What this node publishes beside its heartbeat (round_source.h): the state and ranks().
  schema::NodeProgress node_progress() const;
  const TelemetryRecord& record() const { return record_; }

  void job_started();
  void state(std::string_view name);  // the agent's lifecycle state, for the metrics
  void round_joined(const Round& a);
  void worker_started(const Worker& w);
  void worker_exited(const Worker& w, int code, bool failed, const std::string& reason);
  void timer_expired(const Worker& w, const TimerExpiry& timer);
  void worker_hung(const Worker& w, std::chrono::nanoseconds silent, int signal);
  void hang(const HangReport& report);
  // Every rank made progress again after a reported hang.
  void hang_cleared(std::chrono::nanoseconds silent, bool ended);
  void straggler(const Worker& w, bool flagged, double ratio, std::string_view measure);
  // The ranks flagged as stragglers during the job, one line each (for the end of the job);
  // empty when none was.
  std::vector<std::string> straggler_summary() const;
  void restarting(int restart_count);
  // --restart-policy in-place (the fields: the schema above).
  struct InPlaceRestart {
    int round = 0;
    int generation = 0;
    Worker failed;
    int exit_code = 0;
    pid_t new_pid = -1;
    std::vector<int> survivors;
    int restarts = 0;               // used, this one included
    std::optional<int> supersedes;  // the generation under way it was folded into
  };
  void in_place_restart(const InPlaceRestart& r);
  void in_place_recovered(int round, int generation, int rank, std::chrono::milliseconds stall,
                          const std::string& record);
  void in_place_fallback(int round, std::optional<int> generation, const std::string& reason);
  // A worker failed once every other worker of the job had finished: not replaced, the job done.
  void in_place_job_done(int round, int rank, const std::string& reason);
  struct InPlaceRegroup {
    int round = 0;
    int new_round = 0;
    std::optional<int> generation;  // the publishing node's
    int node_rank = 0;
    int world_size = 0;
    std::vector<std::pair<int, int>> ranks;  // this node's workers: old rank, new rank
    std::chrono::milliseconds stall{0};
    std::string record;  // the group's recovered record (the publishing node's), or empty
    int new_nodes = 0;   // nodes new to the job in the new round
  };
  void in_place_regrouped(const InPlaceRegroup& r);
  void in_place_joined(int round, int generation, const std::vector<int>& ranks);
  // The job's workers finished while the nodes regrouped in round `round` (`generation`: the one
  // named already, if any): the round's exit barrier ends the job, its newcomers included.
  void in_place_finished(int round, std::optional<int> generation, const std::string& reason);
  void verdict(int round, const Verdict& v);
  void node_lost(int round, int node_rank);
  void node_joined(int round);
  // The job failed: the workers replaced in place on every node (the failure report's), which
  // job_end counts among its restarts rather than this node's alone.
  void job_replacements(int count) { job_replacements_ = count; }
  void job_ended(int exit_code, std::string_view outcome, const std::string& reason);
  // This node, cut off from the job's store, stopped its workers to rejoin the job when the store
  // answers again (within `within`): no job_end, as the node's next agent writes no job_start.
  void rejoining(const std::string& reason, std::chrono::seconds within);

 private:
  void log(std::string_view event, const nlohmann::ordered_json& fields);

  const LaunchConfig& config_;
  std::string host_;
  std::optional<EventLog> event_log_;
  std::function<std::vector<WorkerProgress>()> progress_source_;
  TelemetryRecord record_;
  std::optional<int> job_replacements_;
  struct StragglerRecord {
    int flags = 0;        // times flagged
    double worst = 0;     // the highest ratio it was flagged at
    std::string measure;  // "work per step" or "step time"
  };
  std::map<int, StragglerRecord> stragglers_;  // by rank
};

}  // namespace dist::agent
