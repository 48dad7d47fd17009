// dist-test-worker: a worker for the agent's tests. Runs its arguments as actions, in order:
//   env FILE                 write this process's environment (KEY=VALUE lines) to FILE
//   status FILE              copy /proc/self/status (Cpus_allowed_list, ...) to FILE
//   fds FILE                 write this process's open descriptors to FILE, one per line:
//                            "<fd> <what /proc/self/fd/<fd> links to>"
//   session FILE             write "<pid> <process group> <session>" to FILE
//   pidfile FILE             write this process's pid to FILE
//   exit CODE                exit with CODE
//   exit-if-rank RANK CODE   exit with CODE when RANK matches $RANK
//   exit-if-world N CODE     exit with CODE when $WORLD_SIZE is N
//   exit-if-file PATH CODE   exit with CODE when PATH exists
//   append FILE              append "RANK WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE RESTART_COUNT
//                            wall-clock-ns" to FILE: one line per round this worker ran in
//   fail-on-attempt N CODE   exit with CODE when $TORCHELASTIC_RESTART_COUNT == N
//   kill-self SIGNAL         raise SIGNAL (a number)
//   error-file MESSAGE       write $TORCHELASTIC_ERROR_FILE the way torch's @record does
//   error-file-if-rank RANK MESSAGE   the same, when RANK matches $RANK
//   wait-gone PIDFILE        wait until PIDFILE names a process that has exited (a zombie or
//                            gone; at most a minute, else exit 65)
//   trap SIGNAL FILE MS      on SIGNAL: append the signal number to FILE, wait MS, exit 0
//   note SIGNAL FILE         on SIGNAL: append the signal number to FILE and carry on
//   ignore SIGNAL            ignore SIGNAL
//   spawn-child-if-rank RANK PIDFILE   when RANK matches $RANK: start a child (in this process's
//                            group, as a DataLoader's workers are) that sleeps until signalled,
//                            and write its pid to PIDFILE
//   fail-on SIGNAL MESSAGE   on SIGNAL: write the error file with MESSAGE and exit 1 (a SIGTERM
//                            handler that raises)
//   lines N                  print N lines to stdout and N to stderr, each written in two parts
//   spam-lines N             print N lines of kSpamLineBytes bytes to stdout ("line K xxx...")
//   spam-forever             print such lines to stdout until killed
//   long-line BYTES          print one line of BYTES bytes ('a'..'z' repeated) and its newline
//   write TEXT               write TEXT to stdout as it is, after \r, \n and \\ escapes
//   echo-line                read a line from stdin and write it to stdout (exit 66 at EOF)
//   wait-file FILE           wait until FILE exists (at most a minute, else exit 65)
//   check-sigpipe            exit 3 unless SIGPIPE has its default disposition
//   connect-master           exit 67 unless a TCP connection to MASTER_ADDR:MASTER_PORT succeeds
//   stamp DIR                write the wall clock (ns) to DIR/start_<attempt>_<local rank>
//   crash-if DIR RANK ATTEMPT   on that rank and attempt: write the clock to DIR/crash, exit 1
//   sleep-if-attempt N MS    sleep MS on attempt N only
//   progress MS              from now on, a thread counts a step and a heartbeat in the worker's
//                            progress slot (DIST_HEARTBEAT_FD, as a Python worker does through
//                            ctypes) every MS * (RANK + 1) ms: each rank its own pace; exit 68
//                            when the agent gave no slot
//   sleep MS                 sleep (signals interrupt it and are handled)
//   forever                  sleep until a signal handler ends the process
#include <netdb.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>
#include <thread>

#include "dist/contract/worker_contract.h"

extern char** environ;

void write_error_file(const std::string& message);

namespace {

volatile sig_atomic_t g_received = 0;
std::string g_signal_files[65];
int g_exit_after_ms[65];
bool g_exits[65];
std::string g_fail_messages[65];

void on_signal(int s) {
  g_received = s;
}

// Writes a file that tests poll for by its existence: under another name first, then renamed,
// so that a test never reads it half written (sanitized workers write slowly enough to show it).
void write_whole_file(const std::string& path, const std::string& content) {
  const std::string temp = path + ".partial";
  std::ofstream(temp) << content;
  std::rename(temp.c_str(), path.c_str());
}

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

void handle_pending() {
  const int s = g_received;
  if (s == 0) return;
  g_received = 0;
  if (!g_fail_messages[s].empty()) {
    write_error_file(g_fail_messages[s]);
    std::exit(1);
  }
  std::ofstream(g_signal_files[s], std::ios::app) << s << "\n";
  if (g_exits[s]) {
    std::this_thread::sleep_for(std::chrono::milliseconds(g_exit_after_ms[s]));
    std::exit(0);
  }
}

void sleep_ms(long ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    handle_pending();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  handle_pending();
}

void install(int s, const std::string& file, bool exits, int after_ms) {
  g_signal_files[s] = file;
  g_exits[s] = exits;
  g_exit_after_ms[s] = after_ms;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(s, &sa, nullptr);
}

long long wall_clock_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<long long>(ts.tv_sec) * 1'000'000'000LL + ts.tv_nsec;
}

constexpr std::size_t kSpamLineBytes = 100;  // agent/tests/output_test.cc counts on it
constexpr auto kWaitFileTimeout = std::chrono::seconds(60);

std::string spam_line(long k) {
  std::string line = "line " + std::to_string(k) + " ";
  line.resize(kSpamLineBytes - 1, 'x');
  return line + "\n";
}

void write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n <= 0) std::exit(66);  // the agent closed the pipe: nothing more to do
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

std::string unescape(const std::string& text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\' || i + 1 == text.size()) {
      out.push_back(text[i]);
      continue;
    }
    const char c = text[++i];
    out.push_back(c == 'r' ? '\r' : c == 'n' ? '\n' : c);
  }
  return out;
}

void write_in_two_parts(int fd, const std::string& line) {
  const std::size_t half = line.size() / 2;
  [[maybe_unused]] ssize_t a = ::write(fd, line.data(), half);
  std::this_thread::sleep_for(std::chrono::microseconds(200));
  [[maybe_unused]] ssize_t b = ::write(fd, line.data() + half, line.size() - half);
}

// Whether something listens at MASTER_ADDR:MASTER_PORT (the store the agent gave the workers).
bool connects_to_master() {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string host = env_or("MASTER_ADDR", ""), port = env_or("MASTER_PORT", "");
  if (port.empty() || port == "0" || ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found)) {
    return false;
  }
  bool connected = false;
  for (addrinfo* a = found; a && !connected; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    connected = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return connected;
}

long long monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1'000'000'000LL + ts.tv_nsec;
}

// Steps and beats in the progress slot the agent gave this worker, from a thread of their own.
void start_progress(long every_ms) {
  namespace slot = dist::worker_contract::heartbeat_slot;
  const char* fd = std::getenv(slot::kFdVariable);
  void* page =
      fd ? ::mmap(nullptr, slot::kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, std::atoi(fd), 0)
         : MAP_FAILED;
  auto* s = static_cast<slot::Slot*>(page == MAP_FAILED ? nullptr : page);
  if (!s || s->magic != slot::kMagic) {
    std::fprintf(stderr, "dist-test-worker: no progress slot (%s)\n", fd ? fd : "unset");
    std::exit(68);
  }
  const long pace = every_ms * (std::atol(env_or("RANK", "0").c_str()) + 1);
  std::thread([s, pace] {
    while (true) {
      std::this_thread::sleep_for(std::chrono::milliseconds(pace));
      const auto now = static_cast<std::uint64_t>(monotonic_ns());
      s->steps.fetch_add(1, std::memory_order_relaxed);
      s->last_step_ns.store(now, std::memory_order_release);
      s->beats.fetch_add(1, std::memory_order_relaxed);
      s->last_beat_ns.store(now, std::memory_order_release);
    }
  }).detach();
}

}  // namespace

// $TORCHELASTIC_ERROR_FILE the way torch's @record writes it (a timestamp of whole seconds).
void write_error_file(const std::string& message) {
  std::ofstream(env_or("TORCHELASTIC_ERROR_FILE", "/dev/null"))
      << R"({"message": {"message": ")" << message
      << R"(", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"train.py\", line 3\n)"
      << message << R"(", "timestamp": ")" << std::time(nullptr) << R"("}}})";
}

// Whether the process PIDFILE names has exited (waiting for the file, then for the exit).
bool wait_gone(const std::string& pidfile) {
  for (int i = 0; i < 6000; ++i) {
    std::ifstream in(pidfile);
    pid_t pid = 0;
    if (in >> pid && pid > 0) {
      std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
      std::string line;
      if (!std::getline(stat, line)) return true;
      const auto close = line.rfind(')');
      if (close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z') {
        return true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "dist-test-worker: %s needs an argument\n", a.c_str());
        std::exit(64);
      }
      return argv[++i];
    };
    if (a == "env") {
      std::string all;
      for (char** e = environ; *e; ++e) all.append(*e).append("\n");
      write_whole_file(next(), all);
    } else if (a == "status") {
      std::ifstream in("/proc/self/status");
      std::ofstream(next()) << in.rdbuf();
    } else if (a == "fds") {
      std::string list;
      for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
        std::error_code ec;
        const auto target = std::filesystem::read_symlink(entry.path(), ec);
        list += entry.path().filename().string() + " " + target.string() + "\n";
      }
      std::ofstream(next()) << list;
    } else if (a == "session") {
      std::ofstream(next()) << ::getpid() << " " << ::getpgid(0) << " " << ::getsid(0) << "\n";
    } else if (a == "pidfile") {
      std::ofstream(next()) << ::getpid() << "\n";
    } else if (a == "exit") {
      return std::stoi(next());
    } else if (a == "exit-if-rank") {
      const std::string rank = next();
      const int code = std::stoi(next());
      if (env_or("RANK", "") == rank) return code;
    } else if (a == "exit-if-world") {
      const std::string world = next();
      const int code = std::stoi(next());
      if (env_or("WORLD_SIZE", "") == world) return code;
    } else if (a == "exit-if-file") {
      const std::string path = next();
      const int code = std::stoi(next());
      if (std::ifstream(path)) return code;
    } else if (a == "append") {
      std::ofstream(next(), std::ios::app)
          << env_or("RANK", "?") << " " << env_or("WORLD_SIZE", "?") << " "
          << env_or("GROUP_RANK", "?") << " " << env_or("GROUP_WORLD_SIZE", "?") << " "
          << env_or("TORCHELASTIC_RESTART_COUNT", "?") << " " << wall_clock_ns() << "\n";
    } else if (a == "fail-on-attempt") {
      const std::string attempt = next();
      const int code = std::stoi(next());
      if (env_or("TORCHELASTIC_RESTART_COUNT", "") == attempt) return code;
    } else if (a == "kill-self") {
      const int s = std::stoi(next());
      signal(s, SIG_DFL);
      raise(s);
    } else if (a == "error-file-if-rank") {
      const std::string rank = next();
      const std::string message = next();
      if (env_or("RANK", "") == rank) write_error_file(message);
    } else if (a == "wait-gone") {
      if (!wait_gone(next())) return 65;
    } else if (a == "error-file") {
      const std::string message = next();
      write_error_file(message);
    } else if (a == "trap") {
      const int s = std::stoi(next());
      const std::string file = next();
      install(s, file, true, std::stoi(next()));
    } else if (a == "note") {
      const int s = std::stoi(next());
      install(s, next(), false, 0);
    } else if (a == "ignore") {
      signal(std::stoi(next()), SIG_IGN);
    } else if (a == "spawn-child-if-rank") {
      const std::string rank = next();
      const std::string pidfile = next();
      if (env_or("RANK", "") != rank) continue;
      const pid_t child = ::fork();
      if (child == 0) {
        for (;;) ::pause();
      }
      write_whole_file(pidfile, std::to_string(child) + "\n");
    } else if (a == "fail-on") {
      const int s = std::stoi(next());
      g_fail_messages[s] = next();
      install(s, "", false, 0);
    } else if (a == "lines") {
      const int n = std::stoi(next());
      const std::string rank = env_or("RANK", "?");
      for (int k = 0; k < n; ++k) {
        write_in_two_parts(1, "out line " + std::to_string(k) + " of rank " + rank + " end\n");
        write_in_two_parts(2, "err line " + std::to_string(k) + " of rank " + rank + " end\n");
      }
    } else if (a == "spam-lines") {
      const long n = std::stol(next());
      for (long k = 0; k < n; ++k) write_all(1, spam_line(k));
    } else if (a == "spam-forever") {
      for (long k = 0;; ++k) write_all(1, spam_line(k));
    } else if (a == "long-line") {
      const std::size_t bytes = std::stoul(next());
      constexpr std::size_t kChunkBytes = 64 * 1024;  // many writes: the agent reads it in parts
      std::string chunk;
      for (std::size_t done = 0; done < bytes; done += chunk.size()) {
        chunk.resize(std::min(kChunkBytes, bytes - done));
        for (std::size_t k = 0; k < chunk.size(); ++k) {
          chunk[k] = static_cast<char>('a' + (done + k) % 26);
        }
        write_all(1, chunk);
      }
      write_all(1, "\n");
    } else if (a == "write") {
      write_all(1, unescape(next()));
    } else if (a == "echo-line") {
      std::string line;
      if (!std::getline(std::cin, line)) return 66;
      write_all(1, line + "\n");
    } else if (a == "wait-file") {
      const std::string path = next();
      const auto end = std::chrono::steady_clock::now() + kWaitFileTimeout;
      while (!std::ifstream(path)) {
        if (std::chrono::steady_clock::now() > end) return 65;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    } else if (a == "check-sigpipe") {
      struct sigaction current {};
      sigaction(SIGPIPE, nullptr, &current);
      if (current.sa_handler != SIG_DFL) return 3;
    } else if (a == "connect-master") {
      if (!connects_to_master()) return 67;
    } else if (a == "stamp") {
      const std::string dir = next();
      std::ofstream(dir + "/start_" + env_or("TORCHELASTIC_RESTART_COUNT", "0") + "_" +
                    env_or("LOCAL_RANK", "0"))
          << wall_clock_ns() << "\n";
    } else if (a == "crash-if") {
      const std::string dir = next();
      const std::string rank = next();
      const std::string attempt = next();
      if (env_or("RANK", "") == rank && env_or("TORCHELASTIC_RESTART_COUNT", "") == attempt) {
        std::ofstream(dir + "/crash") << wall_clock_ns() << "\n";
        return 1;
      }
    } else if (a == "sleep-if-attempt") {
      const std::string attempt = next();
      const long ms = std::stol(next());
      if (env_or("TORCHELASTIC_RESTART_COUNT", "") == attempt) sleep_ms(ms);
    } else if (a == "progress") {
      start_progress(std::stol(next()));
    } else if (a == "sleep") {
      sleep_ms(std::stol(next()));
    } else if (a == "forever") {
      while (true) sleep_ms(1000);
    } else {
      std::fprintf(stderr, "dist-test-worker: unknown action '%s'\n", a.c_str());
      return 64;
    }
  }
  return 0;
}
