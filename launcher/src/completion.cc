#include "completion.h"

namespace dist::launcher {
namespace {

std::string joined(const std::vector<std::string>& words, std::size_t drop_prefix) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + w.substr(drop_prefix);
  return out;
}

std::string bash_script(const std::vector<std::string>& options) {
  return "# dist-launch completion: eval \"$(dist-launch --print-completion bash)\"\n"
         "_dist_launch() {\n"
         "  local cur=${COMP_WORDS[COMP_CWORD]}\n"
         "  if [[ $cur == -* ]]; then\n"
         "    COMPREPLY=($(compgen -W \"" +
         joined(options, 0) +
         "\" -- \"$cur\"))\n"
         "  else\n"
         "    COMPREPLY=($(compgen -f -- \"$cur\"))\n"
         "  fi\n"
         "}\n"
         "complete -o filenames -F _dist_launch dist-launch\n";
}

}  // namespace

std::optional<std::string> completion_script(const std::string& shell,
                                             const std::vector<std::string>& long_options) {
  if (shell == "bash") return bash_script(long_options);
  if (shell == "zsh") {  // zsh runs the bash function through its bashcompinit layer
    return "#compdef dist-launch\nautoload -U +X bashcompinit && bashcompinit\n" +
           bash_script(long_options);
  }
  if (shell == "tcsh") {
    return "# dist-launch completion: eval `dist-launch --print-completion tcsh`\n"
           "complete dist-launch 'c/--/(" +
           joined(long_options, 2) + ")/' 'p/*/f/'\n";
  }
  return std::nullopt;
}

}  // namespace dist::launcher
