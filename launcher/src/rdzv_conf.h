// --rdzv-conf key=value,...: every key the launcher knows, listed once (rdzv_conf.cc's table),
// which drives parsing, the error message that lists them and --help.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "dist/agent/config.h"

namespace dist::launcher {

// A key or value --rdzv-conf does not take; what() is one line naming it and what to give.
class RdzvConfError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// What apply_rdzv_conf found: the keys given that belong to the etcd-v3 backend (the caller
// refuses them for another backend), and the key=value items of keys nobody reads (torchrun's
// backends ignore them too: the caller says so).
struct RdzvConf {
  std::vector<std::string> etcd_keys;
  std::vector<std::string> ignored;
};

// Applies each key=value of `text` to `config` (a value quoted as a whole, "'a=1,b=2'", as a test
// that runs torchrun without a shell passes it, is unquoted first). RdzvConfError for an item that
// is not key=value, or a value its key does not take.
RdzvConf apply_rdzv_conf(std::string text, agent::LaunchConfig& config);

// The keys, for --help: "timeout, join_timeout, ... (etcd-v3: cacert, ...)".
std::string rdzv_conf_keys();

}  // namespace dist::launcher
