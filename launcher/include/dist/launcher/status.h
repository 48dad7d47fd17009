// dist-launch status: what a job's agents have written to its store, as a table, once or live.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace dist::launcher {

// Runs `dist-launch status --rdzv-endpoint HOST:PORT [--rdzv-id ID] [--token-file F] [--json]
// [--watch [--interval S] [--count N]]` (args without "status"); returns the exit code.
// `terminal`: `out` is a terminal, where --watch redraws in place (ANSI cursor home and clears).
int run_status(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
               bool terminal = false);

}  // namespace dist::launcher
