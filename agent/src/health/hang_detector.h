// Hangs and stragglers, found by default (--hang-timeout, --no-step-hook). Every worker has a
// progress slot (heartbeat_monitor.h) that its steps stamp: the SDK's step() and DDP, Python's
// dist_launch.progress.step(), and the optimizer-step hook the agent installs in torch workers
// (python_hook.h), whose sampler also says which collective the main thread is blocked in and
// every process group's count. Once a second the detector reads every running worker's slot
// (step_stats.h). What is seen and what is done are apart:
//
//   - seen: a worker without progress for its hang timeout (10 x the p99 of its own step times,
//     at least 30 s, once it made 5 steps, 5 minutes before; or --hang-timeout S from its first
//     step; a declared pause is no silence) starts an investigation: every rank that can is asked
//     for its stacks (the stack signal: faulthandler in Python, the SDK's handler in C++), twice,
//     kConfirmGap apart, and its processes read (state, CPU, I/O: process_activity.h);
//     hang_report.h says what is made of it. A rank that moved meanwhile clears it. Otherwise the
//     finding is reported in the log (a warning when a rank the others wait for does nothing at
//     all, else what it is doing), the event log (hang_suspected), the metrics, the status page and
//     `dist-launch status`; the next look comes a timeout later, and progress after it is said
//     (hang_cleared), as is every rank here ending with 0 after it (a last evaluation);
//   - done, under --hang-timeout auto: a rank is ended only on proof that it cannot go on (held
//     stopped by a signal while other ranks here run, or while other nodes' ranks are seen
//     waiting in a collective well after every worker here stopped, or in their group's set-up
//     (a process group's rendezvous, an in-place generation) since before, or as a replacement
//     of a failed worker: from kStoppedProof on,
//     without waiting for a hang timeout; collectives that can never match: collective_proof.h,
//     with the other nodes' ranks as their agents publish them), or, once the silence passed the
//     bound (the job's own collective timeout plus kBoundMargin; none when no worker says its
//     timeout) with a rank waiting in one collective as long (which torch would have failed by
//     itself: a job whose collectives complete, an evaluation's, is never past it however long
//     it goes without a step), a rank the others wait for that does nothing at all (no CPU, no
//     I/O, its stack still). A rank that works or declared a pause is never ended;
//   - done, under an explicit --hang-timeout S: after S the ranks found to be the cause are
//     ended (proven, else behind the others, else not waiting while others wait), unless a rank
//     declared a pause. When every rank here waits for a peer, none of them is the cause: with
//     other nodes, the node whose rank it is gets kVictimGrace to find it before these are
//     ended as collateral; alone, every rank waits for another: all are hung.
// Ending is SIGKILL (the stacks are taken first), with a reason naming where the rank was, so that
// the failure report names it and the restart policy applies.
//   - stragglers: each rank's own work per step (or its step time) against the others' median
//     (StragglerWatch): logged, in the event log, the metrics and dist-launch status.
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
#include "health/process_activity.h"
#include "health/step_stats.h"
#include "health/telemetry.h"

namespace dist::agent {

inline constexpr std::chrono::seconds kProgressSampleInterval{1};
inline constexpr std::chrono::seconds kConfirmGap{2};
inline constexpr std::chrono::seconds kStackDumpWait{2};
// A rank asked for its stacks in its slot that has not answered in this long (its sampler cannot
// run: a thread keeps the GIL) is signalled for its main thread's instead, when that thread has
// waited in the kernel all the while (a Python worker's; hang_detector.cc says why).
inline constexpr std::chrono::milliseconds kStackAskWait{500};
inline constexpr std::chrono::seconds kVictimGrace{10};
inline constexpr std::chrono::seconds kStoppedProof{3};  // held stopped this long: proof
// A pause of a whole job reaches all its nodes within this (a scheduler's suspend, kill -STOP
// over ssh): a node whose every worker is stopped takes other nodes' ranks seen waiting after it
// as waiting for its own.
inline constexpr std::chrono::seconds kPauseSpread{10};
inline constexpr std::chrono::seconds kBoundMargin{60};    // past the job's collective timeout
inline constexpr std::chrono::seconds kHookLoadGrace{10};  // a Python worker's hook must be in
inline constexpr int kStableBlockedReadings = 3;  // samples in the same collective: a stable wait

// The realtime signal that asks a worker for its stacks (DIST_STACK_SIGNAL).
int stack_signal();

struct HangOptions {
  HangTimeoutRule timeout;
  bool other_nodes = false;     // ranks on other nodes: a rank here may wait for one of them
  bool python_workers = false;  // the workers are Python with the progress hook on their path
  std::string host;             // for the report
};

class HangDetector {
 public:
  // kill(local_rank, reason, collateral, silent): the worker is hung; kill it, and say why.
  using Kill = std::function<void(int, const std::string&, bool, std::chrono::nanoseconds)>;
  HangDetector(boost::asio::io_context& io, HangOptions options, HeartbeatMonitor& slots,
               Telemetry& telemetry, Kill kill);
  HangDetector(const HangDetector&) = delete;
  HangDetector& operator=(const HangDetector&) = delete;

  void started(const Worker& worker, std::filesystem::path stack_file);
  // The worker ended: its slot is read a last time (a silence its last steps ended is said). One
  // that `succeeded` (exit 0, no watchdog's end) is past a suspected hang as one that stepped is.
  void exited(int local_rank, bool succeeded);
  void stopping();  // the group stops: no sampling, no investigation until the next start
  // In-place, elastic: the running workers run on in round `round` with global ranks from
  // `rank_offset`. Their blocked ranks are published under the new numbers (the old ones may be a
  // newcomer's now), a worker started again in that round is a replacement, and the stragglers
  // are told again from the new ranks' steps.
  void regrouped(int round, int rank_offset);

  // The step counts, rates, hang timeout, straggler flag, suspected hang, work per step and stable
  // wait in a collective of a running worker.
  void fill(WorkerProgress& p) const;

  // The job as node 0 sees it (several nodes): stragglers are told against every rank of the job,
  // and a hang is proven with the other nodes' blocked ranks.
  void job_view(const schema::JobView& view);

 private:
  struct Watched {
    Worker worker;
    std::filesystem::path stack_file;
    bool running = false;
    bool succeeded = false;    // exited 0, not ended by a watchdog
    bool replacement = false;  // started again in its round: in place, for a failed worker
    std::chrono::nanoseconds started_at{0};
    StepHistory history;
    std::optional<RankLook> look;      // during an investigation
    std::uintmax_t stacks_offset = 0;  // the stack file's size before the last look
    bool asked = false;                // for its stacks, in its slot
    bool signalled = false;            // for its main thread's stack
    bool signal_due = false;  // a Python worker with no sampler: signalled after kStackAskWait
    std::optional<ThreadRun> main_thread;    // a Python worker's, as the look asked
    std::optional<RankWhere> reported;       // what the last report said of it, while it stands
    std::optional<std::uint64_t> cpu_ticks;  // its process's, at the last sample
    double cpu_share = 0;                    // of a core, over the last sample's interval
    int blocked_readings = 0;  // consecutive samples that saw it blocked in the same collective
    int setup_readings = 0;    // and in the same wait in a group's set-up
    std::optional<std::chrono::nanoseconds> stopped_since;  // first sample that saw it stopped
  };
  void arm_sample();
  void after_agent_stall();
  void sample();
  void check_hook(Watched& w, const SlotReading& r, std::chrono::nanoseconds now);
  void investigate(std::chrono::nanoseconds silent, std::chrono::nanoseconds timeout);
  void look(bool first);
  static bool signal_for_stack(const Watched& w);
  static bool dump_grew(const Watched& w);
  void await_dumps(bool first, std::chrono::steady_clock::time_point deadline);
  void conclude();
  HangRule rule() const;
  std::optional<std::chrono::nanoseconds> bound() const;
  std::string bound_text() const;
  void report(const HangFinding& finding, const std::vector<Watched*>& ranks);
  void act(const HangFinding& finding, const std::vector<Watched*>& ranks);
  void kill_after_grace(std::vector<int> local_ranks, std::vector<std::string> reasons);
  // `stacks`: the line that says where their stacks are (a warning's, kept at the job's end; a
  // look said in passing leaves none behind).
  std::string rank_block(const HangFinding& finding, const std::vector<Watched*>& ranks,
                         bool stacks = true) const;
  HangReport telemetry_report(const HangFinding& finding, const std::vector<Watched*>& ranks,
                              bool acted, const std::string& verdict) const;
  bool dumps_arrived() const;
  std::string hang_reason() const;
  void progress_resumed(std::chrono::nanoseconds now, bool some_ended = false);
  void track_blocked(Watched& w, const SlotReading& previous, const SlotReading& now);
  std::optional<std::chrono::nanoseconds> held_stopped(std::chrono::nanoseconds now);
  bool waited_on(std::chrono::nanoseconds stopped_for) const;
  struct Holds {
    int running = 0, stopped = 0;
    std::optional<std::chrono::nanoseconds> shortest;  // of the stopped ones
    std::optional<std::chrono::nanoseconds> longest;   // of those held kStoppedProof or more
  };
  Holds holds(std::chrono::nanoseconds now) const;
  bool alone_in_job(const HangFinding& finding) const;
  bool paused_here() const;
  void investigate_stopped(std::chrono::nanoseconds held);
  bool cpus_oversubscribed();
  bool crowded(std::optional<double> median_wait, bool& state, std::string_view who);
  // Every flagged rank of this node cleared (logged with `why`, and a cleared event each).
  void clear_stragglers(std::string_view why);
  static constexpr std::string_view kWaitForCpus = "the ranks wait for CPUs";
  // StepHistory::cpu_wait_share: at 8 ranks on 2 CPUs and 4 on 1, where the scheduler made
  // healthy ranks stragglers, 0.76-0.8 (torch 1.13 and 2.x); 4 ranks on 2 CPUs 0.47, 0.63-0.67
  // with a CI run beside them; 2 ranks whose steps mostly sleep about 0.1.
  static constexpr double kCpuWaitShare = 0.6;
  static constexpr double kCpuWaitShareLeft = 0.5;
  void flag_stragglers(const std::map<int, std::optional<double>>& seconds_per_step,
                       std::string_view measure);
  std::vector<const schema::BlockedRank*> waiting_elsewhere() const;
  std::vector<CollectiveState> elsewhere() const;

  boost::asio::io_context& io_;
  HangOptions options_;
  HeartbeatMonitor& slots_;
  Telemetry& telemetry_;
  Kill kill_;
  std::map<int, Watched> workers_;       // by local rank
  StragglerWatch stragglers_;            // this node's ranks (one node), or the job's (several)
  std::optional<schema::JobView> view_;  // the last job view, with when it came
  std::chrono::steady_clock::time_point view_at_{};
  bool running_ = false;
  boost::asio::steady_timer sampler_;
  boost::asio::steady_timer investigation_;
  bool investigating_ = false;
  // A silence counts from here at the latest (the last look ended then): the next look comes a
  // hang timeout after the last.
  std::chrono::nanoseconds quiet_since_{0};
  // Of the investigation under way: the silence since the most silent worker's last progress,
  // and its hang timeout.
  std::chrono::nanoseconds silent_{0}, timeout_{0};
  // The longest wait in one collective at the last look's end, here or on another node (rule()).
  std::chrono::nanoseconds longest_wait_{0};
  std::optional<std::chrono::nanoseconds> episode_;  // the silence a report was made of began
  std::string last_report_;                          // its text, not said twice
  bool hook_missing_said_ = false;
  bool cpu_wait_said_ = false;     // the ranks wait for CPUs (crowded): said once
  bool crowded_here_ = false;      // this node's workers, compared among themselves
  bool crowded_job_ = false;       // the job's ranks, in the job view
  bool all_stopped_said_ = false;  // every worker here stopped: said once
  bool pause_look_said_ = false;   // and a look at the hang timeout left it alone: said once
  bool stopped_look_ = false;      // the investigation under way is of a rank held stopped
  std::shared_ptr<char> alive_ = std::make_shared<char>();
};

}  // namespace dist::agent
