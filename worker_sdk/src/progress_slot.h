// The worker's progress slot (dist/contract/worker_contract.h), mapped once for heartbeat(),
// step() and the process groups' collectives; and what the SDK writes when the agent asks a hung
// worker where it is.
#pragma once

#include <chrono>
#include <cstdint>

#include "dist/contract/worker_contract.h"

namespace dist::sdk::detail {

using Slot = worker_contract::heartbeat_slot::Slot;
using Collective = worker_contract::heartbeat_slot::Collective;

// The slot the agent passed, mapped; null without one (outside dist-launch, or heartbeats off).
Slot* progress_slot();

// CLOCK_MONOTONIC in nanoseconds: the clock every stamp in the slot uses.
std::uint64_t monotonic_ns();

// A collective issued (its sequence number) and completed (or failed): the slot's counts and the
// oldest pending one. Cheap (a lock held for a few stores), safe from any thread.
std::uint64_t collective_issued(Collective kind);
void collective_completed(std::uint64_t sequence);
Collective collective_kind(const char* name);  // "all_reduce" -> kAllReduce, ...
// A process group's collective timeout: the slot keeps the longest (the agent's bound for a hang
// it cannot prove).
void note_collective_timeout(std::chrono::milliseconds timeout);

// A step's own work, before it waited for its peers (the slot's work_ns; the straggler measure).
void add_work(std::uint64_t ns);

// While one lives (nested: the outermost), the slot says this worker waits for its peers in a
// group's set-up (setup_since_ns): building a process group, or an in-place generation. The agent
// publishes such a rank as waiting on its group's every rank (a node whose workers are all held
// stopped is waited on, not paused).
class SetupWait {
 public:
  SetupWait();
  ~SetupWait();
  SetupWait(const SetupWait&) = delete;
  SetupWait& operator=(const SetupWait&) = delete;
};

// Once (init() calls it): on the agent's stack-dump signal (DIST_STACK_SIGNAL), append this
// process's pending collective and a backtrace to DIST_STACK_FILE, and tell the agent it does.
void install_stack_dump();

}  // namespace dist::sdk::detail
