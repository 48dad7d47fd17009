#include "text.h"

namespace dist::store {

std::string quote_key(std::string_view key, std::size_t max_bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  const std::string_view shown = key.substr(0, max_bytes);
  std::string out = "'";
  out.reserve(shown.size() + 16);
  for (const char c : shown) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f && c != '\\' && c != '\'') {
      out.push_back(c);
    } else {
      out += "\\x";
      out.push_back(kHex[byte >> 4]);
      out.push_back(kHex[byte & 0xf]);
    }
  }
  out.push_back('\'');
  if (shown.size() < key.size()) out += "... (" + std::to_string(key.size()) + " bytes)";
  return out;
}

std::string group_digits(std::uint64_t n) {
  std::string digits = std::to_string(n);
  for (std::size_t i = digits.size(); i > 3; i -= 3) digits.insert(i - 3, 1, ',');
  return digits;
}

std::string closed_at_handshake(const std::string& endpoint, const std::string& what) {
  return "the server at " + endpoint +
         " closed the connection at the handshake: it does not speak dist-launch's store "
         "extensions (a plain PyTorch TCPStore?), or it refused the connection at a limit "
         "(--max-connections, or the open-file limit of its process: its log says which): " +
         what;
}

std::string refused_for_good(const std::string& endpoint) {
  return "the store at " + endpoint +
         " refused the connection: its host answers but the store is gone";
}

}  // namespace dist::store
