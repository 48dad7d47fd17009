// Starting a helper process of the agent's own (the zygote, the scratch directory's guardian): a
// child in a process group of its own, with exactly the descriptors it is given, and a pidfd that
// becomes readable when it exits (Linux 5.3+; -1 on older kernels). Like every exec'd child it
// reports its exit with SIGCHLD (exec resets the exit signal), so the worker group's reaping loop
// may be the one that reaps it (warm_start.h, WarmStart::reaped), and its stop spares it
// (Leftovers::spare).
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace dist::agent::warm {

struct ExecSpec {
  std::string executable;  // a path (no PATH search)
  std::vector<std::string> argv;
  std::vector<std::string> env;
  // (descriptor here, its number in the child); every other descriptor is closed there.
  std::vector<std::pair<int, int>> fds;
  std::vector<int> reset_signals;   // back to SIG_DFL (the agent's handled and ignored ones)
  std::vector<int> ignore_signals;  // SIG_IGN
  bool die_with_agent = false;      // PR_SET_PDEATHSIG(SIGKILL), checked against a parent gone
};

struct Cloned {
  pid_t pid = -1;
  int pidfd = -1;  // readable once the child exited; -1 when the kernel gives none
};

// Starts `spec` in a process group of its own and waits until its exec worked. Throws
// std::runtime_error naming the executable and the reason when it did not (the child is then
// reaped). Safe in a multithreaded process: between the clone and the exec the child makes system
// calls only.
Cloned clone_exec(const ExecSpec& spec);

// Reaps a child started by clone_exec (blocking until it exits); returns its wait status, or -1
// when someone else reaped it.
int reap_cloned(pid_t pid);

}  // namespace dist::agent::warm
