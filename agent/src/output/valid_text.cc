#include "output/valid_text.h"

#include <cstdint>

namespace dist::agent {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// The length of the well-formed sequence at text[at], or 0 with `subpart` set to the length of
// its maximal ill-formed subpart (at least 1).
std::size_t sequence_at(std::string_view text, std::size_t at, std::size_t& subpart) {
  const auto byte = [&](std::size_t i) { return static_cast<std::uint8_t>(text[i]); };
  const std::uint8_t lead = byte(at);
  subpart = 1;
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  std::uint8_t low = 0x80, high = 0xBF;  // the second byte's range (Unicode's table 3-7)
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 0;  // 80..C1, F5..FF begin nothing
  }
  std::size_t got = 1;
  while (got < length && at + got < text.size()) {
    const std::uint8_t b = byte(at + got);
    if (got == 1 ? (b < low || b > high) : (b < 0x80 || b > 0xBF)) break;
    ++got;
  }
  if (got == length) return length;
  subpart = got;
  return 0;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The code unit of "\uXXXX" at text[at] (at: the backslash), or -1 when there is none.
int escaped_unit(std::string_view text, std::size_t at) {
  if (at + 6 > text.size() || text[at] != '\\' || text[at + 1] != 'u') return -1;
  int unit = 0;
  for (std::size_t i = at + 2; i < at + 6; ++i) {
    const int digit = hex_value(text[i]);
    if (digit < 0) return -1;
    unit = unit * 16 + digit;
  }
  return unit;
}

template <typename Json>
std::string dump_replacing(const Json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

bool is_valid_utf8(std::string_view text) {
  std::size_t subpart = 0;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t n = sequence_at(text, at, subpart);
    if (n == 0) return false;
    at += n;
  }
  return true;
}

std::string_view utf8_prefix(std::string_view text, std::size_t bytes) {
  if (text.size() <= bytes) return text;
  std::size_t end = bytes;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end);
}

std::string valid_utf8(std::string_view text) {
  if (is_valid_utf8(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 8);
  std::size_t subpart = 0;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t n = sequence_at(text, at, subpart);
    if (n == 0) {
      out += kReplacement;
      at += subpart;
    } else {
      out.append(text.substr(at, n));
      at += n;
    }
  }
  return out;
}

std::string json_text(const nlohmann::json& j) {
  return dump_replacing(j);
}

std::string json_text(const nlohmann::ordered_json& j) {
  return dump_replacing(j);
}

std::string lenient_json(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t at = 0; at < text.size();) {
    if (text[at] != '\\' || at + 1 >= text.size()) {
      out.push_back(text[at++]);
      continue;
    }
    const int unit = escaped_unit(text, at);
    if (unit < 0xD800 || unit > 0xDFFF) {  // not a surrogate: the escape as it is ("\\", "\n")
      const std::size_t n = unit < 0 ? 2 : 6;
      out.append(text.substr(at, n));
      at += n;
      continue;
    }
    const int next = unit <= 0xDBFF ? escaped_unit(text, at + 6) : -1;
    if (next >= 0xDC00 && next <= 0xDFFF) {  // a pair: one character
      out.append(text.substr(at, 12));
      at += 12;
      continue;
    }
    out += "\\ufffd";
    at += 6;
  }
  return valid_utf8(out);
}

}  // namespace dist::agent
