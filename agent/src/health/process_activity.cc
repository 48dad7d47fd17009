#include "health/process_activity.h"

#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

namespace dist::agent {
namespace {

constexpr int kMaxProcesses = 256;  // a worker's tree read at most: a fork bomb is not read whole

std::string read_small(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  std::getline(in, text, '\0');
  return text;
}

long ticks_per_second() {
  static const long ticks = ::sysconf(_SC_CLK_TCK);
  return ticks > 0 ? ticks : 100;
}

// State, CPU ticks (utime + stime, fields 14 and 15) and, with `flags`, the kernel's PF_* flags
// (field 9) from a /proc stat file (a process's or a thread's); false when gone.
bool read_stat_file(const std::string& path, char& state, std::uint64_t& ticks,
                    unsigned long* flags = nullptr) {
  const std::string stat = read_small(path);
  const auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  state = stat[close + 2];
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  std::uint64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {  // field 3 is the state
    if (i == 9 && flags) *flags = std::strtoul(field.c_str(), nullptr, 10);
    if (i == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
    if (i == 15) stime = std::strtoull(field.c_str(), nullptr, 10);
  }
  ticks = utime + stime;
  return true;
}

bool read_stat(pid_t pid, char& state, std::uint64_t& ticks) {
  return read_stat_file("/proc/" + std::to_string(pid) + "/stat", state, ticks);
}

void add_io(pid_t pid, ProcessActivity& a) {
  std::istringstream lines(read_small("/proc/" + std::to_string(pid) + "/io"));
  for (std::string name; lines >> name;) {
    std::uint64_t value = 0;
    lines >> value;
    if (name == "rchar:") a.read_bytes += value;
    if (name == "wchar:") a.write_bytes += value;
    if (name == "write_bytes:") a.storage_written += value;
  }
}

// The children of every thread of `pid` (/proc/<pid>/task/<tid>/children).
std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> children;
  std::error_code ec;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::istringstream list(read_small(task.path().string() + "/children"));
    for (pid_t child; list >> child;) children.push_back(child);
  }
  return children;
}

// The call `pid`'s main thread is blocked in on a descriptor, from /proc/<pid>/syscall (the
// call's number and its arguments, the first the descriptor): a read, a write, or a poll of one
// descriptor for either (how Python waits on a socket with a timeout: the pollfd read from the
// process's memory).
struct BlockedCall {
  int fd = -1;
  bool writes = false;
};
std::optional<BlockedCall> blocked_call(pid_t pid) {
  std::istringstream call(read_small("/proc/" + std::to_string(pid) + "/syscall"));
  long number = -1;
  std::string first, second;
  if (!(call >> number >> first >> second)) return std::nullopt;
  const auto fd = static_cast<int>(std::strtol(first.c_str(), nullptr, 16));
  switch (number) {
    case SYS_read:
    case SYS_readv:
    case SYS_pread64:
    case SYS_recvfrom:
    case SYS_recvmsg:
    case SYS_recvmmsg:
      return BlockedCall{fd, false};
    case SYS_write:
    case SYS_writev:
    case SYS_pwrite64:
    case SYS_sendto:
    case SYS_sendmsg:
    case SYS_sendmmsg:
      return BlockedCall{fd, true};
#ifdef SYS_poll
    case SYS_poll:
#endif
    case SYS_ppoll: {
      if (std::strtoul(second.c_str(), nullptr, 16) != 1) return std::nullopt;  // nfds
      pollfd polled{};
      iovec local{&polled, sizeof polled};
      iovec remote{reinterpret_cast<void*>(std::strtoull(first.c_str(), nullptr, 16)),
                   sizeof polled};
      if (::process_vm_readv(pid, &local, 1, &remote, 1, 0) != sizeof polled) return std::nullopt;
      if ((polled.events & (POLLIN | POLLOUT)) == (POLLIN | POLLOUT)) return std::nullopt;
      if ((polled.events & (POLLIN | POLLOUT)) == 0 || polled.fd < 0) return std::nullopt;
      return BlockedCall{polled.fd, (polled.events & POLLOUT) != 0};
    }
    default:
      return std::nullopt;
  }
}

// "127.0.0.1:5000" from /proc/net/tcp's "0100007F:1388" (IPv4: one word in the host's order)
// or tcp6's 32 digits (four such words).
std::string address_of(const std::string& hex) {
  const auto colon = hex.find(':');
  if (colon == std::string::npos) return "";
  const std::string ip = hex.substr(0, colon);
  const auto port = std::strtoul(hex.c_str() + colon + 1, nullptr, 16);
  unsigned char bytes[16];
  if (ip.size() != 8 && ip.size() != 32) return "";
  for (std::size_t word = 0; word < ip.size() / 8; ++word) {
    const auto value =
        static_cast<std::uint32_t>(std::strtoul(ip.substr(word * 8, 8).c_str(), nullptr, 16));
    std::memcpy(bytes + word * 4, &value, 4);
  }
  char text[INET6_ADDRSTRLEN] = {};
  if (ip.size() == 8) {
    ::inet_ntop(AF_INET, bytes, text, sizeof text);
    return std::string(text) + ":" + std::to_string(port);
  }
  ::inet_ntop(AF_INET6, bytes, text, sizeof text);
  return "[" + std::string(text) + "]:" + std::to_string(port);
}

// The TCP socket `inode` in `pid`'s network namespace: its peer and state (/proc/net/tcp's
// hex: 01 established, 02 connecting); none when it is no TCP socket.
struct TcpSocket {
  std::string peer;
  int state = 0;
};
std::optional<TcpSocket> tcp_socket(pid_t pid, const std::string& inode) {
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream lines("/proc/" + std::to_string(pid) + table);
    std::string line;
    std::getline(lines, line);  // the heading
    while (std::getline(lines, line)) {
      // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
      std::istringstream fields(line);
      std::string sl, local, remote, state, queues, timer, retransmits, uid, timeout, node;
      if (fields >> sl >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
              timeout >> node &&
          node == inode) {
        return TcpSocket{address_of(remote),
                         static_cast<int>(std::strtol(state.c_str(), nullptr, 16))};
      }
    }
  }
  return std::nullopt;
}

constexpr int kTcpEstablished = 1;
constexpr int kTcpSynSent = 2;

// What `target` (what descriptor of `pid` links to) is, in words: "a socket to 127.0.0.1:5000",
// "a pipe (pipe:[4711])", a file's path. `connecting`: a TCP socket whose connection is not made
// yet; `established`: one whose is.
std::string descriptor_of(pid_t pid, const std::string& target, bool& connecting,
                          bool& established) {
  if (target.starts_with("socket:[") && target.ends_with("]")) {
    const auto tcp = tcp_socket(pid, target.substr(8, target.size() - 9));
    connecting = tcp && tcp->state == kTcpSynSent;
    established = tcp && tcp->state == kTcpEstablished;
    return tcp && !tcp->peer.empty() ? "a socket to " + tcp->peer : "a socket (" + target + ")";
  }
  established = true;  // a pipe, a file: written as it is
  if (target.starts_with("pipe:[")) return "a pipe (" + target + ")";
  return target;
}

// What descriptor `fd` of `pid` links to ("socket:[4711]", "/dev/pts/3"); empty when it cannot
// be read.
std::string link_of(pid_t pid, int fd) {
  std::error_code ec;
  const auto target = std::filesystem::read_symlink(
      "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd), ec);
  return ec ? "" : target.string();
}

// Where `pid`'s main thread waits for input, when it reads `target` (descriptor `fd`) and that is
// a terminal, or its stdin: "at its terminal (/dev/pts/3)", "on its stdin (pipe:[4711])"; empty
// otherwise.
std::string input_awaited(pid_t pid, int fd, const std::string& target) {
  if (target.starts_with("/dev/pts/") || target.starts_with("/dev/tty") ||
      target == "/dev/console") {
    return "at its terminal (" + target + ")";
  }
  // Its stdin, or the same file opened again (torch.distributed.breakpoint's /dev/stdin).
  if (fd != STDIN_FILENO && link_of(pid, STDIN_FILENO) != target) return "";
  return "on its stdin (" + target + ")";
}

// Reads what `pid`'s main thread, asleep, is blocked on into `a`.
void read_blocked_call(pid_t pid, ProcessActivity& a) {
  const auto call = blocked_call(pid);
  if (!call) return;
  const std::string target = link_of(pid, call->fd);
  if (target.empty()) return;
  if (!call->writes) a.awaits_input = input_awaited(pid, call->fd, target);
  if (!a.awaits_input.empty()) return;
  bool connecting = false, established = false;
  const std::string what = descriptor_of(pid, target, connecting, established);
  if (connecting) {  // a poll for POLLOUT is how a connection with a timeout is waited for
    a.blocked_on = "connecting with " + what;
    return;
  }
  a.blocked_writing = call->writes && established;
  a.blocked_on = (call->writes ? "writing to " : "reading from ") + what;
}

}  // namespace

ProcessActivity read_activity(pid_t pid) {
  ProcessActivity a;
  std::vector<pid_t> todo = {pid};
  while (!todo.empty() && a.processes < kMaxProcesses) {
    const pid_t p = todo.back();
    todo.pop_back();
    char state = '?';
    std::uint64_t ticks = 0;
    if (!read_stat(p, state, ticks)) continue;
    if (p == pid) {
      a.state = state;
      a.wchan = read_small("/proc/" + std::to_string(p) + "/wchan");
      if (a.wchan == "0") a.wchan.clear();
      if (state == 'S') read_blocked_call(p, a);
      if (state == 'S' && a.wchan == "do_wait") {
        const auto children = children_of(p);  // (which one it waits for is not said)
        for (std::size_t i = 0; i < children.size() && i < 3; ++i) {
          std::string comm = read_small("/proc/" + std::to_string(children[i]) + "/comm");
          while (!comm.empty() && comm.back() == '\n') comm.pop_back();
          a.awaits_child += (i == 0 ? "" : ", ") + std::to_string(children[i]) + " (" + comm + ")";
        }
        if (!children.empty()) {
          a.awaits_child.insert(0, children.size() == 1 ? "its child " : "one of its children ");
          if (children.size() > 3) a.awaits_child += ", ...";
        }
      }
    }
    ProcessCounters counters{p, ticks, 0};
    if (const auto use = read_cpu_use(p)) {
      counters.cpu_queued_ns = static_cast<std::uint64_t>(use->waited.count());
    }
    a.cpu_ticks += counters.cpu_ticks;
    a.cpu_queued_ns += counters.cpu_queued_ns;
    a.each.push_back(counters);
    add_io(p, a);
    ++a.processes;
    for (const pid_t child : children_of(p)) todo.push_back(child);
  }
  return a;
}

bool on_its_way_out(pid_t pid) {
  if (pid <= 0) return false;
  const std::string proc = "/proc/" + std::to_string(pid);
  char state = '?';
  std::uint64_t ticks = 0;
  unsigned long flags = 0;
  if (!read_stat_file(proc + "/stat", state, ticks, &flags)) return false;  // reaped
  constexpr unsigned long kExiting = 0x4;                                   // PF_EXITING
  if (state == 'Z' || state == 'X' || (flags & kExiting) != 0) return true;
  std::istringstream status(read_small(proc + "/status"));
  constexpr unsigned long long kKill = 1ULL << (SIGKILL - 1);
  for (std::string line; std::getline(status, line);) {
    if ((line.starts_with("SigPnd:") || line.starts_with("ShdPnd:")) &&
        (std::strtoull(line.c_str() + 7, nullptr, 16) & kKill) != 0) {
      return true;
    }
  }
  return false;
}

bool restarts_after_a_handler(pid_t pid) {
  std::istringstream call(read_small("/proc/" + std::to_string(pid) + "/syscall"));
  long number = -1;
  if (!(call >> number)) return false;  // running, gone, or not to be read
  switch (number) {
    case SYS_futex:  // a lock, a condition (the GIL's): restarted, or retried by glibc
    case SYS_read:
    case SYS_readv:
    case SYS_pread64:
    case SYS_write:
    case SYS_writev:
    case SYS_pwrite64:
    case SYS_wait4:
    case SYS_waitid:
    case SYS_flock:
      return true;
    default:  // poll, select, epoll_wait, nanosleep, ...: EINTR whatever the handler's flags
      return false;
  }
}

std::optional<ProcessStat> read_process_stat(pid_t pid) {
  ProcessStat s;
  if (!read_stat(pid, s.state, s.cpu_ticks)) return std::nullopt;
  return s;
}

std::optional<ThreadRun> read_thread_run(pid_t pid, pid_t tid) {
  const std::string task = "/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid);
  ThreadRun run;
  run.at = std::chrono::steady_clock::now();
  std::uint64_t ticks = 0;
  if (!read_stat_file(task + "/stat", run.state, ticks)) return std::nullopt;
  // schedstat: nanoseconds on a CPU, nanoseconds waiting for one, timeslices; all zero on a
  // kernel without scheduler statistics, where the stat's ticks (10 ms each) stand in.
  std::istringstream schedstat(read_small(task + "/schedstat"));
  std::uint64_t on_cpu_ns = 0, waited_ns = 0, slices = 0;
  if (schedstat >> on_cpu_ns >> waited_ns >> slices && slices > 0) {
    run.on_cpu = std::chrono::nanoseconds(on_cpu_ns);
  } else {
    run.on_cpu = std::chrono::nanoseconds(ticks * 1'000'000'000 /
                                          static_cast<std::uint64_t>(ticks_per_second()));
  }
  return run;
}

std::optional<CpuUse> read_cpu_use(pid_t pid) {
  std::istringstream schedstat(read_small("/proc/" + std::to_string(pid) + "/schedstat"));
  std::uint64_t on_cpu_ns = 0, waited_ns = 0, slices = 0;
  if (!(schedstat >> on_cpu_ns >> waited_ns >> slices) || slices == 0) return std::nullopt;
  return CpuUse{std::chrono::nanoseconds(on_cpu_ns), std::chrono::nanoseconds(waited_ns)};
}

bool thread_waited_in_kernel(const ThreadRun& before, const ThreadRun& now) {
  if (now.state != 'S' && now.state != 'D') return false;
  const auto between = now.at - before.at;
  return now.on_cpu >= before.on_cpu && (now.on_cpu - before.on_cpu) * 100 <= between;
}

namespace {

// What `field` of the reading's processes grew by between the readings: each process in both by
// its own growth, one born since by all it has (a pid reused meanwhile, its counter lower, by
// its own too); from the totals where a reading has no processes of its own listed.
std::uint64_t grown(const ProcessActivity& before, const ProcessActivity& after,
                    std::uint64_t ProcessCounters::*field, std::uint64_t ProcessActivity::*total) {
  if (before.each.empty() || after.each.empty()) {
    return after.*total > before.*total ? after.*total - before.*total : 0;
  }
  std::uint64_t sum = 0;
  for (const auto& now : after.each) {
    const auto then = std::find_if(before.each.begin(), before.each.end(),
                                   [&](const ProcessCounters& b) { return b.pid == now.pid; });
    const std::uint64_t from =
        then == before.each.end() || (*then).*field > now.*field ? 0 : (*then).*field;
    sum += now.*field - from;
  }
  return sum;
}

}  // namespace

double cpu_share(const ProcessActivity& before, const ProcessActivity& after, double seconds) {
  if (seconds <= 0) return 0;
  const auto ticks = grown(before, after, &ProcessCounters::cpu_ticks, &ProcessActivity::cpu_ticks);
  return static_cast<double>(ticks) / static_cast<double>(ticks_per_second()) / seconds;
}

double cpu_queued_share(const ProcessActivity& before, const ProcessActivity& after,
                        double seconds) {
  if (seconds <= 0) return 0;
  const auto queued =
      grown(before, after, &ProcessCounters::cpu_queued_ns, &ProcessActivity::cpu_queued_ns);
  return static_cast<double>(queued) / 1e9 / seconds;
}

double cpu_share(std::uint64_t before, std::uint64_t after, double seconds) {
  if (seconds <= 0 || after < before) return 0;
  return static_cast<double>(after - before) / static_cast<double>(ticks_per_second()) / seconds;
}

}  // namespace dist::agent
