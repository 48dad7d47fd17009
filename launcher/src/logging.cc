#include "logging.h"

#include <spdlog/spdlog.h>

#include <cctype>
#include <cstdlib>
#include <optional>

namespace dist::launcher {

namespace {

// LOGLEVEL's level (Python's names, any case); none when it names none (spdlog would take an
// unknown name for "off", and hide even the errors).
std::optional<spdlog::level::level_enum> level_from_environment() {
  const char* level = std::getenv("LOGLEVEL");
  std::string text = level && *level ? level : "info";  // (an empty one: unset)
  for (auto& ch : text) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (text == "warning") text = "warn";
  if (text == "fatal") text = "critical";  // (Python's alias)
  for (const auto* name : {"trace", "debug", "info", "warn", "error", "critical", "off"}) {
    if (text == name) return spdlog::level::from_str(text);
  }
  return std::nullopt;
}

}  // namespace

void setup_logging(std::shared_ptr<agent::Console> console, const std::string& name) {
  auto logger = agent::make_console_logger(name, std::move(console));
  logger->set_pattern("[" + name + "] %^%l%$: %v");
  spdlog::set_default_logger(logger);
  const auto level = level_from_environment();
  spdlog::set_level(level.value_or(spdlog::level::info));
  if (!level) {
    spdlog::warn("LOGLEVEL={} is no level (debug, info, warning, error, critical): info",
                 std::getenv("LOGLEVEL"));
  }
}

bool warnings_hidden() {
  const auto level = level_from_environment();
  return level && *level > spdlog::level::warn;
}

}  // namespace dist::launcher
