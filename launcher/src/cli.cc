// dist-launch's command line: argv in, the job out. Declaring the options (options.cc) and giving
// them meaning (config_from_options.cc) are apart; this file parses argv between the two
// (command_line.h), and answers --help, --version and --print-completion itself.
#include "dist/launcher/cli.h"

#include <unistd.h>

#include <filesystem>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>

#include "command_line.h"
#include "completion.h"
#include "config_from_options.h"
#include "logging.h"
#include "option_scan.h"
#include "options.h"

namespace dist::launcher {
namespace {

namespace fs = std::filesystem;

// An empty PET_* value is an error, not a silent default: the Kubeflow training operator sets
// PET_STANDALONE="" for `standalone: true`, which read as unset would run a different job.
std::optional<std::string> empty_environment(const CommandLine& app,
                                             const CommandLine::Parsed& parsed) {
  const auto empty = app.empty_variables(parsed);
  if (empty.empty()) return std::nullopt;
  const auto& first = empty.front();
  return first.variable + " is set but empty: " +
         (first.flag ? "set it to 1 or 0, or unset it (for standalone: true, which the Kubeflow "
                       "training operator passes as an empty PET_STANDALONE, give --standalone)"
                     : "give it a value or unset it (" + first.option + ")");
}

constexpr const char* kExamples =
    "Examples:\n"
    "  dist-launch --nproc-per-node 4 train.py --lr 0.1\n"
    "  dist-launch --nproc-per-node 2 --no-python build/bin/ddp_train --epochs 5\n"
    "  dist-launch --nnodes 2 --node-rank 0 --master-addr A --master-port 29500 train.py\n"
    "  dist-launch --nnodes 1:4 --rdzv-endpoint A:29400 --rdzv-id job7 train.py\n"
    "  dist-launch --hosts A:4,B:4 train.py (an agent on each host over ssh)";

// argv into `raw`; an outcome when that already ends the run (help, version, a parse error).
// An option given twice keeps its last value, as with argparse.
std::optional<CliOutcome> parse(CommandLine& app, const std::vector<std::string>& args,
                                RawOptions& raw, std::ostream& out, std::ostream& err) {
  CommandLine::Parsed parsed;
  try {
    parsed = app.parse(args);
  } catch (const OptionScanError& e) {
    err << "dist-launch: error: " << e.what() << "\n";
    return CliOutcome{true, kExitUsage, {}};
  } catch (const CommandLineError& e) {
    err << "dist-launch: error: " << e.what() << " (see dist-launch --help)\n";
    return CliOutcome{true, kExitUsage, {}};
  }
  if (parsed.help) {
    out << app.help();
    return CliOutcome{true, kExitOk, {}};
  }
  if (parsed.version) {
    out << "dist-launch " << version() << "\n";
    return CliOutcome{true, kExitOk, {}};
  }
  if (!parsed.rest.empty() && !parsed.given.contains("--print-completion")) {
    if (const auto empty = empty_environment(app, parsed)) {
      err << "dist-launch: error: " << *empty << "\n";
      return CliOutcome{true, kExitUsage, {}};
    }
  }
  raw.expanded_args = std::move(parsed.expanded);
  raw.script_and_args = std::move(parsed.rest);
  raw.script_after_dash_dash = parsed.dash_dash;
  raw.given = std::move(parsed.given);
  return std::nullopt;
}

CliOutcome usage_error(const std::string& message, std::ostream& err) {
  err << "dist-launch: error: " << message << "\n";
  return {true, kExitUsage, {}};
}

}  // namespace

std::string version() {
  return DIST_VERSION;
}

// pip installs dist-launch into a venv's (or a prefix's) bin/, next to the interpreter the job's
// packages were installed for: its workers use that one, as torchrun's use torchrun's own.
std::string default_python(const fs::path& program) {
  if (!program.is_absolute()) return "python3";
  for (const char* name : {"python3", "python"}) {
    const fs::path candidate = program.parent_path() / name;
    std::error_code ec;
    if (::access(candidate.c_str(), X_OK) == 0 && !fs::is_directory(candidate, ec)) {
      return candidate.string();
    }
  }
  return "python3";
}

CliOutcome parse_command_line(const std::vector<std::string>& args, std::ostream& out,
                              std::ostream& err) {
  CommandLine app("dist-launch",
                  "dist-launch: start and supervise the workers of a distributed job "
                  "(torchrun-compatible). Every option may also come from PET_<NAME>; long "
                  "options may be abbreviated to a unique prefix, and spelled with underscores "
                  "(--hang_timeout).",
                  "[OPTIONS] TRAINING_SCRIPT [SCRIPT_ARGS...]");
  app.footer(kExamples);
  RawOptions raw;
  declare_options(app, raw);
  if (auto done = parse(app, args, raw, out, err)) return *done;
  try {
    if (raw.was_given("--print-completion")) {
      const auto script = completion_script(raw.print_completion, app.long_names());
      if (!script) {
        throw UsageError("--print-completion takes " + std::string(kCompletionShells) + ", got '" +
                         raw.print_completion + "'");
      }
      out << *script;
      return {true, kExitOk, {}};
    }
    std::ostream hidden(nullptr);  // (what is written to it goes nowhere)
    return config_from_options(raw, warnings_hidden() ? hidden : err);
  } catch (const UsageError& e) {
    return usage_error(e.what(), err);
  } catch (const agent::ConfigError& e) {
    const bool from_environment = raw.log_line_prefix_template.empty() &&
                                  std::getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
    const bool about_prefix = std::string_view(e.what()).starts_with("--log-line-prefix-template");
    return usage_error(
        std::string(e.what()) + (from_environment && about_prefix
                                     ? " (from TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)"
                                     : ""),
        err);
  } catch (const std::invalid_argument& e) {  // a malformed SLURM_*, TORCHELASTIC_*, the token
    return usage_error(e.what(), err);
  }
}

}  // namespace dist::launcher
