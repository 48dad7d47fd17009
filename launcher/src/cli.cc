#include "dist/launcher/cli.h"

#include <CLI/CLI.hpp>
#include <ostream>

namespace dist::launcher {

std::string version() {
  return DIST_VERSION;
}

CliOutcome parse_command_line(const std::vector<std::string>& args, std::ostream& out,
                              std::ostream& err) {
  CLI::App app{
      "dist-launch: start and supervise the workers of a distributed job "
      "(torchrun-compatible)",
      "dist-launch"};
  app.set_version_flag("--version", "dist-launch " + version());
  app.footer("Example: dist-launch --nproc-per-node 2 train.py --lr 0.1");

  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 parses from the back
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    return {true, kExitOk};
  } catch (const CLI::CallForAllHelp&) {
    out << app.help("", CLI::AppFormatMode::All);
    return {true, kExitOk};
  } catch (const CLI::CallForVersion&) {
    out << "dist-launch " << version() << "\n";
    return {true, kExitOk};
  } catch (const CLI::ParseError& e) {
    err << "dist-launch: error: " << e.what() << " (see dist-launch --help)\n";
    return {true, kExitUsage};
  }
  return {};
}

}  // namespace dist::launcher
