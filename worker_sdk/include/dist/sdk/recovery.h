// In-place recovery around a training loop, for jobs run with dist-launch --restart-policy
// in-place: when a worker fails, the agent replaces it alone; the survivors' collective fails at
// once (the peer's sockets close), they wait for the agent's new generation of the group, rebuild
// the group with the replacement, and every rank takes the state of the most senior survivor (the
// lowest rank that kept its state) by broadcast, not from disk. The unit of work that was in
// flight is run again from that state, so training ends with the weights of a run that never
// failed. Under --restart-policy group (or without dist-launch) a failed collective is rethrown,
// as without this helper.
//
//   auto dist = dist::sdk::init();
//   Model model(seed);                      // every rank builds its state as usual
//   std::uint64_t step = 0;
//   std::optional<dist::sdk::DistributedDataParallel> ddp;
//   dist::sdk::InPlaceRecovery recovery(dist);
//   recovery.state().add("w", std::span<float>(model.w));   // ... every tensor, the optimizer's
//   recovery.state().add("step", step);                     // state, counters (sampler position)
//   recovery.on_group([&](dist::sdk::ProcessGroup& g) { ddp.emplace(g, model.parameters()); },
//                     [&] { ddp.reset(); });                // what depends on the group
//   recovery.start();                       // a replacement receives the survivors' state here
//   while (step < total_steps) recovery.run([&] { train_step(*ddp); ++step; });
//
// The contract that makes a unit safe to run again: a unit changes the registered state only
// after its last collective (DDP: backward, synchronize(), then the optimizer step and the
// counters), and what the loop does next follows from the registered state alone (the step
// counter gives the epoch and the sampler's position). Then a unit that failed left its rank's
// state as it was before the unit, and every rank goes on from the root's, which is either that
// or the state after the unit (the root completed it): both are states of an uninterrupted run.
//
// A peer that goes silent without closing its connections (its host lost or cut off) fails no
// collective: the survivors' collectives would wait for it until the group's timeout. The agents
// find such a node lost and regroup the job without it; the agent asks its workers to regroup
// (the progress slot's regroup_round), and a thread of this class that watches for that request
// aborts the group (ProcessGroup::abort) once it stood kAbortGrace without this rank following
// it, so that the collective in flight fails and the rank recovers into the next generation.
//
// The store keys and the variables are the worker contract's (dist/contract/worker_contract.h).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "dist/sdk/init.h"
#include "dist/sdk/process_group.h"
#include "dist/store/client.h"

namespace dist::sdk {

// What a replacement receives: named buffers of a fixed size (tensors, optimizer state,
// counters) and named blobs of any size, the same names in the same order on every rank. The
// buffers are the caller's: they must outlive the recovery. Blobs are the state of what depends on
// the group (DistributedDataParallel::state()): a survivor reads them (`get`) before `release`
// destroys their owner, and every rank applies the root's (`set`) after `build` made it again.
class RecoverableState {
 public:
  void add(std::string name, std::span<float> values);
  void add(std::string name, std::span<double> values);
  void add(std::string name, std::uint64_t& counter);
  void add(std::string name, std::int64_t& counter);
  void add(std::string name, float& value);
  // Bytes: `get` before the group is released (on every survivor), `set` after it was built again
  // (on every rank, with the root's).
  void add_blob(std::string name, std::function<std::string()> get,
                std::function<void(const std::string&)> set);

  // The counters as "name=value ..." (the agent's event log shows them).
  std::string describe_counters() const;

 private:
  friend class InPlaceRecovery;
  struct Item {
    std::string name;
    void* data = nullptr;  // fixed-size items
    std::size_t bytes = 0;
    bool counter = false;
    std::function<std::string()> get;  // blobs
    std::function<void(const std::string&)> set;
    std::string blob;  // captured, or received
  };
  void capture_blobs();
  void apply_blobs();
  std::string serialize() const;
  void deserialize(const std::string& bytes);
  std::uint64_t layout_hash() const;
  std::vector<Item> items_;
};

struct RecoveryOptions {
  // How long a survivor waits for the agent's new generation after its collective failed: the
  // agent publishes it as soon as it reaps the failed worker (or, a node lost, once the nodes
  // regrouped, which may wait for a relaunched node), within its --in-place-timeout, or stops
  // every worker (a group restart) instead. Past it, the collective's error is rethrown. None:
  // twice the agent's --in-place-timeout (WorkerEnv::in_place_timeout) and a minute more.
  std::optional<std::chrono::milliseconds> generation_timeout;
  // Building generation g's group and receiving the state, each bounded by this. None: the
  // agent's --in-place-timeout (WorkerEnv::in_place_timeout), past which it restarts the group.
  std::optional<std::chrono::milliseconds> group_timeout;
  Backend backend = Backend::kGloo;
};

class InPlaceRecovery {
 public:
  // `dist` is init()'s result: its group is replaced at each recovery (dist.group always holds
  // the current one; use it, but leave replacing or resetting it to this object while it lives:
  // its watcher may abort it from another thread). Connects a store client of its own when the
  // job is in-place.
  explicit InPlaceRecovery(Distributed& dist, RecoveryOptions options = {});
  ~InPlaceRecovery();
  InPlaceRecovery(const InPlaceRecovery&) = delete;
  InPlaceRecovery& operator=(const InPlaceRecovery&) = delete;

  RecoverableState& state() { return state_; }
  // `build` makes what depends on the group (DDP), `release` destroys it before the group goes.
  void on_group(std::function<void(ProcessGroup&)> build, std::function<void()> release);

  // Once, after the state is registered: a replacement (DIST_LAUNCH_GENERATION > 0) receives the
  // survivors' state; then `build` runs on every rank.
  void start();
  // Runs `unit`. True when it completed; false when a peer failed during it and the group was
  // recovered instead: the state is now the root's, so let the loop decide what runs next (the
  // same unit, usually). Rethrows CollectiveError when the job is not in-place, or no new
  // generation came. Before the unit, when the agent asked the workers to regroup (a node joins
  // the job: the progress slot's regroup_round), the group is recovered instead of running it,
  // in the new world, with the newcomers' workers, and it returns false.
  bool run(const std::function<void()>& unit);

  bool enabled() const { return dist_.env.in_place; }
  int generation() const { return generation_; }
  // Whether the agent asked the workers to regroup (a node joins) and this rank has not yet: the
  // next run() recovers first. A loop about to end may end instead (every rank alike): the
  // agents then tell the newcomers the job finished.
  bool regroup_asked() const;
  // The rank whose state every rank took at the last recovery (-1: none yet).
  int last_root() const { return last_root_; }

  // How long a request to regroup may stand, this rank still in its group, before the watcher
  // aborts the group: a unit in flight may end on its own meanwhile (peers that let go of the
  // group first fail its collectives anyway).
  static constexpr std::chrono::milliseconds kAbortGrace{500};

 private:
  struct Recovering;
  void watch();
  void stop_watching();
  // The group (under group_mutex_, which the watcher's abort takes too).
  void replace_group(std::unique_ptr<ProcessGroup> group);
  void recover(const CollectiveError& error);
  void regroup();
  // After the failure or the regroup (`since`, for the log; `what`, said first): the agent's next
  // generation, this rank's place in it, the group rebuilt and the root's state. `cause` starts
  // its errors.
  void join_next_generation(std::chrono::steady_clock::time_point began, const std::string& since,
                            const std::string& cause, const std::string& what);
  void forget_generation_keys();
  void release_group();
  void take_new_rank(int generation);
  void say_follows_folds();
  std::chrono::milliseconds generation_timeout() const;  // RecoveryOptions'
  void settle_in(int generation, bool built);
  void rebuild_group(int generation);
  void synchronize_state();

  Distributed& dist_;
  RecoveryOptions options_;
  RecoverableState state_;
  std::function<void(ProcessGroup&)> build_;
  std::function<void()> release_;
  std::unique_ptr<store::StoreClient> store_;  // in-place jobs: the generation keys
  std::string prefix_;                         // their prefix
  int generation_ = 0;
  bool has_state_ = true;  // false for a replacement until it received the root's
  int last_root_ = -1;
  // The last round the job regrouped in that this rank followed.
  std::atomic<std::uint32_t> regroup_seen_{0};
  std::atomic<bool> recovering_{false};          // the group is being released or rebuilt
  std::atomic<std::uint32_t> aborted_round_{0};  // the watcher aborted the group for it
  std::mutex group_mutex_;                       // dist_.group replaced, or aborted
  std::mutex watch_mutex_;
  std::condition_variable watch_wake_;
  bool stopping_ = false;  // under watch_mutex_
  std::thread watcher_;    // in-place jobs under dist-launch (a progress slot)
};

}  // namespace dist::sdk
