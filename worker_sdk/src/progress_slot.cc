#include "progress_slot.h"

#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "dist/sdk/heartbeat.h"
#include "dist/sdk/progress.h"

namespace dist::sdk {
namespace detail {
namespace {

namespace slot = worker_contract::heartbeat_slot;

// The slot the agent passed, mapped; null without one. A descriptor that is not a slot (a wrapper
// closed it and the number was reused) is said once on stderr.
Slot* map_slot() {
  const char* text = std::getenv(slot::kFdVariable);
  if (!text || !*text) return nullptr;
  const auto off = [text](const std::string& why) -> Slot* {
    std::fprintf(stderr,
                 "dist::sdk: %s=%s %s: heartbeats and progress are off (was the descriptor "
                 "closed by a wrapper between dist-launch and this process?)\n",
                 slot::kFdVariable, text, why.c_str());
    return nullptr;
  };
  char* end = nullptr;
  const long fd = std::strtol(text, &end, 10);
  if (*end != '\0' || fd < 0) return off("is not a descriptor number");
  struct stat st {};
  if (::fstat(static_cast<int>(fd), &st) != 0) {
    return off(std::string("cannot be read (") + std::strerror(errno) + ")");
  }
  if (!S_ISREG(st.st_mode) || st.st_size < static_cast<off_t>(slot::kBytes)) {
    return off("is not a heartbeat slot");
  }
  void* at =
      ::mmap(nullptr, slot::kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, static_cast<int>(fd), 0);
  if (at == MAP_FAILED) return off(std::string("cannot be mapped (") + std::strerror(errno) + ")");
  auto* s = static_cast<Slot*>(at);
  if (s->magic != slot::kMagic) {
    ::munmap(at, slot::kBytes);
    return off("is not a heartbeat slot");
  }
  // Programs this worker runs do not inherit it: they would beat for it.
  ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
  return s;
}

// The collectives issued and not yet completed, oldest first (they complete in order, but a
// failed one may leave out of order).
struct Pending {
  std::uint64_t sequence;
  Collective kind;
  std::uint64_t issued_ns;
};
std::mutex collectives_mutex;
std::deque<Pending> pending;
std::uint64_t next_sequence = 1;

// The oldest pending collective, as the slot shows it. Under collectives_mutex.
void show_oldest(Slot& s) {
  if (pending.empty()) {
    s.pending_since_ns.store(0, std::memory_order_relaxed);
    s.pending_op.store(static_cast<std::uint32_t>(Collective::kNone), std::memory_order_relaxed);
    return;
  }
  s.pending_op.store(static_cast<std::uint32_t>(pending.front().kind), std::memory_order_relaxed);
  s.pending_since_ns.store(pending.front().issued_ns, std::memory_order_release);
}

// The stack dump: the file, opened once, and what the handler writes (only async-signal-safe
// calls in the handler: write, backtrace_symbols_fd; backtrace is warmed up at install).
int stack_fd = -1;

void write_text(const char* text) {
  [[maybe_unused]] const auto n = ::write(stack_fd, text, std::strlen(text));
}

void write_number(std::uint64_t v) {
  char digits[24];
  int i = sizeof digits;
  do {
    digits[--i] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0 && i > 0);
  [[maybe_unused]] const auto n =
      ::write(stack_fd, digits + i, sizeof digits - static_cast<std::size_t>(i));
}

const char* collective_name(std::uint32_t kind) {
  switch (static_cast<Collective>(kind)) {
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kBarrier:
      return "barrier";
    case Collective::kOther:
      return "collective";
    case Collective::kReduce:
      return "reduce";
    case Collective::kAllToAll:
      return "all_to_all";
    case Collective::kGather:
      return "gather";
    case Collective::kScatter:
      return "scatter";
    case Collective::kSendRecv:
      return "send/recv";
    case Collective::kSetup:
      return "group set-up";
    case Collective::kNone:
      break;
  }
  return "none";
}

void dump_stack(int) {
  const int saved = errno;
  write_text("dist::sdk stack of pid ");
  write_number(static_cast<std::uint64_t>(::getpid()));
  if (Slot* s = progress_slot()) {
    const std::uint64_t since = s->pending_since_ns.load(std::memory_order_acquire);
    write_text(": steps ");
    write_number(s->steps.load(std::memory_order_relaxed));
    write_text(", collectives ");
    write_number(s->collectives_done.load(std::memory_order_relaxed));
    write_text(" of ");
    write_number(s->collectives_issued.load(std::memory_order_relaxed));
    if (since != 0) {
      write_text(" done, waiting in ");
      write_text(collective_name(s->pending_op.load(std::memory_order_relaxed)));
      write_text(" #");
      write_number(s->collectives_done.load(std::memory_order_relaxed) + 1);
      write_text(" for ");
      write_number((monotonic_ns() - since) / 1'000'000);
      write_text(" ms");
    } else {
      write_text(" done, none pending");
    }
  }
  write_text("\n");
  void* frames[64];
  const int depth = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, depth, stack_fd);
  write_text("\n");
  errno = saved;
}

}  // namespace

Slot* progress_slot() {
  static Slot* const s = map_slot();
  return s;
}

std::uint64_t monotonic_ns() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<std::uint64_t>(now.tv_sec) * 1'000'000'000ULL +
         static_cast<std::uint64_t>(now.tv_nsec);
}

std::uint64_t collective_issued(Collective kind) {
  Slot* s = progress_slot();
  if (!s) return 0;
  std::lock_guard lock(collectives_mutex);
  const std::uint64_t sequence = next_sequence++;
  pending.push_back({sequence, kind, monotonic_ns()});
  s->collectives_issued.store(sequence, std::memory_order_relaxed);
  if (pending.size() == 1) show_oldest(*s);
  return sequence;
}

void collective_completed(std::uint64_t sequence) {
  Slot* s = progress_slot();
  if (!s || sequence == 0) return;
  std::lock_guard lock(collectives_mutex);
  for (auto it = pending.begin(); it != pending.end(); ++it) {
    if (it->sequence != sequence) continue;
    const bool oldest = it == pending.begin();
    pending.erase(it);
    s->collectives_done.fetch_add(1, std::memory_order_relaxed);
    if (oldest) show_oldest(*s);
    return;
  }
}

void add_work(std::uint64_t ns) {
  if (Slot* s = progress_slot()) s->work_ns.fetch_add(ns, std::memory_order_relaxed);
}

Collective collective_kind(const char* name) {
  const std::string_view n(name);
  if (n == "all_reduce") return Collective::kAllReduce;
  if (n == "broadcast") return Collective::kBroadcast;
  if (n == "all_gather") return Collective::kAllGather;
  if (n == "reduce_scatter") return Collective::kReduceScatter;
  if (n == "barrier") return Collective::kBarrier;
  if (n == "reduce") return Collective::kReduce;
  if (n == "all_to_all") return Collective::kAllToAll;
  if (n == "gather") return Collective::kGather;
  if (n == "scatter") return Collective::kScatter;
  if (n == "send" || n == "recv") return Collective::kSendRecv;
  return Collective::kOther;
}

void note_collective_timeout(std::chrono::milliseconds timeout) {
  Slot* s = progress_slot();
  if (!s || timeout.count() <= 0) return;
  const auto ms = static_cast<std::uint64_t>(timeout.count());
  std::uint64_t seen = s->collective_timeout_ms.load(std::memory_order_relaxed);
  while (ms > seen &&
         !s->collective_timeout_ms.compare_exchange_weak(seen, ms, std::memory_order_relaxed)) {
  }
}

namespace {
std::mutex setup_mutex;
int setup_depth = 0;
}  // namespace

SetupWait::SetupWait() {
  Slot* s = progress_slot();
  std::lock_guard lock(setup_mutex);
  if (++setup_depth == 1 && s) s->setup_since_ns.store(monotonic_ns(), std::memory_order_release);
}

SetupWait::~SetupWait() {
  Slot* s = progress_slot();
  std::lock_guard lock(setup_mutex);
  if (--setup_depth == 0 && s) s->setup_since_ns.store(0, std::memory_order_release);
}

void install_stack_dump() {
  static std::once_flag once;
  std::call_once(once, [] {
    Slot* s = progress_slot();
    const char* signal_text = std::getenv(worker_contract::kStackSignalVariable);
    const char* file = std::getenv(worker_contract::kStackFileVariable);
    if (!s || !signal_text || !file || !*file) return;
    const int signal = std::atoi(signal_text);
    if (signal < SIGRTMIN || signal > SIGRTMAX) return;
    stack_fd = ::open(file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (stack_fd < 0) return;
    void* warm_up[1];
    ::backtrace(warm_up, 1);  // loads what backtrace() needs outside the handler
    struct sigaction action {};
    action.sa_handler = dump_stack;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    if (::sigaction(signal, &action, nullptr) != 0) return;
    s->dump_pid.store(static_cast<std::uint32_t>(::getpid()), std::memory_order_relaxed);
    s->features.fetch_or(slot::kStacksOnSignal, std::memory_order_release);
  });
}

}  // namespace detail

void step() {
  detail::Slot* s = detail::progress_slot();
  if (!s) return;
  s->last_step_ns.store(detail::monotonic_ns(), std::memory_order_release);
  // One writer in practice; steps racing from several threads may lose a count, never a step.
  s->steps.store(s->steps.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

bool progress_enabled() {
  return detail::progress_slot() != nullptr;
}

namespace {
namespace slot = worker_contract::heartbeat_slot;
std::mutex pause_mutex;
int pause_depth = 0;
}  // namespace

Pause::Pause(std::string_view reason) {
  detail::Slot* s = detail::progress_slot();
  std::lock_guard lock(pause_mutex);
  if (++pause_depth != 1 || !s) return;
  // The reason first (NUL-padded, cut before a UTF-8 character's continuation bytes), then the
  // stamp that makes it a pause.
  std::size_t length = std::min(reason.size(), slot::kPauseReasonBytes - 1);
  while (length > 0 && length < reason.size() &&
         (static_cast<unsigned char>(reason[length]) & 0xC0) == 0x80) {
    --length;
  }
  char text[slot::kPauseReasonBytes] = {};
  std::memcpy(text, reason.data(), length);
  std::memcpy(s->pause_reason, text, sizeof text);
  s->paused_since_ns.store(detail::monotonic_ns(), std::memory_order_release);
}

Pause::~Pause() {
  detail::Slot* s = detail::progress_slot();
  std::lock_guard lock(pause_mutex);
  if (--pause_depth != 0 || !s) return;
  s->resumed_ns.store(detail::monotonic_ns(), std::memory_order_relaxed);
  s->paused_since_ns.store(0, std::memory_order_release);
}

void heartbeat() {
  detail::Slot* s = detail::progress_slot();
  if (!s) return;
  s->last_beat_ns.store(detail::monotonic_ns(), std::memory_order_release);
  // One writer in practice; beats racing from several threads may lose a count, never a beat.
  s->beats.store(s->beats.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

bool heartbeat_enabled() {
  return detail::progress_slot() != nullptr;
}

}  // namespace dist::sdk
