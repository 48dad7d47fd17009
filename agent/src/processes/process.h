// Starting and signalling worker processes.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dist/agent/signals.h"
#include "resources/placement.h"

namespace dist::agent {

// Environment variables by name (looked up by string_view too).
using Variables = std::map<std::string, std::string, std::less<>>;

// This machine's name, as gethostname() gives it (the default --local-addr, ${hostname}).
std::string this_host();

// A pipe, both ends close-on-exec; std::runtime_error when none can be made. close() closes what
// is still open.
struct Pipe {
  int read = -1, write = -1;
  void close();
};
Pipe make_pipe();

// What a child started by start_process reads until its exec (process.cc).
struct ChildLaunch;

// A process started by start_process, whose exec has not been confirmed yet.
struct SpawnedProcess {
  pid_t pid = -1;
  int stdout_fd = -1;  // read ends of the worker's stdout and stderr pipes
  int stderr_fd = -1;  // (-1: its stderr is its stdout's pipe, SpawnPlan::merge_stderr)
  int status_fd = -1;  // EOF once the exec worked; else the child's ChildFailure
  std::string program;
  const WorkerPlacement* placement = nullptr;
  // Held until the child no longer shares this process's memory (confirm_started, or whoever
  // drops the last copy: that waits for the child's exec or exit).
  std::shared_ptr<ChildLaunch> launch;
};

// What every child of one group shares, worked out once: the executable, searched on PATH as
// execvp would (an empty `path_variable`: the system's default path).
struct SpawnPlan {
  std::string executable;  // argv[0] resolved; argv[0] itself when it names no file on PATH
  bool found = true;       // false: a bare name found nowhere on PATH (start_process throws)
  // The child keeps this process's stdin, as torchrun's workers do (a debugger's prompt, input()
  // from a pipe); false: /dev/null (this process's stdin is its own channel).
  bool keep_stdin = false;
  // The child's stderr is its stdout's pipe (SpawnedProcess::stderr_fd -1): what it writes to
  // either stays in the order it wrote it, where both go to one place anyway.
  bool merge_stderr = false;
};
SpawnPlan plan_spawn(const std::string& program, const std::string& path_variable);

// The signals whose disposition a child of this process must put back to the default before its
// exec: those with a handler, and the ignored SIGPIPE and SIGXFSZ (the agent's console), as
// Python's subprocess does it; other ignored signals stay ignored, as exec keeps them. (The warm
// zygote's; start_process's child reads them itself.)
std::vector<int> signals_to_reset();

// Starts `argv` (argv[0] run as plan.executable) with exactly `env`, in a new session (and so a
// process group) of its own, with PR_SET_PDEATHSIG so that it dies with this process (checked
// against a parent that died before the flag took effect), bound to `placement`'s CPUs and memory
// nodes when given, holding stdin (this process's, or /dev/null: plan.keep_stdin), stdout and
// stderr (pipes) and `inherited` (descriptors, close-on-exec here, that this child alone keeps),
// nothing else of this process's. The child shares this process's memory until its exec, as
// posix_spawn's does (no page tables copied), but this returns at once: children started one
// after the other exec side by side. confirm_started says whether the exec worked. Throws
// std::runtime_error when no process can be started.
SpawnedProcess start_process(const SpawnPlan& plan, std::vector<std::string> argv,
                             std::vector<std::string> env,
                             const WorkerPlacement* placement = nullptr,
                             const std::vector<int>& inherited = {});

// Waits until the child's exec worked. Throws std::runtime_error with a one-line reason when it
// did not (the executable missing, or the binding refused: the child reports the failed call's
// errno through a close-on-exec pipe); the child is then reaped and its pipes closed.
void confirm_started(SpawnedProcess& process);

// Sends `signal` to the worker's whole process group (its children included); to the worker
// alone while it has not made its group yet.
void signal_group(pid_t pid, int signal);

}  // namespace dist::agent
