// dist-launch's command line: argv in, the job out. Declaring the options (options.cc) and giving
// them meaning (config_from_options.cc) are apart; this file parses argv with CLI11 between the
// two, and answers --help, --version and --print-completion itself.
#include "dist/launcher/cli.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <ostream>
#include <stdexcept>

#include "completion.h"
#include "config_from_options.h"
#include "option_scan.h"
#include "options.h"

namespace dist::launcher {
namespace {

namespace fs = std::filesystem;

// An empty PET_* value is an error, not a silent default: the Kubeflow training operator sets
// PET_STANDALONE="" for `standalone: true`, which read as unset would run a different job.
void reject_empty_environment(const CLI::App& app) {
  for (const CLI::Option* option : all_options(app)) {
    const std::string name = option->get_envname();
    if (name.empty() || option->count() > 0) continue;  // the command line gave it
    const char* value = std::getenv(name.c_str());
    if (!value || *value) continue;
    throw UsageError(name + " is set but empty: " +
                     (option->get_expected_min() == 0
                          ? "set it to 1 or 0, or unset it (for standalone: true, which the "
                            "Kubeflow training operator passes as an empty PET_STANDALONE, give "
                            "--standalone)"
                          : "give it a value or unset it (" + option->get_name() + ")"));
  }
}

std::vector<OptionSpelling> spellings(const CLI::App& app) {
  std::vector<OptionSpelling> out;
  for (const CLI::Option* option : all_options(app)) {
    out.push_back({option->get_lnames(), option->get_snames(), option->get_expected_min() > 0});
  }
  return out;
}

std::vector<std::string> long_options(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* option : all_options(app)) {
    for (const auto& name : option->get_lnames()) names.push_back("--" + name);
  }
  return names;
}

void describe(CLI::App& app) {
  app.set_version_flag("--version", "dist-launch " + version());
  // An option given twice keeps its last value, as with argparse.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.prefix_command();  // everything from the training script on belongs to the script
  app.footer(
      "Examples:\n"
      "  dist-launch --nproc-per-node 4 train.py --lr 0.1\n"
      "  dist-launch --nproc-per-node 2 --no-python build/bin/ddp_train --epochs 5\n"
      "  dist-launch --nnodes 2 --node-rank 0 --master-addr A --master-port 29500 train.py\n"
      "  dist-launch --nnodes 1:4 --rdzv-endpoint A:29400 --rdzv-id job7 train.py\n"
      "  dist-launch --hosts A:4,B:4 train.py (an agent on each host over ssh)");
}

// argv into `raw`; an outcome when that already ends the run (help, version, a parse error).
std::optional<CliOutcome> parse(CLI::App& app, const std::vector<std::string>& args,
                                RawOptions& raw, std::ostream& out, std::ostream& err) {
  try {
    raw.expanded_args = expand_options(args, spellings(app));
    std::vector<std::string> reversed(raw.expanded_args.rbegin(), raw.expanded_args.rend());
    app.parse(reversed);  // CLI11 takes the arguments from the back
  } catch (const OptionScanError& e) {
    err << "dist-launch: error: " << e.what() << "\n";
    return CliOutcome{true, kExitUsage, {}};
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    return CliOutcome{true, kExitOk, {}};
  } catch (const CLI::CallForAllHelp&) {
    out << app.help("", CLI::AppFormatMode::All);
    return CliOutcome{true, kExitOk, {}};
  } catch (const CLI::CallForVersion&) {
    out << "dist-launch " << version() << "\n";
    return CliOutcome{true, kExitOk, {}};
  } catch (const CLI::ParseError& e) {
    err << "dist-launch: error: " << e.what() << " (see dist-launch --help)\n";
    return CliOutcome{true, kExitUsage, {}};
  }
  collect_parse_results(app, raw);
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
  CLI::App app{
      "dist-launch: start and supervise the workers of a distributed job "
      "(torchrun-compatible). Every option may also come from PET_<NAME>; long options may be "
      "abbreviated to a unique prefix.",
      "dist-launch"};
  describe(app);
  RawOptions raw;
  declare_options(app, raw);
  if (auto done = parse(app, args, raw, out, err)) return *done;
  try {
    if (raw.was_given("--print-completion")) {
      const auto script = completion_script(raw.print_completion, long_options(app));
      if (!script) {
        throw UsageError("--print-completion takes " + std::string(kCompletionShells) + ", got '" +
                         raw.print_completion + "'");
      }
      out << *script;
      return {true, kExitOk, {}};
    }
    if (!raw.script_and_args.empty()) reject_empty_environment(app);
    return config_from_options(raw, err);
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
