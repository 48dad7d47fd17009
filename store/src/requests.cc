#include "requests.h"

#include "text.h"

namespace dist::store::requests {

std::string describe_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (std::size_t i = 0; i < keys.size() && i < 3; ++i) {
    s += (i ? ", " : "") + quote_key(keys[i]);
  }
  if (keys.size() > 3) s += " and " + std::to_string(keys.size() - 3) + " more";
  return s;
}

}  // namespace dist::store::requests
