// A worker's heartbeat for dist-launch's hang watchdog (--worker-heartbeat-timeout S): call
// heartbeat() every step. A worker that has beaten once and then stays silent for S seconds is
// taken for hung (a deadlock, a stopped process): the agent kills it and the group restarts. A
// worker that never beats is never watched.
#pragma once

#include "dist/contract/worker_contract.h"

namespace dist::sdk {

// Records that this worker makes progress: a clock read and a store to memory the agent shares,
// no system call, so it is cheap enough for every step and never blocks. Does nothing when
// dist-launch watches no heartbeat. Safe from any thread.
void heartbeat();

// Whether heartbeat() reaches the agent (the worker was started with a heartbeat slot).
bool heartbeat_enabled();

// The channel, for workers in other languages: dist/contract/worker_contract.h.
namespace heartbeat_slot = worker_contract::heartbeat_slot;

}  // namespace dist::sdk
