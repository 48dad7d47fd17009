// The options before the training script, read the way torchrun's argparse reads them:
//   - a long option may be abbreviated to a prefix that names one option (--redirect=3 for
//     --redirects); a prefix of several options is an error naming them (argparse also calls
//     --nproc ambiguous between --nproc-per-node and --nproc_per_node, two spellings of one
//     option: dist-launch takes it);
//   - an unknown option is an error that says so, with the option's own spelling when the name is
//     close to one (--nprocs-per-node) or what became of it (torch.distributed.launch's
//     --use-env), never "training script '--X' not found".
// The scan stops at the first argument that is not an option: the training script, after which
// everything belongs to the script.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace dist::launcher {

struct OptionSpelling {
  std::vector<std::string> long_names;   // without the dashes: "redirects"
  std::vector<std::string> short_names;  // without the dash: "r"
  bool takes_value = true;
};

// A command line the scan refuses; what() is the one-line message.
class OptionScanError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// `args` with every abbreviated long option written out in full (as the spelling it abbreviates).
// Throws OptionScanError for an unknown or ambiguous option.
std::vector<std::string> expand_options(const std::vector<std::string>& args,
                                        const std::vector<OptionSpelling>& options);

}  // namespace dist::launcher
