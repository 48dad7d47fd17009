// The second half of stopping a worker group: what its workers started and left behind.
//
// A worker's child that stayed in its process group got the group's stop signal; a daemon that
// left the group (setsid, setpgid) did not, and a child of a worker that exited on its own got
// nothing at all. Once every worker is reaped, whatever remains below the agent (a subreaper: its
// workers' orphans are its children) or carries its marker (job_processes.h) gets SIGTERM, and
// SIGKILL at the stop's deadline (--shutdown-timeout), like the workers themselves. The stop ends
// when the agent has no child left but those it spares (spare()): a child of the agent's own that
// is not spared (the janitor, a clone child without exit signal, is not counted) would be taken
// for a leftover and killed.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace dist::agent {

// How long what the workers left may take to end by itself before it is signalled: a helper tied
// to its worker ends once the worker has (Python's multiprocessing resource tracker reads EOF from
// it), and a healthy job is not warned about it.
inline constexpr std::chrono::milliseconds kLeftoverGrace{1000};

class Leftovers {
 public:
  // `janitor`: the janitor's pid (never signalled), or -1.
  Leftovers(std::string agent_id, pid_t janitor)
      : agent_id_(std::move(agent_id)), janitor_(janitor) {}

  // A new stop begins: `grace` for one without a stop signal (the workers ended by themselves);
  // a stop signal's leftovers get SIGTERM at once, within the stop's deadline.
  void reset(bool grace) { stage_ = grace ? Stage::kNone : Stage::kGraceOver; }

  // Processes of the agent's own that are never leftovers: the --warm-restart zygote and the
  // guardian of the agent's shared-memory directory (agent/src/warm/), children of the agent
  // (the zygote carries the marker). Nothing is left once they are the only children.
  void spare(std::vector<pid_t> pids) { spared_ = std::move(pids); }

  // Call once every worker is reaped, then again after each child's exit while it returns false.
  // True once nothing the workers started remains, reaped (leftovers that refuse SIGKILL, another
  // user's, are given up on with a warning). False: the leftovers are given kLeftoverGrace to end
  // by themselves (on the first call: in_grace(), and the caller calls grace_over() once it
  // passed), then get SIGTERM (the next call) or SIGKILL (on every call after kill()); each exit
  // is a SIGCHLD to the agent (a subreaper: the leftovers end up its children), and the caller
  // arms the stop's deadline, which calls kill(), if not armed yet.
  bool gone();
  bool in_grace() const { return stage_ == Stage::kGrace; }
  void grace_over() {
    if (stage_ == Stage::kGrace) stage_ = Stage::kGraceOver;
  }

  // The stop's deadline passed: SIGKILL every leftover now, and on every later gone(). Returns how
  // many were signalled.
  int kill();

 private:
  enum class Stage { kNone, kGrace, kGraceOver, kTerminated, kKilled };
  // Sends `signal` to every leftover; how many got it, and how many refused it (EPERM).
  struct Sent {
    int signalled = 0;
    int refused = 0;
    std::string named;  // the first few signalled: "pid 123 (sleep), pid 124 (python3)"
  };
  // `named`: the first few said by name in Sent::named (read from /proc before the signal).
  Sent signal_all(int signal, bool named = false) const;

  std::string agent_id_;
  pid_t janitor_;
  std::vector<pid_t> spared_;
  Stage stage_ = Stage::kNone;
};

}  // namespace dist::agent
