// The ssh side of dist-launch --hosts: the OpenSSH client's command line for one host, and what a
// start that failed means, in words that name the host and say what to do.
#pragma once

#include <string>
#include <vector>

#include "dist/launcher/hosts_job.h"

namespace dist::launcher {

// `ssh -T -x -o BatchMode=yes [-F file] [-o option]... [-p port] -o ServerAliveInterval=I
// -o ServerAliveCountMax=N -- <host> <command>`. BatchMode first (ssh keeps the first value of an
// option): nothing can answer a password prompt. The user's -o options come before the
// ServerAlive defaults, so theirs win.
std::vector<std::string> ssh_command_line(const SshOptions& ssh, const std::string& host,
                                          const std::string& remote_command,
                                          int keep_alive_interval_seconds,
                                          int keep_alive_max_attempt);

// What the remote shell runs: `exec '<dist-launch>' remote-agent`, quoted for a POSIX shell.
std::string remote_agent_command(const std::string& remote_dist_launch);

// Why `host`'s agent never ran, from the process's wait() status and what ssh or the remote shell
// said before (`said`, may be empty): unreachable, key refused, host key unknown, no dist-launch
// on the PATH, not executable, or the agent's own early error. `over_ssh` false: this host's
// agent, started directly.
std::string explain_start_failure(const std::string& host, bool over_ssh, int wait_status,
                                  const std::string& said, const std::string& remote_command);

}  // namespace dist::launcher
