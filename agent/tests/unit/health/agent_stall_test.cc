// The agent's own stalls (health/agent_stall.h): late timers noted once per stall, the time of a
// span the agent was stalled, and the tick that lets any handler see a stall first. The record is
// the process's: each test works at times of its own, far from the others' and from now.
#include "health/agent_stall.h"

#include <gtest/gtest.h>

#include <chrono>

namespace dist::agent {
namespace {

using namespace std::chrono_literals;
using std::chrono::nanoseconds;

TEST(AgentStall, ALateTimerIsAStallAndOnlyItsTimeIsNotCounted) {
  const nanoseconds b = 1'000'000s;
  EXPECT_FALSE(agent_stalled(b, b + 4s)) << "late, but less than kAgentStall";
  EXPECT_TRUE(agent_stalled(b, b + 10s));
  EXPECT_EQ(agent_stalled_between(b - 5s, b + 12s), 10s);
  EXPECT_EQ(ran_since(b - 5s, b + 12s), 7s);
  EXPECT_EQ(agent_stalled_between(b + 2s, b + 4s), 2s) << "a part of it";
  EXPECT_EQ(agent_stalled_between(b + 11s, b + 20s), 0s);
  // Another timer due within the stall, seen as it ends: the same stall, not one more.
  EXPECT_TRUE(agent_stalled(b + 3s, b + 10s + 500ms));
  EXPECT_EQ(agent_stalled_between(b, b + 20s), 10s + 500ms);
  // A later one is a stall of its own.
  EXPECT_TRUE(agent_stalled(b + 30s, b + 36s));
  EXPECT_EQ(agent_stalled_between(b, b + 40s), 16s + 500ms);
}

TEST(AgentStall, WhatIsReadJustAfterAStallCountsFromItsStart) {
  const nanoseconds b = 2'000'000s;
  ASSERT_TRUE(agent_stalled(b, b + 8s));
  EXPECT_EQ(unwatched_since(b + 8s + 500ms), b);
  EXPECT_EQ(unwatched_since(b + 10s), b + 10s);
}

TEST(AgentStall, AnOverdueTickIsAStallSeenByWhicheverHandlerRunsFirst) {
  const nanoseconds b = 3'000'000s;
  expect_tick(b);
  EXPECT_FALSE(stall_seen_now(b + 3s));
  EXPECT_TRUE(stall_seen_now(b + 9s));
  EXPECT_EQ(agent_stalled_between(b, b + 9s), 9s);
  expect_tick(std::nullopt);  // no worker runs: no tick, so no stall to see
  EXPECT_FALSE(stall_seen_now(b + 100s));
}

TEST(AgentStall, TheLastSixteenStallsAreKept) {
  const nanoseconds b = 4'000'000s;
  for (int i = 0; i < 20; ++i) {
    const nanoseconds due = b + i * 100s;
    ASSERT_TRUE(agent_stalled(due, due + 6s));
  }
  EXPECT_EQ(agent_stalled_between(b, b + 2000s), 16 * 6s);
  EXPECT_EQ(agent_stalled_between(b, b + 400s), 0s) << "the first four are gone";
}

}  // namespace
}  // namespace dist::agent
