// The job's token on dist-launch's command line (docs/STORE.md, Authentication):
//   --token-file FILE    the job's token, the same file on every node (PET_TOKEN_FILE, or
//                        DIST_LAUNCH_TOKEN_FILE); "-": one line read from standard input
//   --generate-token     one node: a random token for this job alone
//   --unauthenticated P  with a token: who may use this agent's store without it
#pragma once

#include <string>

#include "command_line.h"
#include "dist/agent/config.h"

namespace dist::launcher {

struct TokenOptions {
  std::string token_file;
  bool generate = false;
  std::string unauthenticated;
};

void add_token_options(CommandLine& app, TokenOptions& options);

// Puts the token into `config`, whose nodes are already known (a generated token is for one node
// only). Throws std::invalid_argument with a one-line message for the user.
void apply_token_options(const TokenOptions& options, agent::LaunchConfig& config);

}  // namespace dist::launcher
