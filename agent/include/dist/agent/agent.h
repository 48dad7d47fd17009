// The per-node agent: hosts the store, starts the node's workers, watches them, restarts the group
// on failure and reports the root cause. run() returns the process exit code.
#pragma once

#include "dist/agent/config.h"

namespace dist::agent {

// Runs the job on this node to completion. Returns 0 when every worker succeeded, the root-cause
// worker's exit code (128 + signal for a signal) when the job failed, or 128 + signal when the
// agent itself was told to stop.
int run_agent(const LaunchConfig& config);

}  // namespace dist::agent
