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
// span the agent was stalled. While workers run, the watchdogs' tick comes every second and says
// when the next one is due: any handler that runs first after a stall (a heartbeat's deadline, a
// file timer request read from its pipe) sees the stall from that.
// Times are monotonic_now()'s (CLOCK_MONOTONIC, the slots' clock).
#pragma once

#include <chrono>
#include <optional>

namespace dist::agent {

inline constexpr std::chrono::seconds kAgentStall{5};

// A timer due at `due` fires at `now`: when that is kAgentStall late or more, the stall (due to
// now) is noted, said once, and true returned.
bool agent_stalled(std::chrono::nanoseconds due, std::chrono::nanoseconds now);

// The regular tick's next due time; none while no tick runs (no worker runs).
void expect_tick(std::optional<std::chrono::nanoseconds> due);
// Whether the tick is kAgentStall overdue at `now`: a stall, noted as agent_stalled() does.
bool stall_seen_now(std::chrono::nanoseconds now);
// When what happens at `now` may have happened: the start of a stall that ended a moment ago
// (what the agent reads now was most likely written before it), else `now`.
std::chrono::nanoseconds unwatched_since(std::chrono::nanoseconds now);

// How long of [from, to] the agent was stalled (the last kKeptStalls stalls).
std::chrono::nanoseconds agent_stalled_between(std::chrono::nanoseconds from,
                                               std::chrono::nanoseconds to);

// The time since `since` that the agent ran: now - since, less its stalls.
std::chrono::nanoseconds ran_since(std::chrono::nanoseconds since, std::chrono::nanoseconds now);

}  // namespace dist::agent
