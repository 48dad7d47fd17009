#include "command_line.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <optional>

namespace dist::launcher {
namespace {

constexpr std::size_t kHelpWidth = 100;
constexpr std::size_t kHelpColumn = 32;  // where an option's description starts

// Torchrun reads a flag's variable as bool(int(value)): any integer, non-zero for on.
std::optional<bool> parse_bool(std::string_view text) {
  long long number = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (error == std::errc() && end == text.data() + text.size() && !text.empty()) return number != 0;
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "true" || lower == "yes" || lower == "on") return true;
  if (lower == "false" || lower == "no" || lower == "off") return false;
  return std::nullopt;
}

// `text` as lines of at most `width` columns, broken between words; the first starts at column
// `first_column` (it may be past `indent`), the others at `indent`.
std::string wrapped(std::string_view text, std::size_t indent, std::size_t first_column) {
  std::string out;
  std::size_t column = first_column;
  bool line_empty = true;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t space = std::min(text.find(' ', start), text.size());
    const std::string_view word = text.substr(start, space - start);
    start = space + 1;
    if (word.empty()) continue;
    if (!line_empty && column + 1 + word.size() > kHelpWidth) {
      out += "\n" + std::string(indent, ' ');
      column = indent;
      line_empty = true;
    }
    if (!line_empty) {
      out += ' ';
      ++column;
    }
    out += word;
    column += word.size();
    line_empty = false;
  }
  return out;
}

std::string joined(const std::vector<std::string_view>& words, std::string_view separator) {
  std::string out;
  for (const auto word : words)
    out += (out.empty() ? "" : std::string(separator)) + std::string(word);
  return out;
}

}  // namespace

CommandLine::Option& CommandLine::Option::env(std::string name) {
  env_ = std::move(name);
  return *this;
}

CommandLine::Option& CommandLine::Option::show_default() {
  switch (kind_) {
    case Kind::kText:
      default_ = *static_cast<const std::string*>(target_);
      break;
    case Kind::kNumber:
      default_ = std::to_string(*static_cast<const int*>(target_));
      break;
    case Kind::kFlag:
    case Kind::kList:
      break;
  }
  return *this;
}

CommandLine::Option& CommandLine::Option::choices(std::vector<std::string_view> allowed) {
  choices_ = std::move(allowed);
  return *this;
}

CommandLine::CommandLine(std::string program, std::string description, std::string usage,
                         Builtins builtins)
    : program_(std::move(program)), description_(std::move(description)), usage_(std::move(usage)) {
  group("Options");
  flag("-h,--help", help_, "Print this help and exit");
  if (builtins == kHelpAndVersion) flag("--version", version_, "Print the version and exit");
}

void CommandLine::group(std::string heading, std::string description) {
  groups_.push_back({std::move(heading), std::move(description), options_.size()});
}

CommandLine::Option& CommandLine::add(std::string_view names, Kind kind, void* target,
                                      std::string help) {
  Option& o = options_.emplace_back();
  o.kind_ = kind;
  o.target_ = target;
  o.help_ = std::move(help);
  std::size_t start = 0;
  while (start < names.size()) {
    const std::size_t comma = std::min(names.find(',', start), names.size());
    const std::string_view name = names.substr(start, comma - start);
    if (name.starts_with("--")) {
      o.long_names_.push_back(name.substr(2));
    } else if (name.starts_with("-")) {
      o.short_names_.push_back(name.substr(1));
    }
    start = comma + 1;
  }
  // Every long option has both spellings, as torchrun's do: --hang-timeout is --hang_timeout too.
  const std::size_t declared = o.shown_long_names_ = o.long_names_.size();
  for (std::size_t i = 0; i < declared; ++i) {
    std::string other(o.long_names_[i]);
    std::replace(other.begin(), other.end(), '-', '_');
    if (std::find(o.long_names_.begin(), o.long_names_.end(), other) != o.long_names_.end()) {
      continue;
    }
    o.long_names_.push_back(spellings_.emplace_back(std::move(other)));
  }
  return o;
}

CommandLine::Option& CommandLine::text(std::string_view names, std::string& target,
                                       std::string help) {
  return add(names, Kind::kText, &target, std::move(help));
}

CommandLine::Option& CommandLine::flag(std::string_view names, bool& target, std::string help) {
  return add(names, Kind::kFlag, &target, std::move(help));
}

CommandLine::Option& CommandLine::number(std::string_view names, int& target, int min, int max,
                                         std::string help) {
  Option& o = add(names, Kind::kNumber, &target, std::move(help));
  o.min_ = min;
  o.max_ = max;
  return o;
}

CommandLine::Option& CommandLine::list(std::string_view names, std::vector<std::string>& target,
                                       std::string help) {
  return add(names, Kind::kList, &target, std::move(help));
}

std::vector<OptionSpelling> CommandLine::spellings() const {
  std::vector<OptionSpelling> out;
  out.reserve(options_.size());
  for (const Option& o : options_) {
    OptionSpelling s;
    s.long_names.assign(o.long_names_.begin(), o.long_names_.end());
    s.short_names.assign(o.short_names_.begin(), o.short_names_.end());
    s.takes_value = o.kind_ != Kind::kFlag;
    out.push_back(std::move(s));
  }
  return out;
}

const CommandLine::Option* CommandLine::find(std::string_view spelling) const {
  const bool is_long = spelling.starts_with("--");
  const std::string_view name = spelling.substr(is_long ? 2 : 1);
  for (const Option& o : options_) {
    const auto& names = is_long ? o.long_names_ : o.short_names_;
    if (std::find(names.begin(), names.end(), name) != names.end()) return &o;
  }
  return nullptr;
}

// `spelling` names where the value came from: the option as given, or its variable.
void CommandLine::apply(const Option& o, const std::string& spelling, const std::string& value,
                        bool has_value) const {
  if (!o.choices_.empty() &&
      std::find(o.choices_.begin(), o.choices_.end(), value) == o.choices_.end()) {
    throw CommandLineError(spelling + " is one of " + joined(o.choices_, ", ") + ", not '" + value +
                           "'");
  }
  switch (o.kind_) {
    case Kind::kText:
      *static_cast<std::string*>(o.target_) = value;
      return;
    case Kind::kList:
      static_cast<std::vector<std::string>*>(o.target_)->push_back(value);
      return;
    case Kind::kFlag: {
      const auto on = has_value ? parse_bool(value) : std::optional<bool>(true);
      if (!on) {
        throw CommandLineError(spelling +
                               (spelling.starts_with("-") ? " takes no value, or" : " is") +
                               " 1 or 0 (true or false), not '" + value + "'");
      }
      *static_cast<bool*>(o.target_) = *on;
      return;
    }
    case Kind::kNumber: {
      int number = 0;
      const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
      if (error != std::errc() || end != value.data() + value.size() || number < o.min_ ||
          number > o.max_) {
        throw CommandLineError(spelling + " takes a number from " + std::to_string(o.min_) +
                               " to " + std::to_string(o.max_) + ", not '" + value + "'");
      }
      *static_cast<int*>(o.target_) = number;
      return;
    }
  }
}

CommandLine::Parsed CommandLine::parse(const std::vector<std::string>& args) {
  Parsed p;
  help_ = version_ = false;
  p.expanded = expand_options(args, spellings());
  const auto given = [&p](const Option& o) {
    for (const auto name : o.long_names_) p.given.insert("--" + std::string(name));
  };
  std::size_t i = 0;
  for (; i < p.expanded.size(); ++i) {
    const std::string& token = p.expanded[i];
    if (token == "--") {  // argparse's end of the options: the script follows
      ++i;
      p.dash_dash = true;
      break;
    }
    if (token.size() < 2 || token[0] != '-' || std::isdigit(static_cast<unsigned char>(token[1])))
      break;  // the training script
    const bool is_long = token[1] == '-';
    const std::size_t split = is_long ? std::min(token.find('='), token.size()) : 2;
    const std::string spelling = token.substr(0, split);
    const Option* o = find(spelling);
    if (!o) throw CommandLineError("unknown option '" + token + "'");  // expand_options knew it
    bool has_value = split < token.size();
    std::string value = has_value ? token.substr(split + (is_long ? 1 : 0)) : std::string();
    if (o->kind_ == Kind::kFlag && has_value && !is_long) {
      throw CommandLineError(spelling + " takes no value, not '" + token + "'");
    }
    if (o->kind_ != Kind::kFlag && !has_value) {
      if (i + 1 == p.expanded.size()) throw CommandLineError(spelling + " needs a value");
      value = p.expanded[++i];
      has_value = true;
    }
    apply(*o, spelling, value, has_value);
    given(*o);
    if (help_ || version_) {
      p.help = help_;
      p.version = version_;
      return p;
    }
  }
  p.rest.assign(p.expanded.begin() + static_cast<std::ptrdiff_t>(i), p.expanded.end());
  for (const Option& o : options_) {
    if (o.env_.empty() || p.given.contains("--" + std::string(o.long_names_.front()))) continue;
    const char* value = std::getenv(o.env_.c_str());
    if (!value || !*value) continue;  // empty: see empty_variables()
    apply(o, o.env_, value, true);
    given(o);
  }
  return p;
}

std::vector<CommandLine::EmptyVariable> CommandLine::empty_variables(const Parsed& parsed) const {
  std::vector<EmptyVariable> out;
  for (const Option& o : options_) {
    if (o.env_.empty()) continue;
    const std::string name = "--" + std::string(o.long_names_.front());
    const char* value = std::getenv(o.env_.c_str());
    if (value && !*value && !parsed.given.contains(name)) {
      out.push_back({o.env_, name, o.kind_ == Kind::kFlag});
    }
  }
  return out;
}

std::vector<std::string> CommandLine::long_names() const {
  std::vector<std::string> out;
  for (const Option& o : options_) {
    for (const auto name : o.long_names_) out.push_back("--" + std::string(name));
  }
  return out;
}

std::string CommandLine::help() const {
  std::string out = wrapped(description_, 0, 0) + "\nUsage: " + program_ + " " + usage_ + "\n";
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const std::size_t end = g + 1 < groups_.size() ? groups_[g + 1].first : options_.size();
    out += "\n" + groups_[g].heading + ":\n";
    if (!groups_[g].description.empty()) out += "  " + wrapped(groups_[g].description, 2, 2) + "\n";
    for (std::size_t i = groups_[g].first; i < end; ++i) {
      const Option& o = options_[i];
      std::string left = "  ";
      for (const auto n : o.short_names_) left += "-" + std::string(n) + ", ";
      for (std::size_t i = 0; i < o.shown_long_names_; ++i) {  // (not the spellings add() made)
        left += "--" + std::string(o.long_names_[i]) + ", ";
      }
      left.resize(left.size() - 2);
      if (o.kind_ != Kind::kFlag) {
        left += o.choices_.empty() ? (o.kind_ == Kind::kNumber ? " N" : " VALUE")
                                   : " {" + joined(o.choices_, ",") + "}";
      }
      std::string text = o.help_;
      if (o.kind_ == Kind::kList) text += " (repeatable)";
      if (!o.default_.empty()) text += " [default: " + o.default_ + "]";
      if (!o.env_.empty()) text += " [env: " + o.env_ + "]";
      if (left.size() + 2 <= kHelpColumn) {
        out += left + std::string(kHelpColumn - left.size(), ' ');
      } else {
        out += left + "\n" + std::string(kHelpColumn, ' ');
      }
      out += wrapped(text, kHelpColumn, kHelpColumn) + "\n";
    }
  }
  if (!footer_.empty()) out += "\n" + footer_ + "\n";
  return out;
}

}  // namespace dist::launcher
