#include "processes/janitor.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <system_error>

#include "processes/job_processes.h"

namespace dist::agent {
namespace {

// The messages on the socket (SOCK_SEQPACKET: each arrives whole or not at all), one int32 each: a
// positive pid tracks that process group, a negative one untracks it, zero dismisses the janitor.
using Message = std::int32_t;
constexpr Message kDismiss = 0;

// Groups the janitor remembers (a worker's group is untracked once its worker is reaped, so this
// bounds the workers alive at once); beyond it, the marker alone finds their processes.
constexpr std::size_t kMaxTrackedGroups = 4096;
// After the agent's death: marker sweeps until one finds nothing, at most this many, this far apart
// (a process SIGKILLed in one sweep may still be exiting in the next).
constexpr int kMaxSweeps = 200;
constexpr long kSweepPauseNanoseconds = 5'000'000;
// Without close_range (Linux < 5.9), descriptors are closed one by one up to this limit.
constexpr rlim_t kMaxDescriptorsToClose = 1 << 16;

bool is_fault_signal(int s) {
  return s == SIGSEGV || s == SIGBUS || s == SIGFPE || s == SIGILL || s == SIGTRAP || s == SIGSYS ||
         s == SIGABRT;
}

// Everything but `keep` is closed: the janitor must not keep the store's listening socket, a
// worker's pipe or the console open after the agent is gone.
void close_all_but(int keep) {
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, 0, keep - 1, 0) == 0 &&
      ::syscall(SYS_close_range, keep + 1, ~0U, 0) == 0) {
    return;
  }
#endif
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  const rlim_t last = std::min(limit.rlim_cur, kMaxDescriptorsToClose);
  for (rlim_t fd = 0; fd < last; ++fd) {
    if (static_cast<int>(fd) != keep) ::close(static_cast<int>(fd));
  }
}

// The janitor's whole life. A copy of the agent made by a raw clone: only system calls and our own
// allocation-free code run here (glibc's per-thread state still describes the agent's thread).
[[noreturn]] void run_janitor(int channel, std::string_view agent_id) {
  struct sigaction action {};
  for (int s = 1; s < NSIG; ++s) {
    // A fault ends the janitor; every other signal is the agent's business, or a supervisor's
    // aimed at the agent's group.
    action.sa_handler = is_fault_signal(s) ? SIG_DFL : SIG_IGN;
    ::sigaction(s, &action, nullptr);  // fails harmlessly for SIGKILL, SIGSTOP and glibc's own
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::setpgid(0, 0);
  ::prctl(PR_SET_NAME, "dist-janitor", 0, 0, 0);
  [[maybe_unused]] const int ignored = ::chdir("/");  // never keeps a directory busy
  close_all_but(channel);

  pid_t groups[kMaxTrackedGroups];
  std::size_t n_groups = 0;
  while (true) {
    Message m;
    const ssize_t n = ::read(channel, &m, sizeof m);
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof m)) break;  // EOF: the agent is gone without a word
    if (m == kDismiss) ::_exit(0);
    if (m > 0 && n_groups < kMaxTrackedGroups) groups[n_groups++] = m;
    if (m < 0) {
      const auto end = std::remove(groups, groups + n_groups, -m);
      n_groups = static_cast<std::size_t>(end - groups);
    }
  }

  for (std::size_t i = 0; i < n_groups; ++i) {
    if (group_is_jobs(groups[i], agent_id)) ::kill(-groups[i], SIGKILL);
  }
  const timespec pause{0, kSweepPauseNanoseconds};
  for (int sweep = 0; sweep < kMaxSweeps; ++sweep) {
    if (kill_marked_processes(agent_id, 0) == 0) break;
    ::nanosleep(&pause, nullptr);
  }
  ::_exit(0);
}

}  // namespace

Janitor::Janitor(std::string_view agent_id) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    throw std::system_error(errno, std::generic_category(), "cannot create the janitor's socket");
  }
  // Signals stay blocked across the clone until the janitor has replaced the agent's handlers.
  sigset_t all, previous;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  // Flags 0: a copy like fork's, but with no exit signal (see janitor.h). Every argument is 0, so
  // the architectures' different argument orders for clone do not matter.
  const long pid = ::syscall(SYS_clone, 0UL, 0UL, 0UL, 0UL, 0UL);
  if (pid == 0) run_janitor(fds[1], agent_id);
  const int error = errno;
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  ::close(fds[1]);
  if (pid < 0) {
    ::close(fds[0]);
    throw std::system_error(error, std::generic_category(), "cannot start the janitor");
  }
  pid_ = static_cast<pid_t>(pid);
  channel_ = fds[0];
}

Janitor::~Janitor() {
  dismiss();
}

void Janitor::track(pid_t pgid) {
  if (pgid > 0) send(pgid);
}

void Janitor::untrack(pid_t pgid) {
  if (pgid > 0) send(-pgid);
}

void Janitor::send(Message message) {
  if (channel_ < 0) return;
  if (::send(channel_, &message, sizeof message, MSG_DONTWAIT | MSG_NOSIGNAL) ==
          static_cast<ssize_t>(sizeof message) ||
      lost_) {
    return;
  }
  if (errno == EPIPE || errno == ECONNRESET) {
    lost_ = true;
    spdlog::warn(
        "the janitor (pid {}) is gone: if this agent is killed, processes the workers started may "
        "outlive it",
        pid_);
  }
}

void Janitor::dismiss() {
  if (pid_ < 0) return;
  send(kDismiss);  // without it, the closed socket alone would make the janitor sweep
  ::close(channel_);
  channel_ = -1;
  while (::waitpid(pid_, nullptr, __WCLONE) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

}  // namespace dist::agent
