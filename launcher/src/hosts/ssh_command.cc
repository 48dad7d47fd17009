#include "hosts/ssh_command.h"

#include <sys/wait.h>

#include <array>
#include <string_view>
#include <utility>

#include "dist/agent/signals.h"

namespace dist::launcher {
using agent::signal_name;
namespace {

// ssh's exit status for its own errors (and for a remote command killed by a signal).
constexpr int kSshError = 255;
// A POSIX shell's, for a command it cannot find or cannot execute.
constexpr int kCommandNotFound = 127;
constexpr int kCannotExecute = 126;

bool says(const std::string& text, std::string_view what) {
  return text.find(what) != std::string::npos;
}

std::string single_quoted(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted.push_back(c);
    }
  }
  return quoted + "'";
}

// What OpenSSH 8-9 print when the host cannot be reached at all.
constexpr std::array<std::string_view, 8> kUnreachable = {
    "Connection refused",        "No route to host",
    "Connection timed out",      "Operation timed out",
    "Network is unreachable",    "Could not resolve hostname",
    "Name or service not known", "Temporary failure in name resolution"};

std::string explain_ssh_error(const std::string& host, const std::string& said) {
  if (says(said, "Permission denied")) {
    return "host " + host +
           " refused the ssh key: ssh runs in BatchMode (no password or passphrase prompt), so "
           "the key must come from ssh-agent or the ssh config (IdentityFile, --ssh-config) and "
           "be in that host's authorized_keys for that user";
  }
  if (says(said, "Host key verification failed") || says(said, "IDENTIFICATION HAS CHANGED")) {
    return "host " + host +
           "'s host key is not in known_hosts, or changed: connect once with ssh to check and "
           "accept it";
  }
  for (const auto& phrase : kUnreachable) {
    if (says(said, phrase)) return "host " + host + " is unreachable over ssh";
  }
  return "ssh to host " + host + " failed";
}

}  // namespace

std::vector<std::string> ssh_command_line(const SshOptions& ssh, const std::string& host,
                                          const std::string& remote_command,
                                          int keep_alive_interval_seconds,
                                          int keep_alive_max_attempt) {
  std::vector<std::string> argv = {ssh.program, "-T", "-x", "-o", "BatchMode=yes"};
  if (!ssh.config_file.empty()) {
    argv.push_back("-F");
    argv.push_back(ssh.config_file);
  }
  for (const auto& option : ssh.options) {
    argv.push_back("-o");
    argv.push_back(option);
  }
  if (ssh.port) {
    argv.push_back("-p");
    argv.push_back(std::to_string(*ssh.port));
  }
  // A host that vanished (a partition, a dead machine) ends its ssh too, as it ends its agent's
  // store connection: the launcher then knows the host is lost.
  argv.push_back("-o");
  argv.push_back("ServerAliveInterval=" + std::to_string(keep_alive_interval_seconds));
  argv.push_back("-o");
  argv.push_back("ServerAliveCountMax=" + std::to_string(keep_alive_max_attempt));
  argv.push_back("--");
  argv.push_back(host);
  argv.push_back(remote_command);
  return argv;
}

std::string remote_agent_command(const std::string& remote_dist_launch) {
  return "exec " + single_quoted(remote_dist_launch) + " remote-agent";
}

std::string explain_start_failure(const std::string& host, bool over_ssh, int wait_status,
                                  const std::string& said, const std::string& remote_command) {
  std::string why;
  if (WIFSIGNALED(wait_status)) {
    why = std::string(over_ssh ? "ssh to host " : "the agent of host ") + host + " was killed by " +
          signal_name(WTERMSIG(wait_status));
  } else {
    const int code = WEXITSTATUS(wait_status);
    if (over_ssh && code == kSshError) {
      why = explain_ssh_error(host, said);
    } else if (code == kCommandNotFound) {
      why = "host " + host + " has no `" + remote_command + "` on its PATH (the PATH of a " +
            "non-interactive ssh session there): install dist-launch on that host, or give " +
            "its path with --remote-dist-launch";
    } else if (code == kCannotExecute) {
      why = "host " + host + " cannot execute `" + remote_command + "`";
    } else {
      why = "the agent of host " + host + " did not start (exit " + std::to_string(code) + ")";
    }
  }
  return why + (said.empty() ? std::string(over_ssh ? " (ssh said nothing)" : "") : ": " + said);
}

}  // namespace dist::launcher
