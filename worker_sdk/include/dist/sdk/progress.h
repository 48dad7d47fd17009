// A worker's progress, for dist-launch's hang and straggler detection (on by default): call step()
// once per training step, after the optimizer's step. torch workers need nothing: dist-launch
// counts their optimizer steps itself.
//
// A step costs a clock read and two stores to memory the agent shares (the worker's slot,
// dist/rendezvous/worker_contract.h): no system call, nothing that can block. The SDK's process
// groups also count their collectives there, and the oldest one still pending, so that the agent
// can say where a hung rank waits. Outside dist-launch nothing is recorded.
#pragma once

namespace dist::sdk {

// One training step done. Safe from any thread.
void step();

// Whether step() reaches the agent (the worker was started with a progress slot).
bool progress_enabled();

}  // namespace dist::sdk
