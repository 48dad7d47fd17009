// What a hang investigation found (hang_detector.h gathers it): where each rank of this node was,
// and which of them the others wait for. Plain values in, plain answers out.
//
// A rank is read twice, kConfirmGap apart (its slot, the kernel's word on the process, and the
// stacks it dumped on the agent's signal: Python's faulthandler for torch workers, the SDK's
// pending collective and backtrace for C++ ones). Then, in order:
//   - moving: a rank whose counters moved, or whose main thread is in other functions the second
//     time, is working (an evaluation, a checkpoint written slowly): no hang;
//   - the ranks the kernel holds stopped (state T: SIGSTOP, a debugger) are the cause;
//   - else those behind the others (fewer steps, or fewer collectives issued: one that skipped
//     a collective);
//   - else those not waiting in a collective (the SDK's pending one, a frame inside torch on top
//     of the main thread's Python stack) while others are: the ones the others wait for;
//   - else none here: every rank waits (for a rank on another node, or a mismatch among them).
// Where each rank was is said in one line: "at train.py:42 in train_step", "waiting in torch
// (backward, torch/_tensor.py:487) from train.py:40 in main", "waiting in all_reduce #12 for
// 31.0 s", "stopped (state T: SIGSTOP or a debugger)".
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "health/step_stats.h"
#include "health/telemetry.h"

namespace dist::agent {

struct RankLook {
  WorkerRef worker;
  SlotReading first, second;
  char state = '?';  // /proc/<pid>/stat's state at the second look (of the worker or its dumper)
  std::string wchan;
  std::optional<std::string> stacks_first, stacks_second;  // what each signal made it dump
};

struct RankWhere {
  bool cause = false;
  bool waiting = false;  // waits for its peers
  std::string where;
};

struct HangFinding {
  std::optional<std::string> moving;  // why this is no hang, when it is none
  std::vector<RankWhere> ranks;       // in the order of the looks
  bool any_cause() const;
};

HangFinding examine(const std::vector<RankLook>& looks);

// A Python stack, as faulthandler dumps all threads: the main thread's frames, innermost first.
struct PythonFrame {
  std::string file;
  int line = 0;
  std::string function;
  bool in_torch = false;  // the file is torch's own
  bool hook = false;      // dist-launch's progress hook (python/dist_launch/progress.py)
};
std::vector<PythonFrame> main_thread_frames(std::string_view dump);

// "waiting in all_reduce" for the slot's pending_op.
std::string_view collective_name(std::uint32_t pending_op);

}  // namespace dist::agent
