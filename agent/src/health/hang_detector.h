// Hangs and stragglers, found by default (--hang-timeout, --no-step-hook). Every worker has a
// progress slot (heartbeat_monitor.h) that its steps stamp: the SDK's step() and DDP, Python's
// dist_launch.progress.step(), and the optimizer-step hook the agent installs in torch workers
// (python_hook.h). Once a second the detector reads every running worker's slot (step_stats.h):
//
//   - a worker without progress for its hang timeout (10 x the p99 of its own step times, at least
//     30 s, once it made 5 steps; or --hang-timeout S from its first step) starts an
//     investigation: every rank that can is asked for its stacks (the stack signal: faulthandler in
//     Python, the SDK's handler in C++), twice, kConfirmGap apart, and its process state read
//     (hang_report.h says what is made of it);
//   - a rank that moved meanwhile clears it (the next one comes a timeout later); the ranks found
//     to be the cause are killed (SIGKILL: their stacks are taken) with a reason naming where they
//     were, so that the failure report names them and the normal restart policy applies; when
//     every rank here waits for a peer, none of them is the cause: with other nodes, the node
//     whose rank it is gets kVictimGrace to find it before these are killed as collateral; alone,
//     every rank waits for another: all are hung;
//   - each rank's own work per step (or its step time) against the others' median flags
//     stragglers (StragglerWatch): logged, in the event log, the metrics and dist-launch status.
//
// The investigation is one event on the detector's timers; nothing blocks the agent's loop.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "health/hang_report.h"
#include "health/heartbeat_monitor.h"
#include "health/step_stats.h"
#include "health/telemetry.h"

namespace dist::agent {

inline constexpr std::chrono::seconds kProgressSampleInterval{1};
inline constexpr std::chrono::seconds kConfirmGap{2};
inline constexpr std::chrono::seconds kStackDumpWait{2};
inline constexpr std::chrono::seconds kVictimGrace{10};

// The realtime signal that asks a worker for its stacks (DIST_STACK_SIGNAL).
int stack_signal();

struct HangOptions {
  HangTimeoutRule timeout;
  bool other_nodes = false;  // ranks on other nodes: a rank here may wait for one of them
  std::string host;          // for the report
};

class HangDetector {
 public:
  // kill(local_rank, reason, collateral, silent): the worker is hung; kill it, and say why.
  using Kill = std::function<void(int, const std::string&, bool, std::chrono::nanoseconds)>;
  HangDetector(boost::asio::io_context& io, HangOptions options, const HeartbeatMonitor& slots,
               Telemetry& telemetry, Kill kill);
  HangDetector(const HangDetector&) = delete;
  HangDetector& operator=(const HangDetector&) = delete;

  void started(const WorkerRef& worker, std::filesystem::path stack_file);
  void exited(int local_rank);
  void stopping();  // the group stops: no sampling, no investigation until the next start

  // The step counts, rates, hang timeout and straggler flag of a running worker.
  void fill(WorkerProgress& p) const;

 private:
  struct Watched {
    WorkerRef worker;
    std::filesystem::path stack_file;
    bool running = false;
    StepHistory history;
    std::optional<RankLook> look;      // during an investigation
    std::uintmax_t stacks_offset = 0;  // the stack file's size before the last signal
    bool signalled = false;
  };
  void arm_sample();
  void sample();
  void investigate(std::chrono::nanoseconds silent, std::chrono::nanoseconds timeout);
  void look(bool first);
  void await_dumps(bool first, std::chrono::steady_clock::time_point deadline);
  void conclude();
  void act(const HangFinding& finding, const std::vector<Watched*>& ranks);
  void kill_after_grace(std::vector<int> local_ranks, std::vector<std::string> reasons);
  bool dumps_arrived() const;
  std::string hang_reason() const;

  boost::asio::io_context& io_;
  HangOptions options_;
  const HeartbeatMonitor& slots_;
  Telemetry& telemetry_;
  Kill kill_;
  std::map<int, Watched> workers_;  // by local rank
  StragglerWatch stragglers_;
  bool running_ = false;
  boost::asio::steady_timer sampler_;
  boost::asio::steady_timer investigation_;
  bool investigating_ = false;
  std::chrono::nanoseconds quiet_since_{0};  // progress before this does not count (a cleared look)
  std::chrono::nanoseconds silent_{0}, timeout_{0};  // of the investigation under way
  std::shared_ptr<char> alive_ = std::make_shared<char>();
};

}  // namespace dist::agent
