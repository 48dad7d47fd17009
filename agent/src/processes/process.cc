#include "processes/process.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace dist::agent {
namespace {

// What the child reports through the status pipe when it cannot exec.
struct ChildFailure {
  enum Stage : int { kExec, kCpuAffinity, kMemoryPolicy } stage = kExec;
  int error = 0;
};

[[noreturn]] void report_and_exit(Pipe status, ChildFailure failure) {
  [[maybe_unused]] ssize_t n = ::write(status.write, &failure, sizeof failure);
  ::_exit(127);
}

// In the child: every descriptor from 3 up closes at exec, but those in `kept` (the agent's
// listening sockets, its pipes and files are none of the worker's business, and a worker holding
// a store's socket could accept its connections and keep its port bound after the agent).
// Async-signal-safe.
void close_others_at_exec(const std::vector<int>& kept) {
  if (::syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {  // before Linux 5.11
    struct rlimit limit {};
    const rlim_t last =
        ::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < 65536 ? limit.rlim_cur : 65536;
    for (int fd = 3; fd < static_cast<int>(last); ++fd) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  for (const int fd : kept) ::fcntl(fd, F_SETFD, 0);
}

// In the child, between fork and exec: only async-signal-safe calls.
[[noreturn]] void exec_child(const char* executable, char* const* argv, char* const* envp,
                             const int* signals_to_reset, std::size_t signal_count, pid_t parent,
                             Pipe out, Pipe err, Pipe status, const WorkerPlacement* placement,
                             const std::vector<int>& inherited) {
  // Signals arrive blocked (see start_process): the agent's dispositions are put back to the
  // defaults before any can arrive here. (A handler run in this process would act for the agent.)
  for (std::size_t i = 0; i < signal_count; ++i) ::signal(signals_to_reset[i], SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);  // the agent died before the flag was set
  if (placement) {
    const PlacementResult bound = apply_placement_in_child(*placement);
    if (bound.error != 0) {
      const bool cpus = bound.call[0] == 's' && bound.call[1] == 'c';  // "sched_setaffinity"
      report_and_exit(
          status, {cpus ? ChildFailure::kCpuAffinity : ChildFailure::kMemoryPolicy, bound.error});
    }
  }
  ::dup2(out.write, STDOUT_FILENO);
  ::dup2(err.write, STDERR_FILENO);
  const int devnull = ::open("/dev/null", O_RDONLY);
  if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
  close_others_at_exec(inherited);
  ::execve(executable, argv, envp);
  // A script without "#!" (ENOEXEC), or a name not found on PATH: as execvp does it.
  if (errno == ENOEXEC || errno == ENOENT) ::execvpe(argv[0], argv, envp);
  report_and_exit(status, {ChildFailure::kExec, errno});
}

// What the child needs, read from the parent's memory (CLONE_VM) while the parent waits.
struct ChildStart {
  const char* executable;
  char* const* argv;
  char* const* envp;
  const int* signals_to_reset;
  std::size_t signal_count;
  pid_t parent;
  Pipe out, err, status;
  const WorkerPlacement* placement;
  const std::vector<int>* inherited;
};

int child_entry(void* raw) {
  const auto* c = static_cast<const ChildStart*>(raw);
  exec_child(c->executable, c->argv, c->envp, c->signals_to_reset, c->signal_count, c->parent,
             c->out, c->err, c->status, c->placement, *c->inherited);
}

// The stack a child runs on until it execs. The parent waits meanwhile (CLONE_VFORK), so one stack
// serves every spawn. Reserved once; only the pages the child touches become memory. Null when it
// cannot be had: the spawn forks instead.
char* child_stack_top() {
  static constexpr std::size_t kBytes = 1 << 20;  // execvpe's path buffer is a stack array
  static void* const stack = [] {
    void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }();
  return stack ? static_cast<char*>(stack) + kBytes : nullptr;
}

// Starts the child as posix_spawn does: clone(CLONE_VM | CLONE_VFORK) shares the parent's memory
// until the exec instead of copying its page tables and then faulting on every page either side
// writes (a fork's cost grows with the agent's size; this one does not). The child makes system
// calls only, on its own stack.
//
// Under AddressSanitizer or ThreadSanitizer the child forks instead: their runtimes keep per-thread
// state for the stacks they know, and a child running instrumented code on a stack of its own in
// the parent's memory corrupts it (ASan's no-return handler writes past the unknown stack).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kCloneOnOwnStack = false;
#else
constexpr bool kCloneOnOwnStack = true;
#endif

pid_t spawn_child(ChildStart& start) {
  if (char* top = kCloneOnOwnStack ? child_stack_top() : nullptr) {
    return ::clone(child_entry, top, CLONE_VM | CLONE_VFORK | SIGCHLD, &start);
  }
  const pid_t pid = ::fork();
  if (pid == 0) child_entry(&start);
  return pid;
}

}  // namespace

std::string this_host() {
  char buf[HOST_NAME_MAX + 1] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

void Pipe::close() {
  for (int* fd : {&read, &write}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

Pipe make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("cannot create a pipe: ") + std::strerror(errno));
  }
  return {fds[0], fds[1]};
}

SpawnPlan plan_spawn(const std::string& program, const std::string& path_variable) {
  SpawnPlan plan;
  plan.executable = program;
  if (program.find('/') == std::string::npos) {
    std::size_t start = 0;
    while (start <= path_variable.size()) {
      const auto end = std::min(path_variable.find(':', start), path_variable.size());
      const std::string dir = end > start ? path_variable.substr(start, end - start) : ".";
      const std::string candidate = dir + "/" + program;
      if (::access(candidate.c_str(), X_OK) == 0) {
        plan.executable = candidate;
        break;
      }
      start = end + 1;
    }
  }
  // Handlers do not survive exec, but ignored signals do: the ones the agent ignores (SIGPIPE:
  // its console) go back to the default, as Python's subprocess does it; so does any signal with
  // a handler, which would otherwise run in the child until the exec.
  for (int s = 1; s < NSIG; ++s) {
    struct sigaction current {};
    if (::sigaction(s, nullptr, &current) != 0) continue;
    const bool handled = (current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL;
    const bool inherited_ignore = current.sa_handler == SIG_IGN && s != SIGPIPE && s != SIGXFSZ;
    if (handled && !inherited_ignore) plan.signals_to_reset.push_back(s);
  }
  return plan;
}

SpawnedProcess start_process(const SpawnPlan& plan, const std::vector<std::string>& argv,
                             const std::vector<std::string>& env, const WorkerPlacement* placement,
                             const std::vector<int>& inherited) {
  std::vector<char*> c_argv, c_env;
  for (const auto& a : argv) c_argv.push_back(const_cast<char*>(a.c_str()));
  c_argv.push_back(nullptr);
  for (const auto& e : env) c_env.push_back(const_cast<char*>(e.c_str()));
  c_env.push_back(nullptr);

  Pipe out = make_pipe(), err = make_pipe(), status = make_pipe();
  const pid_t parent = ::getpid();
  // Every signal stays blocked across fork until the child has its dispositions back.
  sigset_t all, previous;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  ChildStart start{plan.executable.c_str(),
                   c_argv.data(),
                   c_env.data(),
                   plan.signals_to_reset.data(),
                   plan.signals_to_reset.size(),
                   parent,
                   out,
                   err,
                   status,
                   placement,
                   &inherited};
  const pid_t pid = spawn_child(start);  // returns once the child has exec'd (or failed to)
  const int spawn_error = errno;
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (pid < 0) {
    for (int fd : {out.read, out.write, err.read, err.write, status.read, status.write})
      ::close(fd);
    throw std::runtime_error(std::string("cannot start a process: ") + std::strerror(spawn_error));
  }
  ::setpgid(pid, pid);  // (the child did it before its exec; a forked one may not have yet)
  ::close(out.write);
  ::close(err.write);
  ::close(status.write);
  return {pid, out.read, err.read, status.read, argv.front(), placement};
}

void confirm_started(SpawnedProcess& p) {
  ChildFailure failure;
  const ssize_t n = ::read(p.status_fd, &failure, sizeof failure);  // EOF once exec worked
  ::close(p.status_fd);
  p.status_fd = -1;
  if (n != sizeof failure) return;
  ::close(p.stdout_fd);
  ::close(p.stderr_fd);
  while (::waitpid(p.pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  const std::string why = std::strerror(failure.error);
  switch (failure.stage) {
    case ChildFailure::kExec:
      throw std::runtime_error("cannot run '" + p.program + "': " + why);
    case ChildFailure::kCpuAffinity:
      throw std::runtime_error("cannot bind the worker to " + p.placement->describe() +
                               " (sched_setaffinity: " + why + ")");
    case ChildFailure::kMemoryPolicy:
      throw std::runtime_error("cannot set the worker's memory policy for " +
                               p.placement->describe() + " (set_mempolicy: " + why + ")");
  }
}

void signal_group(pid_t pid, int signal) {
  if (pid > 0) ::kill(-pid, signal);
}

}  // namespace dist::agent
