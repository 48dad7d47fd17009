// --warm-restart for the worker group: which zygote (zygote.h) the Python workers are forked from,
// and when a worker starts cold instead.
//
// The zygote starts with the worker group, before the first round forms (while the nodes
// rendezvous), on the workers' interpreter and environment. An attempt whose zygote is still
// importing waits for it (readiness() == kPreparing, then when_settled()): its import is the one
// the workers would have done themselves, so the first launch costs what a cold one does, and
// every attempt after it skips the import. A zygote that cannot start, or refuses (a failed import,
// threads or CUDA started by the imports), turns warm starts off with one warning: the workers
// start cold. One that dies later is replaced at the next attempt (after kMaxZygoteDeaths deaths,
// warm starts are turned off), and so is one whose interpreter or preloaded modules changed on
// disk. Workers started with CPU or memory binding (--cpu-bind, --numa-binding) always start cold.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/agent/config.h"
#include "processes/process.h"
#include "warm/scratch.h"
#include "warm/zygote.h"

namespace dist::agent::warm {

// How long an attempt waits for a zygote to import before its workers start cold.
inline constexpr std::chrono::seconds kZygoteReadyTimeout{300};
// How long one spawn may take (two forks of the zygote).
inline constexpr std::chrono::milliseconds kSpawnTimeout{30'000};
// Zygotes that may die (after being ready) before warm starts are turned off for the job.
inline constexpr int kMaxZygoteDeaths = 3;

class WarmStart {
 public:
  enum class Readiness { kReady, kPreparing, kOff };

  // Starts the zygote for `command`'s Python workers, `workers` of them on this node (the
  // standbys it keeps), as `options` asks (--preload); workers `placement` binds are not forked.
  // `env`: the zygote's environment, the agent's with the variables every worker gets whatever its
  // rank (the job's marker, OMP_NUM_THREADS, the snapshot variables): the zygote imports under
  // them.
  WarmStart(boost::asio::io_context& io, const WorkerCommand& command, const WarmOptions& options,
            const PlacementOptions& placement, int workers, const Scratch& scratch,
            std::vector<std::string> env);
  ~WarmStart();
  WarmStart(const WarmStart&) = delete;
  WarmStart& operator=(const WarmStart&) = delete;

  // Whether --warm-restart applies to these workers at all.
  static bool applies(const WorkerCommand& command, const WarmOptions& options);

  // Before an attempt: a dead or stale zygote is replaced here.
  Readiness readiness();
  // Calls `then` once (on the io_context) when the zygote is ready or will not be.
  void when_settled(std::function<void()> then);

  // Forks one worker (stdin this process's when keep_stdin, else /dev/null; stderr its stdout's
  // pipe when merge_stderr: as SpawnPlan's); nullopt when it must start cold (said in a
  // warning).
  std::optional<SpawnedProcess> spawn(const std::vector<std::string>& argv,
                                      const std::vector<std::string>& env,
                                      const std::vector<int>& inherited, int rank, bool keep_stdin,
                                      bool merge_stderr = false);

  // The zygote and its standby workers (the worker group's stop must spare them).
  std::vector<pid_t> helpers() const;
  // The zygote's pid alone, -1 when none runs.
  pid_t zygote_pid() const;
  // The worker group's reaping loop reaped `pid`: true when it was the zygote or a standby
  // (consumed here).
  bool reaped(pid_t pid, int status);

 private:
  void start_zygote();
  void turn_off(const std::string& why);
  void on_state(Zygote::State state);
  void settle();
  void post(std::function<void()> then);

  boost::asio::io_context& io_;
  ZygoteSpec spec_;
  std::unique_ptr<Zygote> zygote_;
  bool off_ = false;
  int deaths_ = 0;
  int generation_ = 0;
  std::chrono::steady_clock::time_point started_at_;
  std::vector<std::function<void()>> waiting_;
  boost::asio::steady_timer ready_timer_;
  std::shared_ptr<char> alive_ = std::make_shared<char>();
};

}  // namespace dist::agent::warm
