// The hang detector's arithmetic on its own: step times and their percentiles from slot readings,
// the hang timeout each rule gives, steps per second and work per step over the rate window, and
// the straggler watch's flag and clear.
#include "health/step_stats.h"

#include <gtest/gtest.h>

#include <functional>

namespace dist::agent {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;

constexpr std::uint64_t kSecond = 1'000'000'000;

// A reading taken at `at_s` seconds of a worker that made `steps` steps, its last at `step_s`.
SlotReading reading(double at_s, std::uint64_t steps, double step_s, std::uint64_t work_ns = 0) {
  SlotReading r;
  r.at = nanoseconds(static_cast<std::int64_t>(at_s * 1e9));
  r.steps = steps;
  r.last_step_ns = step_s > 0 ? static_cast<std::uint64_t>(step_s * 1e9) : 0;
  r.work_ns = work_ns;
  return r;
}

// A history fed one reading a second, a step every `step_s` seconds, for `readings` seconds.
StepHistory steady(double step_s, int readings) {
  StepHistory h;
  for (int i = 1; i <= readings; ++i) {
    const auto steps = static_cast<std::uint64_t>(i / step_s);
    h.add(reading(i, steps, static_cast<double>(steps) * step_s, steps * kSecond / 100));
  }
  return h;
}

TEST(StepHistory, NothingIsKnownBeforeTheSecondStep) {
  StepHistory h;
  h.add(reading(1, 0, 0));
  EXPECT_FALSE(h.step_seconds_p50());
  EXPECT_FALSE(h.steps_per_second());
  EXPECT_FALSE(h.hang_timeout({}));
  EXPECT_FALSE(h.hang_timeout({milliseconds(3000), false})) << "no progress yet: nothing to time";
  h.add(reading(2, 1, 1.5));
  EXPECT_FALSE(h.step_seconds_p50()) << "the first step carries the start-up: not a step time";
}

TEST(StepHistory, StepTimesShareTheSpanOfTheStepsBetweenTwoReadings) {
  StepHistory h;
  h.add(reading(1, 1, 0.9));
  h.add(reading(2, 5, 1.9));  // 4 steps in 1 s
  ASSERT_TRUE(h.step_seconds_p50());
  EXPECT_DOUBLE_EQ(*h.step_seconds_p50(), 0.25);
  h.add(reading(3, 5, 1.9));  // no step: nothing added
  h.add(reading(4, 6, 3.9));  // one step of 2 s
  EXPECT_DOUBLE_EQ(*h.step_seconds_p50(), 0.25);
  EXPECT_DOUBLE_EQ(*h.step_seconds_p99(), 2.0);
}

TEST(StepHistory, TheAutomaticTimeoutIsTenTimesTheP99AtLeastThirtySeconds) {
  const StepHistory fast = steady(0.1, 20);
  ASSERT_TRUE(fast.hang_timeout({}));
  EXPECT_EQ(*fast.hang_timeout({}), kMinHangTimeout) << "10 x 0.1 s is under the floor";

  const StepHistory slow = steady(5, 60);  // a step every 5 s: 12 steps
  ASSERT_TRUE(slow.hang_timeout({}));
  EXPECT_NEAR(std::chrono::duration<double>(*slow.hang_timeout({})).count(), 50.0, 1e-6);
}

// A 45 s checkpoint between two steps (torch.save seen at the readings meanwhile), or a pause the
// worker declared, is no step's time: the automatic timeout stays 30 s, not 450 s. The same 45 s
// with nothing of its own seen is a step that long (10 x it).
TEST(StepHistory, ACheckpointOrADeclaredPauseIsNoStepsTime) {
  namespace slot = worker_contract::heartbeat_slot;
  const auto after_a_gap = [](const std::function<void(SlotReading&, int)>& during,
                              const std::function<void(SlotReading&)>& at_the_step) {
    StepHistory h = steady(0.1, 20);  // 200 steps, the last at 20 s
    for (int t = 21; t <= 65; ++t) {
      SlotReading r = reading(t, 200, 20.0);
      during(r, t);
      h.add(r);
    }
    SlotReading r = reading(66, 201, 65.5);
    at_the_step(r);
    h.add(r);
    h.add(reading(67, 211, 66.5));
    return std::chrono::duration<double>(*h.hang_timeout({})).count();
  };
  const auto none = [](SlotReading&) {};
  EXPECT_NEAR(after_a_gap([](SlotReading&, int) {}, none), 455.0, 1e-6) << "a 45.5 s step";
  EXPECT_NEAR(after_a_gap([](SlotReading& r, int) { r.activity = slot::kActivitySave; }, none),
              30.0, 1e-6);
  EXPECT_NEAR(after_a_gap(
                  [](SlotReading& r, int t) {
                    if (t == 40) r.activity = slot::kActivityCheckpoint;  // seen once is enough
                  },
                  none),
              30.0, 1e-6);
  const auto paused = [](SlotReading& r, int) { r.paused_since_ns = 21 * kSecond; };
  const auto resumed = [](SlotReading& r) { r.resumed_ns = 65 * kSecond; };
  EXPECT_NEAR(after_a_gap(paused, resumed), 30.0, 1e-6);
  // A pause too short for any reading to see it while it lasted: its end says it.
  EXPECT_NEAR(after_a_gap([](SlotReading&, int) {}, resumed), 30.0, 1e-6);

  // Steps of 5 s that each load a shard (torch.load seen at every reading): their time is the
  // steps', 10 x 5 s, not the floor.
  StepHistory loads;
  for (int i = 1; i <= 60; ++i) {
    const auto steps = static_cast<std::uint64_t>(i / 5);
    SlotReading r = reading(i, steps, static_cast<double>(steps) * 5);
    r.activity = slot::kActivitySave;
    loads.add(r);
  }
  EXPECT_NEAR(std::chrono::duration<double>(*loads.hang_timeout({})).count(), 50.0, 1e-6);
}

TEST(StepHistory, BeforeFiveStepsTheAutomaticTimeoutIsFiveMinutes) {
  const StepHistory h = steady(1, 4);  // 4 steps
  ASSERT_TRUE(h.hang_timeout({})) << "a job stuck at its second step is looked at too";
  EXPECT_EQ(*h.hang_timeout({}), kEarlyHangTimeout) << "4 steps are too few to know a step's time";
  EXPECT_EQ(*h.hang_timeout({milliseconds(3000), false}), milliseconds(3000))
      << "a fixed timeout counts from the first step";
  EXPECT_FALSE(h.hang_timeout({std::nullopt, true})) << "off is off";
}

TEST(StepHistory, StepsFasterThanTheReadingsGetTheFloor) {
  StepHistory h;
  h.add(reading(1, 0, 0));
  h.add(reading(2, 9, 1.8));  // 9 steps between two readings, then none
  EXPECT_FALSE(h.step_seconds_p99());
  ASSERT_TRUE(h.hang_timeout({}));
  EXPECT_EQ(*h.hang_timeout({}), kMinHangTimeout);
}

TEST(StepHistory, RatesAreOverTheLastTenSeconds) {
  StepHistory h;
  // 100 steps in the first 5 s, then 1 step a second.
  for (int i = 1; i <= 5; ++i) h.add(reading(i, 20U * i, i, 20ULL * i * kSecond / 1000));
  for (int i = 6; i <= 30; ++i)
    h.add(reading(i, 100 + (i - 5), i, (100ULL + (i - 5)) * kSecond / 1000));
  ASSERT_TRUE(h.steps_per_second());
  EXPECT_NEAR(*h.steps_per_second(), 1.0, 0.15) << "the burst left the window";
  ASSERT_TRUE(h.work_seconds_per_step());
  EXPECT_NEAR(*h.work_seconds_per_step(), 0.001, 1e-9);
}

TEST(StepHistory, ANewWorkerInTheSlotStartsAfresh) {
  StepHistory h = steady(0.1, 20);
  ASSERT_TRUE(h.step_seconds_p50());
  h.add(reading(21, 1, 20.5));  // the restarted worker's first step
  EXPECT_FALSE(h.step_seconds_p50());
  EXPECT_EQ(h.last().steps, 1U);
}

TEST(StepHistory, AReadingThatCarriesALongPauseIsNotTheWorkPerStep) {
  // 10 steps a second, 20 ms of work each; then the rank pauses 30 s on its own (a checkpoint)
  // and trains on: the reading after the pause holds 30 s of work for its steps.
  StepHistory h;
  std::uint64_t steps = 0, work = 0;
  double t = 0;
  const auto next = [&](double seconds, std::uint64_t work_ns) {
    t += seconds;
    steps += 10;
    work += work_ns;
    h.add(reading(t, steps, t, work));
  };
  for (int i = 0; i < 5; ++i) next(1, 200 * kSecond / 1000);
  next(30, 30 * kSecond + 200 * kSecond / 1000);
  for (int i = 0; i < 4; ++i) next(1, 200 * kSecond / 1000);
  ASSERT_TRUE(h.work_seconds_per_step());
  EXPECT_NEAR(*h.work_seconds_per_step(), 0.02, 1e-9);
}

TEST(StepHistory, AMeasureAPauseFrozeIsNotARecentOne) {
  StepHistory h;
  for (int i = 1; i <= 5; ++i) h.add(reading(i, 10U * i, i, 200ULL * i * kSecond / 1000));
  ASSERT_TRUE(h.recent_work_seconds_per_step(nanoseconds(0)));
  h.add(reading(6, 50, 5, kSecond));  // a pause: no step since the last reading
  EXPECT_TRUE(h.work_seconds_per_step()) << "the window still holds the steps before it";
  EXPECT_FALSE(h.recent_work_seconds_per_step(nanoseconds(0)));
  EXPECT_TRUE(h.recent_work_seconds_per_step(std::chrono::seconds(5)));
  h.add(reading(12, 50, 5, kSecond));
  EXPECT_FALSE(h.recent_work_seconds_per_step(std::chrono::seconds(5)));
}

// Two ranks train with rank 1 measured 1.5x rank 0 for fewer readings than it takes to flag it
// (a loaded machine's few seconds), then both wait (rank 1 pauses, rank 0 waits for it): the
// frozen measures are not counted once a second until they flag it.
TEST(StragglerWatch, AMeasureFrozenByAPauseDoesNotFlag) {
  StepHistory fast, slow;
  std::uint64_t steps = 0, fast_work = 0, slow_work = 0;
  double t = 0;
  StragglerWatch watch;
  const auto second = [&](bool stepping) {
    t += 1;
    if (stepping) {
      steps += 10;
      fast_work += 200 * kSecond / 1000;
      slow_work += 300 * kSecond / 1000;
    }
    fast.add(reading(t, steps, t, fast_work));
    slow.add(reading(t, steps, t, slow_work));
    return watch.update({{0, fast.recent_work_seconds_per_step(nanoseconds(0))},
                         {1, slow.recent_work_seconds_per_step(nanoseconds(0))}});
  };
  // Measures from the fourth reading on (three that saw steps): three of the five it takes.
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(second(true).empty());
  ASSERT_TRUE(watch.ratio(1));
  EXPECT_NEAR(*watch.ratio(1), 1.5, 1e-9);
  for (int i = 0; i < 9; ++i) EXPECT_TRUE(second(false).empty()) << "second " << t;
  EXPECT_FALSE(watch.straggler(1));
  // Stepping again at 1.5x: new measures, and those flag it.
  bool flagged = false;
  for (int i = 0; i < 5 && !flagged; ++i) flagged = !second(true).empty();
  EXPECT_TRUE(flagged);
  EXPECT_TRUE(watch.straggler(1));
}

// A worker that steps 10 times a second: its main thread ran `ran_ms` and waited for a CPU
// `waited_ms` of each second, and measured its work as `work_ms` a second.
StepHistory crowded(double ran_ms, double waited_ms, double work_ms, int readings = 10) {
  StepHistory h;
  for (int i = 1; i <= readings; ++i) {
    SlotReading r = reading(i, 10U * static_cast<std::uint64_t>(i), i,
                            static_cast<std::uint64_t>(i * work_ms * 1e6));
    r.on_cpu_ns = static_cast<std::uint64_t>(i * ran_ms * 1e6);
    r.run_queue_ns = static_cast<std::uint64_t>(i * waited_ms * 1e6);
    h.add(r);
  }
  return h;
}

TEST(StepHistory, TheShareOfTheTimeItCouldRunThatItWaitedForACpu) {
  const StepHistory h = crowded(250, 750, 600);
  ASSERT_TRUE(h.cpu_wait_share());
  EXPECT_NEAR(*h.cpu_wait_share(), 0.75, 1e-9);
  EXPECT_NEAR(*h.work_seconds_per_step(), 0.06, 1e-9) << "the work is the worker's measure";
  EXPECT_FALSE(crowded(250, 750, 600, 3).cpu_wait_share()) << "two readings that saw steps";
  EXPECT_DOUBLE_EQ(*crowded(0, 0, 600).cpu_wait_share(), 0) << "a kernel without the counts";
  // A thread that mostly sleeps waits a moment at each wake-up, as long as it then runs (half the
  // time it could run), on an idle machine too: a share of half the wall-clock time.
  EXPECT_NEAR(*crowded(10, 10, 30).cpu_wait_share(), 0.02, 1e-9);
  // A main thread that waits for its process's own threads part of the time (torch 2's, for
  // gloo's): of the time it could run, not of the wall-clock time.
  EXPECT_NEAR(*crowded(170, 560, 600).cpu_wait_share(), 560.0 / 730, 1e-9);
}

TEST(StepHistory, NoWorkMeasuredIsNoWorkPerStep) {
  StepHistory h;
  h.add(reading(1, 10, 1));
  h.add(reading(2, 20, 2));
  EXPECT_FALSE(h.work_seconds_per_step());
  EXPECT_TRUE(h.steps_per_second());
}

TEST(SlotReading, ProgressIsTheLaterOfTheLastStepAndBeat) {
  SlotReading r;
  EXPECT_FALSE(r.last_progress());
  r.last_beat_ns = 7;
  EXPECT_EQ(*r.last_progress(), nanoseconds(7));
  r.last_step_ns = 5;
  EXPECT_EQ(*r.last_progress(), nanoseconds(7));
  r.last_step_ns = 9;
  EXPECT_EQ(*r.last_progress(), nanoseconds(9));
}

std::map<int, std::optional<double>> times(double r0, double r1, double r2, double r3) {
  return {{0, r0}, {1, r1}, {2, r2}, {3, r3}};
}

TEST(StragglerWatch, ARankSlowerByAFifthFiveTimesRunningIsFlagged) {
  StragglerWatch w;
  for (int i = 0; i < StragglerWatch::kFlagAfter - 1; ++i) {
    EXPECT_TRUE(w.update(times(0.1, 0.1, 0.1, 0.13)).empty());
  }
  const auto changes = w.update(times(0.1, 0.1, 0.1, 0.13));
  ASSERT_EQ(changes.size(), 1U);
  EXPECT_EQ(changes[0].rank, 3);
  EXPECT_TRUE(changes[0].straggler);
  EXPECT_NEAR(changes[0].ratio, 1.3, 1e-9);
  EXPECT_TRUE(w.straggler(3));
  EXPECT_FALSE(w.straggler(0));
  EXPECT_TRUE(w.update(times(0.1, 0.1, 0.1, 0.13)).empty()) << "flagged once, not again";
}

TEST(StragglerWatch, AHiccupIsNotAStragglerAndAFlagDoesNotFlicker) {
  StragglerWatch w;
  for (int round = 0; round < 10; ++round) {
    for (int i = 0; i < StragglerWatch::kFlagAfter - 1; ++i) w.update(times(0.1, 0.2, 0.1, 0.1));
    w.update(times(0.1, 0.1, 0.1, 0.1));  // back in line before the fifth
  }
  EXPECT_FALSE(w.straggler(1));

  for (int i = 0; i < StragglerWatch::kFlagAfter; ++i) w.update(times(0.1, 0.2, 0.1, 0.1));
  ASSERT_TRUE(w.straggler(1));
  for (int i = 0; i < StragglerWatch::kClearAfter - 1; ++i) {
    EXPECT_TRUE(w.update(times(0.1, 0.105, 0.1, 0.1)).empty());
  }
  w.update(times(0.1, 0.115, 0.1, 0.1));  // between the margins: the clear count starts again
  EXPECT_TRUE(w.straggler(1));
  for (int i = 0; i < StragglerWatch::kClearAfter - 1; ++i) w.update(times(0.1, 0.1, 0.1, 0.1));
  const auto cleared = w.update(times(0.1, 0.1, 0.1, 0.1));
  ASSERT_EQ(cleared.size(), 1U);
  EXPECT_FALSE(cleared[0].straggler);
  EXPECT_FALSE(w.straggler(1));
}

TEST(StragglerWatch, TheMedianLeavesTheRankItselfOutAndTwoRanksCompare) {
  StragglerWatch w;
  for (int i = 0; i < StragglerWatch::kFlagAfter; ++i) w.update({{0, 0.1}, {1, 0.3}});
  EXPECT_TRUE(w.straggler(1));
  EXPECT_FALSE(w.straggler(0)) << "rank 0 against rank 1 alone: faster";
  EXPECT_NEAR(*w.ratio(0), 1.0 / 3, 1e-9);
}

TEST(StragglerWatch, AnUnmeasuredRankKeepsItsCounts) {
  StragglerWatch w;
  for (int i = 0; i < StragglerWatch::kFlagAfter - 1; ++i) w.update({{0, 0.1}, {1, 0.3}});
  w.update({{0, 0.1}, {1, std::nullopt}});
  EXPECT_FALSE(w.ratio(1));
  w.update({{0, 0.1}, {1, 0.3}});
  EXPECT_TRUE(w.straggler(1)) << "a reading without a figure neither counts nor resets";
  w.update({{0, std::nullopt}});
  EXPECT_TRUE(w.update({{0, 0.1}}).empty()) << "alone: no one to compare with";
}

}  // namespace
}  // namespace dist::agent
