#include "warm/clone_exec.h"

#include <fcntl.h>
#include <linux/sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace dist::agent::warm {
namespace {

// The child's descriptors are first moved this high, so that no source is overwritten by another's
// target.
constexpr int kStagingFloor = 64;
constexpr std::size_t kMaxCloneDescriptors = 16;

// In the child, between the clone and the exec: system calls only.
[[noreturn]] void exec_in_child(const ExecSpec& spec, char* const* argv, char* const* envp,
                                pid_t parent, int status_fd) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (const int s : spec.reset_signals) ::sigaction(s, &dfl, nullptr);
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  for (const int s : spec.ignore_signals) ::sigaction(s, &ign, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::setpgid(0, 0);
  if (spec.die_with_agent) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
  }
  // The status pipe first, out of the way of the targets (it closes at the exec).
  status_fd = ::fcntl(status_fd, F_DUPFD_CLOEXEC, kStagingFloor);
  int staged[kMaxCloneDescriptors];
  const std::size_t n = spec.fds.size();
  for (std::size_t i = 0; i < n; ++i) {
    staged[i] = ::fcntl(spec.fds[i].first, F_DUPFD, kStagingFloor + static_cast<int>(i));
  }
  int highest = 2;
  for (std::size_t i = 0; i < n; ++i) {
    ::dup2(staged[i], spec.fds[i].second);
    highest = std::max(highest, spec.fds[i].second);
  }
  for (int fd = 0; fd <= highest; ++fd) {
    bool wanted = false;
    for (std::size_t i = 0; i < n; ++i) wanted = wanted || spec.fds[i].second == fd;
    if (!wanted) ::close(fd);
  }
  // Everything above: the staged copies and whatever the agent had open, but the status pipe.
#ifdef SYS_close_range
  ::syscall(SYS_close_range, highest + 1, status_fd - 1, 0);
  ::syscall(SYS_close_range, status_fd + 1, ~0U, 0);
#else
  for (int fd = highest + 1; fd < 1024; ++fd) {
    if (fd != status_fd) ::close(fd);
  }
#endif
  ::execve(spec.executable.c_str(), argv, envp);
  const int error = errno;
  [[maybe_unused]] const ssize_t written = ::write(status_fd, &error, sizeof error);
  ::_exit(127);
}

// clone3 with a pidfd (as fork, otherwise); without clone3, fork and no pidfd.
pid_t clone_with_pidfd(int* pidfd) {
  *pidfd = -1;
#ifdef SYS_clone3
  clone_args args{};
  args.flags = CLONE_PIDFD;
  args.pidfd = reinterpret_cast<std::uintptr_t>(pidfd);
  args.exit_signal = SIGCHLD;
  const long pid = ::syscall(SYS_clone3, &args, sizeof args);
  if (pid >= 0 || (errno != ENOSYS && errno != EINVAL)) return static_cast<pid_t>(pid);
  *pidfd = -1;
#endif
  return static_cast<pid_t>(
      ::syscall(SYS_clone, static_cast<unsigned long>(SIGCHLD), 0UL, 0UL, 0UL, 0UL));
}

}  // namespace

Cloned clone_exec(const ExecSpec& spec) {
  if (spec.fds.size() > kMaxCloneDescriptors) {
    throw std::invalid_argument("clone_exec: at most 16 descriptors for " + spec.executable);
  }
  std::vector<char*> argv, envp;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  int status[2];
  if (::pipe2(status, O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("cannot create a pipe: ") + std::strerror(errno));
  }
  const pid_t parent = ::getpid();
  sigset_t all, previous;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  int pidfd = -1;
  const pid_t pid = clone_with_pidfd(&pidfd);
  if (pid == 0) exec_in_child(spec, argv.data(), envp.data(), parent, status[1]);
  const int clone_error = errno;
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  ::close(status[1]);
  if (pid < 0) {
    ::close(status[0]);
    throw std::runtime_error("cannot start " + spec.executable + ": " + std::strerror(clone_error));
  }
  if (pidfd >= 0) ::fcntl(pidfd, F_SETFD, FD_CLOEXEC);
  int exec_error = 0;
  ssize_t n;
  while ((n = ::read(status[0], &exec_error, sizeof exec_error)) < 0 && errno == EINTR) {
  }
  ::close(status[0]);
  if (n == static_cast<ssize_t>(sizeof exec_error)) {
    reap_cloned(pid);
    if (pidfd >= 0) ::close(pidfd);
    throw std::runtime_error("cannot run " + spec.executable + ": " + std::strerror(exec_error));
  }
  return {pid, pidfd};
}

int reap_cloned(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, __WALL) < 0) {
    if (errno != EINTR) return -1;
  }
  return status;
}

}  // namespace dist::agent::warm
