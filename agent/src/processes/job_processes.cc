#include "processes/job_processes.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

namespace dist::agent {
namespace {

// The marker's entry is short (a few ids); a longer entry of the same name is not ours.
constexpr std::size_t kMaxMarkerEntryBytes = 4096;
constexpr std::size_t kEnvironReadBytes = 4096;
constexpr std::size_t kStatReadBytes = 1024;  // a stat line is about 300 bytes
constexpr std::size_t kDirentBufferBytes = 8192;

// Async-signal-safe helpers: no allocation, no locale, no stdio.

// "/proc/<pid>/<file>" into `out` (at least 64 bytes).
void proc_path(char* out, pid_t pid, const char* file) {
  char digits[16];
  int n = 0;
  for (auto v = static_cast<unsigned>(pid); n == 0 || v != 0; v /= 10) {
    digits[n++] = static_cast<char>('0' + v % 10);
  }
  std::memcpy(out, "/proc/", 6);
  char* p = out + 6;
  while (n > 0) *p++ = digits[--n];
  *p++ = '/';
  const std::size_t len = std::strlen(file);
  std::memcpy(p, file, len + 1);
}

int open_proc_file(pid_t pid, const char* file) {
  char path[64];
  proc_path(path, pid, file);
  return ::open(path, O_RDONLY | O_CLOEXEC);
}

struct ProcStat {
  pid_t ppid = 0;
  char state = '?';
  unsigned long long start_time = 0;
};

// /proc/<pid>/stat: "pid (comm) state ppid pgrp ... starttime(22nd field) ...". The command name
// may hold spaces and parentheses: fields are counted from the last ')'.
bool read_stat(pid_t pid, ProcStat& out) {
  const int fd = open_proc_file(pid, "stat");
  if (fd < 0) return false;
  char buf[kStatReadBytes];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* p = nullptr;
  for (ssize_t i = n - 1; i >= 0; --i) {
    if (buf[i] == ')') {
      p = buf + i + 1;
      break;
    }
  }
  if (!p) return false;
  // p points at " state ppid ...": field 3 onwards.
  int field = 2;
  while (*p) {
    while (*p == ' ') ++p;
    if (!*p) break;
    ++field;
    const char* token = p;
    while (*p && *p != ' ') ++p;
    if (field == 3) out.state = *token;
    if (field == 4 || field == 22) {
      unsigned long long v = 0;
      for (const char* d = token; d < p && *d >= '0' && *d <= '9'; ++d) v = v * 10 + (*d - '0');
      if (field == 4) out.ppid = static_cast<pid_t>(v);
      if (field == 22) {
        out.start_time = v;
        return true;
      }
    }
  }
  return false;
}

// The ':'-separated `value` holds `id` as one of its elements.
bool value_lists(std::string_view value, std::string_view id) {
  while (true) {
    const std::size_t colon = value.find(':');
    if (value.substr(0, colon) == id) return true;
    if (colon == std::string_view::npos) return false;
    value.remove_prefix(colon + 1);
  }
}

bool marker_entry(std::string_view entry, std::string_view id) {
  constexpr std::string_view name = kAgentIdVariable;
  return entry.size() > name.size() && entry.starts_with(name) && entry[name.size()] == '=' &&
         value_lists(entry.substr(name.size() + 1), id);
}

// Calls visit(pid) for every process in /proc; stops early when visit returns false.
template <typename Visit>
void for_each_process(Visit&& visit) {
  const int dir = ::open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return;
  alignas(8) char buf[kDirentBufferBytes];
  ssize_t n;
  while ((n = ::getdents64(dir, buf, sizeof buf)) > 0) {
    for (ssize_t off = 0; off < n;) {
      const auto* entry = reinterpret_cast<const dirent64*>(buf + off);
      off += entry->d_reclen;
      pid_t pid = 0;
      const char* c = entry->d_name;
      for (; *c >= '0' && *c <= '9'; ++c) pid = pid * 10 + (*c - '0');
      if (*c != '\0' || pid <= 0) continue;  // ".", "self", "sys", ...
      if (!visit(pid)) {
        ::close(dir);
        return;
      }
    }
  }
  ::close(dir);
}

int pidfd_open(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  errno = ENOSYS;
  return -1;
#endif
}

int pidfd_send_signal(int pidfd, int signal) {
#ifdef SYS_pidfd_send_signal
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, signal, nullptr, 0));
#else
  errno = ENOSYS;
  return -1;
#endif
}

std::string hex(const unsigned char* bytes, std::size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    s += kDigits[bytes[i] >> 4];
    s += kDigits[bytes[i] & 0xf];
  }
  return s;
}

}  // namespace

AgentId AgentId::generate() {
  unsigned char random[6] = {};
  if (::getrandom(random, sizeof random, GRND_NONBLOCK) != sizeof random) {
    // Early boot without entropy: the pid and the clock still tell this run from the others.
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    std::memcpy(random, &now, sizeof random);
  }
  AgentId a;
  a.id_ = std::to_string(::getpid()) + "-" + hex(random, sizeof random);
  const char* enclosing = std::getenv(kAgentIdVariable);
  a.value_ = enclosing && *enclosing ? std::string(enclosing) + ":" + a.id_ : a.id_;
  return a;
}

bool become_subreaper() {
  return ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0;
}

bool has_children() {
  siginfo_t info{};
  // WNOWAIT: a child that has exited stays for the agent's own reaping loop.
  while (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
    if (errno != EINTR) return false;  // ECHILD: none
  }
  return true;
}

std::vector<ProcessRef> job_processes(std::string_view agent_id, pid_t except) {
  struct Seen {
    pid_t ppid;
    unsigned long long start_time;
    bool zombie;
    bool marked;
  };
  std::unordered_map<pid_t, Seen> seen;
  std::vector<ProcessRef> found;
  const pid_t self = ::getpid();
  for_each_process([&](pid_t pid) {
    ProcStat stat;
    if (pid == self || pid == except || !read_stat(pid, stat)) return true;
    const bool zombie = stat.state == 'Z';
    const bool marked = !zombie && carries_agent_id(pid, agent_id);
    seen[pid] = {stat.ppid, stat.start_time, zombie, marked};
    if (marked) found.push_back({pid, stat.start_time});
    return true;
  });
  // Add the descendants that carry no marker: walk each one's ancestry up to this process (the
  // janitor, left out of `seen`, ends a walk). The snapshot is not atomic: a reused pid could
  // close a loop, hence the bound on the steps.
  for (const auto& [pid, s] : seen) {
    if (s.zombie || s.marked) continue;
    std::size_t steps = 0;
    for (pid_t up = s.ppid; up > 1 && steps <= seen.size(); ++steps) {
      if (up == self) {
        found.push_back({pid, s.start_time});
        break;
      }
      const auto parent = seen.find(up);
      if (parent == seen.end()) break;
      up = parent->second.ppid;
    }
  }
  return found;
}

bool signal_process(ProcessRef p, int signal) {
  // The pidfd names the process that holds the pid now. Its start time read after the pidfd was
  // opened matching p's means p held the pid throughout: the pidfd is p.
  const int pidfd = pidfd_open(p.pid);
  if (pidfd < 0 && errno != ENOSYS) return false;
  ProcStat now;
  if (!read_stat(p.pid, now) || now.start_time != p.start_time) {
    if (pidfd >= 0) ::close(pidfd);
    errno = ESRCH;
    return false;
  }
  if (pidfd < 0) return ::kill(p.pid, signal) == 0;  // kernel before 5.3: a narrow race remains
  const bool sent = pidfd_send_signal(pidfd, signal) == 0;
  const int error = errno;
  ::close(pidfd);
  errno = error;
  return sent;
}

bool carries_agent_id(pid_t pid, std::string_view agent_id) {
  const int fd = open_proc_file(pid, "environ");
  if (fd < 0) return false;
  // The environment is NUL-separated entries of any length, read a block at a time; an entry is
  // collected only while it may still be the marker.
  char block[kEnvironReadBytes];
  char entry[kMaxMarkerEntryBytes];
  std::size_t entry_len = 0;
  bool skipping = false;
  bool found = false;
  ssize_t n;
  while (!found && (n = ::read(fd, block, sizeof block)) > 0) {
    const char* p = block;
    const char* const end = block + n;
    while (p < end && !found) {
      const auto* nul =
          static_cast<const char*>(std::memchr(p, '\0', static_cast<std::size_t>(end - p)));
      const char* const stop = nul ? nul : end;
      const auto len = static_cast<std::size_t>(stop - p);
      if (!skipping) {
        if (entry_len + len > sizeof entry) {
          skipping = true;
        } else {
          std::memcpy(entry + entry_len, p, len);
          entry_len += len;
          const std::size_t check = std::min(entry_len, sizeof kAgentIdVariable - 1);
          skipping = std::memcmp(entry, kAgentIdVariable, check) != 0;
        }
      }
      if (!nul) break;
      found = !skipping && marker_entry({entry, entry_len}, agent_id);
      entry_len = 0;
      skipping = false;
      p = nul + 1;
    }
  }
  // An environment that does not end with NUL (rewritten in place by its process) ends an entry.
  if (!found && !skipping && entry_len > 0) found = marker_entry({entry, entry_len}, agent_id);
  ::close(fd);
  return found;
}

int kill_marked_processes(std::string_view agent_id, pid_t except) {
  int killed = 0;
  const pid_t self = ::getpid();
  for_each_process([&](pid_t pid) {
    if (pid == self || pid == except) return true;
    // The pidfd first: an environment read after it belongs to the pidfd's process if that is
    // still alive when signalled (pidfd_send_signal fails on a dead one).
    const int pidfd = pidfd_open(pid);
    if (pidfd < 0 && errno != ENOSYS) return true;
    if (carries_agent_id(pid, agent_id)) {
      const bool sent =
          pidfd >= 0 ? pidfd_send_signal(pidfd, SIGKILL) == 0 : ::kill(pid, SIGKILL) == 0;
      if (sent) ++killed;
    }
    if (pidfd >= 0) ::close(pidfd);
    return true;
  });
  return killed;
}

bool group_is_jobs(pid_t pgid, std::string_view agent_id) {
  ProcStat leader;
  if (!read_stat(pgid, leader)) return true;  // gone: only the job's members can hold the id
  return leader.state == 'Z' || carries_agent_id(pgid, agent_id);
}

}  // namespace dist::agent
