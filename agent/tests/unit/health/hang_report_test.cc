// What a hang investigation makes of two looks at every rank: real faulthandler dumps (written by
// a Python interpreter in the test, never typed in), the SDK's dump line, process states, and the
// slots' counters; which rank is the cause and where each one was.
#include "health/hang_report.h"

#include <gtest/gtest.h>
#include <stdio.h>

#include <array>
#include <cstdlib>
#include <memory>
#include <string>

namespace dist::agent {
namespace {

namespace slot = rendezvous::worker_contract::heartbeat_slot;

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
  l.state = state;
  return l;
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

TEST(HangReport, TheProgressHooksFramesAreNotTheUsersCode) {
  auto waiting = look(0, 12);
  waiting.stacks_second =
      "Current thread 0x00007f00 (most recent call first):\n"
      "  File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", line 1541 "
      "in all_reduce\n"
      "  File \"/tmp/dist-launch-x/python/_dist_launch_progress.py\", line 117 in wrapper\n"
      "  File \"/home/u/train.py\", line 71 in main\n";
  const auto f = examine({waiting, look(1, 12, 'T')});
  EXPECT_EQ(f.ranks[0].where,
            "waiting in torch (all_reduce, /usr/lib/python3/dist-packages/torch/distributed/"
            "distributed_c10d.py:1541) from /home/u/train.py:71 in main");
}

TEST(HangReport, TheRankOutsideTorchIsTheOneTheOthersWaitFor) {
  auto waiting = look(0, 320);
  waiting.stacks_first = waiting.stacks_second = in_torch_dump();
  auto stuck = look(1, 320);
  stuck.stacks_first = stuck.stacks_second = at_user_code_dump();
  const HangFinding f = examine({waiting, stuck});
  ASSERT_FALSE(f.moving);
  ASSERT_EQ(f.ranks.size(), 2U);
  EXPECT_FALSE(f.ranks[0].cause);
  EXPECT_TRUE(f.ranks[0].waiting);
  EXPECT_EQ(f.ranks[0].where,
            "waiting in torch (backward, /usr/lib/python3/dist-packages/torch/autograd/"
            "__init__.py:197) from /home/u/train.py:40 in main");
  EXPECT_TRUE(f.ranks[1].cause);
  EXPECT_EQ(f.ranks[1].where, "at /home/u/train.py:33 in slow_loader");
}

TEST(HangReport, AStackThatMovesBetweenLooksIsWorkNotAHang) {
  auto a = look(0, 10);
  a.stacks_first = at_user_code_dump(33);
  a.stacks_second = at_user_code_dump(34);  // the same function, another line: a loop
  auto b = look(1, 10);
  b.stacks_first = b.stacks_second = in_torch_dump();
  EXPECT_FALSE(examine({a, b}).moving) << "one function, two lines: still stuck in it";

  a.stacks_second = in_torch_dump();  // it went on into torch
  const auto f = examine({a, b});
  ASSERT_TRUE(f.moving);
  EXPECT_NE(f.moving->find("rank 0"), std::string::npos) << *f.moving;
}

TEST(HangReport, MovedCountersAreProgress) {
  auto a = look(0, 10);
  auto b = look(1, 10);
  b.second.collectives_done = 1;
  const auto f = examine({a, b});
  ASSERT_TRUE(f.moving);
  EXPECT_NE(f.moving->find("rank 1"), std::string::npos);
}

TEST(HangReport, AStoppedRankIsTheCauseWhateverTheOthersDo) {
  auto stopped = look(1, 320, 'T');
  auto waiting = look(0, 320);
  waiting.stacks_second = in_torch_dump();
  const auto f = examine({waiting, stopped});
  EXPECT_FALSE(f.ranks[0].cause);
  EXPECT_TRUE(f.ranks[1].cause);
  EXPECT_EQ(f.ranks[1].where, "stopped (state T: SIGSTOP or a debugger)");
}

TEST(HangReport, TheRankBehindIsTheCause) {
  // The SDK's ranks: rank 2 skipped a collective and waits in the next, one issue behind.
  std::vector<RankLook> looks = {look(0, 50), look(1, 50), look(2, 50)};
  for (auto& l : looks) {
    l.first.collectives_issued = l.second.collectives_issued = 101;
    l.first.collectives_done = l.second.collectives_done = 100;
    l.first.pending_since_ns = l.second.pending_since_ns = 70'000'000'000;
    l.second.pending_op = static_cast<std::uint32_t>(slot::Collective::kAllReduce);
  }
  looks[2].first.collectives_issued = looks[2].second.collectives_issued = 100;
  looks[2].second.pending_op = static_cast<std::uint32_t>(slot::Collective::kBarrier);
  const auto f = examine(looks);
  EXPECT_FALSE(f.ranks[0].cause);
  EXPECT_FALSE(f.ranks[1].cause);
  EXPECT_TRUE(f.ranks[2].cause);
  EXPECT_EQ(f.ranks[0].where, "waiting in all_reduce #101 for 32.0 s");
  EXPECT_EQ(f.ranks[2].where,
            "waiting in barrier #101 for 32.0 s; behind the others: 50 steps and 100 "
            "collectives, rank 0 at 50 and 101");
}

TEST(HangReport, AnSdkRankOutsideAnyCollectiveIsTheCause) {
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
  const auto f = examine({waiting, idle});
  EXPECT_TRUE(f.ranks[1].cause);
  EXPECT_EQ(f.ranks[1].where, "not in a collective (steps 320, collectives 641 done)");
  EXPECT_EQ(f.ranks[0].where, "waiting in all_reduce #641 for 12.0 s");
}

TEST(HangReport, WhenEveryRankWaitsNoneHereIsTheCause) {
  auto a = look(0, 7);
  auto b = look(1, 7);
  a.stacks_second = b.stacks_second = in_torch_dump();
  const auto f = examine({a, b});
  EXPECT_FALSE(f.moving);
  EXPECT_FALSE(f.any_cause());
  EXPECT_TRUE(f.ranks[0].waiting && f.ranks[1].waiting);
}

TEST(HangReport, ASingleRankStuckOnItsOwnIsTheCauseAndAnUnknownOneIsNot) {
  auto alone = look(0, 7);
  alone.stacks_second = at_user_code_dump();
  EXPECT_TRUE(examine({alone}).any_cause());

  auto unknown = look(0, 7, 'S');
  unknown.wchan = "pipe_read";
  const auto f = examine({unknown});
  EXPECT_FALSE(f.any_cause());
  EXPECT_EQ(f.ranks[0].where, "no stack (state S, in pipe_read)");
}

TEST(HangReport, UninterruptibleIoIsSaidWithTheKernelsWaitChannel) {
  auto d = look(1, 9, 'D');
  d.wchan = "nfs_wait_bit_killable";
  auto w = look(0, 9);
  w.stacks_second = in_torch_dump();
  const auto f = examine({w, d});
  EXPECT_TRUE(f.ranks[1].cause);
  EXPECT_EQ(f.ranks[1].where, "in uninterruptible I/O (state D, in nfs_wait_bit_killable)");
}

TEST(HangReport, CollectivesHaveTheirNames) {
  EXPECT_EQ(collective_name(static_cast<std::uint32_t>(slot::Collective::kAllReduce)),
            "all_reduce");
  EXPECT_EQ(collective_name(static_cast<std::uint32_t>(slot::Collective::kAllGather)),
            "all_gather");
  EXPECT_EQ(collective_name(999), "none");
}

}  // namespace
}  // namespace dist::agent
