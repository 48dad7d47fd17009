// dist-launch status: what a job's agents have written to its store, as a table.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace dist::launcher {

// Runs `dist-launch status --rdzv-endpoint HOST:PORT [--rdzv-id ID] [--token-file F]` (args
// without "status"); returns the exit code.
int run_status(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace dist::launcher
