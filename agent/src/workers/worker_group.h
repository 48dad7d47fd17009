// The workers of one round on this node: started together, each in its own process group with
// its output on pipes; their exits reaped as SIGCHLD reports them; stopped together.
//
// The agent drives it and hears back through these events:
//   failed(failures)  while running: workers exited non-zero (all exits reaped at that moment,
//                     so a crash and the peers it broke are one batch: the earliest is the root)
//   succeeded()       while running: the last worker exited 0
//   one_succeeded()   while running: a worker exited 0, others still run
//   stopped()         after stop(): every worker is reaped and its output drained (a descendant
//                     that keeps a pipe open is waited for at most kOutputDrainTimeout)
// Stopping covers what the workers started too (leftovers.h): the agent is a subreaper, every
// process of the job carries its id, and a janitor kills them all if the agent itself is killed.
// The destructor SIGKILLs and reaps whatever is left: no worker outlives the group.
// --restart-policy in-place: replace() starts one failed worker again, alone, while the others
// run (its logs in attempt_<round>/<local rank>/generation_<g>/).
// Hung workers (worker_watchdogs.h) are killed by their watchdog; their exit fails the round, even
// with code 0, and the report says which watchdog fired. Each start and exit goes to the telemetry.
// --warm-restart: Python workers are forked from the zygote (warm/warm_start.h), cold ones started
// by processes/process.h; the zygote, its standbys and the snapshot scratch's guardian are the
// agent's own children, spared by a stop and reaped here (warm/). The snapshot store
// (--snapshot-memory, --snapshot-dir) is held here too, so that it outlives every round.
#pragma once

#include <nlohmann/json.hpp>

#include <sys/types.h>

#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dist/agent/config.h"
#include "dist/agent/console.h"
#include "dist/store/endpoint.h"
#include "health/python_hook.h"
#include "health/telemetry.h"
#include "health/worker_watchdogs.h"
#include "output/duplicate_log.h"
#include "output/log_pump.h"
#include "processes/janitor.h"
#include "processes/job_processes.h"
#include "processes/leftovers.h"
#include "processes/process.h"
#include "rendezvous/rendezvous.h"
#include "resources/worker_resources.h"
#include "workers/run_directory.h"
#include "workers/worker_output.h"

namespace dist::agent {

namespace warm {  // --warm-restart and snapshots (warm/)
class Scratch;
class SnapshotStore;
class WarmStart;
}  // namespace warm

class WorkerGroup {
 public:
  // This node, for every round: its name (the failure report's), the job's token file for the
  // SDK (DIST_LAUNCH_TOKEN_FILE; empty: none), and whether its workers are generations of their
  // group (the recovery policy says: in place, each is told its generation and has a progress
  // slot, where a regroup is asked; the event log names the generation).
  struct Identity {
    std::string host;
    std::string token_file;
    bool generations = false;
  };
  struct Events {
    std::function<void(std::vector<WorkerFailure>)> failed;
    std::function<void()> succeeded;
    std::function<void()> stopped;
    // A start that waited for the --warm-restart zygote failed, for this reason (the workers
    // that started are stopped by the caller, as when start() throws).
    std::function<void(std::string)> start_failed;
    std::function<void()> one_succeeded;  // optional
  };

  // `janitor` may be null (it could not start). Plans each local rank's device and placement
  // (throws DeviceError / PlacementError with a message for the user), and starts the watchdogs
  // (std::runtime_error: the file timer pipe cannot be served).
  WorkerGroup(boost::asio::io_context& io, const LaunchConfig& config, const RunDirectory& dir,
              const AgentId& agent_id, Janitor* janitor, std::shared_ptr<Console> console,
              Telemetry& telemetry, Identity identity, Events events);
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Starts round `a`'s workers, whose store is `store` (MASTER_ADDR, MASTER_PORT); throws
  // std::runtime_error naming the worker that could not start (the ones already started are
  // then stopped by the caller). While the zygote still imports, the start waits for it (running,
  // no worker yet); a failure then comes as Events::start_failed.
  void start(const Round& a, const store::Endpoint& store);
  // In-place, a newcomer to a running job: round `a` continues a group that is running on the
  // other nodes, which this node's workers join as one of its generations, known later. Until
  // start_generation(g) the group runs with no worker (a stop ends it at once); then round `a`'s
  // workers start as generation g's (DIST_LAUNCH_GENERATION; they receive the running workers'
  // state), as start() starts them, and throws as it does.
  void start_joining(const Round& a, const store::Endpoint& store);
  void start_generation(int generation);
  // Sends `signal` (0: none, just wait) to every worker's process group and SIGKILLs what is
  // left after the shutdown timeout; stopped() follows. Again while stopping: SIGKILL at once.
  // `already_sent`: the workers got `signal` from elsewhere (Slurm signals the whole step):
  // only the shutdown timeout applies.
  void stop(int signal, bool already_sent = false);
  // SIGUSR1/SIGUSR2 and the like (SIGKILL too): to every running worker's process group, nothing
  // else.
  void forward(int signal);
  // In-place: starts local rank `local_rank` again (it failed and was reaped) as the replacement
  // of `generation`, with its rank, store and restart count, while the others run on. Returns its
  // pid; throws std::runtime_error naming it when it cannot start.
  pid_t replace(int local_rank, int generation);
  // In-place, a lost node or a newcomer: the running workers go on in round `a` (another world
  // size); their global ranks start at a.rank_offset from now on, and a later replacement starts
  // with a's variables. Returns each worker's old and new global rank.
  std::vector<std::pair<int, int>> regroup(const Round& a);
  // And once the regroup's generation is out: each running worker is asked to recover at its
  // next unit of work (WorkerWatchdogs::ask_to_regroup; their collectives may not fail).
  void ask_to_regroup() { watchdogs_.ask_to_regroup(round_.round); }
  // The global ranks of the workers still running.
  std::vector<int> running_ranks() const;
  // Whether every worker but local rank `local_rank`'s has exited (while running: with 0, else
  // the group would have reported a failure). True when there is no other.
  bool others_exited(int local_rank) const;
  // Reaps every child that exited (SIGCHLD arrived).
  void reap();

  // The running workers' heartbeats (for the metrics and the health check).
  std::vector<WorkerProgress> progress() const { return watchdogs_.progress(); }
  // The snapshot store's status.json section (warm/snapshot_store.h); null without snapshots.
  nlohmann::ordered_json snapshot_status() const;
  // The job view (several nodes: schema::JobView), for the hang detector.
  void job_view(const schema::JobView& view) { watchdogs_.job_view(view); }
  // Failures seen while stopping: workers that had exited with an error on their own before the
  // stop reached them (a root cause may come a few milliseconds after the failure it caused).
  // Taken once.
  std::vector<WorkerFailure> take_late_failures() { return std::exchange(late_failures_, {}); }
  // Warns of each log file given up on so far (a full disk, an I/O error): they miss output.
  void warn_incomplete_logs() const { output_.warn_incomplete_logs(); }

 private:
  // A worker of the group (its round the one it runs in, its generation the one it started as)
  // and its process's state.
  struct Member {
    Worker worker;
    bool exited = false;
    bool exited_before_stop = false;  // had exited (not yet reaped) when the group was stopped
    bool failed = false;              // exited with an error (in place: until replaced)
    int open_pipes = 0;
  };
  enum class State { kIdle, kRunning, kStopping };

  void take_round(const Round& a, const store::Endpoint& store);  // round_ and the rest
  void launch();         // round_'s workers: now, or once their snapshots and the zygote are ready
  void after_restore();  // then the zygote (warm/warm_start.h)
  void start_pending();  // then the workers
  void start_now();
  void set_up_warm();
  void write_python_files_once();            // the hook (not with --no-step-hook), the package
  std::vector<pid_t> agent_helpers() const;  // zygote, standbys, scratch guardian: not leftovers
  SpawnPlan worker_plan() const;
  SpawnedProcess spawn(Member& w, const SpawnPlan& plan, const std::vector<std::string>& base_env);
  std::filesystem::path worker_dir(const Member& w) const;
  void attach_output(Member& w, const SpawnedProcess& p);
  WorkerFailure failure_of(const Member& w, int code, std::chrono::system_clock::time_point when,
                           const std::string& watchdog_reason) const;
  void maybe_stopped();
  void say_stopped();
  void settle();  // failures told once the workers dying with them have exited
  void arm_stop_deadline();

  boost::asio::io_context& io_;
  const LaunchConfig& config_;
  const RunDirectory& dir_;
  const AgentId& agent_id_;
  Janitor* janitor_;
  Leftovers leftovers_;
  WorkerOutput output_;  // the workers' pipes, to their log files and the console
  Events events_;
  Telemetry& telemetry_;
  WorkerWatchdogs watchdogs_;
  State state_ = State::kIdle;
  Identity identity_;
  Round round_;                             // the round running (or last run)
  int started_round_ = 0;                   // the round the group started in (its directories)
  store::Endpoint store_;                   // its workers' store
  std::string host_label_;                  // this node, as failure reports name it
  std::vector<WorkerResources> resources_;  // by local rank
  std::vector<Member> workers_;
  std::filesystem::path python_hook_;     // on the workers' PYTHONPATH (health/python_hook.h)
  std::filesystem::path python_package_;  // the stand-in dist_launch package (health/python_hook.h)
  bool python_files_written_ = false;
  std::vector<WorkerFailure> late_failures_;
  std::vector<std::string> stopped_;      // "0 (SIGTERM)": ended by the stop, said once it is done
  boost::asio::steady_timer kill_timer_;  // the stop's deadline: --shutdown-timeout
  bool deadline_armed_ = false;
  boost::asio::steady_timer grace_timer_;  // the leftovers' kLeftoverGrace
  bool grace_armed_ = false;
  boost::asio::steady_timer drain_timer_;
  bool draining_ = false;
  // Failures reaped while running, waiting for the workers dying with them (settle()).
  std::vector<WorkerFailure> settling_;
  boost::asio::steady_timer settle_timer_;
  bool settle_armed_ = false;
  std::optional<std::chrono::steady_clock::time_point> settle_deadline_;
  static constexpr std::chrono::milliseconds kDyingWait{500}, kDyingPoll{2};
  // --warm-restart and snapshots (destroyed in this order's reverse: zygote, snapshots, scratch).
  std::unique_ptr<warm::Scratch> scratch_;
  std::unique_ptr<warm::SnapshotStore> snapshots_;
  std::unique_ptr<warm::WarmStart> warm_;
  bool start_pending_ = false;  // round_'s start waits (snapshots, zygote, its generation)
  int launches_ = 0;            // a wait's end counts for its own launch() only
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // for what ends on other threads
  bool awaiting_generation_ = false;  // start_joining(): for its generation
  int start_generation_ = 0;          // the generation round_'s workers start as
  // When the stop began: an error file written before it is a failure of the worker's own, even
  // when the stop's signal then ended the worker before it exited.
  std::chrono::system_clock::time_point stop_began_{};  // by the clock files are stamped with
};

}  // namespace dist::agent
