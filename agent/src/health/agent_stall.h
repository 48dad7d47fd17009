// The agent's own stalls. A timer of the agent that fires kAgentStall or more after it was due
// means that the agent did not run meanwhile: held stopped with its workers (Slurm's `scontrol
// suspend`, a kill -STOP of the job's processes), a paused virtual machine, a machine too loaded to
// schedule it. Nobody watched the workers then, and they were most likely held too: the time of a
// stall is not counted in a worker's silence, nor against a heartbeat's deadline or a timer's, so
// that a job suspended and resumed is not taken for hung (it used to be looked at as silent for
// the whole suspension; with --worker-heartbeat-timeout, killed).
//
// A stall is a fact about the agent's process, so it is kept once for the process: whichever
// watchdog's timer sees it first notes it (and says it), and every watchdog asks how much of a
// span the agent was stalled. Times are monotonic_now()'s (CLOCK_MONOTONIC, the slots' clock).
#pragma once

#include <chrono>

namespace dist::agent {

inline constexpr std::chrono::seconds kAgentStall{5};

// A timer due at `due` fires at `now`: when that is kAgentStall late or more, the stall (due to
// now) is noted, said once, and true returned.
bool agent_stalled(std::chrono::nanoseconds due, std::chrono::nanoseconds now);

// How long of [from, to] the agent was stalled (the last kKeptStalls stalls).
std::chrono::nanoseconds agent_stalled_between(std::chrono::nanoseconds from,
                                               std::chrono::nanoseconds to);

// The time since `since` that the agent ran: now - since, less its stalls.
std::chrono::nanoseconds ran_since(std::chrono::nanoseconds since, std::chrono::nanoseconds now);

}  // namespace dist::agent
