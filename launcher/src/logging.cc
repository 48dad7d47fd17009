#include "logging.h"

#include <spdlog/spdlog.h>

#include <cctype>
#include <cstdlib>

namespace dist::launcher {

void setup_logging(std::shared_ptr<agent::Console> console, const std::string& name) {
  auto logger = agent::make_console_logger(name, std::move(console));
  logger->set_pattern("[" + name + "] %^%l%$: %v");
  spdlog::set_default_logger(logger);
  const char* level = std::getenv("LOGLEVEL");
  std::string text = level ? level : "info";
  for (auto& ch : text) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (text == "warning") text = "warn";
  spdlog::set_level(spdlog::level::from_str(text));
}

}  // namespace dist::launcher
