#include "job_token.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <stdexcept>

#include "dist/store/client.h"
#include "dist/store/token.h"

namespace dist::launcher {

namespace {

// A token line longer than this is not a token (the rest stays on stdin).
constexpr std::size_t kMaxTokenLineBytes = 4096;

const std::map<std::string, store::UnauthenticatedPolicy> kPolicies = {
    {"deny", store::UnauthenticatedPolicy::kDeny},
    {"loopback", store::UnauthenticatedPolicy::kLoopback},
    {"known-hosts", store::UnauthenticatedPolicy::kKnownHosts},
    {"allow", store::UnauthenticatedPolicy::kAllow}};

// --token-file, else DIST_LAUNCH_TOKEN_FILE (what a launcher that writes the file sets).
std::string token_file_given(const TokenOptions& options) {
  if (!options.token_file.empty() || options.generate) return options.token_file;
  const char* from_environment = std::getenv(store::kTokenFileVariable);
  if (!from_environment) return "";
  if (!*from_environment) {
    throw std::invalid_argument(std::string(store::kTokenFileVariable) +
                                " is set but empty: give it the token file's path or unset it");
  }
  return from_environment;
}

// One line, read a byte at a time: what follows it on stdin is the workers' (they inherit it),
// not a buffer's of this process.
std::string token_from_stdin() {
  std::string token;
  char c = 0;
  while (token.size() < kMaxTokenLineBytes) {
    const ssize_t n = ::read(STDIN_FILENO, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || c == '\n') break;
    token.push_back(c);
  }
  while (!token.empty() && (token.back() == '\r' || token.back() == '\n')) token.pop_back();
  if (token.empty()) {
    throw std::invalid_argument("--token-file -: no token on standard input (one line)");
  }
  return token;
}

}  // namespace

void add_token_options(CommandLine& app, TokenOptions& options) {
  app.text("--token-file,--token_file", options.token_file,
           "The job's token, the same file on every node (chmod 600): every agent proves it "
           "to the store; C++ workers find it through DIST_LAUNCH_TOKEN_FILE. '-': one line "
           "from standard input. Default: $DIST_LAUNCH_TOKEN_FILE")
      .env("PET_TOKEN_FILE");
  app.flag("--generate-token,--generate_token", options.generate,
           "One node: a random token for this job (a 0600 file in the run directory)")
      .env("PET_GENERATE_TOKEN");
  app.text("--unauthenticated", options.unauthenticated,
           "With a token: who may use this agent's store without it (PyTorch workers "
           "cannot authenticate): deny, loopback, known-hosts (default: this machine and "
           "the hosts whose agents authenticated) or allow. Such clients never touch the "
           "agents' keys")
      .env("PET_UNAUTHENTICATED")
      .choices({"deny", "loopback", "known-hosts", "allow"});
}

void apply_token_options(const TokenOptions& options, agent::LaunchConfig& config) {
  const std::string file = token_file_given(options);
  if (options.generate && !file.empty()) {
    throw std::invalid_argument("--token-file and --generate-token cannot be used together");
  }
  if (options.generate) {
    if (config.max_nodes > 1 || config.elastic) {
      throw std::invalid_argument(
          "--generate-token makes a token only this node knows; a job of several nodes needs "
          "the same --token-file on every node");
    }
    config.secret = store::generate_secret();
  } else if (file == "-") {
    config.secret = token_from_stdin();
  } else if (!file.empty()) {
    try {
      config.secret = store::read_secret_file(file);
    } catch (const store::StoreError& e) {
      throw std::invalid_argument(e.what());
    }
    config.token_file = std::filesystem::absolute(file).string();
  }
  if (options.unauthenticated.empty()) return;
  if (config.secret.empty()) {
    throw std::invalid_argument("--unauthenticated " + options.unauthenticated +
                                " applies to a job with a token: give --token-file or "
                                "--generate-token");
  }
  config.unauthenticated = kPolicies.at(options.unauthenticated);
}

}  // namespace dist::launcher
