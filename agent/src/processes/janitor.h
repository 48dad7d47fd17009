// The agent's janitor: a small process that outlives the agent only to clean up after it.
//
// Workers die with the agent (PR_SET_PDEATHSIG); what they started does not, and once the agent is
// SIGKILLed, its knowledge as a subreaper is gone with it. The janitor, forked when the agent
// starts, waits on a socket whose other end only the agent holds. When that end closes without a
// dismissal (the agent was SIGKILLed or crashed), the janitor SIGKILLs every worker process group
// it was told of, then every process carrying the agent's marker (job_processes.h), sweeping until
// none is left, and exits. Dismissed (the agent exits normally, having stopped everything itself),
// it exits at once, while the agent tears down, and the agent reaps it last. It is told of the
// groups through a table in memory shared with it, which it reads only once the agent is gone: it
// sleeps through the whole job (woken for each worker started and reaped, it took a core from a
// launch of 8 workers on 2 cores 16 times, about 0.8 ms of it).
//
// Cheap and out of the way: forked before the agent starts a thread or allocates much (the fork
// copies page tables: about 0.1 ms; dismissing and reaping it at exit costs about as much), it
// keeps no file descriptor but its socket (not the store's listening socket, not the workers'
// pipes, not the console), runs in a process group of its own (a terminal's ^C, or `kill -- -PGID`
// of the agent's group, leaves it be) and ignores every signal but SIGKILL. It is a clone child
// that reports its exit with no signal: the agent's waitpid(-1) reaping loop and has_children()
// never see it, and only the Janitor's destructor reaps it. It is named "dist-janitor" in ps.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dist::agent {

class Janitor {
 public:
  // Forks the janitor for the agent `agent_id` (AgentId::id()). Call it before the agent starts
  // any thread: the janitor is a raw clone (no fork handlers run), safe only in a process with one
  // thread (sanitizer runtimes included). Throws std::system_error when it cannot start.
  explicit Janitor(std::string_view agent_id);
  ~Janitor();  // dismiss(), then reaps it
  Janitor(const Janitor&) = delete;
  Janitor& operator=(const Janitor&) = delete;

  // A worker's process group, to SIGKILL if the agent dies. Untrack it once the agent has reaped
  // the worker (a group's id may be reused once the group is empty; its members that remain carry
  // the marker). A store into the shared table: it wakes nobody; beyond 4096 groups at once it
  // is dropped, and the marker still finds the group's processes.
  void track(pid_t pgid);
  void untrack(pid_t pgid);

  // One entry of the table shared with the janitor: a tracked group, or 0.
  using Slot = std::atomic<pid_t>;
  static constexpr std::size_t kMaxTrackedGroups = 4096;
  static constexpr std::size_t kMaxPath = 2048;
  // What the agent shares with the janitor (mapped before the clone): the tracked groups, and the
  // directory to tidy (`tidy` set once both paths are written).
  struct Shared {
    Slot groups[kMaxTrackedGroups];
    std::atomic<bool> tidy;
    char directory[kMaxPath];
    char secret[kMaxPath];
  };

  // A temporary run directory (RunDirectory) to tidy if the agent dies: its empty files and
  // folders go, as at the agent's own end (what says something, an error file or a worker's
  // stacks, stays, and so does the directory then), and `secret`, a token file the agent wrote in
  // it, too. Paths longer than kMaxPath are not taken.
  void tidy_on_death(const std::string& directory, const std::string& secret);

  // The agent exits normally with nothing left to clean: the janitor exits. It is reaped by the
  // destructor, so that its exit (a copy of the agent's page tables torn down) overlaps the
  // agent's own teardown instead of preceding it.
  void dismiss();

  pid_t pid() const { return pid_; }

 private:
  void reap();
  void unmap();

  int channel_ = -1;
  pid_t pid_ = -1;
  Shared* shared_ = nullptr;
  std::unordered_map<pid_t, std::size_t> slot_of_;
  std::vector<std::size_t> free_slots_;  // below used_slots_
  std::size_t used_slots_ = 0;
};

}  // namespace dist::agent
