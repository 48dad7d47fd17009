#include "dist/sdk/heartbeat.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace dist::sdk {
namespace {

namespace slot = heartbeat_slot;

// The slot the agent passed, mapped; null (heartbeats off) without one. A descriptor that is not a
// slot (a wrapper closed it and the number was reused) is said once on stderr.
slot::Slot* map_slot() {
  const char* text = std::getenv(slot::kFdVariable);
  if (!text || !*text) return nullptr;
  const auto off = [text](const std::string& why) -> slot::Slot* {
    std::fprintf(stderr,
                 "dist::sdk::heartbeat: %s=%s %s: heartbeats are off (was the descriptor closed "
                 "by a wrapper between dist-launch and this process?)\n",
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
  auto* s = static_cast<slot::Slot*>(at);
  if (s->magic != slot::kMagic) {
    ::munmap(at, slot::kBytes);
    return off("is not a heartbeat slot");
  }
  // Programs this worker runs do not inherit it: they would beat for it.
  ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
  return s;
}

slot::Slot* the_slot() {
  static slot::Slot* const s = map_slot();
  return s;
}

}  // namespace

void heartbeat() {
  slot::Slot* s = the_slot();
  if (!s) return;
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  const auto ns = static_cast<std::uint64_t>(now.tv_sec) * 1'000'000'000ULL +
                  static_cast<std::uint64_t>(now.tv_nsec);
  s->last_beat_ns.store(ns, std::memory_order_release);
  // One writer in practice; beats racing from several threads may lose a count, never a beat.
  s->beats.store(s->beats.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

bool heartbeat_enabled() {
  return the_slot() != nullptr;
}

}  // namespace dist::sdk
