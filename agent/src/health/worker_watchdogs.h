// The hang watchdogs of this node's workers, for the worker group:
//   - torch's file timer (TORCHELASTIC_ENABLE_FILE_TIMER=1, file_timer_server.h): the workers get
//     TORCHELASTIC_TIMER_FILE; a process of theirs whose timer expires is sent the signal its
//     request names, as torch does;
//   - the SDK's heartbeat (--worker-heartbeat-timeout S, heartbeat_monitor.h): a worker that beat
//     and then stays silent for S seconds is hung. One the kernel holds stopped (SIGSTOP, a
//     debugger's stop) gets SIGKILL at once, since nothing else reaches it; another gets SIGABRT,
//     so that it leaves a core or a stack trace of the hang, and its process group SIGKILL
//     kHungWorkerAbortGrace later. Without the timeout, workers still get a slot when the metrics
//     or the health check show heartbeats: nothing is then killed.
//   - hangs and stragglers, by default (hang_detector.h): every worker gets a slot, and the stack
//     signal and file (DIST_STACK_SIGNAL, DIST_STACK_FILE); a rank found hung is killed (SIGKILL:
//     its stacks are taken).
// The worker's exit then fails the round like any failure, and the group restarts if restarts are
// left; reason() names the watchdog for the failure report. Timers and deadlines apply to a
// running group only: stopping() ends them until the next start.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/agent/config.h"
#include "health/file_timer_server.h"
#include "health/hang_detector.h"
#include "health/heartbeat_monitor.h"
#include "health/telemetry.h"
#include "processes/process.h"

namespace dist::agent {

inline constexpr std::chrono::milliseconds kHungWorkerAbortGrace{3000};

class WorkerWatchdogs {
 public:
  // Serves the file timer pipe when the options ask for it (throws std::runtime_error naming the
  // path when it cannot). `in_place` (--restart-policy in-place): every worker gets a progress
  // slot, the channel that asks it to regroup (ask_to_regroup). `heartbeats_shown`: an endpoint
  // shows the workers' heartbeats (TelemetryEndpoints::show_heartbeats): every worker gets a slot.
  WorkerWatchdogs(boost::asio::io_context& io, const WatchdogOptions& options, Telemetry& telemetry,
                  HangOptions hang, bool in_place, bool heartbeats_shown);
  WorkerWatchdogs(const WorkerWatchdogs&) = delete;
  WorkerWatchdogs& operator=(const WorkerWatchdogs&) = delete;

  // For local rank `local_rank`, about to start in `dir`: its variables, and the descriptors it
  // must inherit.
  void prepare(int local_rank, const std::filesystem::path& dir, Variables& env,
               std::vector<int>& fds);
  void started(const Worker& worker);
  // The worker ended; `succeeded`: with 0, and no watchdog ended it.
  void exited(int local_rank, bool succeeded);
  void stopping();
  // In-place: the running workers are asked to recover at their next unit of work, into the
  // job's regroup in round `round` (worker_contract.h, the slot's regroup_round).
  void ask_to_regroup(int round);
  // In-place, elastic: the running workers run on in round `round`, with global ranks from
  // `rank_offset` (WorkerGroup::regroup): what the watchdogs say and publish uses them from now,
  // and a worker started again in that round is a replacement (HangDetector::started).
  void regrouped(int round, int rank_offset);

  // Why a watchdog killed this worker ("timer expired (scope 'step')"); empty when none did.
  std::string reason(int local_rank) const;
  // Whether it was killed only as a consequence (hung waiting for a peer elsewhere).
  bool collateral(int local_rank) const;
  // The running workers' heartbeats.
  std::vector<WorkerProgress> progress() const;
  // The job view (several nodes), for the hang detector.
  void job_view(const schema::JobView& view);

 private:
  struct Watched {
    Worker worker;
    bool running = false;
    std::string reason;
    bool collateral = false;
    std::unique_ptr<boost::asio::steady_timer> abort_grace;
  };
  void on_timer_expired(const TimerExpiry& timer);
  void on_silent(int local_rank, std::chrono::nanoseconds silent);
  void on_hung(int local_rank, const std::string& reason, bool collateral,
               std::chrono::nanoseconds silent);
  Watched* owner_of(pid_t pid);
  void tick_for_stalls();

  boost::asio::io_context& io_;
  const WatchdogOptions& options_;
  Telemetry& telemetry_;
  std::optional<FileTimerServer> timers_;
  std::optional<HeartbeatMonitor> heartbeats_;
  std::optional<HangDetector> hang_;
  std::vector<std::filesystem::path> stack_files_;  // by local rank
  std::vector<Watched> workers_;                    // by local rank
  bool running_ = false;
  boost::asio::steady_timer stall_tick_;
  std::shared_ptr<char> alive_ = std::make_shared<char>();
};

}  // namespace dist::agent
