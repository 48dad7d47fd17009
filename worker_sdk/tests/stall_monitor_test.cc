// The NCCL watchdog's own watchdog, on a plain thread: it reports a thread that stopped beating,
// once, and never one that goes on.
#include "stall_monitor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

namespace dist::sdk::detail {
namespace {

using namespace std::chrono_literals;

TEST(StallMonitor, AThreadThatKeepsBeatingIsNeverReported) {
  std::atomic<int> stalls{0};
  StallMonitor monitor(2s, [&](std::chrono::milliseconds) { ++stalls; });
  const auto until = std::chrono::steady_clock::now() + 1s;
  while (std::chrono::steady_clock::now() < until) {
    monitor.beat();
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(stalls.load(), 0);
}

TEST(StallMonitor, AThreadThatStopsIsReportedOnceAfterTheTimeout) {
  std::atomic<int> stalls{0};
  std::promise<std::chrono::milliseconds> reported;
  const auto start = std::chrono::steady_clock::now();
  StallMonitor monitor(100ms, [&](std::chrono::milliseconds silent) {
    if (stalls++ == 0) reported.set_value(silent);
  });
  monitor.beat();  // then nothing
  auto silent = reported.get_future();
  ASSERT_EQ(silent.wait_for(30s), std::future_status::ready) << "never reported";
  EXPECT_GE(silent.get(), 100ms);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 100ms);
  std::this_thread::sleep_for(300ms);  // what a second report would need, three times over
  EXPECT_EQ(stalls.load(), 1);
}

TEST(StallMonitor, AStoppedMonitorNeverReports) {
  std::atomic<int> stalls{0};
  {
    StallMonitor monitor(10s, [&](std::chrono::milliseconds) { ++stalls; });
  }
  {
    StallMonitor unwatched(0ms, [&](std::chrono::milliseconds) { ++stalls; });
  }
  EXPECT_EQ(stalls.load(), 0);
}

}  // namespace
}  // namespace dist::sdk::detail
