#include "output/log_line_prefix.h"

#include <cctype>

namespace dist::agent {
namespace {

constexpr std::string_view kKnownVariables = "${role_name}, ${rank}, ${local_rank} or ${hostname}";

bool identifier_char(char c, bool first) {
  const auto u = static_cast<unsigned char>(c);
  return c == '_' || std::isalpha(u) || (!first && std::isdigit(u));
}

[[noreturn]] void fail(std::string_view template_text, const std::string& fault) {
  throw LogLinePrefixError("--log-line-prefix-template '" + std::string(template_text) +
                           "': " + fault);
}

}  // namespace

std::string default_log_line_prefix(const std::string& role, int local_rank) {
  return "[" + role + std::to_string(local_rank) + "]:";
}

std::string render_log_line_prefix(std::string_view template_text,
                                   const LogLinePrefixValues& values) {
  std::string out;
  for (std::size_t i = 0; i < template_text.size(); ++i) {
    if (template_text[i] != '$') {
      out.push_back(template_text[i]);
      continue;
    }
    const std::size_t at = i;
    if (++i < template_text.size() && template_text[i] == '$') {
      out.push_back('$');
      continue;
    }
    const bool braced = i < template_text.size() && template_text[i] == '{';
    if (braced) ++i;
    const std::size_t start = i;
    while (i < template_text.size() && identifier_char(template_text[i], i == start)) ++i;
    const std::string name(template_text.substr(start, i - start));
    if (name.empty() || (braced && (i >= template_text.size() || template_text[i] != '}'))) {
      fail(template_text, "the '$' at position " + std::to_string(at) +
                              " starts no variable (use " + std::string(kKnownVariables) +
                              ", or $$ for a '$')");
    }
    if (!braced) --i;  // the loop's ++i moves past the name
    if (name == "role_name") {
      out += values.role_name;
    } else if (name == "rank") {
      out += std::to_string(values.worker.rank);
    } else if (name == "local_rank") {
      out += std::to_string(values.worker.local_rank);
    } else if (name == "hostname") {
      out += values.hostname;
    } else {
      fail(template_text,
           "unknown variable '" + name + "' (use " + std::string(kKnownVariables) + ")");
    }
  }
  return out;
}

}  // namespace dist::agent
