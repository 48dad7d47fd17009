// The live view's pieces on their own: the progress a node publishes beside its heartbeat (its
// encoding, bounds and checked decoding), the ring of samples the status page plots, the recent
// events of its timeline, the status table's per-rank rows, and the page's embedding of its data.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dist/agent/job_status.h"
#include "dist/contract/worker_contract.h"
#include "health/progress_history.h"
#include "health/status_page.h"
#include "rendezvous/schema.h"

namespace dist::agent {
namespace {

using Json = nlohmann::json;

RankStatus stepping(int rank, std::uint64_t steps, double since_step) {
  RankStatus r;
  r.worker.rank = rank;
  r.worker.local_rank = rank;
  r.steps = steps;
  r.since_step_seconds = since_step;
  return r;
}

// ------------------------------------------------------------------------------------------------
// progress/<k>

TEST(NodeProgress, EveryFieldRoundTripsAndWhatIsAbsentStaysAbsent) {
  RankStatus full = stepping(3, 1200, 0.25);
  full.worker.local_rank = 1;
  full.steps_per_second = 9.87654;
  full.step_seconds = 0.1013;
  full.since_beat_seconds = 0.5;
  full.beats = 77;
  full.hang_timeout_seconds = 30;
  full.straggler = true;
  full.pending_collective = "all_reduce #12";
  full.suspect = true;
  full.paused = true;
  full.doing = "paused: checkpoint (for 40.0 s)";
  full.work_seconds = 0.0123456;
  RankStatus bare;  // a worker that reports nothing yet
  bare.worker.rank = 2;
  schema::BlockedRank blocked;
  blocked.rank = 3;
  blocked.groups = {{0xFFFF'FFFF'FFFF'FFF1ULL, 17}, {42, 3}};
  blocked.sizes = {{0xFFFF'FFFF'FFFF'FFF1ULL, 64}, {42, 2}};
  blocked.threads = true;
  blocked.group = 42;
  blocked.seq = 3;
  blocked.op = 5;
  blocked.seconds = 31.5;
  const schema::NodeProgress p{1'700'000'000.5, "running", {full, bare}, 0, {blocked}, 0};
  const std::string text = schema::encode(p);
  const auto back = schema::decode_node_progress("r0/progress/1", text);
  EXPECT_DOUBLE_EQ(back.time, 1'700'000'000.5);
  EXPECT_EQ(back.state, "running");
  ASSERT_EQ(back.ranks.size(), 2u);
  const RankStatus& f = back.ranks[0];
  EXPECT_EQ(f.worker.rank, 3);
  EXPECT_EQ(f.worker.local_rank, 1);
  EXPECT_EQ(f.steps, 1200u);
  EXPECT_DOUBLE_EQ(*f.steps_per_second, 9.877);  // milliseconds' precision is what travels
  EXPECT_DOUBLE_EQ(*f.step_seconds, 0.101);
  EXPECT_DOUBLE_EQ(*f.since_step_seconds, 0.25);
  EXPECT_DOUBLE_EQ(*f.since_beat_seconds, 0.5);
  EXPECT_EQ(f.beats, 77u);
  EXPECT_DOUBLE_EQ(*f.hang_timeout_seconds, 30);
  EXPECT_TRUE(f.straggler);
  EXPECT_EQ(f.pending_collective, "all_reduce #12");
  EXPECT_TRUE(f.suspect && f.paused);
  EXPECT_EQ(f.doing, "paused: checkpoint (for 40.0 s)");
  EXPECT_DOUBLE_EQ(*f.work_seconds, 0.01235) << "a time per step: four significant digits";
  ASSERT_EQ(back.blocked.size(), 1u);
  EXPECT_EQ(back.blocked[0].rank, 3);
  EXPECT_EQ(back.blocked[0].groups, blocked.groups) << "64-bit group ids travel whole";
  EXPECT_EQ(back.blocked[0].sizes, blocked.sizes);
  EXPECT_TRUE(back.blocked[0].threads);
  EXPECT_EQ(back.blocked[0].group, 42u);
  EXPECT_EQ(back.blocked[0].seq, 3u);
  EXPECT_EQ(back.blocked[0].op, 5u);
  EXPECT_DOUBLE_EQ(back.blocked[0].seconds, 31.5);
  const RankStatus& b = back.ranks[1];
  EXPECT_EQ(b.worker.rank, 2);
  EXPECT_FALSE(b.steps || b.steps_per_second || b.step_seconds || b.since_step_seconds ||
               b.since_beat_seconds || b.hang_timeout_seconds);
  EXPECT_FALSE(b.straggler);
  EXPECT_NE(text.find(R"({"r":2,"l":0})"), std::string::npos) << "absent fields left out: " << text;
}

// A slot whose times a worker wrote wrongly (its last step "in the future") gives negative
// durations: they are left out of what is published, which `dist-launch status` and the other
// nodes would otherwise refuse as a corrupted value, for the whole job.
TEST(NodeProgress, NegativeDurationsAreLeftOutNotPublishedForTheReaderToRefuse) {
  RankStatus odd;
  odd.worker.rank = 0;
  odd.steps = 5;
  odd.since_step_seconds = -9'223'369'086.844;
  odd.step_seconds = 0.2;
  odd.work_seconds = -1.0;
  const schema::NodeProgress p{1'700'000'000.5, "running", {odd}, 0, {}, 0};
  const auto back = schema::decode_node_progress("r0/progress/0", schema::encode(p));
  ASSERT_EQ(back.ranks.size(), 1u);
  EXPECT_FALSE(back.ranks[0].since_step_seconds.has_value());
  EXPECT_FALSE(back.ranks[0].work_seconds.has_value());
  EXPECT_DOUBLE_EQ(*back.ranks[0].step_seconds, 0.2);
}

TEST(NodeProgress, TheValueIsBoundedWhateverTheNodeRuns) {
  schema::NodeProgress p{1.0, std::string(500, 's'), {}, 0, {}, 0};
  for (int r = 0; r < 1000; ++r) {
    RankStatus w = stepping(r, 1'000'000'000'000ull, 123.456);
    w.steps_per_second = w.step_seconds = w.since_beat_seconds = w.hang_timeout_seconds = 1e6;
    w.beats = 1'000'000'000'000ull;
    w.straggler = true;
    w.pending_collective = std::string(1000, 'c');
    w.suspect = w.paused = true;
    w.doing = std::string(1000, 'd');
    w.work_seconds = 1e6;
    p.ranks.push_back(w);
    schema::BlockedRank b;
    b.rank = r;
    for (std::uint64_t g = 0; g < 1000; ++g) {
      b.groups.emplace_back(~g, ~0ULL);
      b.sizes[~g] = ~0U;
    }
    b.threads = true;
    b.group = b.seq = ~0ULL;
    b.op = ~0U;
    b.seconds = 1e9;
    p.blocked.push_back(b);
  }
  const std::string text = schema::encode(p);
  EXPECT_LT(text.size(), 48u * 1024) << "1,000 workers with every field at its longest";
  const auto back = schema::decode_node_progress("r0/progress/0", text);
  EXPECT_EQ(back.ranks.size(), schema::kMaxPublishedRanks);
  EXPECT_EQ(back.more, 1000 - schema::kMaxPublishedRanks);
  EXPECT_EQ(back.ranks[0].pending_collective.size(), schema::kMaxPublishedNameBytes);
  EXPECT_EQ(back.ranks[0].doing.size(), schema::kMaxPublishedDoingBytes);
  EXPECT_EQ(back.blocked.size(), schema::kMaxPublishedBlocked);
  EXPECT_EQ(back.blocked[0].groups.size(), schema::kMaxPublishedGroups);
  EXPECT_EQ(back.blocked[0].sizes.size(), schema::kMaxPublishedGroups) << "the groups published";
  EXPECT_EQ(back.blocked[0].sizes.count(back.blocked[0].groups[0].first), 1u);
  EXPECT_EQ(back.state.size(), schema::kMaxPublishedNameBytes);
}

TEST(JobView, NodeZeroMakesItFromEveryNodesProgressAndItRoundTrips) {
  RankStatus fast = stepping(0, 10, 0.1), slow = stepping(1, 10, 0.1), quiet = stepping(2, 0, 1);
  fast.work_seconds = 0.020;
  slow.work_seconds = 0.026;
  schema::BlockedRank b;
  b.rank = 1;
  b.groups = {{7, 12}};
  b.group = 7;
  b.seq = 12;
  b.op = 1;
  b.seconds = 20;
  schema::BlockedRank setup;  // waiting in its group's set-up
  setup.rank = 2;
  setup.op = static_cast<std::uint32_t>(worker_contract::heartbeat_slot::Collective::kSetup);
  setup.seconds = 5;
  const std::vector<schema::NodeProgress> nodes = {{100, "running", {slow}, 0, {b}, 0},
                                                   {100, "running", {fast, quiet}, 0, {setup}, 0}};
  const schema::JobView v = schema::make_job_view(nodes, 123.5);
  EXPECT_EQ(v.measured, 2u) << "a rank without a work measure is not counted";
  EXPECT_DOUBLE_EQ(v.median_work, 0.023);
  ASSERT_EQ(v.work.size(), 2u);
  EXPECT_EQ(v.work[0].first, 0) << "ascending by rank";
  const auto back = schema::decode_job_view("r3/view", schema::encode(v));
  EXPECT_DOUBLE_EQ(back.time, 123.5);
  EXPECT_EQ(back.measured, 2u);
  EXPECT_EQ(back.work, v.work);
  ASSERT_EQ(back.blocked.size(), 2u);
  EXPECT_EQ(back.blocked[0].groups, b.groups);
  EXPECT_TRUE(back.blocked[0].sizes.empty() && !back.blocked[0].threads);
  EXPECT_DOUBLE_EQ(back.blocked[0].seconds, 20) << "a collective wait as its node saw it";
  EXPECT_DOUBLE_EQ(back.blocked[1].seconds, 28.5) << "a set-up wait as of the view's time";
  for (const char* text :
       {"", "{}", R"({"t":1,"n":1,"m":0.1})", R"({"t":1,"n":1,"m":0.1,"w":[[-1,0.1]]})",
        R"({"t":1,"n":1,"m":0.1,"w":[],"b":[{"r":1}]})",
        R"({"t":1,"n":1,"m":0.1,"w":[],"b":[{"r":1,"g":[],"w":[0,1,1,2],"s":[[7]]}]})",
        R"({"t":1,"n":1,"m":0.1,"w":[],"b":[{"r":1,"g":[],"w":[0,1,1,2],"t":1}]})"}) {
    SCOPED_TRACE(text);
    EXPECT_THROW(schema::decode_job_view("r3/view", text), schema::CorruptValueError);
  }
}

// A rank may wait in a collective with a timeout longer than its group's (monitored_barrier's
// own argument), and the rank it waits for may be on another node: each node publishes the
// longest its ranks said, and the view carries the longest of all, which every node's hang bound
// reads. A value of an agent before it has none, and is no error.
TEST(JobView, TheLongestCollectiveTimeoutOfAnyNodeGoesThroughTheView) {
  const std::vector<schema::NodeProgress> nodes = {
      {100, "running", {stepping(0, 10, 0.1)}, 0, {}, 10'000},
      {100, "running", {stepping(1, 10, 0.1)}, 0, {}, 140'000},
      {100, "running", {stepping(2, 10, 0.1)}, 0, {}, 0}};
  const auto published = schema::decode_node_progress("r0/progress/1", schema::encode(nodes[1]));
  EXPECT_EQ(published.collective_timeout_ms, 140'000u);
  EXPECT_EQ(
      schema::decode_node_progress("r0/progress/2", schema::encode(nodes[2])).collective_timeout_ms,
      0u);
  const schema::JobView v = schema::make_job_view(nodes, 5);
  EXPECT_EQ(v.collective_timeout_ms, 140'000u);
  EXPECT_EQ(schema::decode_job_view("r0/view", schema::encode(v)).collective_timeout_ms, 140'000u);
  EXPECT_EQ(schema::decode_job_view("r0/view", R"({"t":1,"n":1,"m":0.1,"w":[[0,0.1]]})")
                .collective_timeout_ms,
            0u);
  EXPECT_THROW(schema::decode_job_view("r0/view", R"({"t":1,"n":1,"m":0.1,"w":[],"ct":-5})"),
               schema::CorruptValueError);
  EXPECT_THROW(
      schema::decode_node_progress("r0/progress/0", R"({"t":1,"st":"running","w":[],"ct":"x"})"),
      schema::CorruptValueError);
}

// Ranks publish the share of the time that they waited for a CPU: the view says
// the median, once most of the ranks with a work measure publish one, and round-trips it.
TEST(JobView, TheRanksWaitForCpusGoesThroughTheView) {
  std::vector<RankStatus> ranks;
  for (int r = 0; r < 3; ++r) {
    RankStatus s = stepping(r, 10, 0.1);
    s.work_seconds = 0.00142 + 0.0001 * r;  // 1.4 ms: published to 4 digits, not to 1 ms
    s.cpu_wait = 0.2 * r;                   // 0, 0.2, 0.4: the median 0.2
    ranks.push_back(s);
  }
  const std::vector<schema::NodeProgress> nodes = {{100, "running", ranks, 0, {}, 0}};
  const auto back = schema::decode_node_progress("r0/progress/0", schema::encode(nodes[0]));
  ASSERT_EQ(back.ranks.size(), 3u);
  ASSERT_TRUE(back.ranks[1].work_seconds);
  EXPECT_DOUBLE_EQ(*back.ranks[1].work_seconds, 0.00152);
  EXPECT_EQ(back.ranks[2].cpu_wait, ranks[2].cpu_wait);
  const schema::JobView v = schema::make_job_view(nodes, 5);
  ASSERT_TRUE(v.median_cpu_wait);
  EXPECT_DOUBLE_EQ(*v.median_cpu_wait, 0.2);
  const auto view = schema::decode_job_view("r0/view", schema::encode(v));
  EXPECT_EQ(view.median_cpu_wait, v.median_cpu_wait);
  ASSERT_EQ(view.work.size(), 3u);
  EXPECT_DOUBLE_EQ(view.work[0].second, 0.00142);
  // Two ranks of three that say none (agents before this, kernels without the counts): none.
  std::vector<RankStatus> few = ranks;
  few[0].cpu_wait.reset();
  few[1].cpu_wait.reset();
  EXPECT_FALSE(schema::make_job_view({{100, "running", few, 0, {}, 0}}, 5).median_cpu_wait);
  // A view from an agent before it: no share, and no error.
  const auto old = schema::decode_job_view("r0/view", R"({"t":1,"n":1,"m":0.1,"w":[[0,0.1]]})");
  EXPECT_FALSE(old.median_cpu_wait);
  EXPECT_THROW(schema::decode_job_view("r0/view", R"({"t":1,"n":1,"m":0.1,"w":[],"cw":"x"})"),
               schema::CorruptValueError);
}

TEST(JobView, TheViewOfAHugeJobIsBounded) {
  std::vector<schema::NodeProgress> nodes(100);
  for (int n = 0; n < 100; ++n) {
    for (int l = 0; l < 100; ++l) {
      RankStatus r = stepping(n * 100 + l, 1, 1);
      r.work_seconds = 0.01 + 0.0001 * l;
      nodes[static_cast<std::size_t>(n)].ranks.push_back(r);
    }
  }
  const schema::JobView v = schema::make_job_view(nodes, 1);
  EXPECT_EQ(v.measured, 10'000u);
  EXPECT_EQ(v.work.size(), schema::kMaxViewRanks);
  EXPECT_NEAR(v.median_work, 0.01495, 1e-4) << "the median of every rank, listed or not";
}

TEST(NodeProgress, ACorruptedValueIsAnErrorNamingItsKey) {
  for (const char* text : {
           "", "[]", "{oops", R"({"st":"running","w":[]})",             // no time
           R"({"t":1,"w":[]})",                                         // no state
           R"({"t":1,"st":"running","w":{}})",                          // workers not a list
           R"({"t":1,"st":"running","w":[{"l":0}]})",                   // a worker without rank
           R"({"t":1,"st":"running","w":[{"r":-1,"l":0}]})",            // a negative rank
           R"({"t":1,"st":"running","w":[{"r":0,"l":0,"s":"many"}]})",  // steps not a count
           R"({"t":1,"st":"running","w":[{"r":0,"l":0,"as":-2}]})",     // a negative age
           R"({"t":1,"st":"running","w":[{"r":0,"l":0,"sg":"yes"}]})",  // straggler not a bool
           R"({"t":1,"st":"running","w":[{"r":0,"l":0,"pc":7}]})",      // pending not a name
       }) {
    SCOPED_TRACE(text);
    try {
      schema::decode_node_progress("r4/progress/2", text);
      ADD_FAILURE() << "decoded";
    } catch (const schema::CorruptValueError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("'r4/progress/2'"), std::string::npos) << what;
      EXPECT_NE(what.find("a JSON object with t (seconds)"), std::string::npos) << what;
    }
  }
}

TEST(NodeProgress, AReaderAgesWhatWasPublishedToItsOwnNow) {
  RankStatus beating;
  beating.since_beat_seconds = 0.5;
  schema::NodeProgress p{100.0, "running", {stepping(0, 10, 1.0), beating}, 0, {}, 0};
  schema::age_to(p, 103.0);
  EXPECT_DOUBLE_EQ(*p.ranks[0].since_step_seconds, 4.0);
  EXPECT_DOUBLE_EQ(*p.ranks[1].since_beat_seconds, 3.5);
  EXPECT_DOUBLE_EQ(*p.ranks[0].progress_age_seconds(), 4.0) << "its last step, not its last beat";
  EXPECT_DOUBLE_EQ(*p.ranks[1].progress_age_seconds(), 3.5) << "no steps: its last beat";
  schema::age_to(p, 50.0);  // a reader whose clock is behind never makes an age negative
  EXPECT_DOUBLE_EQ(*p.ranks[0].since_step_seconds, 4.0);
}

TEST(NodeProgress, TheHeartbeatAndTheProgressGoInOneRequest) {
  const auto items = schema::heartbeat_items(3, 1, [] { return std::string("{...}"); });
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0].first, "r3/heartbeat/1");
  EXPECT_GT(schema::decode_int(items[0].first, items[0].second), 1'600'000'000);
  EXPECT_EQ(items[1], (std::pair<std::string, std::string>{"r3/progress/1", "{...}"}));
  EXPECT_EQ(schema::heartbeat_items(3, 1, {}).size(), 1u) << "no source: the heartbeat alone";
}

// ------------------------------------------------------------------------------------------------
// The status table and JSON

TEST(StatusTable, EachRankHasARowWithItsMarksAndADashForWhatIsNotReported) {
  JobStatus s;
  s.run_id = "j";
  s.endpoint = "127.0.0.1:1";
  s.state = "running";
  NodeStatus n;
  n.node_rank = 1;
  n.first_rank = 2;
  n.workers = 2;
  n.alive = true;
  n.agent_state = "running";
  RankStatus slow = stepping(2, 340, 45.0);
  slow.worker.local_rank = 0;
  slow.steps_per_second = 2.5;
  slow.step_seconds = 0.4;
  slow.hang_timeout_seconds = 30;
  slow.straggler = true;
  slow.pending_collective = "all_reduce #7";
  slow.suspect = true;
  slow.doing = "idle";
  RankStatus beating;
  beating.worker.rank = 3;
  beating.worker.local_rank = 1;
  beating.since_beat_seconds = 1.5;
  beating.beats = 12;
  n.ranks = {slow, beating};
  s.nodes = {n};
  const std::string table = format_table(s);
  EXPECT_NE(table.find("running      ?"), std::string::npos) << "the agent's state\n" << table;
  EXPECT_NE(table.find("2     1     0      340        2.50     0.40 s     45.0 s ago     0        "
                       "HUNG? (idle) STRAGGLER waits in all_reduce #7\n"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("3     1     1      -          -        -          1.50 s ago     12\n"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("2 running worker(s), 1 straggler(s), 1 suspected of a hang"),
            std::string::npos)
      << table;
  const Json j = Json::parse(to_json(s));
  const Json& r = j["nodes"][0]["ranks"];
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0]["steps"], 340);
  EXPECT_EQ(r[0]["hung"], true);
  EXPECT_EQ(r[0]["progress_age_seconds"], 45.0);
  EXPECT_TRUE(r[1]["steps"].is_null());
  EXPECT_EQ(r[1]["beats"], 12);
  EXPECT_EQ(j["nodes"][0]["agent_state"], "running");
}

TEST(StatusTable, SecondsReadAtAGlance) {
  EXPECT_EQ(format_seconds(std::nullopt), "-");
  EXPECT_EQ(format_seconds(0.123), "0.12 s");
  EXPECT_EQ(format_seconds(42.25), "42.2 s");
  EXPECT_EQ(format_seconds(185), "3m05s");
  EXPECT_EQ(format_seconds(7300), "2h01m");
}

// ------------------------------------------------------------------------------------------------
// The ring of samples

TEST(ProgressHistory, AStepTimeIsMeasuredFromWhenTheStepsHappened) {
  ProgressHistory h;
  h.add(100.0, 0, {stepping(0, 10, 0.2)});  // step 10 at 99.8: the baseline, nothing measured
  h.add(101.0, 0, {stepping(0, 10, 1.2)});  // no step this second
  h.add(102.0, 0, {stepping(0, 14, 0.2)});  // steps 11..14 by 101.8: 2 s for 4 steps
  const auto* s = h.samples(0);
  ASSERT_NE(s, nullptr);
  ASSERT_EQ(s->size(), 3u);
  EXPECT_FALSE((*s)[0].step_seconds);
  EXPECT_FALSE((*s)[1].step_seconds) << "a second without a step has no step time";
  ASSERT_TRUE((*s)[2].step_seconds);
  EXPECT_DOUBLE_EQ(*(*s)[2].step_seconds, 0.5);
}

TEST(ProgressHistory, ASlowStepIsMeasuredWhole) {
  ProgressHistory h;
  h.add(100.0, 0, {stepping(0, 1, 0.0)});
  for (int t = 101; t < 105; ++t) h.add(t, 0, {stepping(0, 1, t - 100.0)});
  h.add(105.0, 0, {stepping(0, 2, 0.0)});  // one step of 5 s, not of the last second
  EXPECT_DOUBLE_EQ(*h.samples(0)->back().step_seconds, 5.0);
}

TEST(ProgressHistory, WithoutStepsTheHeartbeatsAreMeasured) {
  ProgressHistory h;
  RankStatus w;
  w.since_beat_seconds = 0.0;
  w.beats = 5;
  h.add(10.0, 0, {w});
  w.beats = 8;
  w.since_beat_seconds = 0.5;
  h.add(11.0, 0, {w});
  const auto& last = h.samples(0)->back();
  EXPECT_FALSE(last.step_seconds);
  ASSERT_TRUE(last.beat_seconds);
  EXPECT_DOUBLE_EQ(*last.beat_seconds, 0.5 / 3);
}

TEST(ProgressHistory, ANewRoundOrAFallingCountStartsAfresh) {
  ProgressHistory h;
  h.add(10.0, 0, {stepping(0, 100, 0.0)});
  h.add(11.0, 1, {stepping(0, 150, 0.0)});  // a new round: its worker's steps are not comparable
  h.add(12.0, 1, {stepping(0, 3, 0.0)});    // a new worker in this rank: its count restarted
  h.add(13.0, 1, {stepping(0, 5, 0.0)});
  const auto& s = *h.samples(0);
  EXPECT_FALSE(s[1].step_seconds);
  EXPECT_FALSE(s[2].step_seconds);
  EXPECT_DOUBLE_EQ(*s[3].step_seconds, 0.5);
  EXPECT_EQ(s[3].round, 1);
}

TEST(ProgressHistory, TheRingKeepsTheLastSamplesOfTheLastRanks) {
  ProgressHistory h(5, 3);
  for (int t = 0; t < 12; ++t) h.add(t, 0, {stepping(0, t, 0), stepping(1, t, 0)});
  EXPECT_EQ(h.samples(0)->size(), 5u);
  EXPECT_DOUBLE_EQ(h.samples(0)->front().time, 7.0);
  h.add(12.0, 0, {stepping(2, 1, 0)});
  h.add(13.0, 0, {stepping(0, 13, 0), stepping(2, 2, 0)});
  h.add(14.0, 0, {stepping(3, 1, 0)});  // a fourth rank: rank 1, sampled longest ago, goes
  EXPECT_EQ(h.size(), 3u);
  EXPECT_EQ(h.samples(1), nullptr);
  EXPECT_NE(h.samples(3), nullptr);
}

TEST(ProgressHistory, TheJsonHasOneColumnPerFieldAndOnlyWhatCameAfterSince) {
  ProgressHistory h;
  for (int t = 0; t < 4; ++t) h.add(1000.0 + t, 2, {stepping(7, 10 * t, 0)});
  const Json all = h.to_json(0);
  ASSERT_TRUE(all.contains("7"));
  EXPECT_EQ(all["7"]["t"], Json({1000.0, 1001.0, 1002.0, 1003.0}));
  EXPECT_EQ(all["7"]["round"], Json({2, 2, 2, 2}));
  EXPECT_EQ(all["7"]["step_s"], Json({nullptr, 0.1, 0.1, 0.1}));
  EXPECT_EQ(all["7"]["beat_s"], Json({nullptr, nullptr, nullptr, nullptr}));
  const Json later = h.to_json(1001.0);
  EXPECT_EQ(later["7"]["t"], Json({1002.0, 1003.0}));
  EXPECT_TRUE(h.to_json(1003.0).empty()) << "nothing new: no rank at all";
}

TEST(EventTimeline, KeepsTheLastEventsWithTheirFields) {
  EventTimeline t(3);
  for (int i = 0; i < 5; ++i) t.add(10.0 + i, "restart", {{"restart_count", i}});
  EXPECT_EQ(t.size(), 3u);
  EXPECT_EQ(t.dropped(), 2u);
  const Json all = t.to_json(0);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0], Json({{"t", 12.0}, {"event", "restart"}, {"restart_count", 2}}));
  EXPECT_EQ(t.to_json(13.0).size(), 1u);
}

// ------------------------------------------------------------------------------------------------
// The page

TEST(StatusPage, TheDataItStartsFromCannotEndItsScript) {
  const nlohmann::ordered_json status = {{"run_id", "</script><script>alert(1)</script>"}};
  const std::string page = status_page(status);
  EXPECT_EQ(page.find("@STATUS_JSON@"), std::string::npos);
  EXPECT_EQ(page.find("alert(1)</script>"), std::string::npos) << "escaped: " << page.substr(0, 80);
  const auto start = page.find(R"(<script id="initial" type="application/json">)");
  ASSERT_NE(start, std::string::npos);
  const auto body = start + std::string(R"(<script id="initial" type="application/json">)").size();
  const auto end = page.find("</script>", body);
  EXPECT_EQ(Json::parse(page.substr(body, end - body))["run_id"], status["run_id"]);
  for (const char* external : {"src=\"http", "href=\"http", "@import", "url("}) {
    EXPECT_EQ(page.find(external), std::string::npos) << "self-contained: " << external;
  }
}

}  // namespace
}  // namespace dist::agent
