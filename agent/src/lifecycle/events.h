// What happens to the agent (lifecycle/agent.cc), as typed events: from the worker group, the
// signals and the steps that talk to the rendezvous store. on() visits them; a step's exception
// is a RendezvousFailed (failure_event).
#pragma once

#include <sys/types.h>

#include <exception>
#include <string>
#include <variant>
#include <vector>

#include "rendezvous/rendezvous.h"
#include "rendezvous/round_source.h"

namespace dist::agent {

namespace event {
struct Prepared {};  // the stores and the rendezvous session are ready
struct Joined {
  Round round;
};
struct WorkersFailed {
  std::vector<WorkerFailure> failures;
};
struct StartFailed {  // a start that waited for the --warm-restart zygote
  std::string why;
};
struct WorkersSucceeded {};
struct GroupStopped {};
struct WatchEnded {  // the round's watch: ended elsewhere, stopped, or the store lost
  WatchOutcome outcome;
};
struct BarrierDone {
  BarrierEnd end;
};
struct VerdictReached {
  Verdict verdict;
};
struct FailuresCollected {
  CollectedFailures all;
};
struct OthersLeft {};
struct RendezvousFailed {  // a rendezvous step could not be done
  enum Kind { kError, kJobOver, kJobDone, kRoundAborted, kCancelled } kind = kError;
  std::string why;
};
struct SignalReceived {
  int signal = 0;
  pid_t sender = 0;
  int code = 0;  // si_code
};
}  // namespace event

using Event = std::variant<event::Prepared, event::Joined, event::WorkersFailed, event::StartFailed,
                           event::WorkersSucceeded, event::GroupStopped, event::WatchEnded,
                           event::BarrierDone, event::VerdictReached, event::FailuresCollected,
                           event::OthersLeft, event::RendezvousFailed, event::SignalReceived>;

// One lambda per event type, for std::visit over an Event.
template <typename... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <typename... F>
Overloaded(F...) -> Overloaded<F...>;

// A step's exception, as the event it is: the job over or done, the round aborted, cancelled
// (the agent leaving: nothing to say), or an error.
event::RendezvousFailed failure_event(std::exception_ptr e);

}  // namespace dist::agent
