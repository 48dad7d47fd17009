#include "requests.h"

#include <cstdio>

namespace dist::rendezvous::requests {

std::string shorten(std::string_view key) {
  constexpr std::size_t kShown = 64;
  std::string s;
  for (std::size_t i = 0; i < key.size() && i < kShown; ++i) {
    const auto c = static_cast<unsigned char>(key[i]);
    if (c < 0x20 || c == 0x7f || c == '\\') {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
      s += escaped;
    } else {
      s += static_cast<char>(c);
    }
  }
  if (key.size() > kShown) s += "...";
  return s;
}

std::string describe_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (std::size_t i = 0; i < keys.size() && i < 3; ++i) {
    s += (i ? ", '" : "'") + shorten(keys[i]) + "'";
  }
  if (keys.size() > 3) s += " and " + std::to_string(keys.size() - 3) + " more";
  return s;
}

}  // namespace dist::rendezvous::requests
