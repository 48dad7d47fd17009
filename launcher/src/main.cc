// dist-launch: parse the command line, then run this node's agent.
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <iostream>

#include "dist/agent/agent.h"
#include "dist/agent/console.h"
#include "dist/launcher/cli.h"
#include "dist/launcher/status.h"

namespace {

// The agent's own messages, through the same non-blocking console as the workers' output:
// colored on a terminal only; level from LOGLEVEL like torchrun.
void setup_logging(std::shared_ptr<dist::agent::Console> console) {
  auto logger = dist::agent::make_console_logger("dist-launch", std::move(console));
  logger->set_pattern("[dist-launch] %^%l%$: %v");
  spdlog::set_default_logger(logger);
  const char* level = std::getenv("LOGLEVEL");
  std::string name = level ? level : "info";
  for (auto& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (name == "warning") name = "warn";
  spdlog::set_level(spdlog::level::from_str(name));
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args.front() == "status") {
    return dist::launcher::run_status({args.begin() + 1, args.end()}, std::cout, std::cerr);
  }
  const auto outcome = dist::launcher::parse_command_line(args, std::cout, std::cerr);
  if (outcome.exit_now) return outcome.exit_code;
  const auto console = dist::agent::Console::process();
  setup_logging(console);
  const int exit_code = dist::agent::run_agent(outcome.config);
  console->flush_for(dist::agent::kConsoleExitFlushTimeout);  // a blocked console is not waited for
  return exit_code;
}
