// A worker's progress, for dist-launch's hang and straggler detection (on by default): call step()
// once per training step, after the optimizer's step. torch workers need nothing: dist-launch
// counts their optimizer steps itself.
//
// A step costs a clock read and two stores to memory the agent shares (the worker's slot,
// dist/contract/worker_contract.h): no system call, nothing that can block. The SDK's process
// groups also count their collectives there, and the oldest one still pending, so that the agent
// can say where a hung rank waits. Outside dist-launch nothing is recorded.
#pragma once

#include <string_view>

namespace dist::sdk {

// One training step done. Safe from any thread.
void step();

// Whether step() reaches the agent (the worker was started with a progress slot).
bool progress_enabled();

// A long pause of the worker's own, said to dist-launch: a checkpoint written for minutes, an
// evaluation on one rank while the others wait. While a Pause lives the agent reports the rank as
// paused (the reason, for how long), never as hung, and ends it for no timeout of its own (the
// collectives' own timeouts still hold); its end counts as progress. Nests; any thread.
//
//   { dist::sdk::Pause pause("checkpoint"); save(state); }
class Pause {
 public:
  explicit Pause(std::string_view reason);
  ~Pause();
  Pause(const Pause&) = delete;
  Pause& operator=(const Pause&) = delete;
};

}  // namespace dist::sdk
