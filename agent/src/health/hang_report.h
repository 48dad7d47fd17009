// What a hang investigation found (hang_detector.h gathers it): where each rank of this node was,
// what it was doing, which of them the others wait for, and whether any of them cannot go on.
// Plain values in, plain answers out.
//
// A rank is read twice, kConfirmGap apart: its slot, the kernel's word on its processes (state,
// CPU time, I/O: process_activity.h) and the stacks it dumped on the agent's signal (Python's
// faulthandler for torch workers, the SDK's pending collective and backtrace for C++ ones). Then:
//   - moving: a rank whose counters moved (a step, a beat, a collective issued or done, a pause
//     that ended) makes progress: no hang. Under the timeout rule a main thread in other
//     functions the second time counts as moving too (an evaluation, a slow checkpoint);
//   - proven: the ranks the kernel holds stopped (state T at both looks: SIGSTOP, SIGTSTP; not a
//     debugger's stop, state t) and those whose collectives can never match (collective_proof.h,
//     with the ranks of other nodes as their agents published them) cannot go on: the cause,
//     whatever the rule;
//   - suspects: else the ranks behind the others (fewer steps, or fewer collectives issued), else
//     those not blocked in a collective while others are, else (one rank alone, not waiting) that
//     rank. Under the timeout rule (an explicit --hang-timeout) they are the cause unless a rank
//     declared a pause; under the proof rule (--hang-timeout auto) they are reported, with what
//     they are doing: one that works (CPU, I/O, its Python stack moving) or declared a pause is
//     no hang, one that does none of it is suspected of one; past the bound (the job's own
//     collective timeout) the suspects that do nothing at all are the cause.
// Where a rank was is said in one line ("at train.py:42 in train_step", "waiting in all_reduce #12
// of process group 0 for 31.0 s", "stopped (state T: SIGSTOP)"), what it was doing in another
// ("computing (CPU 98%)", "writing (12.5 MB in 2.0 s), in torch.save", "idle").
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "health/collective_proof.h"
#include "health/process_activity.h"
#include "health/step_stats.h"
#include "health/telemetry.h"

namespace dist::agent {

inline constexpr double kIdleCpuShare = 0.10;  // of one core: less is no work of its own
inline constexpr double kRunnableShare = 0.5;  // on a CPU or waiting for one: computes, crowded
inline constexpr double kMinProvenWaitSeconds = 10;  // blocked at least this long for a proof
// Blocked this long: published for the job view (proofs from other nodes' waits still ask
// kMinProvenWaitSeconds of each; a node whose every worker is stopped learns sooner that others
// wait for it).
inline constexpr double kPublishedWaitSeconds = 3;

struct RankLook {
  Worker worker;
  SlotReading first, second;
  ProcessActivity before, after;                           // at the first look and the second
  std::optional<std::string> stacks_first, stacks_second;  // what each ask made it dump
  std::uint64_t stack_bytes = 0;  // written to its stack file between the two readings
};

enum class HangRule {
  kProof,    // --hang-timeout auto, before the bound: only a proof ends a rank
  kBound,    // auto past the bound: and the suspects that do nothing at all
  kTimeout,  // an explicit --hang-timeout: and every suspect, unless a rank declared a pause
};

struct RankWhere {
  bool cause = false;    // to be ended
  bool proven = false;   // it cannot go on
  bool suspect = false;  // the others wait for it (or, alone, it makes no progress)
  bool waiting = false;  // blocked in a collective, for its peers
  bool active = false;   // works: CPU, I/O, its stack moving
  // Idle inside torch.save, torch.distributed.checkpoint, a DataLoader or torch.compile (a
  // network file system, its loader's or compiler's workers), or blocked writing output that its
  // reader does not take (a slow log service): said as its work, no warning; but
  // ended past the bound as an idle rank (a DataLoader's timeout is none by default).
  bool own_work = false;
  bool paused = false;        // declared a pause of its own
  bool awaits_input = false;  // reads its terminal or stdin (a debugger's prompt, input())
  bool awaits_child = false;  // waits for a child process of its own to end (subprocess.run)
  std::string where;
  std::string doing;
  // A suspect that neither works nor declared a pause.
  bool idle_suspect() const;
};

struct HangFinding {
  std::optional<std::string> moving;  // why this is no hang, when it is none
  std::optional<std::string> proof;   // why the proven ranks cannot go on
  std::vector<RankWhere> ranks;       // in the order of the looks
  bool any_cause() const;
  // A suspect that neither works nor declared a pause: what a warning is said for.
  bool idle_suspect() const;
  // Every such suspect reads its terminal or stdin: it waits for its user.
  bool idle_suspects_await_input() const;
  // Every such suspect waits for a child process of its own (that does nothing either).
  bool idle_suspects_await_children() const;
  bool any_paused() const;
};

// `elsewhere`: the collectives of ranks on other nodes, as their agents published them. A rank
// blocked for less than `min_proven_wait_s` proves nothing.
HangFinding examine(const std::vector<RankLook>& looks, HangRule rule,
                    const std::vector<CollectiveState>& elsewhere = {},
                    double min_proven_wait_s = kMinProvenWaitSeconds);

// A rank's collective state as two looks agree on it (collective_proof.h): its groups' counts,
// and the collective it is blocked in when both looks show the same one, it did no work meanwhile
// and it has been blocked in it for `min_wait_s` at least.
CollectiveState collective_state(const RankLook& look, double min_wait_s = kMinProvenWaitSeconds);

// How long the rank has been blocked in its pending collective at the second look (0: none), as
// the report says it, whether or not it spins meanwhile.
double waited_seconds(const RankLook& look);

// A Python stack, as faulthandler dumps all threads: the main thread's frames, innermost first.
struct PythonFrame {
  std::string file;
  int line = 0;
  std::string function;
  bool in_torch = false;  // the file is torch's own
  bool hook = false;      // dist-launch's progress hook (python/dist_launch/progress.py)
};
std::vector<PythonFrame> main_thread_frames(std::string_view dump);

// What a slot says a rank is blocked in: "all_reduce #12 of process group 0"; empty when none.
std::string pending_text(const SlotReading& reading);

}  // namespace dist::agent
