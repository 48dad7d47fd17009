// Starting and signalling worker processes.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "dist/agent/placement.h"
#include "dist/agent/signals.h"

namespace dist::agent {

struct SpawnedProcess {
  pid_t pid = -1;
  int stdout_fd = -1;  // read ends of the worker's stdout and stderr pipes
  int stderr_fd = -1;
};

// fork + exec `argv` with exactly `env`, in a new process group of its own, with PR_SET_PDEATHSIG
// so that it dies with this process (checked against a parent that died before the flag took
// effect), bound to `placement`'s CPUs and memory nodes when given. Throws std::runtime_error with
// a one-line reason if the process cannot start (the executable missing, or the binding refused:
// the child reports the failed call's errno through a close-on-exec pipe). `inherited`: descriptors
// (close-on-exec here) that this worker alone keeps across exec.
SpawnedProcess spawn_worker(const std::vector<std::string>& argv,
                            const std::vector<std::string>& env,
                            const WorkerPlacement* placement = nullptr,
                            const std::vector<int>& inherited = {});

// Sends `signal` to the worker's whole process group (its children included).
void signal_group(pid_t pid, int signal);

}  // namespace dist::agent
