#include "stall_monitor.h"

#include <algorithm>

namespace dist::sdk::detail {

StallMonitor::StallMonitor(std::chrono::milliseconds timeout, OnStall on_stall)
    : timeout_(timeout), on_stall_(std::move(on_stall)) {
  if (timeout_.count() > 0) thread_ = std::thread([this] { run(); });
}

StallMonitor::~StallMonitor() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void StallMonitor::run() {
  using namespace std::chrono;
  const auto period = std::clamp<milliseconds>(timeout_ / 8, milliseconds(1), seconds(10));
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, period, [this] { return stopping_; })) {
    const steady_clock::time_point last{
        steady_clock::duration(last_beat_.load(std::memory_order_relaxed))};
    const auto silent = duration_cast<milliseconds>(steady_clock::now() - last);
    if (silent >= timeout_) {
      lock.unlock();
      on_stall_(silent);
      return;  // once: what follows a stall is on_stall's to decide (exit, as a rule)
    }
  }
}

}  // namespace dist::sdk::detail
