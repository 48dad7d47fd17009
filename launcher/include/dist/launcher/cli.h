// dist-launch's command line: argv (and PET_* variables) in, a validated LaunchConfig out.
#pragma once

#include <filesystem>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "dist/agent/config.h"
#include "dist/launcher/hosts_job.h"

namespace dist::launcher {

inline constexpr int kExitOk = 0;
inline constexpr int kExitUsage = 2;  // invalid command line, like torchrun's argparse

struct CliOutcome {
  bool exit_now = false;  // --help, --version or an error: nothing to launch
  int exit_code = kExitOk;
  agent::LaunchConfig config;
  std::optional<HostsJobConfig> hosts_job = std::nullopt;  // --hosts: the job over ssh
};

// Parses argv (without the program name). Help and version go to `out`, a one-line error to
// `err`; notices (OMP_NUM_THREADS) to `err` as well.
CliOutcome parse_command_line(const std::vector<std::string>& args, std::ostream& out,
                              std::ostream& err);

std::string version();

// The interpreter Python workers run when PYTHON_EXEC is unset: python3 (else python) in the
// directory of `program`, dist-launch's own path, when it holds one; otherwise "python3" from PATH.
std::string default_python(const std::filesystem::path& program);

}  // namespace dist::launcher
