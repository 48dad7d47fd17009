// What a hang investigation makes of two looks at every rank: real faulthandler dumps (written by
// a Python interpreter in the test, never typed in), the SDK's dump line, process states, and the
// slots' counters; which rank is the cause and where each one was.
#include "health/hang_report.h"

#include <gtest/gtest.h>
#include <stdio.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>

namespace dist::agent {
namespace {

namespace slot = worker_contract::heartbeat_slot;

// What `faulthandler.dump_traceback(all_threads=True)` writes for a main thread inside `inner()`
// (called from `outer()` of a script named train.py) while a second thread waits in an Event.
std::string real_faulthandler_dump() {
  const char* script = R"(python3 - <<'PY'
import faulthandler, sys, threading
ev = threading.Event()
t = threading.Thread(target=ev.wait, daemon=True); t.start()
code = compile('''
def inner():
    faulthandler.dump_traceback(sys.stdout, all_threads=True)
def outer():
    inner()
outer()
''', '/home/u/train.py', 'exec')
exec(code, {'faulthandler': faulthandler, 'sys': sys})
sys.stdout.flush()
ev.set()
PY)";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(script, "r"), ::pclose);
  std::string out;
  std::array<char, 4096> buf{};
  while (pipe && std::fgets(buf.data(), buf.size(), pipe.get())) out += buf.data();
  return out;
}

RankLook look(int rank, std::uint64_t steps, char state = 'S') {
  RankLook l;
  l.worker = {0, rank, rank, 100 + rank};
  l.first.steps = l.second.steps = steps;
  l.first.at = std::chrono::seconds(100);
  l.second.at = std::chrono::seconds(102);
  l.before.state = l.after.state = state;
  l.before.processes = l.after.processes = 1;
  return l;
}

// A rank whose processes used `share` of a core between the looks (2 s apart).
void busy(RankLook& l, double share) {
  l.after.cpu_ticks =
      l.before.cpu_ticks + static_cast<std::uint64_t>(share * 2 * ::sysconf(_SC_CLK_TCK));
}

// A torch rank as its sampler shows it: its groups' counts, blocked in (group, seq) since `since`.
constexpr std::uint64_t kWorld = 0xA1, kMetrics = 0xB2;
// Every group has `group_size` ranks (0: unknown).
void torch_rank(RankLook& l, std::vector<std::pair<std::uint64_t, std::uint64_t>> groups,
                std::uint64_t pending_group = 0, std::uint64_t pending_seq = 0,
                slot::Collective op = slot::Collective::kAllReduce, double since_s = 60,
                std::uint32_t group_size = 3) {
  l.first.sampled_ns = 101'000'000'000;
  l.second.sampled_ns = 102'000'000'000;  // the sampler ran between the looks
  for (SlotReading* r : {&l.first, &l.second}) {
    r->features = slot::kStacksOnSignal | slot::kSampler | slot::kProgressHook;
    r->groups = groups;
    for (const auto& [id, seq] : groups) {
      r->collectives_issued += seq;
      r->group_sizes[id] = group_size;
    }
    if (pending_group != 0) {
      r->pending_group = pending_group;
      r->pending_seq = pending_seq;
      r->pending_op = static_cast<std::uint32_t>(op);
      r->pending_since_ns = static_cast<std::uint64_t>(since_s * 1e9);
    }
  }
}

// A Python dump whose main thread is in torch's backward, called from train.py.
std::string in_torch_dump() {
  return "Thread 0x00007f01 (most recent call first):\n"
         "  File \"/usr/lib/python3.11/threading.py\", line 320 in wait\n"
         "\n"
         "Current thread 0x00007f00 (most recent call first):\n"
         "  File \"/usr/lib/python3/dist-packages/torch/autograd/__init__.py\", line 197 in "
         "backward\n"
         "  File \"/usr/lib/python3/dist-packages/torch/_tensor.py\", line 487 in backward\n"
         "  File \"/home/u/train.py\", line 40 in main\n"
         "  File \"/home/u/train.py\", line 60 in <module>\n";
}

std::string at_user_code_dump(int line = 33) {
  return "Current thread 0x00007f00 (most recent call first):\n"
         "  File \"/home/u/train.py\", line " +
         std::to_string(line) +
         " in slow_loader\n"
         "  File \"/home/u/train.py\", line 38 in main\n"
         "  File \"/home/u/train.py\", line 60 in <module>\n";
}

// A main thread waiting in the standard library (a future's result(): an async checkpoint's) is
// said where the script called it, and in what (it was "at .../threading.py:327 in wait").
TEST(HangReport, AWaitInTheStandardLibraryIsSaidWhereTheScriptCalledIt) {
  auto waiting = look(0, 30);
  torch_rank(waiting, {{kWorld, 40}});
  waiting.stacks_first = waiting.stacks_second =
      "Current thread 0x00007f00 (most recent call first):\n"
      "  File \"/usr/lib/python3.11/threading.py\", line 327 in wait\n"
      "  File \"/usr/lib/python3.11/concurrent/futures/_base.py\", line 451 in result\n"
      "  File \"/home/u/train.py\", line 88 in checkpoint\n"
      "  File \"/home/u/train.py\", line 120 in <module>\n";
  auto other = look(1, 30);
  torch_rank(other, {{kWorld, 41}}, kWorld, 41, slot::Collective::kBarrier);
  const HangFinding f = examine({waiting, other}, HangRule::kProof);
  EXPECT_EQ(f.ranks[0].where.substr(0, f.ranks[0].where.find(';')),
            "at /home/u/train.py:88 in checkpoint, in the standard library (wait, "
            "/usr/lib/python3.11/threading.py:327)");
  // A script of its own in a site-packages directory is no standard library's.
  waiting.stacks_first = waiting.stacks_second =
      "Current thread 0x00007f00 (most recent call first):\n"
      "  File \"/usr/lib/python3/dist-packages/mylib/io.py\", line 7 in fetch\n"
      "  File \"/home/u/train.py\", line 88 in checkpoint\n";
  const HangFinding g = examine({waiting, other}, HangRule::kProof);
  EXPECT_EQ(g.ranks[0].where.substr(0, g.ranks[0].where.find(';')),
            "at /usr/lib/python3/dist-packages/mylib/io.py:7 in fetch");
}

TEST(HangReport, TheMainThreadIsFaulthandlersLastBlock) {
  const std::string dump = real_faulthandler_dump();
  if (dump.empty()) GTEST_SKIP() << "no python3 to write a real faulthandler dump";
  const auto frames = main_thread_frames(dump);
  ASSERT_GE(frames.size(), 3U) << dump;
  EXPECT_EQ(frames[0].file, "/home/u/train.py");
  EXPECT_EQ(frames[0].function, "inner");
  EXPECT_EQ(frames[0].line, 3);
  EXPECT_EQ(frames[1].function, "outer");
  EXPECT_EQ(frames[1].line, 5);
  EXPECT_EQ(frames[2].function, "<module>");
  EXPECT_FALSE(frames[0].in_torch);
}

// faulthandler's dump of the one thread it interrupts ends with no blank line: a second dump
// after it (the agent's fallback signal, then the sampler's late answer) is a block of its own.
TEST(HangReport, DumpsBackToBackAreBlocksOfTheirOwn) {
  const std::string signalled =
      "Stack (most recent call first):\n"
      "  File \"/home/u/train.py\", line 12 in step\n"
      "  File \"/home/u/train.py\", line 60 in <module>\n";
  const std::string answered =
      "Thread 0x00007f01 (most recent call first):\n"
      "  File \"/usr/lib/python3.11/threading.py\", line 320 in wait\n"
      "\n"
      "Thread 0x00007f00 (most recent call first):\n"
      "  File \"/home/u/train.py\", line 40 in main\n"
      "  File \"/home/u/train.py\", line 60 in <module>\n"
      "\n";
  auto frames = main_thread_frames(signalled + signalled);
  ASSERT_EQ(frames.size(), 2U);
  EXPECT_EQ(frames[0].line, 12);
  frames = main_thread_frames(signalled + answered);
  ASSERT_EQ(frames.size(), 2U);
  EXPECT_EQ(frames[0].line, 40);
  frames = main_thread_frames(answered + signalled);
  ASSERT_EQ(frames.size(), 2U);
  EXPECT_EQ(frames[0].line, 12);
}

TEST(HangReport, FramesInsideTorchAreMarked) {
  const auto frames = main_thread_frames(in_torch_dump());
  ASSERT_EQ(frames.size(), 4U);
  EXPECT_TRUE(frames[0].in_torch);
  EXPECT_TRUE(frames[1].in_torch);
  EXPECT_FALSE(frames[2].in_torch);
  EXPECT_EQ(frames[2].line, 40);
  EXPECT_TRUE(main_thread_frames("no dump here").empty());
}

TEST(HangReport, AUsersFolderNamedTorchIsNotTorch) {
  const auto frames = main_thread_frames(
      "Current thread 0x00007f00 (most recent call first):\n"
      "  File \"/src/pytorch/torch/nn/modules/module.py\", line 1 in _call_impl\n"
      "  File \"/home/u/tests/torch/train.py\", line 98 in main\n");
  ASSERT_EQ(frames.size(), 2U);
  EXPECT_TRUE(frames[0].in_torch) << "a source tree's torch/nn";
  EXPECT_FALSE(frames[1].in_torch) << "tests/torch/train.py is the user's";
}

std::string in_c10d_dump() {
  return "Current thread 0x00007f00 (most recent call first):\n"
         "  File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", line "
         "1541 in barrier\n"
         "  File \"/home/u/train.py\", line 71 in main\n";
}

std::string in_save_dump() {
  return "Current thread 0x00007f00 (most recent call first):\n"
         "  File \"/usr/lib/python3/dist-packages/torch/serialization.py\", line 650 in save\n"
         "  File \"/home/u/train.py\", line 88 in checkpoint\n"
         "  File \"/home/u/train.py\", line 95 in main\n";
}

// Rank 0 writes a checkpoint (torch.save) while rank 1 waits for it in a barrier.
std::vector<RankLook> checkpoint_while_the_other_waits() {
  auto saving = look(0, 30);
  torch_rank(saving, {{kWorld, 40}});
  saving.stacks_first = saving.stacks_second = in_save_dump();
  saving.second.activity = slot::kActivitySave;
  saving.after.write_bytes = saving.before.write_bytes + 50'000'000;
  busy(saving, 0.4);
  auto waiting = look(1, 30);
  torch_rank(waiting, {{kWorld, 41}}, kWorld, 41, slot::Collective::kBarrier);
  waiting.stacks_first = waiting.stacks_second = in_c10d_dump();
  return {saving, waiting};
}

// What the rank wrote into its stack file between the looks (a late answer to the first look's
// ask, every thread's) is the agent's doing, not the rank's: an idle rank stays idle.
TEST(HangReport, DumpsWrittenBetweenTheLooksAreNotTheRanksWrites) {
  auto looks = checkpoint_while_the_other_waits();
  RankLook& idle = looks[0];
  idle.second.activity = 0;
  idle.after.cpu_ticks = idle.before.cpu_ticks;
  idle.after.write_bytes = idle.before.write_bytes + 300'000;
  idle.stack_bytes = 300'000;
  HangFinding f = examine(looks, HangRule::kBound);
  EXPECT_FALSE(f.ranks[0].active) << f.ranks[0].doing;
  idle.stack_bytes = 0;  // the same bytes written by the rank itself
  f = examine(looks, HangRule::kBound);
  EXPECT_TRUE(f.ranks[0].active) << f.ranks[0].doing;
}

TEST(HangReport, ARankWritingACheckpointIsWorkingAndNeverEndedByTheProofRule) {
  const auto looks = checkpoint_while_the_other_waits();
  const HangFinding f = examine(looks, HangRule::kProof);
  ASSERT_FALSE(f.moving);
  EXPECT_FALSE(f.any_cause());
  EXPECT_FALSE(f.proof);
  EXPECT_TRUE(f.ranks[0].suspect) << "the others wait for it";
  EXPECT_TRUE(f.ranks[0].active);
  EXPECT_FALSE(f.idle_suspect());
  EXPECT_EQ(f.ranks[0].where,
            "at /home/u/train.py:88 in checkpoint, in torch (save, "
            "/usr/lib/python3/dist-packages/torch/serialization.py:650); behind the others: 1 "
            "collective fewer than rank 1 in process group 0");
  EXPECT_EQ(f.ranks[0].doing,
            "computing (CPU 40%), writing (50.0 MB in 2.0 s), in torch.save/torch.load");
  EXPECT_TRUE(f.ranks[1].waiting);
  EXPECT_EQ(f.ranks[1].where, "waiting in barrier #41 of process group 0 for 42.0 s");
  // Past the bound it still works: not ended; under an explicit timeout it is.
  EXPECT_FALSE(examine(looks, HangRule::kBound).any_cause());
  const HangFinding timed = examine(looks, HangRule::kTimeout);
  EXPECT_TRUE(timed.ranks[0].cause);
  EXPECT_FALSE(timed.ranks[1].cause);
}

TEST(HangReport, AnIdleRankTheOthersWaitForIsSuspectedAndEndedOnlyPastTheBound) {
  auto sleeping = look(0, 30);
  torch_rank(sleeping, {{kWorld, 40}});
  sleeping.stacks_first = sleeping.stacks_second = at_user_code_dump(33);
  sleeping.after.wchan = "hrtimer_nanosleep";
  auto waiting = look(1, 30);
  torch_rank(waiting, {{kWorld, 41}}, kWorld, 41, slot::Collective::kBarrier);
  const HangFinding f = examine({sleeping, waiting}, HangRule::kProof);
  EXPECT_FALSE(f.any_cause());
  EXPECT_TRUE(f.idle_suspect());
  EXPECT_EQ(f.ranks[0].doing, "idle (asleep in hrtimer_nanosleep)");
  EXPECT_FALSE(f.ranks[0].active);
  const HangFinding bound = examine({sleeping, waiting}, HangRule::kBound);
  EXPECT_TRUE(bound.ranks[0].cause);
  EXPECT_FALSE(bound.ranks[1].cause) << "the waiting one is not the cause";
}

// On a crowded machine a rank in a forward pass runs a few percent of the time and waits for a
// CPU the rest: it computes (seen as "idle, in a forward pass" under CI's load, and a suspect).
TEST(HangReport, ARankWaitingForACpuComputes) {
  auto evaluating = look(0, 30, 'R');
  torch_rank(evaluating, {{kWorld, 40}});
  evaluating.stacks_first = evaluating.stacks_second = at_user_code_dump(33);
  evaluating.first.activity = evaluating.second.activity = slot::kActivityForward;
  busy(evaluating, 0.06);
  evaluating.after.cpu_queued_ns = evaluating.before.cpu_queued_ns + 1'400'000'000;  // of 2 s
  auto waiting = look(1, 30);
  torch_rank(waiting, {{kWorld, 41}}, kWorld, 41, slot::Collective::kBarrier);
  const HangFinding f = examine({evaluating, waiting}, HangRule::kBound);
  EXPECT_TRUE(f.ranks[0].active) << f.ranks[0].doing;
  EXPECT_EQ(f.ranks[0].doing,
            "computing (CPU 6%, waiting for a CPU 70% of the time), in a forward pass");
  EXPECT_FALSE(f.idle_suspect());
  EXPECT_FALSE(f.any_cause()) << "past the bound a rank that computes is not ended";
  // A thread that only wakes often (a 1 ms poll) waits for a CPU at each wake on a crowded
  // machine, and is runnable a small part of the time: idle, and ended past the bound.
  busy(evaluating, 0.02);
  evaluating.after.cpu_queued_ns = evaluating.before.cpu_queued_ns + 500'000'000;  // 25%
  const HangFinding idle = examine({evaluating, waiting}, HangRule::kBound);
  EXPECT_FALSE(idle.ranks[0].active) << idle.ranks[0].doing;
  EXPECT_TRUE(idle.ranks[0].cause);
}

// Idle in its own process but inside torch.save (a network file system), waiting for a thread
// inside torch.distributed.checkpoint (an async save), a DataLoader (its worker processes) or
// torch.compile: work of its own, said as such (no warning); past the bound, when a
// rank has waited for it longer than the job's collective timeout, ended as an idle rank is (a
// DataLoader whose workers deadlocked waits forever: its timeout is none by default).
TEST(HangReport, AnIdleRankInsideTorchSaveADataLoaderOrCompileIsWorkOfItsOwn) {
  for (const std::uint32_t activity :
       {slot::kActivitySave, slot::kActivityCheckpoint, slot::kActivityCheckpointThread,
        slot::kActivityData, slot::kActivityCompile}) {
    SCOPED_TRACE(activity);
    auto loading = look(0, 30);
    torch_rank(loading, {{kWorld, 40}});
    loading.stacks_first = loading.stacks_second = at_user_code_dump(33);
    loading.after.wchan = "futex_do_wait";
    loading.first.activity = loading.second.activity = activity;
    auto waiting = look(1, 30);
    torch_rank(waiting, {{kWorld, 41}}, kWorld, 41, slot::Collective::kBarrier);
    const HangFinding f = examine({loading, waiting}, HangRule::kProof);
    EXPECT_TRUE(f.ranks[0].suspect);
    EXPECT_TRUE(f.ranks[0].own_work) << f.ranks[0].doing;
    EXPECT_EQ(f.ranks[0].doing.find("idle"), std::string::npos) << f.ranks[0].doing;
    EXPECT_FALSE(f.idle_suspect());
    EXPECT_FALSE(f.any_cause());
    EXPECT_TRUE(examine({loading, waiting}, HangRule::kBound).ranks[0].cause);
  }
}

// Waiting for a child of its own that does nothing either (subprocess.run of a sleep): idle, said
// with the child, and the warning says so (it said the rank "does nothing").
TEST(HangReport, ARankWaitingForAnIdleChildOfItsOwnSaysSo) {
  auto parent = look(0, 30);
  torch_rank(parent, {{kWorld, 40}});
  parent.stacks_first = parent.stacks_second = at_user_code_dump(33);
  parent.after.wchan = "do_wait";
  parent.after.awaits_child = "its child 4711 (sleep)";
  auto waiting = look(1, 30);
  torch_rank(waiting, {{kWorld, 41}}, kWorld, 41, slot::Collective::kBarrier);
  const HangFinding f = examine({parent, waiting}, HangRule::kProof);
  EXPECT_TRUE(f.ranks[0].suspect);
  EXPECT_EQ(f.ranks[0].doing, "idle (waiting for its child 4711 (sleep) to end)");
  EXPECT_TRUE(f.idle_suspect());
  EXPECT_TRUE(f.idle_suspects_await_children());
  EXPECT_FALSE(f.any_cause());
}

// Blocked writing its own output that a slow reader does not take (a log service, a pipe): work
// held up outside the job, said as such with the peer (it was "idle (asleep in wait_woken)"),
// no warning; ended past the bound as an idle rank. Blocked reading a socket, it is idle and
// says what it reads.
TEST(HangReport, ARankBlockedWritingToASlowReaderIsWorkOfItsOwnAndSaysWhere) {
  auto logging = look(0, 30);
  torch_rank(logging, {{kWorld, 40}});
  logging.stacks_first = logging.stacks_second = at_user_code_dump(33);
  logging.after.wchan = "wait_woken";
  logging.after.blocked_on = "writing to a socket to 10.0.0.7:5000";
  logging.after.blocked_writing = true;
  auto waiting = look(1, 30);
  torch_rank(waiting, {{kWorld, 41}}, kWorld, 41, slot::Collective::kBarrier);
  HangFinding f = examine({logging, waiting}, HangRule::kProof);
  EXPECT_TRUE(f.ranks[0].suspect);
  EXPECT_TRUE(f.ranks[0].own_work);
  EXPECT_EQ(f.ranks[0].doing,
            "blocked writing to a socket to 10.0.0.7:5000 (its reader takes no more)");
  EXPECT_FALSE(f.idle_suspect());
  EXPECT_FALSE(f.any_cause());
  EXPECT_TRUE(examine({logging, waiting}, HangRule::kBound).ranks[0].cause);

  logging.after.blocked_on = "reading from a socket to 10.0.0.7:443";
  logging.after.blocked_writing = false;
  f = examine({logging, waiting}, HangRule::kProof);
  EXPECT_EQ(f.ranks[0].doing, "idle (blocked reading from a socket to 10.0.0.7:443)");
  EXPECT_TRUE(f.idle_suspect());
}

// A group is labelled by torch's own number for it (its name, the same on every rank), not by its
// place in one rank's list: ranks 1 and 2 of two pairs each saw theirs second, and both were
// "process group 1", as if they waited in one group whose counts differed by thousands.
TEST(HangReport, GroupsAreLabelledByTorchsNumberTheSameOnEveryRank) {
  const auto id = [](const std::string& name) {  // progress.py's name_id
    std::uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char byte : name) h = (h ^ byte) * 0x100000001b3ULL;
    return h;
  };
  EXPECT_EQ(group_text(id("1"), {id("0"), id("1")}), " of process group 1");
  EXPECT_EQ(group_text(id("2"), {id("0"), id("2")}), " of process group 2");
  EXPECT_EQ(group_text(id("0"), {id("0"), id("2")}), " of process group 0");
  // A name of the script's own: its place in the rank's list, as before.
  EXPECT_EQ(group_text(id("experts"), {id("0"), id("experts")}), " of process group 1");
  EXPECT_EQ(group_text(0xBEEF, {}), " of a process group");
}

// Two tensor-parallel pairs (0-1, 2-3) in one data-parallel job: ranks 0 and 1 wait in the
// world's all_reduce #51, rank 2 sleeps (having issued `sleeper_world` collectives in the world
// group), and its partner, rank 3, waits for it in their pair's all_reduce #101.
std::vector<RankLook> two_pairs(std::uint64_t sleeper_world) {
  constexpr std::uint64_t kPair01 = 0xC3, kPair23 = 0xD4;
  std::vector<RankLook> looks;
  for (int rank : {0, 1}) {
    auto waiting = look(rank, 50);
    torch_rank(waiting, {{kWorld, 51}, {kPair01, 100}}, kWorld, 51);
    looks.push_back(waiting);
  }
  auto sleeping = look(2, 50);
  torch_rank(sleeping, {{kWorld, sleeper_world}, {kPair23, 100}});
  sleeping.stacks_first = sleeping.stacks_second = at_user_code_dump(12);
  sleeping.after.wchan = "hrtimer_nanosleep";
  looks.push_back(sleeping);
  auto partner = look(3, 50);
  torch_rank(partner, {{kWorld, 50}, {kPair23, 101}}, kPair23, 101);
  looks.push_back(partner);
  return looks;
}

// Rank 3 is behind in the world group too, but it waits for rank 2: only rank 2 is the one the
// others wait for (both used to be named, and both ended past the bound).
TEST(HangReport, ARankWaitingInItsSubgroupForAPeerIsNotTheOneTheOthersWaitFor) {
  const auto looks = two_pairs(50);
  for (const HangRule rule : {HangRule::kProof, HangRule::kBound, HangRule::kTimeout}) {
    const HangFinding f = examine(looks, rule);
    EXPECT_FALSE(f.proof);
    EXPECT_TRUE(f.ranks[2].suspect);
    EXPECT_FALSE(f.ranks[3].suspect);
    EXPECT_FALSE(f.ranks[0].suspect || f.ranks[1].suspect);
    EXPECT_EQ(f.ranks[2].cause, rule != HangRule::kProof);
    EXPECT_FALSE(f.ranks[3].cause) << "it waits for rank 2";
    EXPECT_EQ(f.ranks[3].where,
              "waiting in all_reduce #101 of process group 1 for 42.0 s; waiting for rank 2 (it "
              "issued 100 in process group 1)");
    EXPECT_EQ(f.ranks[2].where,
              "at /home/u/train.py:12 in slow_loader; behind the others: 1 collective fewer than "
              "rank 0 in process group 0");
  }
}

// The same, but the sleeping rank had issued the world's collective before it slept (async): it
// is behind in no group, its partner alone is. The partner still waits for it: the sleeping rank
// is the one the others wait for, the partner is not (it used to be taken back as the suspect).
TEST(HangReport, TheRankAWaitingPartnerWaitsForIsTheSuspectEvenWhenItIsBehindInNoGroup) {
  const auto looks = two_pairs(51);
  const HangFinding f = examine(looks, HangRule::kBound);
  EXPECT_TRUE(f.ranks[2].suspect);
  EXPECT_TRUE(f.ranks[2].cause);
  EXPECT_FALSE(f.ranks[3].suspect || f.ranks[3].cause) << "it waits for rank 2";
}

// torch 2.x numbers sends and receives in the group's sequence on their two ranks only, and
// monitored_barrier's twice on rank 0: after one, the counts differ for the rest of the job. Rank
// 0 computes (before a broadcast) at 24; ranks 1 and 2 wait in the broadcast, #23 on them. They
// read as behind rank 0, yet each waits in a collective every other rank has issued: rank 0 is
// the one they wait for (the waiting two were named, and --hang-timeout ended them).
TEST(HangReport, CountsSkewedBySendsAndReceivesNameTheRankAtWorkNotTheWaitingOnes) {
  auto working = look(0, 30);
  torch_rank(working, {{kWorld, 24}});
  working.stacks_first = working.stacks_second = at_user_code_dump(24);
  busy(working, 0.9);
  std::vector<RankLook> looks{working};
  for (int rank : {1, 2}) {
    auto waiting = look(rank, 30);
    torch_rank(waiting, {{kWorld, 23}}, kWorld, 23, slot::Collective::kBroadcast);
    looks.push_back(waiting);
  }
  for (const HangRule rule : {HangRule::kProof, HangRule::kBound, HangRule::kTimeout}) {
    const HangFinding f = examine(looks, rule);
    EXPECT_FALSE(f.proof);
    EXPECT_TRUE(f.ranks[0].suspect);
    EXPECT_FALSE(f.ranks[1].suspect || f.ranks[2].suspect);
    EXPECT_FALSE(f.ranks[1].cause || f.ranks[2].cause);
    EXPECT_EQ(f.ranks[0].cause, rule == HangRule::kTimeout);  // computing: only a timeout ends it
    EXPECT_EQ(f.ranks[1].where.find("behind"), std::string::npos) << f.ranks[1].where;
  }

  // One send from rank 0 to rank 1, then rank 0 works while 1 and 2 wait in a barrier: #22 on
  // rank 1 (the receive counted), #21 on rank 2; rank 0 at 21 (the send counted, the barrier
  // not yet issued). Rank 1 waits for rank 0; rank 2 waits in what both others issued.
  looks[0].second.groups = looks[0].first.groups = {{kWorld, 21}};
  torch_rank(looks[1], {{kWorld, 22}}, kWorld, 22, slot::Collective::kBarrier);
  torch_rank(looks[2], {{kWorld, 21}}, kWorld, 21, slot::Collective::kBarrier);
  const HangFinding f = examine(looks, HangRule::kTimeout);
  EXPECT_TRUE(f.ranks[0].suspect && f.ranks[0].cause);
  EXPECT_FALSE(f.ranks[1].suspect || f.ranks[1].cause) << f.ranks[1].where;
  EXPECT_FALSE(f.ranks[2].suspect || f.ranks[2].cause) << f.ranks[2].where;

  // Behind in another group than the one it waits in: ranks 0-2 wait in the world's #51, which
  // rank 3 has not issued (50); rank 3 waits in its tensor-parallel group's #101, which rank 2,
  // its partner here, issued. The others here wait for it: still named.
  std::vector<RankLook> pairs;
  for (int rank : {0, 1, 2}) {
    auto waiting = look(rank, 30);
    if (rank == 2) {
      torch_rank(waiting, {{kWorld, 51}, {kMetrics, 101}}, kWorld, 51);
    } else {
      torch_rank(waiting, {{kWorld, 51}}, kWorld, 51);
    }
    pairs.push_back(waiting);
  }
  auto partner = look(3, 30);
  torch_rank(partner, {{kWorld, 50}, {kMetrics, 101}}, kMetrics, 101);
  pairs.push_back(partner);
  EXPECT_TRUE(examine(pairs, HangRule::kTimeout).ranks[3].suspect);
}

TEST(HangReport, ADeclaredPauseIsNeverAHangWhateverTheRule) {
  auto looks = checkpoint_while_the_other_waits();
  looks[0].first.paused_since_ns = looks[0].second.paused_since_ns = 70'000'000'000;
  looks[0].second.pause_reason = "checkpoint";
  for (const HangRule rule : {HangRule::kProof, HangRule::kBound, HangRule::kTimeout}) {
    const HangFinding f = examine(looks, rule);
    EXPECT_FALSE(f.any_cause());
    EXPECT_TRUE(f.any_paused());
    EXPECT_TRUE(f.ranks[0].doing.starts_with("paused: checkpoint (for 32.0 s)"))
        << f.ranks[0].doing;
  }
}

TEST(HangReport, ASamplerThatStoppedLeftNothingToBelieve) {
  // Rank 1's main thread took the GIL and never gave it back: its sampler's last word (blocked in
  // the previous step's all_reduce) is stale; its stack says where it is.
  auto stuck = look(1, 9);
  torch_rank(stuck, {{kWorld, 20}}, kWorld, 20);
  stuck.second.sampled_ns = stuck.first.sampled_ns;
  stuck.stacks_first = stuck.stacks_second = at_user_code_dump(40);
  auto waiting = look(0, 10);
  torch_rank(waiting, {{kWorld, 21}}, kWorld, 21);
  const auto f = examine({waiting, stuck}, HangRule::kTimeout);
  EXPECT_FALSE(f.ranks[1].waiting);
  EXPECT_TRUE(f.ranks[1].where.starts_with("at /home/u/train.py:40 in slow_loader"))
      << f.ranks[1].where;
  EXPECT_NE(f.ranks[1].doing.find("its Python not running (a thread holds the GIL)"),
            std::string::npos)
      << f.ranks[1].doing;
  EXPECT_TRUE(f.ranks[1].cause);
  EXPECT_FALSE(collective_state(stuck).wait) << "no proof from a stale word";
}

TEST(HangReport, AStoppedRankIsProvenStuckButADebuggersStopIsNot) {
  auto stopped = look(1, 320, 'T');
  auto waiting = look(0, 320);
  torch_rank(waiting, {{kWorld, 700}}, kWorld, 700);
  torch_rank(stopped, {{kWorld, 699}});
  const auto f = examine({waiting, stopped}, HangRule::kProof);
  EXPECT_FALSE(f.ranks[0].cause);
  EXPECT_TRUE(f.ranks[1].cause && f.ranks[1].proven);
  EXPECT_TRUE(f.ranks[1].where.starts_with("stopped (state T: SIGSTOP); behind the others"))
      << f.ranks[1].where;
  ASSERT_TRUE(f.proof);
  EXPECT_NE(f.proof->find("rank 1 stopped"), std::string::npos) << *f.proof;

  stopped.before.state = 'S';  // stopped only at the second look: not yet proven
  EXPECT_FALSE(examine({waiting, stopped}, HangRule::kProof).any_cause());
  stopped.before.state = stopped.after.state = 't';
  const auto traced = examine({waiting, stopped}, HangRule::kProof);
  EXPECT_FALSE(traced.any_cause());
  EXPECT_TRUE(traced.ranks[1].where.starts_with("stopped by a debugger (state t)"));
}

// A rank held stopped is proof whatever the others do between the looks: one still finishing
// its step (its counters moved) is no reason to wait a hang timeout more for the stopped one.
// Without a stopped rank, the same movement means "not a hang".
TEST(HangReport, AStoppedRankIsProofEvenWhileAnotherRankStillMoves) {
  auto stopped = look(1, 320, 'T');
  auto moving = look(0, 320);
  moving.second.steps = 321;  // it finished the step it was in, then waits for rank 1
  const auto f = examine({moving, stopped}, HangRule::kProof);
  EXPECT_FALSE(f.moving) << *f.moving;
  ASSERT_EQ(f.ranks.size(), 2u);
  EXPECT_FALSE(f.ranks[0].cause);
  EXPECT_TRUE(f.ranks[1].cause && f.ranks[1].proven);

  stopped.before.state = stopped.after.state = 'S';
  EXPECT_TRUE(examine({moving, stopped}, HangRule::kProof).moving.has_value());
}

// hang_worker.py's skip: rank 1 skipped the loss all_reduce (group kMetrics, #11) and blocked in
// its next backward's (group kWorld, #17), which ranks 0 and 2, blocked in the skipped one, never
// issue.
std::vector<RankLook> skipped_collective(std::uint32_t ranks = 3) {
  constexpr auto kAllReduce = slot::Collective::kAllReduce;
  auto r0 = look(0, 11);
  torch_rank(r0, {{kWorld, 16}, {kMetrics, 11}}, kMetrics, 11, kAllReduce, 60, ranks);
  auto r1 = look(1, 11);
  torch_rank(r1, {{kWorld, 17}, {kMetrics, 10}}, kWorld, 17, kAllReduce, 60.5, ranks);
  r1.second.activity = slot::kActivityBackward;
  auto r2 = look(2, 11);
  torch_rank(r2, {{kWorld, 16}, {kMetrics, 11}}, kMetrics, 11, kAllReduce, 60, ranks);
  if (ranks == 2) return {r0, r1};
  return {r0, r1, r2};
}

TEST(HangReport, ASkippedCollectiveIsProvenByTheCycleOfWaitsAndTheRankThatWentPastIsTheCause) {
  const auto f = examine(skipped_collective(), HangRule::kProof);
  ASSERT_TRUE(f.proof);
  EXPECT_FALSE(f.ranks[0].cause);
  EXPECT_TRUE(f.ranks[1].cause && f.ranks[1].proven);
  EXPECT_EQ(*f.proof,
            "collectives that can never match: rank 0 waits in all_reduce #11 of process group 1, "
            "which rank 1 has not issued (it issued 10); rank 1 waits in all_reduce #17 of "
            "process group 0, which rank 0 has not issued (it issued 16); rank 1 went past a "
            "collective the others wait in");
  EXPECT_FALSE(f.ranks[2].cause);
  EXPECT_EQ(f.ranks[0].where, "waiting in all_reduce #11 of process group 1 for 42.0 s");
}

TEST(HangReport, TwoRanksWaitingForEachOtherAreBothTheCause) {
  const auto looks = skipped_collective(2);  // no majority says which of the two went past
  const auto f = examine(looks, HangRule::kProof);
  ASSERT_TRUE(f.proof);
  EXPECT_TRUE(f.ranks[0].cause && f.ranks[1].cause);
  EXPECT_TRUE(f.proof->ends_with("ranks 0 and 1 wait for each other")) << *f.proof;
}

TEST(HangReport, NoProofWithoutAStableIdleLongWaitOnEveryRankOfTheCycle) {
  struct Case {
    const char* name;
    std::function<void(std::vector<RankLook>&)> change;
  };
  const std::vector<Case> cases = {
      {"rank 1 computes", [](auto& l) { busy(l[1], 0.9); }},
      {"rank 1 began waiting 5 s ago",
       [](auto& l) {
         l[1].first.pending_since_ns = l[1].second.pending_since_ns = 97'000'000'000;
       }},
      {"rank 1 waits in another one at the second look",
       [](auto& l) { l[1].first.pending_since_ns = 40'000'000'000; }},
      {"rank 1 is not blocked",
       [](auto& l) {
         for (SlotReading* r : {&l[1].first, &l[1].second}) r->pending_since_ns = 0;
       }},
      {"rank 1 has issued what rank 0 waits in",
       [](auto& l) {
         for (SlotReading* r : {&l[1].first, &l[1].second}) r->groups[1].second = 11;
       }},
      // A thread of rank 1's own may yet issue what rank 0 waits in (its main thread waits).
      {"another thread of rank 1's may issue a collective",
       [](auto& l) { l[1].second.activity |= slot::kActivityThreads; }},
      // torch's counts hold the sends and receives of a group's two ranks: the groups' members
      // must all stand still, or the numbers may name other collectives than they seem to.
      {"the groups have a rank more, not seen",
       [](auto& l) {
         for (auto& look : l)
           for (SlotReading* r : {&look.first, &look.second})
             for (auto& [id, size] : r->group_sizes) size = 4;
       }},
      {"the groups' sizes are unknown",
       [](auto& l) {
         for (auto& look : l)
           for (SlotReading* r : {&look.first, &look.second}) r->group_sizes.clear();
       }},
      {"rank 2, in the group rank 0 waits in, is not blocked",
       [](auto& l) {
         for (SlotReading* r : {&l[2].first, &l[2].second}) r->pending_since_ns = 0;
       }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto looks = skipped_collective();
    c.change(looks);
    const auto f = examine(looks, HangRule::kProof);
    EXPECT_FALSE(f.proof) << *f.proof;
    EXPECT_FALSE(f.any_cause());
  }
}

TEST(HangReport, ARankOnAnotherNodeClosesTheCycle) {
  auto looks = skipped_collective();
  CollectiveState remote = collective_state(looks[1]);
  remote.rank = 7;
  looks.erase(looks.begin() + 1);
  EXPECT_FALSE(examine(looks, HangRule::kProof).proof) << "alone, ranks 0 and 2 only wait";
  const auto f = examine(looks, HangRule::kProof, {remote});
  ASSERT_TRUE(f.proof);
  EXPECT_FALSE(f.ranks[0].cause || f.ranks[1].cause) << "rank 7 went past: its node ends it";
  EXPECT_NE(f.proof->find("rank 7 went past"), std::string::npos) << *f.proof;
}

TEST(HangReport, TheSdksRanksInOneCollectiveWithDifferentOperationsNeverMatch) {
  // Rank 2 skipped an all_reduce and called a barrier: all three wait in collective #101.
  std::vector<RankLook> looks = {look(0, 50), look(1, 50), look(2, 50)};
  for (auto& l : looks) {
    for (SlotReading* r : {&l.first, &l.second}) {
      r->collectives_issued = 101;
      r->collectives_done = 100;
      r->pending_since_ns = 70'000'000'000;
      r->pending_op = static_cast<std::uint32_t>(slot::Collective::kAllReduce);
    }
  }
  looks[2].first.pending_op = looks[2].second.pending_op =
      static_cast<std::uint32_t>(slot::Collective::kBarrier);
  const auto f = examine(looks, HangRule::kProof);
  ASSERT_TRUE(f.proof);
  EXPECT_EQ(*f.proof,
            "collective #101 can never complete: ranks 0 and 1 in all_reduce, rank 2 in barrier");
  EXPECT_FALSE(f.ranks[0].cause);
  EXPECT_FALSE(f.ranks[1].cause);
  EXPECT_TRUE(f.ranks[2].cause);
  EXPECT_EQ(f.ranks[2].where, "waiting in barrier #101 for 32.0 s");
}

// torch numbers a send or a receive in its group's sequence on its two ranks only: a pipeline's
// stage receiving from a slow producer (#26 on it) while another rank all-reduces (#26 on that
// one: the next collective) is no mismatch, and none of them is ended by the proof rule.
TEST(HangReport, ASendOrReceiveNumberedAsAnotherRanksCollectiveIsNoProof) {
  std::vector<RankLook> looks = {look(0, 20), look(1, 20), look(2, 20)};
  torch_rank(looks[0], {{kWorld, 25}});  // sleeping before its send
  torch_rank(looks[1], {{kWorld, 26}}, kWorld, 26, slot::Collective::kAllReduce, 70);
  torch_rank(looks[2], {{kWorld, 26}}, kWorld, 26, slot::Collective::kSendRecv, 70);
  const auto f = examine(looks, HangRule::kProof);
  EXPECT_FALSE(f.proof) << *f.proof;
  EXPECT_FALSE(f.any_cause());
  // Nor does a receive close a cycle of waits: rank 2's count in the metrics group says nothing
  // of whether it issued what rank 1 waits in there.
  torch_rank(looks[1], {{kWorld, 26}, {kMetrics, 5}}, kMetrics, 5, slot::Collective::kAllReduce,
             70);
  torch_rank(looks[2], {{kWorld, 27}, {kMetrics, 4}}, kWorld, 27, slot::Collective::kSendRecv, 70);
  const auto g = examine(looks, HangRule::kProof);
  EXPECT_FALSE(g.proof) << *g.proof;
  EXPECT_FALSE(g.any_cause());
  // The same with every rank blocked (rank 0 in its send too), so that all of them stand still:
  // the send and the receive are still no part of a proof.
  torch_rank(looks[0], {{kWorld, 26}, {kMetrics, 5}}, kWorld, 26, slot::Collective::kSendRecv, 70);
  torch_rank(looks[1], {{kWorld, 26}, {kMetrics, 5}}, kWorld, 26, slot::Collective::kAllReduce, 70);
  torch_rank(looks[2], {{kWorld, 27}, {kMetrics, 4}}, kWorld, 27, slot::Collective::kSendRecv, 70);
  const auto h = examine(looks, HangRule::kProof);
  EXPECT_FALSE(h.proof) << *h.proof;
  EXPECT_FALSE(h.any_cause());
}

// torch numbers a send and its receive on their two ranks only, in the group's sequence: after
// rank 0 sent to rank 1, the gather rank 0 waits in is #27 on it and #26 on rank 2, which gave
// its part and went on to wait in its next collective, an all_reduce (#27 on it), while rank 1
// computes before it joins the gather. Same number, different operations, but no mismatch: rank 1
// will come (a healthy three-rank job was ended by this before). Once every rank stands still,
// nothing can end the wait, whatever the numbers: that is proof.
TEST(HangReport, ASendsOffsetInTheCountsIsNoProofWhileARankOfTheGroupMoves) {
  std::vector<RankLook> looks = {look(0, 20), look(1, 20), look(2, 20)};
  torch_rank(looks[0], {{kWorld, 27}}, kWorld, 27, slot::Collective::kGather, 40);
  torch_rank(looks[1], {{kWorld, 26}});
  busy(looks[1], 0.9);
  torch_rank(looks[2], {{kWorld, 27}}, kWorld, 27, slot::Collective::kAllReduce, 40);
  const auto f = examine(looks, HangRule::kProof);
  EXPECT_FALSE(f.proof) << *f.proof;
  EXPECT_FALSE(f.any_cause());

  looks[1] = look(1, 20);
  torch_rank(looks[1], {{kWorld, 27}}, kWorld, 27, slot::Collective::kBarrier, 40);
  const auto g = examine(looks, HangRule::kProof);
  ASSERT_TRUE(g.proof);
  EXPECT_TRUE(g.any_cause());
}

// A proof across nodes takes another node's rank as blocked only when its main thread is alone
// in being able to issue a collective, as here.
TEST(HangReport, AnotherNodesRankWithAThreadOfItsOwnClosesNoCycle) {
  auto looks = skipped_collective();
  CollectiveState remote = collective_state(looks[1]);
  looks[1].second.activity |= slot::kActivityThreads;
  EXPECT_FALSE(collective_state(looks[1]).wait);
  EXPECT_NE(examine(looks, HangRule::kProof)
                .ranks[1]
                .doing.find("a thread of its own beside it may issue a collective"),
            std::string::npos);
  remote.rank = 7;
  looks.erase(looks.begin() + 1);
  ASSERT_TRUE(examine(looks, HangRule::kProof, {remote}).proof);
  remote.wait.reset();  // as HangDetector::elsewhere() reads a BlockedRank with threads
  EXPECT_FALSE(examine(looks, HangRule::kProof, {remote}).proof);
}

// A three-stage pipeline (torch 2.x): the middle stage sleeps; the first waits in its send to it
// and the last in its receive from it. The middle stage's count holds its own sends and receives
// (twice the others'): it is not "ahead", the others not "behind" it. The one the others wait
// for is the one not waiting, whatever the rule.
TEST(HangReport, InAPipelinesGroupTheCountsOfSendsAndReceivesNameNobodyBehind) {
  std::vector<RankLook> looks = {look(0, 10), look(1, 10), look(2, 10)};
  torch_rank(looks[0], {{kWorld, 91}}, kWorld, 91, slot::Collective::kSendRecv, 70);
  torch_rank(looks[1], {{kWorld, 170}});  // asleep in its own code
  looks[1].stacks_first = looks[1].stacks_second = at_user_code_dump(40);
  torch_rank(looks[2], {{kWorld, 91}}, kWorld, 91, slot::Collective::kSendRecv, 70);
  for (const HangRule rule : {HangRule::kProof, HangRule::kBound, HangRule::kTimeout}) {
    const HangFinding f = examine(looks, rule);
    EXPECT_FALSE(f.proof);
    EXPECT_TRUE(f.ranks[1].suspect);
    EXPECT_FALSE(f.ranks[0].suspect || f.ranks[2].suspect);
    EXPECT_EQ(f.ranks[1].cause, rule != HangRule::kProof);
    EXPECT_FALSE(f.ranks[0].cause || f.ranks[2].cause);
    EXPECT_EQ(f.ranks[0].where.find("behind"), std::string::npos) << f.ranks[0].where;
    EXPECT_EQ(f.ranks[0].where.find("waiting for rank"), std::string::npos) << f.ranks[0].where;
  }
}

TEST(HangReport, MovedCountersAreProgressAndSoIsAPausesEnd) {
  auto a = look(0, 10);
  auto b = look(1, 10);
  b.second.collectives_done = 1;
  ASSERT_TRUE(examine({a, b}, HangRule::kProof).moving);
  b.second.collectives_done = 0;
  b.second.resumed_ns = 101'000'000'000;
  const auto f = examine({a, b}, HangRule::kTimeout);
  ASSERT_TRUE(f.moving);
  EXPECT_NE(f.moving->find("rank 1"), std::string::npos);
}

TEST(HangReport, AStackThatMovesIsWorkUnderEitherRule) {
  auto a = look(0, 10);
  a.stacks_first = at_user_code_dump(33);
  a.stacks_second = at_user_code_dump(34);  // the same function, another line: a loop
  auto b = look(1, 10);
  b.stacks_first = b.stacks_second = in_torch_dump();
  EXPECT_FALSE(examine({a, b}, HangRule::kTimeout).moving)
      << "the timeout rule: one function, two lines is still stuck in it";
  const auto proof = examine({a, b}, HangRule::kProof);
  EXPECT_TRUE(proof.ranks[0].active) << "the proof rule: a loop that moves works";
  EXPECT_NE(proof.ranks[0].doing.find("its stack moving"), std::string::npos);

  a.stacks_second = in_torch_dump();  // it went on into torch
  const auto f = examine({a, b}, HangRule::kTimeout);
  ASSERT_TRUE(f.moving);
  EXPECT_NE(f.moving->find("rank 0"), std::string::npos) << *f.moving;
}

TEST(HangReport, WithoutTheSamplerAFrameInTorchDistributedIsWaitingButSerializationIsNot) {
  auto waiting = look(0, 320);
  waiting.stacks_first = waiting.stacks_second = in_torch_dump();
  auto saving = look(1, 320);
  saving.stacks_first = saving.stacks_second = in_save_dump();
  const HangFinding f = examine({waiting, saving}, HangRule::kTimeout);
  EXPECT_TRUE(f.ranks[0].waiting);
  EXPECT_EQ(f.ranks[0].where,
            "waiting in torch (backward, /usr/lib/python3/dist-packages/torch/autograd/"
            "__init__.py:197) from /home/u/train.py:40 in main");
  EXPECT_FALSE(f.ranks[1].waiting);
  EXPECT_TRUE(f.ranks[1].cause);
}

TEST(HangReport, AnSdkRankOutsideAnyCollectiveIsTheSuspect) {
  auto waiting = look(0, 320);
  waiting.second.collectives_issued = 641;
  waiting.second.collectives_done = 640;
  waiting.second.pending_since_ns = 90'000'000'000;
  waiting.second.pending_op = static_cast<std::uint32_t>(slot::Collective::kAllReduce);
  waiting.first = waiting.second;
  waiting.first.at = std::chrono::seconds(100);
  auto idle = look(1, 320);
  idle.first.collectives_issued = idle.second.collectives_issued = 641;
  idle.first.collectives_done = idle.second.collectives_done = 641;
  idle.stacks_second = "dist::sdk stack of pid 101: steps 320, collectives 641 of 641 done\n";
  const auto f = examine({waiting, idle}, HangRule::kTimeout);
  EXPECT_TRUE(f.ranks[1].cause);
  EXPECT_EQ(f.ranks[1].where, "not in a collective (steps 320, collectives 641 done)");
  EXPECT_EQ(f.ranks[0].where, "waiting in all_reduce #641 for 12.0 s");
  EXPECT_FALSE(examine({waiting, idle}, HangRule::kProof).any_cause());
}

TEST(HangReport, WhenEveryRankWaitsNoneHereIsTheCause) {
  auto a = look(0, 7);
  auto b = look(1, 7);
  a.stacks_second = b.stacks_second = in_torch_dump();
  const auto f = examine({a, b}, HangRule::kTimeout);
  EXPECT_FALSE(f.moving);
  EXPECT_FALSE(f.any_cause());
  EXPECT_TRUE(f.ranks[0].waiting && f.ranks[1].waiting);
}

TEST(HangReport, ASingleRankStuckOnItsOwnIsTheSuspectAndAnUnknownOneIsNot) {
  auto alone = look(0, 7);
  alone.stacks_second = at_user_code_dump();
  EXPECT_TRUE(examine({alone}, HangRule::kTimeout).any_cause());
  EXPECT_TRUE(examine({alone}, HangRule::kProof).idle_suspect());

  auto unknown = look(0, 7, 'S');
  unknown.after.wchan = "pipe_read";
  const auto f = examine({unknown}, HangRule::kTimeout);
  EXPECT_FALSE(f.any_cause());
  EXPECT_EQ(f.ranks[0].where, "no stack (state S, in pipe_read)");
}

TEST(HangReport, UninterruptibleIoIsSaidWithTheKernelsWaitChannel) {
  auto d = look(1, 9, 'D');
  d.after.wchan = "nfs_wait_bit_killable";
  auto w = look(0, 9);
  w.stacks_second = in_torch_dump();
  const auto f = examine({w, d}, HangRule::kTimeout);
  EXPECT_TRUE(f.ranks[1].cause);
  EXPECT_EQ(f.ranks[1].where, "in uninterruptible I/O (state D, in nfs_wait_bit_killable)");
}

TEST(HangReport, CollectivesHaveTheirNames) {
  EXPECT_EQ(collective_name(static_cast<std::uint32_t>(slot::Collective::kAllReduce)),
            "all_reduce");
  EXPECT_EQ(collective_name(static_cast<std::uint32_t>(slot::Collective::kAllToAll)), "all_to_all");
  EXPECT_EQ(collective_name(999), "none");
  EXPECT_EQ(collective_text(5, 3, 0xB2, {0xA1, 0xB2}), "barrier #3 of process group 1");
  EXPECT_EQ(collective_text(1, 3, 0, {}), "all_reduce #3");
}

}  // namespace
}  // namespace dist::agent
