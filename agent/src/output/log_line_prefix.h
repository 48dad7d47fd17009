// The prefix of each worker record on the console: torchrun's default "[<role><local_rank>]:", or
// torchrun 2.x's --log-line-prefix-template.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include "dist/agent/config.h"
#include "dist/agent/vocabulary.h"

namespace dist::agent {

// A template that cannot be rendered; what() names the template, the fault and what to write.
class LogLinePrefixError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

// "[default0]:" for role "default", local rank 0.
std::string default_log_line_prefix(const std::string& role, int local_rank);

// What a template's variables stand for, for one worker.
struct LogLinePrefixValues {
  std::string role_name;
  Worker worker;         // ${rank} and ${local_rank}
  std::string hostname;  // the short host name, as torchrun 2.x's ${hostname}
};

// Renders a template the way torchrun's string.Template does: ${role_name}, ${rank},
// ${local_rank} and ${hostname}, also written without braces ($rank); $$ is a literal $. An
// unknown variable or a '$' that starts none of these throws LogLinePrefixError (torchrun would
// print it as it is).
std::string render_log_line_prefix(std::string_view template_text,
                                   const LogLinePrefixValues& values);

}  // namespace dist::agent
