#include "processes/process.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <linux/futex.h>
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
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "processes/raw_syscall.h"

namespace dist::agent {
namespace {

// What the child reports through the status pipe when it cannot exec.
struct ChildFailure {
  enum Stage : int { kExec, kCpuAffinity, kMemoryPolicy } stage = kExec;
  int error = 0;
};

// The child's system calls (raw_syscall.h: errno untouched). Each returns the kernel's result.
long sys(long number, long a = 0, long b = 0, long c = 0, long d = 0) noexcept {
  return raw_syscall(number, a, b, c, d);
}

[[noreturn]] void exit_child() noexcept {
  for (;;) sys(SYS_exit_group, 127);
}

[[noreturn]] void report_and_exit(int status_fd, ChildFailure failure) noexcept {
  sys(SYS_write, status_fd, syscall_arg(&failure), sizeof failure);
  exit_child();
}

// `from` as descriptor `to`, kept across exec.
void move_fd(int from, int to) noexcept {
  if (from == to) {
    sys(SYS_fcntl, to, F_SETFD, 0);
  } else {
    sys(SYS_dup3, from, to, 0);
  }
}

// In the child: every descriptor from 3 up closes at exec, but those in `kept` (the agent's
// listening sockets, its pipes and files are none of the worker's business, and a worker holding
// a store's socket could accept its connections and keep its port bound after the agent).
void close_others_at_exec(const std::vector<int>& kept) noexcept {
  if (sys(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {  // before Linux 5.11
    struct rlimit limit {};
    const bool known = sys(SYS_prlimit64, 0, RLIMIT_NOFILE, 0, syscall_arg(&limit)) == 0;
    const rlim_t last = known && limit.rlim_cur < 65536 ? limit.rlim_cur : 65536;
    for (long fd = 3; fd < static_cast<long>(last); ++fd) sys(SYS_fcntl, fd, F_SETFD, FD_CLOEXEC);
  }
  for (const int fd : kept) sys(SYS_fcntl, fd, F_SETFD, 0);
}

// The stack of a child started beside the agent (below).
constexpr std::size_t kChildStackBytes = 256 << 10;

}  // namespace

// Everything a child reads between its clone and its exec. Written before the clone, never after:
// the child shares this process's memory and, started beside it (below), reads this while the
// agent goes on.
struct ChildArgs {
  std::string executable;
  std::vector<std::string> argv, env;
  std::vector<char*> c_argv, c_env;
  std::vector<char*> sh_argv;  // a script without "#!", as execvp runs it: /bin/sh SCRIPT ARGS
  std::optional<WorkerPlacement> placement;
  std::vector<int> inherited;
  pid_t parent = 0;
  int stdout_fd = -1, stderr_fd = -1, status_fd = -1;  // the pipes' write ends
  bool keep_stdin = false;                             // SpawnPlan::keep_stdin
};

// A child's arguments and stack, allocated apart from start_process's frame, kept until the kernel
// says the child let go of the memory: at its exec or exit, CLONE_CHILD_CLEARTID zeroes `in_use`
// and wakes its waiters. The child writes only its own stack.
struct ChildLaunch {
  ChildArgs args;
  void* stack = nullptr;          // this child's own (kChildStackBytes, beside), unmapped with this
  std::atomic<pid_t> in_use{-1};  // 0 once the child no longer shares the memory
  bool beside = false;            // started beside the agent: wait for in_use before freeing
  // The kernel writes a plain pid_t there.
  static_assert(sizeof(std::atomic<pid_t>) == sizeof(pid_t) &&
                std::atomic<pid_t>::is_always_lock_free);

  ChildLaunch() = default;
  ChildLaunch(const ChildLaunch&) = delete;
  ChildLaunch& operator=(const ChildLaunch&) = delete;
  ~ChildLaunch() {
    if (beside) {
      while (in_use.load(std::memory_order_acquire) != 0) {
        // Shared (not private): the kernel's wake at the child's exec or exit is.
        ::syscall(SYS_futex, reinterpret_cast<pid_t*>(&in_use), FUTEX_WAIT, -1, nullptr);
      }
    }
    if (stack) ::munmap(stack, kChildStackBytes);
  }
};

namespace {

// Signals arrive blocked (see start_process): every handler is put back to the default before any
// can arrive (a handler run in this process would act for the agent, on its thread's state), as
// are the ignored SIGPIPE and SIGXFSZ (the agent's console), as Python's subprocess does it; other
// ignored signals stay ignored, as exec keeps them. Read here, not in the agent: glibc's sigaction
// hides its own signals (32 and 33) and another thread may change one meanwhile. A kernel
// sigaction begins with the handler and the flags on every architecture; all zeros is SIG_DFL,
// no flags, no mask.
void reset_signal_dispositions() noexcept {
  const long no_handler[4] = {};
  for (long signal = 1; signal < NSIG; ++signal) {
    long current[4] = {};
    if (sys(SYS_rt_sigaction, signal, 0, syscall_arg(current), sizeof(long)) != 0) continue;
    const auto handler = reinterpret_cast<__sighandler_t>(current[0]);
    const bool kept_ignored = handler == SIG_IGN && signal != SIGPIPE && signal != SIGXFSZ;
    if (handler != SIG_DFL && !kept_ignored) {
      sys(SYS_rt_sigaction, signal, syscall_arg(no_handler), 0, sizeof(long));
    }
  }
}

// In the child, between clone and exec: raw system calls only (no errno, no allocation, no
// locks: the agent's memory is this process's too, and the agent may be running).
[[noreturn]] void exec_child(const ChildArgs& c) noexcept {
  reset_signal_dispositions();
  // A session of its own, as torchrun's workers have (its process group is the session's): a
  // worker that reads the terminal (a debugger's prompt) is then not stopped by SIGTTIN as a
  // background process group of the terminal's session would be. Made before its signals are
  // unblocked: a Ctrl-C at the terminal reaches the launcher's group, not this child.
  if (sys(SYS_setsid) < 0) sys(SYS_setpgid, 0, 0);
  const unsigned long none = 0;
  sys(SYS_rt_sigprocmask, SIG_SETMASK, syscall_arg(&none), 0, sizeof none);
  sys(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL);
  if (sys(SYS_getppid) != c.parent) exit_child();  // the agent died before the flag was set
  if (c.placement) {
    const PlacementResult bound = apply_placement_in_child(*c.placement);
    if (bound.error != 0) {
      const bool cpus = bound.call[0] == 's' && bound.call[1] == 'c';  // "sched_setaffinity"
      report_and_exit(c.status_fd, {cpus ? ChildFailure::kCpuAffinity : ChildFailure::kMemoryPolicy,
                                    bound.error});
    }
  }
  move_fd(c.stdout_fd, STDOUT_FILENO);
  move_fd(c.stderr_fd, STDERR_FILENO);
  if (c.keep_stdin) {
    sys(SYS_fcntl, STDIN_FILENO, F_SETFD, 0);  // (however this process opened it)
  } else {
    const long devnull = sys(SYS_openat, AT_FDCWD, syscall_arg("/dev/null"), O_RDONLY);
    if (devnull >= 0) move_fd(static_cast<int>(devnull), STDIN_FILENO);
  }
  close_others_at_exec(c.inherited);
  long error = sys(SYS_execve, syscall_arg(c.executable.c_str()), syscall_arg(c.c_argv.data()),
                   syscall_arg(c.c_env.data()));
  if (error == -ENOEXEC) {  // a script without "#!": as execvp does it
    const long shell = sys(SYS_execve, syscall_arg(c.sh_argv[0]), syscall_arg(c.sh_argv.data()),
                           syscall_arg(c.c_env.data()));
    if (shell != -ENOENT) error = shell;  // (no /bin/sh: the script's own error says more)
  }
  report_and_exit(c.status_fd, {ChildFailure::kExec, static_cast<int>(-error)});
}

int child_entry(void* args) {
  exec_child(*static_cast<const ChildArgs*>(args));
}

// How a child is started. Beside: clone(CLONE_VM) shares the agent's memory until the exec, as
// posix_spawn's does (no page tables copied: a fork's cost grows with the agent's size, this one
// does not), without posix_spawn's CLONE_VFORK: the agent goes on while the kernel sets up the
// exec (about 0.3 ms a child here), so a group's children exec side by side on the machine's cores
// instead of one after the other. That needs system calls that leave errno alone
// (raw_syscall.h); where there are none, the agent waits (CLONE_VFORK) on one shared stack.
//
// Under AddressSanitizer or ThreadSanitizer the child forks instead: their runtimes keep per-thread
// state for the stacks they know, and a child running instrumented code on a stack of its own in
// the parent's memory corrupts it (ASan's no-return handler writes past the unknown stack).
enum class StartMode { kBeside, kVfork, kFork };
#if defined(__has_feature)
#if __has_feature(memory_sanitizer) || __has_feature(hwaddress_sanitizer)
#define DIST_CHILD_MUST_FORK 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || \
    defined(__SANITIZE_HWADDRESS__) || defined(DIST_CHILD_MUST_FORK)
constexpr StartMode kStartMode = StartMode::kFork;
#else
constexpr StartMode kStartMode = kErrnoFreeSyscalls ? StartMode::kBeside : StartMode::kVfork;
#endif

// The stack a child runs on until it execs; only the pages it touches become memory. Its lowest
// page is a guard: an overflow faults instead of writing over the agent's memory. Null when it
// cannot be had: the spawn forks instead.
void* map_stack() {
  void* p = ::mmap(nullptr, kChildStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  if (::mprotect(p, static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)), PROT_NONE) != 0) {
    ::munmap(p, kChildStackBytes);
    return nullptr;
  }
  return p;
}

// Vfork: the parent waits meanwhile, so one stack serves every spawn.
void* shared_stack() {
  static void* const stack = map_stack();
  return stack;
}

pid_t spawn_child(ChildLaunch& launch) {
  if (kStartMode == StartMode::kBeside) {
    launch.stack = map_stack();
    if (launch.stack) {
      char* top = static_cast<char*>(launch.stack) + kChildStackBytes;
      const pid_t pid = ::clone(child_entry, top, CLONE_VM | CLONE_CHILD_CLEARTID | SIGCHLD,
                                &launch.args, nullptr, nullptr, &launch.in_use);
      launch.beside = pid > 0;
      return pid;
    }
  } else if (kStartMode == StartMode::kVfork) {
    if (void* stack = shared_stack()) {
      return ::clone(child_entry, static_cast<char*>(stack) + kChildStackBytes,
                     CLONE_VM | CLONE_VFORK | SIGCHLD, &launch.args);
    }
  }
  const pid_t pid = ::fork();
  if (pid == 0) child_entry(&launch.args);
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
    plan.found = false;
    // No PATH: the system's default search path, as execvp takes it.
    std::string path = path_variable;
    if (path.empty()) {
      char buffer[256] = {};
      path = ::confstr(_CS_PATH, buffer, sizeof buffer) > 0 ? buffer : "/bin:/usr/bin";
    }
    std::size_t start = 0;
    while (start <= path.size()) {
      const auto end = std::min(path.find(':', start), path.size());
      const std::string dir = end > start ? path.substr(start, end - start) : ".";
      const std::string candidate = dir + "/" + program;
      if (::access(candidate.c_str(), X_OK) == 0) {
        plan.executable = candidate;
        plan.found = true;
        break;
      }
      start = end + 1;
    }
  }
  return plan;
}

std::vector<int> signals_to_reset() {
  std::vector<int> reset;
  for (int s = 1; s < NSIG; ++s) {
    struct sigaction current {};
    if (::sigaction(s, nullptr, &current) != 0) continue;
    const bool handled = (current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL;
    const bool inherited_ignore = current.sa_handler == SIG_IGN && s != SIGPIPE && s != SIGXFSZ;
    if (handled && !inherited_ignore) reset.push_back(s);
  }
  return reset;
}

SpawnedProcess start_process(const SpawnPlan& plan, std::vector<std::string> argv,
                             std::vector<std::string> env, const WorkerPlacement* placement,
                             const std::vector<int>& inherited) {
  if (!plan.found) {  // as execvp: a bare name is looked for on PATH alone
    throw std::runtime_error("cannot run '" + argv.front() + "': " + std::strerror(ENOENT));
  }
  struct Pipes {  // closed here, but for the read ends handed on
    Pipe out, err, status;
    ~Pipes() {
      for (Pipe* p : {&out, &err, &status}) p->close();
    }
  } pipes;
  pipes.out = make_pipe();
  if (!plan.merge_stderr) pipes.err = make_pipe();
  pipes.status = make_pipe();
  auto launch = std::make_shared<ChildLaunch>();
  ChildArgs& c = launch->args;
  c.executable = plan.executable;
  c.argv = std::move(argv);
  c.env = std::move(env);
  for (auto& a : c.argv) c.c_argv.push_back(a.data());
  c.c_argv.push_back(nullptr);
  for (auto& e : c.env) c.c_env.push_back(e.data());
  c.c_env.push_back(nullptr);
  static char shell[] = "/bin/sh";
  c.sh_argv = {shell, c.executable.data()};
  c.sh_argv.insert(c.sh_argv.end(), c.c_argv.begin() + 1, c.c_argv.end());
  if (placement) c.placement = *placement;
  c.inherited = inherited;
  c.parent = ::getpid();
  c.stdout_fd = pipes.out.write;
  c.stderr_fd = plan.merge_stderr ? pipes.out.write : pipes.err.write;
  c.status_fd = pipes.status.write;
  c.keep_stdin = plan.keep_stdin;

  std::string program = c.argv.front();  // (copied now: nothing may throw once the child runs)

  // Every signal stays blocked across the clone until the child has its dispositions back.
  sigset_t all, previous;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  const pid_t pid = spawn_child(*launch);
  const int spawn_error = errno;
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (pid < 0) {
    throw std::runtime_error(std::string("cannot start a process: ") + std::strerror(spawn_error));
  }
  // (Its session, and so its process group, are the child's own to make: one made here first
  // would make its setsid fail. Until it has, signal_group reaches the child alone.)
  SpawnedProcess started{
      pid,       pipes.out.read,   pipes.err.read, pipes.status.read, std::move(program),
      placement, std::move(launch)};  // (still read by the child)
  for (Pipe* p : {&pipes.out, &pipes.err, &pipes.status}) p->read = -1;  // handed on
  return started;  // (the write ends close here: the child has its own copies)
}

void confirm_started(SpawnedProcess& p) {
  p.launch.reset();  // (once the child let go of this process's memory)
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
  if (pid <= 0) return;
  // The kernel discards the terminal's stop signals sent to a process group with no parent in
  // its session (a worker's, in a session of its own: kill -TSTP does nothing): SIGSTOP stops it.
  if (signal == SIGTSTP || signal == SIGTTIN || signal == SIGTTOU) signal = SIGSTOP;
  // No such group yet: the child has not made its session (it starts nothing before it has).
  if (::kill(-pid, signal) != 0 && errno == ESRCH) ::kill(pid, signal);
}

}  // namespace dist::agent
