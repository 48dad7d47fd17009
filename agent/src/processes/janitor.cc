#include "processes/janitor.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
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
#include <cstring>
#include <filesystem>
#include <system_error>

#include "processes/job_processes.h"
#include "workers/run_directory.h"

namespace dist::agent {
namespace {

// The one message on the socket (SOCK_SEQPACKET: it arrives whole or not at all): dismissed.
using Message = std::int32_t;
constexpr Message kDismiss = 0;

// Groups the janitor can be told of (a worker's group is untracked once its worker is reaped, so
// this bounds the workers alive at once); beyond it, the marker alone finds their processes.
constexpr std::size_t kMaxTrackedGroups = Janitor::kMaxTrackedGroups;
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
[[noreturn]] void run_janitor(int channel, const Janitor::Shared* shared,
                              std::string_view agent_id) {
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

  while (true) {
    Message m;
    const ssize_t n = ::read(channel, &m, sizeof m);
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof m)) break;  // EOF: the agent is gone without a word
    if (m == kDismiss) ::_exit(0);
  }

  for (std::size_t i = 0; i < kMaxTrackedGroups; ++i) {
    const pid_t group = shared->groups[i].load(std::memory_order_relaxed);
    if (group > 0 && group_is_jobs(group, agent_id)) ::kill(-group, SIGKILL);
  }
  const timespec pause{0, kSweepPauseNanoseconds};
  for (int sweep = 0; sweep < kMaxSweeps; ++sweep) {
    if (kill_marked_processes(agent_id, 0) == 0) break;
    ::nanosleep(&pause, nullptr);
  }
  if (shared->tidy.load(std::memory_order_acquire)) {
    if (shared->secret[0] != '\0') ::unlink(shared->secret);
    prune_empty_tree(AT_FDCWD, shared->directory);
  }
  ::_exit(0);
}

}  // namespace

Janitor::Janitor(std::string_view agent_id) {
  // Shared with the janitor across the clone (MAP_SHARED), zeroed: no group tracked, nothing to
  // tidy.
  void* table =
      ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (table == MAP_FAILED) {
    throw std::system_error(errno, std::generic_category(), "cannot map the janitor's table");
  }
  shared_ = static_cast<Shared*>(table);
  static_assert(Slot::is_always_lock_free, "the table is read by another process");
  static_assert(std::atomic<bool>::is_always_lock_free, "read by another process");
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    const int error = errno;
    unmap();
    throw std::system_error(error, std::generic_category(), "cannot create the janitor's socket");
  }
  // Signals stay blocked across the clone until the janitor has replaced the agent's handlers.
  sigset_t all, previous;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  // Flags 0: a copy like fork's, but with no exit signal (see janitor.h). Every argument is 0, so
  // the architectures' different argument orders for clone do not matter.
  const long pid = ::syscall(SYS_clone, 0UL, 0UL, 0UL, 0UL, 0UL);
  if (pid == 0) run_janitor(fds[1], shared_, agent_id);
  const int error = errno;
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  ::close(fds[1]);
  if (pid < 0) {
    ::close(fds[0]);
    unmap();
    throw std::system_error(error, std::generic_category(), "cannot start the janitor");
  }
  pid_ = static_cast<pid_t>(pid);
  channel_ = fds[0];
}

Janitor::~Janitor() {
  dismiss();
  reap();
  unmap();
}

void Janitor::track(pid_t pgid) {
  if (pgid <= 0 || !shared_ || slot_of_.contains(pgid)) return;
  std::size_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else if (used_slots_ < kMaxTrackedGroups) {
    slot = used_slots_++;
  } else {
    return;  // full: the marker still finds the group's processes
  }
  shared_->groups[slot].store(pgid, std::memory_order_relaxed);
  slot_of_.emplace(pgid, slot);
}

void Janitor::untrack(pid_t pgid) {
  const auto it = slot_of_.find(pgid);
  if (it == slot_of_.end()) return;
  shared_->groups[it->second].store(0, std::memory_order_relaxed);
  free_slots_.push_back(it->second);
  slot_of_.erase(it);
}

void Janitor::tidy_on_death(const std::string& relative_directory,
                            const std::string& relative_secret) {
  // Absolute: the janitor works from "/" (a relative $TMPDIR made relative paths).
  std::error_code directory_error, secret_error;
  const std::string directory =
      std::filesystem::absolute(relative_directory, directory_error).string();
  const std::string secret =
      relative_secret.empty() ? ""
                              : std::filesystem::absolute(relative_secret, secret_error).string();
  if (!shared_ || directory_error || secret_error || relative_directory.empty() ||
      directory.size() >= kMaxPath || secret.size() >= kMaxPath) {
    return;
  }
  // (Again for a node's next agent (it rejoins its job): its run directory is another. The
  // janitor reads the paths only once this process is gone.)
  shared_->tidy.store(false, std::memory_order_release);
  std::memcpy(shared_->directory, directory.c_str(), directory.size() + 1);
  std::memcpy(shared_->secret, secret.c_str(), secret.size() + 1);
  shared_->tidy.store(true, std::memory_order_release);
}

void Janitor::dismiss() {
  if (channel_ < 0) return;
  // Without the word, the closed socket alone would make the janitor sweep.
  const Message message = kDismiss;
  if (::send(channel_, &message, sizeof message, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 &&
      (errno == EPIPE || errno == ECONNRESET)) {
    spdlog::warn("the janitor (pid {}) was gone before this agent's end", pid_);
  }
  ::close(channel_);
  channel_ = -1;
}

void Janitor::reap() {
  if (pid_ < 0) return;
  while (::waitpid(pid_, nullptr, __WCLONE) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

void Janitor::unmap() {
  if (shared_) ::munmap(shared_, sizeof(Shared));
  shared_ = nullptr;
}

}  // namespace dist::agent
