#include "dist/launcher/remote_agent.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "dist/agent/agent.h"
#include "dist/agent/agent_launch.h"
#include "dist/agent/console.h"
#include "dist/launcher/cli.h"
#include "dist/store/token.h"
#include "logging.h"

namespace dist::launcher {
namespace {

namespace fs = std::filesystem;

constexpr int kExitSetupError = 2;

// The job's token in a file only this user can read, in a directory of its own, for as long as the
// agent runs; its path, not the secret, goes into the environment (agent_launch.h).
class TokenFile {
 public:
  explicit TokenFile(const std::string& token) {
    if (token.empty()) return;
    const char* tmp = std::getenv("TMPDIR");
    std::string dir = (fs::path(tmp && *tmp ? tmp : "/tmp") / "dist-launch-token-XXXXXX").string();
    if (!::mkdtemp(dir.data())) fail("cannot create a directory for the job's token", dir);
    dir_ = dir;
    path_ = (fs::path(dir_) / "token").string();
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) fail("cannot create the job's token file", path_);
    const bool written =
        ::write(fd, token.data(), token.size()) == static_cast<ssize_t>(token.size());
    ::close(fd);
    if (!written) fail("cannot write the job's token file", path_);
  }
  ~TokenFile() {
    std::error_code ignored;
    if (!dir_.empty()) fs::remove_all(dir_, ignored);
  }
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }

 private:
  [[noreturn]] static void fail(const std::string& what, const std::string& path) {
    throw std::runtime_error(what + " " + path + ": " + std::strerror(errno));
  }
  std::string dir_, path_;
};

// The address this host's ssh connection came from: the launcher's, as this host reaches it.
std::string ssh_client_address() {
  const char* connection = std::getenv("SSH_CONNECTION");  // "client port server port"
  if (!connection) return "";
  std::istringstream fields(connection);
  std::string client;
  fields >> client;
  return client;
}

// cli.cc's errors and notices, "[dist-launch] ..." or "dist-launch: error: ...", said as this
// host's ("[dist-launch@host] ..."): every host's lines share one console.
void relay(const std::string& text, const std::string& name, agent::Console& console) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    for (const std::string_view prefix : {"[dist-launch] ", "dist-launch: "}) {
      if (line.starts_with(prefix)) {
        line = line.substr(prefix.size());
        break;
      }
    }
    console.write(agent::ConsoleStream::kStderr, "[" + name + "] " + line + "\n");
  }
}

int run_job(const agent::AgentLaunch& launch, const std::string& name,
            std::shared_ptr<agent::Console> console) {
  const TokenFile token(launch.token);
  if (!token.path().empty()) ::setenv(store::kTokenFileVariable, token.path().c_str(), 1);
  if (!launch.working_directory.empty() && ::chdir(launch.working_directory.c_str()) != 0) {
    spdlog::error(
        "cannot work in {} here ({}): run dist-launch --hosts from a directory every "
        "host has (a shared file system)",
        launch.working_directory, std::strerror(errno));
    return kExitSetupError;
  }
  std::vector<std::string> args = launch.options;
  if (!launch.launcher_host.empty()) {
    const std::string address = ssh_client_address();
    args.push_back("--master-addr");
    args.push_back(address.empty() ? launch.launcher_host : address);
  }
  args.insert(args.end(), launch.script.begin(), launch.script.end());
  std::ostringstream out, err;
  CliOutcome outcome = parse_command_line(args, out, err);
  relay(out.str() + err.str(), name, *console);
  if (outcome.exit_now) return outcome.exit_code;
  if (outcome.hosts_job) {
    spdlog::error("an agent started by --hosts does not start hosts of its own");
    return kExitSetupError;
  }
  agent::LaunchConfig& config = outcome.config;
  if (config.log_line_prefix_template.empty()) {
    config.log_line_prefix_template = launch.log_line_prefix_template;
  }
  try {
    agent::check(config);
  } catch (const agent::ConfigError& e) {
    spdlog::error("{}", e.what());
    return kExitSetupError;
  }
  config.print_failure_report = launch.print_failure_report;
  config.launcher_fd = STDIN_FILENO;
  // The launcher's console is where the workers' lines end: as one stream, the launcher reads
  // them from this agent's stdout in the order they were written; its terminal's size for them.
  if (launch.console.one_stream) console->workers_on_stdout();
  if (launch.console.columns > 0) {
    config.relayed_terminal_size = std::pair{launch.console.columns, launch.console.lines};
  }
  return agent::run_agent(config);
}

}  // namespace

int run_remote_agent(const std::vector<std::string>& args) {
  if (!args.empty()) {
    std::cerr << "dist-launch remote-agent: error: takes no arguments (it reads its job from "
                 "dist-launch --hosts on stdin)\n";
    return kExitSetupError;
  }
  agent::AgentLaunch launch;
  try {
    launch = agent::read_agent_launch(STDIN_FILENO);
  } catch (const agent::AgentLaunchError& e) {
    std::cerr << "dist-launch remote-agent: error: " << e.what() << "\n";
    return kExitSetupError;
  }
  for (const auto& [variable, value] : launch.environment) {  // LOGLEVEL included
    ::setenv(variable.c_str(), value.c_str(), 1);
  }
  const auto console = agent::Console::process();
  const std::string name = "dist-launch@" + launch.host;
  setup_logging(console, name);
  console->say(agent::ConsoleStream::kStderr, std::string(agent::kAgentReadyLine) + "\n");
  int exit_code = kExitSetupError;
  try {
    exit_code = run_job(launch, name, console);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
  }
  console->say(agent::ConsoleStream::kStderr,
               std::string(agent::kAgentExitLine) + std::to_string(exit_code) + "\n");
  console->drain();
  return exit_code;
}

}  // namespace dist::launcher
