// dist-launch's own messages: through the non-blocking console, "[<name>] level: text".
#pragma once

#include <memory>
#include <string>

#include "dist/agent/console.h"

namespace dist::launcher {

// Colored on a terminal only; the level from LOGLEVEL, like torchrun's.
void setup_logging(std::shared_ptr<agent::Console> console, const std::string& name);

// LOGLEVEL hides warnings (error, critical, off): the command line's warnings and notices too.
bool warnings_hidden();

}  // namespace dist::launcher
