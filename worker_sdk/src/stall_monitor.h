// A watchdog's watchdog (torch's HeartbeatMonitor): the watched thread calls beat() as it makes
// progress; when no beat came for `timeout`, the monitor's own thread calls on_stall once, with
// how long it has been. It never touches what the watched thread does (CUDA, NCCL), so a thread
// stuck in the driver cannot stop it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace dist::sdk::detail {

class StallMonitor {
 public:
  using OnStall = std::function<void(std::chrono::milliseconds silent_for)>;
  // Checks every timeout / 8 (at least 1 ms, at most 10 s). A zero timeout watches nothing.
  StallMonitor(std::chrono::milliseconds timeout, OnStall on_stall);
  ~StallMonitor();  // stops the monitor (no more on_stall once this returns)
  StallMonitor(const StallMonitor&) = delete;
  StallMonitor& operator=(const StallMonitor&) = delete;

  void beat() { last_beat_.store(now_ticks(), std::memory_order_relaxed); }

 private:
  static std::int64_t now_ticks() {
    return std::chrono::steady_clock::now().time_since_epoch().count();
  }
  void run();

  std::chrono::milliseconds timeout_;
  OnStall on_stall_;
  std::atomic<std::int64_t> last_beat_{now_ticks()};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace dist::sdk::detail
