#include "dist/sdk/error_file.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

namespace dist::sdk {

bool write_error_file(const std::string& message, const std::string& details) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (!path || !*path) return false;
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  char timestamp[32];
  std::snprintf(timestamp, sizeof timestamp, "%.6f", now);
  const nlohmann::json j = {
      {"message",
       {{"message", message},
        {"extraInfo", {{"py_callstack", details}, {"timestamp", timestamp}}}}}};
  std::ofstream out(path);
  // A message that is not UTF-8 (a path, a peer's name) is written with U+FFFD in its place
  // rather than thrown on while reporting an error.
  out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return static_cast<bool>(out.flush());
}

}  // namespace dist::sdk
