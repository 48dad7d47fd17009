// The variables torch's LocalElasticAgent reads from its own environment, read the same way:
// TORCHELASTIC_ENABLE_FILE_TIMER ("1": serve the file timer pipe), TORCHELASTIC_TIMER_FILE (its
// path) and TORCHELASTIC_HEALTH_CHECK_PORT (serve the health check there).
#pragma once

#include "dist/agent/config.h"

namespace dist::launcher {

// Fills the file timer and health check fields of `options`. Throws std::invalid_argument naming
// the variable when one is malformed (torch only logs a bad port and serves nothing).
void read_torchelastic_environment(agent::WatchdogOptions& options);

}  // namespace dist::launcher
