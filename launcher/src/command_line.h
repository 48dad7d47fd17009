// The one command-line parser of dist-launch (the launch's options, and `dist-launch status`'s).
// A command line declared as data: options in groups, each bound to a field of the caller's, read
// the way torchrun's argparse reads them (option_scan.h: abbreviations, unknown options, the
// training script and everything after it left alone), with PET_<NAME> variables as fallbacks.
//
// Declaring is cheap on purpose: a launch declares about 100 options before it can start a
// worker. Each is one entry (its names split once, its help kept as given), parsed in one pass;
// CLI11, which did this before, spent 0.4 ms of every launch building its option objects.
#pragma once

#include <cstddef>
#include <deque>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "option_scan.h"

namespace dist::launcher {

class CommandLine {
 public:
  enum class Kind { kText, kFlag, kNumber, kList };

  class Option {
   public:
    // The value may also come from this variable ("PET_NNODES") when the command line lacks it.
    Option& env(std::string name);
    // --help shows the field's value at declaration as the default.
    Option& show_default();
    // The value must be one of these.
    Option& choices(std::vector<std::string_view> allowed);

   private:
    friend class CommandLine;
    Kind kind_ = Kind::kText;
    void* target_ = nullptr;  // std::string, bool, int or std::vector<std::string>, by kind_
    std::vector<std::string_view> long_names_, short_names_;  // without dashes
    std::size_t shown_long_names_ = 0;  // the declared ones, first in long_names_: in --help
    std::string help_;
    std::string env_;
    std::string default_;  // shown in --help
    std::vector<std::string_view> choices_;
    int min_ = 0, max_ = 0;  // kNumber
  };

  // What a parse found.
  struct Parsed {
    bool help = false;
    bool version = false;
    std::vector<std::string> expanded;  // argv with abbreviations written out
    std::vector<std::string> rest;      // the training script and its arguments
    bool dash_dash = false;             // a `--` ended the options before the script
    std::set<std::string> given;        // "--name" for both spellings of every option given
  };

  // Whether --version is declared with -h/--help (a subcommand has none of its own).
  enum Builtins { kHelpAndVersion, kNoVersion };

  // `usage` follows "Usage: <program> " in --help.
  CommandLine(std::string program, std::string description, std::string usage,
              Builtins builtins = kHelpAndVersion);
  CommandLine(const CommandLine&) = delete;
  CommandLine& operator=(const CommandLine&) = delete;

  // The options declared next appear under `heading` in --help.
  void group(std::string heading, std::string description = {});

  // `names`: comma-separated, each with its dashes: "-r,--redirects", "--nproc-per-node,
  // --nproc_per_node". The string must outlive this object (a literal).
  Option& text(std::string_view names, std::string& target, std::string help);
  Option& flag(std::string_view names, bool& target, std::string help);
  Option& number(std::string_view names, int& target, int min, int max, std::string help);
  Option& list(std::string_view names, std::vector<std::string>& target, std::string help);

  // Text printed after the options in --help.
  void footer(std::string text) { footer_ = std::move(text); }

  // Reads `args` (the options, then the script and its arguments) into the targets. -h/--help and
  // --version end the options at once. Throws OptionScanError for an unknown or ambiguous option,
  // CommandLineError for a value that does not fit its option.
  Parsed parse(const std::vector<std::string>& args);

  std::string help() const;
  // Every long name with its dashes, in declaration order: what shells complete.
  std::vector<std::string> long_names() const;
  // The PET_ variables set but empty, for options the command line did not give: name and the
  // option's first long name.
  struct EmptyVariable {
    std::string variable;
    std::string option;
    bool flag;
  };
  std::vector<EmptyVariable> empty_variables(const Parsed& parsed) const;

 private:
  struct Group {
    std::string heading, description;
    std::size_t first = 0;  // index of its first option
  };
  Option& add(std::string_view names, Kind kind, void* target, std::string help);
  const Option* find(std::string_view spelling) const;
  void apply(const Option& option, const std::string& spelling, const std::string& value,
             bool has_value) const;
  std::vector<OptionSpelling> spellings() const;

  std::string program_, description_, usage_, footer_;
  std::deque<Option> options_;         // stable addresses: declarations return references
  std::deque<std::string> spellings_;  // the underscore spellings add() made (options' names)
  std::vector<Group> groups_;
  bool help_ = false, version_ = false;  // the built-in flags' targets
};

// A value that does not fit its option; what() is the one-line message.
class CommandLineError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace dist::launcher
