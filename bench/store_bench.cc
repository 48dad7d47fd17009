// dist-store-bench: a load generator for any server speaking PyTorch's TCPStore protocol (either
// dialect), so our store, torch 1.13's legacy server and torch 2.x's libuv server are measured by
// the same client in the same run. One thread drives every connection through epoll.
//
// Modes (one request = one op; SET has no reply in either dialect, GET replies length + value):
//   roundtrip   each client: SET+GET pair, wait for the GET reply, repeat
//   pipelined   each client: 100 SET+GET pairs sent back to back, then their 100 replies
//   storm       N clients connect at once, each ADDs a counter; the one that reaches N sets a key
//               every client WAITs for: time from the first connect to the last release
//   slowloris   one client sends half a SET and stalls; the others run roundtrip
//   idle        N connections each answered once, then held: server memory per connection
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "dist/store/limits.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint32_t kValidateMagic = 0x3C85F7CE;
constexpr int kPipelineDepth = 100;
constexpr std::size_t kValueBytes = 16;

struct Dialect {
  std::uint8_t set, get, add, wait;
  bool validate;
};
constexpr Dialect kCurrent{1, 3, 4, 6, true};
constexpr Dialect kLegacy{0, 2, 3, 5, false};

void put_u64(std::string& out, std::uint64_t v) {
  out.append(reinterpret_cast<char*>(&v), 8);
}
void put_str(std::string& out, const std::string& s) {
  put_u64(out, s.size());
  out += s;
}

struct Conn {
  int fd = -1;
  int id = 0;
  std::string out;
  std::size_t out_off = 0;
  std::size_t expect = 0;  // reply bytes still to read for the current batch
  std::string in;          // storm mode: the ADD reply
  Clock::time_point sent_at;
  bool connected = false;
  bool done = false;
  int phase = 0;
};

struct Options {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string dialect = "current";
  std::string mode = "roundtrip";
  int clients = 1;
  double seconds = 3.0;
  int server_pid = 0;
  std::string label = "server";
  double timeout_s = 20.0;
};

long rss_kib(int pid, const char* field = "VmRSS:") {
  if (pid <= 0) return -1;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stol(line.substr(std::strlen(field)));
  }
  return -1;
}

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  const std::size_t k = std::min(v.size() - 1, static_cast<std::size_t>(p * (v.size() - 1)));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

class Bench {
 public:
  explicit Bench(Options o) : o_(std::move(o)), d_(o_.dialect == "legacy" ? kLegacy : kCurrent) {
    epoll_ = epoll_create1(EPOLL_CLOEXEC);
    std::memset(&addr_, 0, sizeof addr_);
    addr_.sin_family = AF_INET;
    addr_.sin_port = htons(static_cast<std::uint16_t>(o_.port));
    inet_pton(AF_INET, o_.host.c_str(), &addr_.sin_addr);
  }

  int run() {
    const long rss_before = rss_kib(o_.server_pid);
    const auto start = Clock::now();
    if (o_.mode == "slowloris") stall_one();
    conns_.resize(static_cast<std::size_t>(o_.clients));
    for (int i = 0; i < o_.clients; ++i) open(conns_[static_cast<std::size_t>(i)], i);
    const bool timed = o_.mode == "roundtrip" || o_.mode == "pipelined" || o_.mode == "slowloris";
    loop(start, timed);
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    const long rss_after = rss_kib(o_.server_pid);
    const long hwm = rss_kib(o_.server_pid, "VmHWM:");

    std::vector<double> lat = latencies_ms_;
    const double p50 = percentile(lat, 0.50), p99 = percentile(lat, 0.99);
    int done = 0;
    for (auto& c : conns_) done += c.done ? 1 : 0;
    const double measured =
        timed && measuring_ ? std::chrono::duration<double>(Clock::now() - measure_start_).count()
                            : elapsed;
    std::printf(
        "{\"label\":\"%s\",\"dialect\":\"%s\",\"mode\":\"%s\",\"clients\":%d,\"ops\":%llu,"
        "\"seconds\":%.3f,\"ops_per_s\":%.0f,\"p50_ms\":%.3f,\"p99_ms\":%.3f,"
        "\"connect_s\":%.3f,\"completed\":%d,\"errors\":%d,\"server_rss_kib\":%ld,"
        "\"server_rss_before_kib\":%ld,\"server_hwm_kib\":%ld,\"idle_bytes_per_conn\":%.0f}\n",
        o_.label.c_str(), o_.dialect.c_str(), o_.mode.c_str(), o_.clients,
        static_cast<unsigned long long>(ops_), measured, timed ? ops_ / measured : 0.0, p50, p99,
        connect_seconds_, done, errors_, rss_after, rss_before, hwm,
        o_.mode == "idle" && rss_before > 0
            ? (static_cast<double>(rss_after - rss_before) * 1024.0) / o_.clients
            : 0.0);
    for (auto& c : conns_) ::close(c.fd);
    if (stalled_fd_ >= 0) ::close(stalled_fd_);
    return errors_ == 0 ? 0 : 1;
  }

 private:
  void stall_one() {
    stalled_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(stalled_fd_, reinterpret_cast<sockaddr*>(&addr_), sizeof addr_) != 0) {
      std::perror("slowloris connect");
      return;
    }
    std::string half;
    if (d_.validate) {
      half.push_back(0);
      half.append(reinterpret_cast<const char*>(&kValidateMagic), 4);
    }
    half.push_back(static_cast<char>(d_.set));
    put_u64(half, 64);      // a 64-byte key is promised...
    half += "only-a-part";  // ...and never finished
    ::send(stalled_fd_, half.data(), half.size(), MSG_NOSIGNAL);
  }

  void open(Conn& c, int id) {
    c.id = id;
    c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) {
      std::perror("socket");
      ++errors_;
      c.done = true;
      return;
    }
    int one = 1;
    ::setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    const int rc = ::connect(c.fd, reinterpret_cast<sockaddr*>(&addr_), sizeof addr_);
    if (rc != 0 && errno != EINPROGRESS) {
      std::perror("connect");
      ++errors_;
      c.done = true;
      return;
    }
    epoll_event ev{};
    ev.events = EPOLLOUT | EPOLLIN;
    ev.data.u32 = static_cast<std::uint32_t>(id);
    epoll_ctl(epoll_, EPOLL_CTL_ADD, c.fd, &ev);
  }

  // The next batch of requests for a connection, and how many reply bytes it expects.
  void next_batch(Conn& c) {
    c.out.clear();
    c.out_off = 0;
    if (c.phase == 0 && d_.validate) {
      c.out.push_back(0);
      c.out.append(reinterpret_cast<const char*>(&kValidateMagic), 4);
    }
    const std::string key = "/bench/" + std::to_string(c.id);
    const std::string value(kValueBytes, 'v');
    if (o_.mode == "storm" || o_.mode == "idle") {
      if (c.phase == 0) {
        c.out.push_back(static_cast<char>(d_.add));
        put_str(c.out, run_key("count"));
        put_u64(c.out, 1);
        c.expect = 8;
      } else {
        if (c.phase == 2) {  // this client completed the count
          c.out.push_back(static_cast<char>(d_.set));
          put_str(c.out, run_key("done"));
          put_str(c.out, "1");
        }
        c.out.push_back(static_cast<char>(d_.wait));
        put_u64(c.out, 1);
        put_str(c.out, run_key("done"));
        c.expect = 1;
      }
    } else {
      const int pairs = o_.mode == "pipelined" ? kPipelineDepth : 1;
      for (int i = 0; i < pairs; ++i) {
        c.out.push_back(static_cast<char>(d_.set));
        put_str(c.out, key);
        put_str(c.out, value);
        c.out.push_back(static_cast<char>(d_.get));
        put_str(c.out, key);
      }
      c.expect = static_cast<std::size_t>(pairs) * (8 + kValueBytes);
    }
    c.sent_at = Clock::now();
  }

  // Keys of one storm or idle run: unique per run, so runs against one server do not interfere.
  std::string run_key(const char* name) const {
    return "/" + o_.mode + "/" + std::to_string(::getpid()) + "/" + name;
  }

  void on_batch_done(Conn& c) {
    const auto now = Clock::now();
    if (o_.mode == "storm") {
      if (c.phase == 0) {
        std::int64_t count = 0;
        std::memcpy(&count, c.in.data(), 8);
        c.phase = count == o_.clients ? 2 : 1;
        next_batch(c);
        return;
      }
      c.done = true;
      return;
    }
    if (o_.mode == "idle") {
      c.done = true;  // answered once; held open, idle
      return;
    }
    const int pairs = o_.mode == "pipelined" ? kPipelineDepth : 1;
    if (measuring_) {
      ops_ += static_cast<std::uint64_t>(2 * pairs);
      latencies_ms_.push_back(std::chrono::duration<double, std::milli>(now - c.sent_at).count());
    }
    c.phase = 1;
    if (!stop_)
      next_batch(c);
    else
      c.done = true;
  }

  static Clock::duration seconds(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

  // Timed modes measure for --seconds from the moment every client is connected; connecting (and
  // the untimed modes) may take up to --timeout.
  void loop(Clock::time_point start, bool timed) {
    Clock::time_point end = start + seconds(o_.timeout_s);
    std::vector<epoll_event> events(4096);
    char buffer[65536];
    int connected = 0;
    while (true) {
      const auto now = Clock::now();
      if (now >= end) {
        if (!timed || !measuring_) {
          ++errors_;  // did not connect, or storm/idle did not finish, in time
          std::fprintf(stderr, "%s: timed out after %.1f s\n", o_.mode.c_str(), o_.timeout_s);
        }
        stop_ = true;
        break;
      }
      bool all_done = true;
      for (auto& c : conns_) {
        if (!c.done) {
          all_done = false;
          break;
        }
      }
      if (all_done && (o_.mode == "storm" || o_.mode == "idle")) break;
      const int n = epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), 50);
      for (int i = 0; i < n; ++i) {
        Conn& c = conns_[events[i].data.u32];
        if (c.done && o_.mode != "idle") continue;
        if (events[i].events & (EPOLLERR | EPOLLHUP)) {
          if (!c.done) ++errors_;
          c.done = true;
          epoll_ctl(epoll_, EPOLL_CTL_DEL, c.fd, nullptr);
          continue;
        }
        if (!c.connected && (events[i].events & EPOLLOUT)) {
          c.connected = true;
          if (++connected == o_.clients) {
            connect_seconds_ = std::chrono::duration<double>(Clock::now() - start).count();
            measuring_ = true;
            if (timed) {
              measure_start_ = Clock::now();
              end = measure_start_ + seconds(o_.seconds);
            }
          }
          next_batch(c);
        }
        if ((events[i].events & EPOLLOUT) && c.out_off < c.out.size()) {
          const ssize_t w =
              ::send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
          if (w > 0) c.out_off += static_cast<std::size_t>(w);
        }
        if (events[i].events & EPOLLIN) {
          while (true) {
            const ssize_t r = ::recv(c.fd, buffer, sizeof buffer, 0);
            if (r <= 0) {
              if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
                if (!c.done) ++errors_;
                c.done = true;
                epoll_ctl(epoll_, EPOLL_CTL_DEL, c.fd, nullptr);
              }
              break;
            }
            std::size_t got = static_cast<std::size_t>(r);
            if (o_.mode == "storm" && c.phase == 0) c.in.append(buffer, std::min(got, c.expect));
            while (got > 0 && !c.done) {
              const std::size_t take = std::min(got, c.expect);
              c.expect -= take;
              got -= take;
              if (c.expect == 0) {
                on_batch_done(c);
                if (c.out_off < c.out.size()) {
                  const ssize_t w = ::send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off,
                                           MSG_NOSIGNAL);
                  if (w > 0) c.out_off += static_cast<std::size_t>(w);
                }
                if (got == 0 || c.expect == 0) break;
              }
            }
            if (c.done) break;
          }
        }
        // Only ask for writability while there is something to write.
        epoll_event ev{};
        const bool want_write = c.out_off < c.out.size() || !c.connected;
        ev.events = EPOLLIN | (want_write ? static_cast<std::uint32_t>(EPOLLOUT) : 0u);
        ev.data.u32 = static_cast<std::uint32_t>(c.id);
        if (!c.done || o_.mode == "idle") epoll_ctl(epoll_, EPOLL_CTL_MOD, c.fd, &ev);
      }
    }
  }

  Options o_;
  Dialect d_;
  int epoll_ = -1;
  sockaddr_in addr_{};
  std::vector<Conn> conns_;
  std::vector<double> latencies_ms_;
  std::uint64_t ops_ = 0;
  double connect_seconds_ = 0;
  bool measuring_ = false;
  Clock::time_point measure_start_;
  bool stop_ = false;
  int errors_ = 0;
  int stalled_fd_ = -1;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"dist-store-bench: load generator for TCPStore-protocol servers",
               "dist-store-bench"};
  app.add_option("--host", o.host)->capture_default_str();
  app.add_option("--port", o.port)->required();
  app.add_option("--dialect", o.dialect)
      ->check(CLI::IsMember({"current", "legacy"}))
      ->capture_default_str();
  app.add_option("--mode", o.mode)
      ->check(CLI::IsMember({"roundtrip", "pipelined", "storm", "slowloris", "idle"}))
      ->capture_default_str();
  app.add_option("--clients", o.clients)->check(CLI::Range(1, 60000))->capture_default_str();
  app.add_option("--seconds", o.seconds, "measuring time of the timed modes")
      ->capture_default_str();
  app.add_option("--timeout", o.timeout_s, "limit for storm and idle")->capture_default_str();
  app.add_option("--server-pid", o.server_pid, "read the server's RSS from /proc");
  app.add_option("--label", o.label)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  dist::store::raise_open_file_limit();
  return Bench(o).run();
}
