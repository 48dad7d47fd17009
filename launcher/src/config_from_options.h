// The meaning of dist-launch's options (options.h): a validated LaunchConfig, or the job over ssh
// (--hosts), with no CLI11 in sight. The steps run in one order, each its own function: Slurm's
// step fills what the command line left out, --hosts takes over, the rendezvous is chosen (as
// torchrun chooses it), --standalone patches it, then the worker command, the warm-restart and
// snapshot flags (which depend on it: Python workers or not) and the agent's checks.
#pragma once

#include <iosfwd>
#include <optional>
#include <stdexcept>
#include <string>

#include "dist/launcher/cli.h"
#include "options.h"

namespace dist::launcher {

// A user error: reported as one line, exit code 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The job `raw` describes. Notices (OMP_NUM_THREADS, ignored options) go to `err`. An extra Slurm
// task, which leaves at once, is an outcome with exit_now and exit code 0. Throws UsageError,
// agent::ConfigError, or std::invalid_argument (a malformed SLURM_*, TORCHELASTIC_* or token).
CliOutcome config_from_options(const RawOptions& raw, std::ostream& err);

// A run id for a job that was given none (--standalone, --hosts): random hex.
std::string random_run_id();

// Whether every address `host` resolves to is a loopback one (false when it does not resolve).
bool resolves_to_loopback_only(const std::string& host);

// The warning for a job of several machines whose Python workers' gloo would bind this host's
// name, `hostname`, when that resolves to loopback alone (Debian and Ubuntu map it to 127.0.1.1):
// empty when none is due (one node; every node on this machine; GLOO_SOCKET_IFNAME set).
std::string loopback_hostname_warning(const agent::LaunchConfig& c, const std::string& hostname);

}  // namespace dist::launcher
