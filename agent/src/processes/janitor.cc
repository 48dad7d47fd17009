#include "processes/janitor.h"

#include <sched.h>
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
#include <new>
#include <system_error>

#include "processes/job_processes.h"

namespace dist::agent {
namespace {

// The one message on the socket (SOCK_SEQPACKET: it arrives whole or not at all): dismissed.
using Message = std::int32_t;
constexpr Message kDismiss = 0;

// Groups the janitor can be told of (a worker's group is untracked once its worker is reaped, so
// this bounds the workers alive at once); beyond it, the marker alone finds their processes.
constexpr std::size_t kMaxTrackedGroups = 4096;
// After the agent's death: marker sweeps until one finds nothing, at most this many, this far apart
// (a process SIGKILLed in one sweep may still be exiting in the next).
constexpr int kMaxSweeps = 200;
constexpr long kSweepPauseNanoseconds = 5'000'000;
// Without close_range (Linux < 5.9), descriptors are closed one by one up to this limit.
constexpr rlim_t kMaxDescriptorsToClose = 1 << 16;

// The janitor shares the agent's memory (CLONE_VM: no page tables copied at the clone, none of the
// agent's pages copied on its next write to them, nothing to tear down when the janitor exits:
// together about 1 ms of a launch of 8 workers on 2 cores), and with it glibc's per-thread state of
// the thread it was cloned from: errno among it. So while the agent lives, the janitor makes its
// system calls itself, without glibc's wrappers, which would write the agent's errno on a failure.
// Sanitizer runtimes keep per-thread state that a second process on these pages would corrupt, and
// other architectures are not written here: there the janitor is a copy, as fork makes it.
#if (defined(__x86_64__) || defined(__aarch64__)) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__)
constexpr bool kSharesMemory = true;
#else
constexpr bool kSharesMemory = false;
#endif
constexpr std::size_t kStackBytes = 256 * 1024;  // kill_marked_processes needs about 20 KB
constexpr std::size_t kMaxAgentIdBytes = 256;

// A system call that returns -errno on failure and leaves errno alone.
long raw_syscall(long number, long a = 0, long b = 0, long c = 0, long d = 0) {
#if defined(__x86_64__)
  long result;
  register long r10 __asm__("r10") = d;
  __asm__ volatile("syscall"
                   : "=a"(result)
                   : "a"(number), "D"(a), "S"(b), "d"(c), "r"(r10)
                   : "rcx", "r11", "memory");
  return result;
#elif defined(__aarch64__)
  register long x8 __asm__("x8") = number;
  register long x0 __asm__("x0") = a;
  register long x1 __asm__("x1") = b;
  register long x2 __asm__("x2") = c;
  register long x3 __asm__("x3") = d;
  __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory");
  return x0;
#else
  const long result = ::syscall(number, a, b, c, d);
  return result == -1 ? -errno : result;
#endif
}

// Everything but `keep` is closed: the janitor must not keep the store's listening socket, a
// worker's pipe or the console open after the agent is gone.
void close_all_but(int keep) {
#ifdef SYS_close_range
  if (raw_syscall(SYS_close_range, 0, keep - 1, 0) == 0 &&
      raw_syscall(SYS_close_range, keep + 1, ~0U, 0) == 0) {
    return;
  }
#endif
  rlimit limit{};
  raw_syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, 0, reinterpret_cast<long>(&limit));
  const rlim_t last = std::min(limit.rlim_cur, kMaxDescriptorsToClose);
  for (rlim_t fd = 0; fd < last; ++fd) {
    if (static_cast<int>(fd) != keep) raw_syscall(SYS_close, static_cast<long>(fd));
  }
}

// What the janitor starts with: in its own memory (the bottom of its stack), which the agent does
// not change.
struct JanitorStart {
  int channel = -1;
  const Janitor::Slot* groups = nullptr;
  std::size_t id_length = 0;
  char id[kMaxAgentIdBytes] = {};
  std::string_view agent_id() const { return {id, id_length}; }
};

// The janitor's whole life. Only system calls and our own allocation-free code run here: glibc's
// per-thread state describes the agent's thread (and is the agent's own while it shares its
// memory). Every signal stays blocked, as the clone left them: the agent's handlers never run here,
// and a fault still ends the janitor (the kernel delivers a synchronous fault regardless).
[[noreturn]] void run_janitor(const JanitorStart& start) {
  raw_syscall(SYS_setpgid, 0, 0);
  raw_syscall(SYS_prctl, PR_SET_NAME, reinterpret_cast<long>("dist-janitor"));
  raw_syscall(SYS_chdir, reinterpret_cast<long>("/"));  // never keeps a directory busy
  close_all_but(start.channel);

  while (true) {
    Message m;
    const long n = raw_syscall(SYS_read, start.channel, reinterpret_cast<long>(&m), sizeof m);
    if (n == -EINTR) continue;
    if (n != static_cast<long>(sizeof m)) break;  // EOF: the agent is gone without a word
    if (m == kDismiss) ::_exit(0);
  }

  // The agent is gone (its last thread closed the socket as it exited): glibc is ours alone now.
  for (std::size_t i = 0; i < kMaxTrackedGroups; ++i) {
    const pid_t group = start.groups[i].load(std::memory_order_relaxed);
    if (group > 0 && group_is_jobs(group, start.agent_id())) ::kill(-group, SIGKILL);
  }
  const timespec pause{0, kSweepPauseNanoseconds};
  for (int sweep = 0; sweep < kMaxSweeps; ++sweep) {
    if (kill_marked_processes(start.agent_id(), 0) == 0) break;
    ::nanosleep(&pause, nullptr);
  }
  ::_exit(0);
}

int janitor_entry(void* start) {
  run_janitor(*static_cast<const JanitorStart*>(start));
}

}  // namespace

Janitor::Janitor(std::string_view agent_id) {
  // Shared with the janitor across the clone (MAP_SHARED), zeroed: no group tracked.
  void* table = ::mmap(nullptr, kMaxTrackedGroups * sizeof(Slot), PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (table == MAP_FAILED) {
    throw std::system_error(errno, std::generic_category(), "cannot map the janitor's table");
  }
  groups_ = static_cast<Slot*>(table);
  static_assert(Slot::is_always_lock_free, "the table is read by another process");
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    const int error = errno;
    unmap();
    throw std::system_error(error, std::generic_category(), "cannot create the janitor's socket");
  }
  void* stack = ::mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED || agent_id.size() > kMaxAgentIdBytes) {
    const int error = stack == MAP_FAILED ? errno : ENAMETOOLONG;
    for (const int fd : fds) ::close(fd);
    unmap();
    throw std::system_error(error, std::generic_category(), "cannot prepare the janitor");
  }
  stack_ = stack;
  auto* start = new (stack) JanitorStart{fds[1], groups_, agent_id.size()};
  agent_id.copy(start->id, agent_id.size());
  // Every signal stays blocked in the janitor (run_janitor).
  sigset_t all, previous;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  // No exit signal (see janitor.h). Sharing memory: the stack above its start. Else flags 0, a copy
  // like fork's (every argument 0, so the architectures' argument orders for clone do not matter).
  long pid;
  if constexpr (kSharesMemory) {
    pid = ::clone(janitor_entry, static_cast<char*>(stack) + kStackBytes, CLONE_VM, start);
  } else {
    pid = ::syscall(SYS_clone, 0UL, 0UL, 0UL, 0UL, 0UL);
    if (pid == 0) run_janitor(*start);
  }
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
  unmap();
}

void Janitor::track(pid_t pgid) {
  if (pgid <= 0 || !groups_ || slot_of_.contains(pgid)) return;
  std::size_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else if (used_slots_ < kMaxTrackedGroups) {
    slot = used_slots_++;
  } else {
    return;  // full: the marker still finds the group's processes
  }
  groups_[slot].store(pgid, std::memory_order_relaxed);
  slot_of_.emplace(pgid, slot);
}

void Janitor::untrack(pid_t pgid) {
  const auto it = slot_of_.find(pgid);
  if (it == slot_of_.end()) return;
  groups_[it->second].store(0, std::memory_order_relaxed);
  free_slots_.push_back(it->second);
  slot_of_.erase(it);
}

void Janitor::dismiss() {
  if (pid_ < 0) return;
  // Without the word, the closed socket alone would make the janitor sweep.
  const Message message = kDismiss;
  if (::send(channel_, &message, sizeof message, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 &&
      (errno == EPIPE || errno == ECONNRESET)) {
    spdlog::warn("the janitor (pid {}) was gone before this agent's end", pid_);
  }
  ::close(channel_);
  channel_ = -1;
  while (::waitpid(pid_, nullptr, __WCLONE) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

// Once the janitor is reaped (or never ran).
void Janitor::unmap() {
  if (groups_) ::munmap(groups_, kMaxTrackedGroups * sizeof(Slot));
  groups_ = nullptr;
  if (stack_) ::munmap(stack_, kStackBytes);
  stack_ = nullptr;
}

}  // namespace dist::agent
