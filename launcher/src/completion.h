// --print-completion SHELL: a completion script for dist-launch's options (torchrun 2.x prints
// one through shtab). Options complete after a dash; anything else completes as a file name.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace dist::launcher {

inline constexpr const char* kCompletionShells = "bash, zsh or tcsh";

// The script for `shell` (bash, zsh, tcsh) completing `long_options` (with their dashes);
// nullopt for another shell.
std::optional<std::string> completion_script(const std::string& shell,
                                             const std::vector<std::string>& long_options);

}  // namespace dist::launcher
