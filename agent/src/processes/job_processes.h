// Finding every process a worker group started, however far it strayed from its worker's process
// group, and signalling it.
//
// Two sources, because each covers what the other cannot:
// - The process tree. The agent is a child subreaper (become_subreaper), so while it lives every
//   process a worker started stays below it: one whose parent exits is reparented to the agent, not
//   to init, daemons that double-forked with setsid included. The tree also holds processes that
//   replaced their environment (env -i).
// - A marker in the environment: kAgentIdVariable, set in every worker's environment and inherited
//   by everything a worker starts. It outlives the agent: once the agent is gone the tree leads
//   nowhere (its orphans went to init), and the janitor (janitor.h) finds the job by the marker.
//   Reading another process's environment takes root or the same user, as signalling it does.
// A cgroup would be exact, but it is rarely the agent's to make: containers mount /sys/fs/cgroup
// read-only, under systemd only a delegated unit may create cgroups, and hybrid hosts (this CI's
// included) have a cgroup v2 tree without controllers or write access. Slurm, where it is there,
// already kills the job's cgroup. So the agent relies on what every Linux since 3.4 offers.
//
// The functions marked async-signal-safe allocate nothing and take no lock: the janitor runs them
// in a process forked from a possibly multithreaded agent.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

namespace dist::agent {

// Every process an agent starts has DIST_LAUNCH_AGENT_ID in its environment, and passes it on.
// Its value is the agent's id, "<agent pid>-<12 hex digits>"; under a nested agent (a worker that
// runs dist-launch), the enclosing agents' ids come first, ':'-separated like PATH, so that every
// agent up the chain still recognizes the processes as its own.
inline constexpr char kAgentIdVariable[] = "DIST_LAUNCH_AGENT_ID";

// One agent run's id, and the value its workers get.
class AgentId {
 public:
  // A new id, after the ids of the enclosing agents found in this process's environment.
  static AgentId generate();

  const std::string& id() const { return id_; }
  // kAgentIdVariable's value for the workers: the enclosing agents' ids, then id().
  const std::string& value() const { return value_; }

 private:
  std::string id_;
  std::string value_;
};

// A process, told apart from a later one that reuses its pid by its start time (clock ticks since
// boot, /proc/<pid>/stat).
struct ProcessRef {
  pid_t pid = -1;
  unsigned long long start_time = 0;
};

// Makes this process a child subreaper (PR_SET_CHILD_SUBREAPER): orphaned descendants are
// reparented to it, and it must reap them (a waitpid(-1) loop does). False, errno set, when the
// kernel refuses.
bool become_subreaper();

// True while this process has a child that reports its exit with SIGCHLD. For a subreaper whose
// workers are all reaped: true exactly while something they started still runs (or is an unreaped
// zombie). A child made with another exit signal (the janitor) does not count.
bool has_children();

// Every process below this one in the process tree, and every process whose environment carries
// `agent_id`, except `except` (the janitor) and zombies (they are gone, only not reaped yet).
std::vector<ProcessRef> job_processes(std::string_view agent_id, pid_t except);

// Sends `signal` to `p` if it is still the same process: through a pidfd where the kernel has them,
// so that a pid reused since `p` was found is never signalled. False with errno when not sent
// (ESRCH: gone; EPERM: another user's). Async-signal-safe.
bool signal_process(ProcessRef p, int signal);

// Whether /proc/<pid>/environ carries `agent_id` in kAgentIdVariable. Async-signal-safe.
bool carries_agent_id(pid_t pid, std::string_view agent_id);

// SIGKILLs every process whose environment carries `agent_id`, `except` excluded; returns how many
// were signalled. Async-signal-safe.
int kill_marked_processes(std::string_view agent_id, pid_t except);

// Whether process group `pgid`, once a worker's, may still be signalled as the job's: its leader
// is gone (a group outlives its leader only with members, and while it has them its id cannot be
// reused), a zombie, or carries `agent_id`. A leader without the marker is a later process that
// reused the id. Async-signal-safe.
bool group_is_jobs(pid_t pgid, std::string_view agent_id);

}  // namespace dist::agent
