// Starting and signalling worker processes.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "dist/agent/placement.h"
#include "dist/agent/signals.h"

namespace dist::agent {

// A process started by start_process, whose exec has not been confirmed yet.
struct SpawnedProcess {
  pid_t pid = -1;
  int stdout_fd = -1;  // read ends of the worker's stdout and stderr pipes
  int stderr_fd = -1;
  int status_fd = -1;  // EOF once the exec worked; else the child's ChildFailure
  std::string program;
  const WorkerPlacement* placement = nullptr;
};

// What every child of one group shares, worked out once: the executable, searched on PATH as
// execvp would, and the signals whose disposition the child must put back to the default.
struct SpawnPlan {
  std::string executable;  // argv[0] resolved; argv[0] itself when it names no file on PATH
  std::vector<int> signals_to_reset;
};
SpawnPlan plan_spawn(const std::string& program, const std::string& path_variable);

// fork + exec `argv` (argv[0] run as plan.executable) with exactly `env`, in a new process group
// of its own, with PR_SET_PDEATHSIG so that it dies with this process (checked against a parent
// that died before the flag took effect), bound to `placement`'s CPUs and memory nodes when given.
// Returns at once: a group's children exec side by side. Throws std::runtime_error when the
// process cannot be forked.
SpawnedProcess start_process(const SpawnPlan& plan, const std::vector<std::string>& argv,
                             const std::vector<std::string>& env,
                             const WorkerPlacement* placement = nullptr);

// Waits until the child's exec worked. Throws std::runtime_error with a one-line reason when it
// did not (the executable missing, or the binding refused: the child reports the failed call's
// errno through a close-on-exec pipe); the child is then reaped and its pipes closed.
void confirm_started(SpawnedProcess& process);

// start_process, then confirm_started.
SpawnedProcess spawn_worker(const std::vector<std::string>& argv,
                            const std::vector<std::string>& env,
                            const WorkerPlacement* placement = nullptr);

// Sends `signal` to the worker's whole process group (its children included).
void signal_group(pid_t pid, int signal);

}  // namespace dist::agent
