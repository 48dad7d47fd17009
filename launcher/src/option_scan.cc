#include "option_scan.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>

namespace dist::launcher {
namespace {

// How far (in edits) an unknown name may be from an option's to be offered as "did you mean".
constexpr std::size_t kMaxSuggestionDistance = 2;

// Options of other launchers that users bring along, and what became of them.
const std::map<std::string, std::string>& known_elsewhere() {
  static const std::map<std::string, std::string> kNotes = {
      {"use-env",
       "torch.distributed.launch's --use-env: dist-launch, like torchrun, always gives the workers "
       "LOCAL_RANK in their environment; drop it"},
      {"nprocs",
       "torch.multiprocessing.spawn's nprocs: dist-launch's (and torchrun's) is --nproc-per-node, "
       "the workers on each node"},
      {"num-processes",
       "accelerate's --num-processes counts the whole job: dist-launch takes --nproc-per-node, "
       "the workers on each node, and --nnodes"},
      {"local-rank",
       "--local-rank is the worker's own option, which torch.distributed.launch passed: workers "
       "read LOCAL_RANK from their environment (put it after the training script if the script "
       "takes it)"},
  };
  return kNotes;
}

std::string normalized(std::string name) {
  for (char& c : name) {
    c = c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return name;
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string unknown_option(const std::string& token, const std::string& name,
                           const std::vector<OptionSpelling>& options) {
  const std::string message = "unknown option '" + token + "'";
  const std::string key = normalized(name);
  if (const auto note = known_elsewhere().find(key); note != known_elsewhere().end()) {
    return message + ": " + note->second;
  }
  std::optional<std::string> best;
  std::size_t best_distance = kMaxSuggestionDistance + 1;
  for (const auto& option : options) {
    for (const auto& spelling : option.long_names) {
      const std::size_t d = edit_distance(key, normalized(spelling));
      if (d < best_distance) {
        best_distance = d;
        best = spelling;
      }
    }
  }
  return message + (best ? ": did you mean --" + *best + "?" : "") +
         " (options go before the training script; see dist-launch --help)";
}

// The option a long name (without dashes) stands for, and the spelling to write it with. Another
// launcher's option is said to be one, even where argparse would take it for an abbreviation
// (torchrun reads --local-rank=0 as --local-ranks-filter=0).
std::string resolve_long(const std::string& token, const std::string& name,
                         const std::vector<OptionSpelling>& options) {
  if (known_elsewhere().contains(normalized(name))) {
    throw OptionScanError(unknown_option(token, name, options));
  }
  std::vector<std::string> candidates;  // one spelling per matching option
  for (const auto& option : options) {
    for (const auto& spelling : option.long_names) {
      if (spelling == name) return spelling;
    }
    for (const auto& spelling : option.long_names) {
      if (spelling.starts_with(name)) {
        candidates.push_back(spelling);
        break;
      }
    }
  }
  if (candidates.size() == 1) return candidates.front();
  if (candidates.empty()) throw OptionScanError(unknown_option(token, name, options));
  std::string list;
  for (const auto& c : candidates) list += (list.empty() ? "--" : ", --") + c;
  throw OptionScanError("ambiguous option '" + token + "' could match " + list);
}

const OptionSpelling* find_long(const std::string& spelling,
                                const std::vector<OptionSpelling>& options) {
  for (const auto& option : options) {
    if (std::find(option.long_names.begin(), option.long_names.end(), spelling) !=
        option.long_names.end()) {
      return &option;
    }
  }
  return nullptr;
}

const OptionSpelling* find_short(const std::string& spelling,
                                 const std::vector<OptionSpelling>& options) {
  for (const auto& option : options) {
    if (std::find(option.short_names.begin(), option.short_names.end(), spelling) !=
        option.short_names.end()) {
      return &option;
    }
  }
  return nullptr;
}

}  // namespace

std::vector<std::string> expand_options(const std::vector<std::string>& args,
                                        const std::vector<OptionSpelling>& options) {
  std::vector<std::string> out = args;
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::string& token = out[i];
    if (token == "--" || token.size() < 2 || token[0] != '-') break;  // the training script
    if (std::isdigit(static_cast<unsigned char>(token[1]))) break;    // "-1": not an option
    const OptionSpelling* option = nullptr;
    bool value_attached = false;
    if (token[1] == '-') {
      const auto eq = token.find('=');
      const std::string name = token.substr(2, eq == std::string::npos ? eq : eq - 2);
      const std::string spelling = resolve_long(token, name, options);
      option = find_long(spelling, options);
      value_attached = eq != std::string::npos;
      token = "--" + spelling + (value_attached ? token.substr(eq) : "");
    } else {
      option = find_short(token.substr(1, 1), options);
      if (!option) throw OptionScanError(unknown_option(token, token.substr(1), options));
      value_attached = token.size() > 2;  // -r3
    }
    if (option->takes_value && !value_attached) ++i;  // the value, whatever it looks like
  }
  return out;
}

}  // namespace dist::launcher
