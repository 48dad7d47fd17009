#include "dist/launcher/torchelastic_env.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace dist::launcher {

void read_torchelastic_environment(agent::WatchdogOptions& options) {
  const char* enable = std::getenv("TORCHELASTIC_ENABLE_FILE_TIMER");
  options.file_timer = enable && std::string(enable) == "1";  // as torch: "1" and nothing else
  const char* file = std::getenv("TORCHELASTIC_TIMER_FILE");
  if (file) options.timer_file = file;
  const char* port = std::getenv("TORCHELASTIC_HEALTH_CHECK_PORT");
  if (!port) return;
  std::size_t used = 0;
  int value = -1;
  try {
    value = std::stoi(port, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != std::string(port).size() || value < 0 || value > 65535) {
    throw std::invalid_argument(std::string("TORCHELASTIC_HEALTH_CHECK_PORT must be a port "
                                            "number from 0 (a free one) to 65535, got '") +
                                port + "'");
  }
  options.health_check_port = static_cast<std::uint16_t>(value);
}

}  // namespace dist::launcher
