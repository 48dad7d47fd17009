// How dist-launch --hosts hands each host's agent its part of the job, and how the two talk after.
//
// The launcher runs `dist-launch remote-agent` on every host (over ssh; on its own host directly),
// the agent's stdin a pipe from the launcher. Everything travels on that pipe and nothing on a
// command line: `ps` on a host shows `dist-launch remote-agent`, never a token or a variable.
//   1. The launch message: a header line "dist-launch-agent <protocol> <bytes>\n", then <bytes> of
//      JSON (AgentLaunch): the agent's command line, the exported variables, the working
//      directory, the job's token.
//   2. Control lines, "signal <number>\n": the agent acts as if it had received that signal (the
//      launcher got it and forwards it to every host).
//   3. The end of the pipe: the launcher is gone (killed, or its ssh connection dropped; a remote
//      process outlives a killed ssh client, but its stdin ends): the agent stops its workers and
//      leaves, as on SIGHUP.
// The agent answers on its stderr, around its own output: first kAgentReadyLine once it runs (what
// came before it is ssh's or the remote shell's: "command not found", "Permission denied"), last
// kAgentExitLine and its exit code when it leaves on its own terms (without it, the agent or its
// connection was lost).
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dist::agent {

// Bumped when the message changes: a launcher and an agent of different protocols refuse each
// other with a message that says to install the same dist-launch everywhere.
inline constexpr int kAgentLaunchProtocol = 2;
// The subcommand the launcher runs on each host.
inline constexpr char kRemoteAgentCommand[] = "remote-agent";
inline constexpr char kAgentReadyLine[] = "dist-launch-agent ready";
inline constexpr char kAgentExitLine[] = "dist-launch-agent exit ";  // followed by the exit code
// A launch message larger than this is refused (it carries variables, not data).
inline constexpr std::size_t kMaxAgentLaunchBytes = 4 << 20;
// How long `dist-launch remote-agent` waits for its launch message.
inline constexpr std::chrono::milliseconds kAgentLaunchReadTimeout{60'000};

struct AgentLaunch {
  std::string host;   // the host as the launcher names it (messages, prefixes)
  int node_rank = 0;  // for messages; the command line carries it
  // The agent's dist-launch command line: its options, then the script and the script's arguments.
  std::vector<std::string> options;
  std::vector<std::string> script;
  std::map<std::string, std::string> environment;  // set before the command line is read
  std::string working_directory;
  // The job's store token. The agent writes it to a file only its user can read and names the file
  // in DIST_LAUNCH_TOKEN_FILE (the secret is in no environment and on no command line). Empty:
  // none.
  std::string token;
  // Set when the command line needs the store's address and does not have it (--master-addr): the
  // agent adds the address its ssh connection came from (SSH_CONNECTION), else this name of the
  // launching host.
  std::string launcher_host;
  std::string log_line_prefix_template;  // unless the command line gives one
  bool print_failure_report = true;
  // The launcher's console, which every host's worker lines end on (the agent's own stdout and
  // stderr are two pipes to the launcher): whether its stdout and stderr are one file (a
  // terminal, `2>&1`), and the size of the terminal it is (0: none).
  struct Console {
    bool one_stream = false;
    int columns = 0;
    int lines = 0;
  } console;
};

// A launch message or control line that cannot be read; what() says why and what to do.
class AgentLaunchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The header line and the JSON.
std::string encode_agent_launch(const AgentLaunch& launch);
// Reads one launch message from `fd` (blocking, at most `timeout`), and not a byte past it: what
// follows is the control lines. Throws AgentLaunchError.
AgentLaunch read_agent_launch(int fd, std::chrono::milliseconds timeout = kAgentLaunchReadTimeout);

std::string signal_line(int signal);  // "signal 15\n"
// The signal of a control line (without its '\n'); nullopt for anything else.
std::optional<int> parse_signal_line(std::string_view line);

}  // namespace dist::agent
