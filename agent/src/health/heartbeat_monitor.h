// The hang watchdog's channel for C++ workers (--worker-heartbeat-timeout): each worker gets one
// page of shared memory, a memfd it inherits, named in its environment (dist/sdk/heartbeat.h); the
// SDK's heartbeat() stores the CLOCK_MONOTONIC time of each beat there.
//
// Why shared memory, and not a pipe or the file timer's pipe: a beat costs the worker a clock read
// and a store, no system call, and nothing can make it block (a pipe fills when the agent lags, and
// each request on the timer pipe is an open, a write and a close). The agent reads a slot only when
// its deadline comes due, last beat + timeout: one wakeup per timeout per worker, and a silence is
// seen at the moment it reaches the timeout, not at the next poll. A memfd has no name, so nothing
// is left behind whoever dies first.
//
// A worker is watched from its first beat: one that never calls heartbeat() (a Python worker, a
// program without the SDK) is never taken for hung.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace dist::worker_contract::heartbeat_slot {
struct Slot;
}

namespace dist::agent {

class HeartbeatMonitor {
 public:
  // on_silent(local_rank, silent_for): the worker beat, then stayed silent for `timeout`; it is
  // no longer watched. A zero timeout: the beats are only read (silence(), beats()).
  HeartbeatMonitor(boost::asio::io_context& io, std::chrono::nanoseconds timeout,
                   std::function<void(int, std::chrono::nanoseconds)> on_silent);
  ~HeartbeatMonitor();
  HeartbeatMonitor(const HeartbeatMonitor&) = delete;
  HeartbeatMonitor& operator=(const HeartbeatMonitor&) = delete;

  // A fresh slot for local rank `local_rank`, about to start: the descriptor its worker must
  // inherit (close-on-exec here; the spawn clears that for this worker only). Throws
  // std::runtime_error when the kernel gives no memfd.
  int open(int local_rank);
  // The worker started: the agent's descriptor is closed, the slot watched until forget().
  void watch(int local_rank);
  void forget(int local_rank);
  void forget_all();

  std::chrono::nanoseconds timeout() const { return timeout_; }
  // Since the last beat; none before the first (or without a slot).
  std::optional<std::chrono::nanoseconds> silence(int local_rank) const;
  std::uint64_t beats(int local_rank) const;
  // The slot itself, for the hang detector's readings; null without one.
  const worker_contract::heartbeat_slot::Slot* slot(int local_rank) const;
  // --restart-policy in-place: tells every worker with a slot that the job regroups in `round`
  // (the slot's regroup_round: the SDK recovers at its next unit of work).
  void ask_to_regroup(int round);
  // Asks the worker for its stacks (the slot's stacks_asked); false without a slot.
  bool ask_for_stacks(int local_rank);

 private:
  struct Watched {
    worker_contract::heartbeat_slot::Slot* slot = nullptr;
    int fd = -1;
    std::unique_ptr<boost::asio::steady_timer> deadline;
  };
  void arm(int local_rank, std::chrono::nanoseconds after);
  void check(int local_rank);
  void release(Watched& w);

  boost::asio::io_context& io_;
  std::chrono::nanoseconds timeout_;
  std::function<void(int, std::chrono::nanoseconds)> on_silent_;
  std::vector<Watched> slots_;  // by local rank
  std::shared_ptr<char> alive_ = std::make_shared<char>();
};

}  // namespace dist::agent
