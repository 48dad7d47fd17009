#include "health/heartbeat_monitor.h"

#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "dist/contract/worker_contract.h"
#include "health/agent_stall.h"
#include "health/step_stats.h"  // monotonic_now(): the clock the SDK stamps beats with

namespace dist::agent {
namespace {

namespace slot = worker_contract::heartbeat_slot;

}  // namespace

HeartbeatMonitor::HeartbeatMonitor(boost::asio::io_context& io, std::chrono::nanoseconds timeout,
                                   std::function<void(int, std::chrono::nanoseconds)> on_silent)
    : io_(io), timeout_(timeout), on_silent_(std::move(on_silent)) {}

HeartbeatMonitor::~HeartbeatMonitor() {
  forget_all();
}

int HeartbeatMonitor::open(int local_rank) {
  if (static_cast<std::size_t>(local_rank) >= slots_.size()) {
    slots_.resize(static_cast<std::size_t>(local_rank) + 1);
  }
  Watched& w = slots_[static_cast<std::size_t>(local_rank)];
  release(w);
  const int fd = ::memfd_create("dist-heartbeat", MFD_CLOEXEC);
  if (fd < 0) {
    throw std::runtime_error(std::string("cannot create the heartbeat slot (memfd_create: ") +
                             std::strerror(errno) + ")");
  }
  void* at = MAP_FAILED;
  if (::ftruncate(fd, slot::kBytes) == 0) {
    at = ::mmap(nullptr, slot::kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (at == MAP_FAILED) {
    const int error = errno;
    ::close(fd);
    throw std::runtime_error(std::string("cannot map the heartbeat slot: ") + std::strerror(error));
  }
  w.slot = new (at) slot::Slot{};  // (a fresh memfd is zeros already)
  w.slot->magic = slot::kMagic;
  w.fd = fd;
  return fd;
}

void HeartbeatMonitor::watch(int local_rank) {
  Watched& w = slots_.at(static_cast<std::size_t>(local_rank));
  if (w.fd >= 0) ::close(w.fd);  // the worker has its own
  w.fd = -1;
  if (timeout_.count() == 0) return;
  w.deadline = std::make_unique<boost::asio::steady_timer>(io_);
  arm(local_rank, timeout_);
}

void HeartbeatMonitor::forget(int local_rank) {
  if (static_cast<std::size_t>(local_rank) < slots_.size()) {
    release(slots_[static_cast<std::size_t>(local_rank)]);
  }
}

void HeartbeatMonitor::forget_all() {
  for (auto& w : slots_) release(w);
}

void HeartbeatMonitor::ask_to_regroup(int round) {
  for (const Watched& w : slots_) {
    if (w.slot) w.slot->regroup_round.store(static_cast<std::uint32_t>(round));
  }
}

bool HeartbeatMonitor::ask_for_stacks(int local_rank) {
  if (static_cast<std::size_t>(local_rank) >= slots_.size()) return false;
  slot::Slot* s = slots_[static_cast<std::size_t>(local_rank)].slot;
  if (s) s->stacks_asked.fetch_add(1, std::memory_order_release);
  return s != nullptr;
}

void HeartbeatMonitor::release(Watched& w) {
  w.deadline.reset();  // cancels its wait
  if (w.slot) ::munmap(w.slot, slot::kBytes);
  if (w.fd >= 0) ::close(w.fd);
  w = Watched{};
}

std::optional<std::chrono::nanoseconds> HeartbeatMonitor::silence(int local_rank) const {
  if (static_cast<std::size_t>(local_rank) >= slots_.size()) return std::nullopt;
  const slot::Slot* s = slots_[static_cast<std::size_t>(local_rank)].slot;
  if (!s) return std::nullopt;
  const std::uint64_t last = s->last_beat_ns.load(std::memory_order_acquire);
  if (last == 0) return std::nullopt;
  return monotonic_now() - std::chrono::nanoseconds(last);
}

std::uint64_t HeartbeatMonitor::beats(int local_rank) const {
  if (static_cast<std::size_t>(local_rank) >= slots_.size()) return 0;
  const slot::Slot* s = slots_[static_cast<std::size_t>(local_rank)].slot;
  return s ? s->beats.load(std::memory_order_relaxed) : 0;
}

const slot::Slot* HeartbeatMonitor::slot(int local_rank) const {
  if (static_cast<std::size_t>(local_rank) >= slots_.size()) return nullptr;
  return slots_[static_cast<std::size_t>(local_rank)].slot;
}

void HeartbeatMonitor::arm(int local_rank, std::chrono::nanoseconds after) {
  auto& timer = *slots_[static_cast<std::size_t>(local_rank)].deadline;
  timer.expires_after(after);
  timer.async_wait(
      [this, local_rank, alive = std::weak_ptr<char>(alive_)](const boost::system::error_code& ec) {
        if (alive.expired() || ec) return;
        stall_seen_now(monotonic_now());  // (noted: check() does not count it)
        check(local_rank);
      });
}

// At a deadline: silent for the whole timeout, or the deadline moves to last beat + timeout. The
// agent's own stalls are not silence (agent_stall.h): the worker was most likely held too.
void HeartbeatMonitor::check(int local_rank) {
  Watched& w = slots_[static_cast<std::size_t>(local_rank)];
  if (!w.slot || !w.deadline) return;
  std::optional<std::chrono::nanoseconds> silent = silence(local_rank);
  if (!silent) return arm(local_rank, timeout_);  // not beaten yet: not watched yet
  const auto now = monotonic_now();
  silent = ran_since(now - *silent, now);
  if (*silent < timeout_) return arm(local_rank, timeout_ - *silent);
  w.deadline.reset();
  on_silent_(local_rank, *silent);
}

}  // namespace dist::agent
