// Which stop signal is a second request (the workers killed at once) and which is the first one
// again: a wrapper passing on the terminal's Ctrl-C, or GNU timeout signalling its child and then
// its process group.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>

#include "dist/agent/signals.h"

namespace dist::agent {
namespace {

using namespace std::chrono_literals;

StopSignal at(int signal, pid_t sender, int code, std::chrono::milliseconds after) {
  return {signal, sender, code, std::chrono::steady_clock::time_point{} + after};
}

TEST(StopSignals, TheTerminalsCtrlCPassedOnByAWrapperIsTheSameStop) {
  const StopSignal terminal = at(SIGINT, 0, SI_KERNEL, 0ms);
  EXPECT_TRUE(is_passed_on(terminal, at(SIGINT, 4242, SI_USER, 3ms)));
  EXPECT_TRUE(is_passed_on(at(SIGINT, 4242, SI_USER, 0ms), at(SIGINT, 0, SI_KERNEL, 2ms)));
  EXPECT_FALSE(is_passed_on(terminal, at(SIGINT, 4242, SI_USER, kPassedOnStopWindow)))
      << "past the window it is asked again";
  EXPECT_FALSE(is_passed_on(terminal, at(SIGTERM, 4242, SI_USER, 3ms))) << "another signal";
}

TEST(StopSignals, OneSendersBurstIsOneStopAndItsLaterSignalASecondRequest) {
  const StopSignal first = at(SIGTERM, 4242, SI_USER, 0ms);
  EXPECT_TRUE(is_passed_on(first, at(SIGTERM, 4242, SI_USER, 1ms)));  // timeout: child, group
  EXPECT_FALSE(is_passed_on(first, at(SIGTERM, 4242, SI_USER, kSameSenderStopWindow)));
  // A person's second Ctrl-C: the terminal again, later.
  EXPECT_FALSE(is_passed_on(at(SIGINT, 0, SI_KERNEL, 0ms), at(SIGINT, 0, SI_KERNEL, 400ms)));
}

}  // namespace
}  // namespace dist::agent
