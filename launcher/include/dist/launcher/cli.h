// dist-launch's command line: argv in, an exit code or a validated configuration out.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace dist::launcher {

inline constexpr int kExitOk = 0;
inline constexpr int kExitUsage = 2;  // invalid command line, like torchrun's argparse

struct CliOutcome {
  bool exit_now = false;  // --help, --version or an error: nothing to launch
  int exit_code = kExitOk;
};

// Parses argv. Help and version go to `out`, a one-line error to `err`.
CliOutcome parse_command_line(const std::vector<std::string>& args, std::ostream& out,
                              std::ostream& err);

std::string version();

}  // namespace dist::launcher
