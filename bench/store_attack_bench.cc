// dist-store-attack-bench: a legitimate client's round trips and the server's memory while
// dist-rendezvous is under the attacks of issue 12, against the same server unattacked (the
// anchor), interleaved A B A B.
//
// Scenarios (each run starts a fresh dist-rendezvous with --max-total-bytes and --max-connections):
//   memory          4 connections WAIT on 131,072 missing 200-byte keys (27 MiB requests), 8
//   pipeline
//                   GETs of a 4 MiB value and never read, 50 send half a SET of a promised 8 MiB
//                   value; each attacker reconnects and starts again when closed
//   unauthenticated with a token and --unauthenticated deny: 50 connections that never
//                   authenticate, and a flood of connections that send a request unauthenticated
//   none            the anchor: no attacker
// The legitimate client does ADD round trips the whole time; another connects anew every 100 ms
// (a client is locked out when it cannot connect and be served within 5 s).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "dist/store/client.h"
#include "dist/store/limits.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
using dist::store::ClientOptions;
using dist::store::StoreClient;
using dist::store::StoreError;

constexpr std::uint32_t kValidateMagic = 0x3C85F7CE;
constexpr std::uint8_t kSet = 1, kGet = 3, kAdd = 4, kWait = 6;
constexpr auto kSendTimeout = 200ms;    // attackers' sends, so they notice the end of a run
constexpr auto kNewcomerEvery = 100ms;  // a fresh legitimate connection this often
constexpr auto kLockedOut = 5s;         // a newcomer not served within this is locked out
constexpr std::size_t kWaitKeys = 131'072;
constexpr std::size_t kWaitKeyBytes = 200;
constexpr std::size_t kBigValueBytes = 4 * 1024 * 1024;
constexpr std::uint64_t kSlowLorisPromisedBytes = 8 * 1024 * 1024;
constexpr int kWaiters = 4, kGreedy = 8, kSlowLoris = 50, kSilent = 50;

void put_u64(std::string& out, std::uint64_t v) {
  out.append(reinterpret_cast<const char*>(&v), 8);
}
void put_str(std::string& out, const std::string& s) {
  put_u64(out, s.size());
  out += s;
}
std::string validate() {
  std::string out(1, '\0');
  out.append(reinterpret_cast<const char*>(&kValidateMagic), 4);
  return out;
}

struct Options {
  std::string rendezvous;
  std::uint64_t cap_mib = 64;
  std::uint64_t max_connections = 200;
  double seconds = 8;
  int runs = 3;
  std::string scenario = "memory";
  std::vector<std::string> attacks = {"wait", "greedy", "slowloris"};  // of the memory scenario
};

// dist-rendezvous on a free port, stopped and reaped at the end of a run.
struct Daemon {
  pid_t pid = -1;
  std::uint16_t port = 0;
  Daemon(const Options& o, const std::string& token_file) {
    std::vector<std::string> args = {o.rendezvous,
                                     "--host",
                                     "127.0.0.1",
                                     "--port",
                                     "0",
                                     "--log-level",
                                     "off",
                                     "--max-total-bytes",
                                     std::to_string(o.cap_mib * 1024 * 1024),
                                     "--max-connections",
                                     std::to_string(o.max_connections)};
    if (!token_file.empty()) {
      args.insert(args.end(), {"--token-file", token_file, "--unauthenticated", "deny"});
    }
    int out[2];
    if (::pipe(out) != 0) throw std::runtime_error("pipe failed");
    pid = ::fork();
    if (pid == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::close(out[0]);
      ::close(out[1]);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(out[1]);
    std::string line;
    char c;
    while (::read(out[0], &c, 1) == 1 && c != '\n') line += c;
    ::close(out[0]);
    std::smatch m;
    if (!std::regex_search(line, m, std::regex(R"(listening on [0-9.]+:(\d+))"))) {
      stop();
      throw std::runtime_error("dist-rendezvous did not start: " + line);
    }
    port = static_cast<std::uint16_t>(std::stoi(m[1]));
  }
  std::uint64_t rss_kib(const char* field) const {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind(field, 0) == 0) return std::stoull(line.substr(std::strlen(field) + 1));
    }
    return 0;
  }
  void stop() {
    if (pid <= 0) return;
    ::kill(pid, SIGTERM);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
  ~Daemon() { stop(); }
};

int connect_raw(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const timeval tv{0, std::chrono::duration_cast<std::chrono::microseconds>(kSendTimeout).count()};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// True while the server keeps the connection: a read that times out, not one that ends.
bool still_open(int fd) {
  char buffer[65536];
  const ssize_t n = ::recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);
  return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
}

// One attacker: connects, sends `bytes` (a whole attack, or its first part), then, if `repeat`,
// sends them again and again, otherwise holds the connection; starts over when closed.
void attacker(std::uint16_t port, const std::string& bytes, bool repeat,
              const std::atomic<bool>& stop, std::atomic<std::uint64_t>& connects) {
  while (!stop) {
    const int fd = connect_raw(port);
    if (fd < 0) {
      std::this_thread::sleep_for(10ms);
      continue;
    }
    ++connects;
    std::size_t sent = 0;
    bool open = true;
    while (!stop && open) {
      if (sent < bytes.size()) {
        const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
        if (n > 0) sent += static_cast<std::size_t>(n);
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) open = false;
      } else if (repeat) {
        sent = validate().size();  // the next batch, on the same connection
      } else {
        std::this_thread::sleep_for(50ms);
        open = still_open(fd);
      }
    }
    ::close(fd);
  }
}

// Connections that send one unauthenticated request and are closed for it, as fast as they can.
void flood(std::uint16_t port, const std::atomic<bool>& stop,
           std::atomic<std::uint64_t>& connects) {
  std::string request = validate() + static_cast<char>(kAdd);
  put_str(request, "/init/");
  put_u64(request, 1);
  while (!stop) {
    const int fd = connect_raw(port);
    if (fd < 0) continue;
    ++connects;
    ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    char c;
    ::recv(fd, &c, 1, 0);  // until the server closes it (or the receive timeout)
    ::close(fd);
  }
}

struct RunResult {
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
  std::uint64_t round_trips = 0, rss_peak_kib = 0, rss_end_kib = 0, attack_connects = 0;
  int newcomers = 0, locked_out = 0;
};

RunResult run(const Options& o, const std::string& scenario, const std::string& token_file,
              const std::string& secret) {
  Daemon daemon(o, scenario == "unauthenticated" ? token_file : "");
  ClientOptions client;
  client.port = daemon.port;
  client.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(kLockedOut);
  client.connect_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(kLockedOut);
  if (scenario == "unauthenticated") client.secret = secret;
  auto legit = StoreClient::connect(client);
  legit.set("/big", std::string(kBigValueBytes, 'b'));

  std::string big_wait = validate() + static_cast<char>(kWait);
  put_u64(big_wait, kWaitKeys);
  for (std::size_t i = 0; i < kWaitKeys; ++i) {
    std::string key = std::to_string(i);
    put_str(big_wait, key + std::string(kWaitKeyBytes - key.size(), 'm'));
  }
  std::string greedy = validate();
  for (int i = 0; i < 64; ++i) {
    greedy += static_cast<char>(kGet);
    put_str(greedy, "/big");
  }
  std::string slow = validate() + static_cast<char>(kSet);
  put_str(slow, "/slow");
  put_u64(slow, kSlowLorisPromisedBytes);
  slow += std::string(1024 * 1024, 's');
  const std::string silent = validate();

  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> connects{0};
  std::vector<std::thread> threads;
  auto chosen = [&](const char* attack) {
    return std::find(o.attacks.begin(), o.attacks.end(), attack) != o.attacks.end();
  };
  if (scenario == "memory") {
    for (int i = 0; chosen("wait") && i < kWaiters; ++i)
      threads.emplace_back(attacker, daemon.port, std::cref(big_wait), false, std::cref(stop),
                           std::ref(connects));
    for (int i = 0; chosen("greedy") && i < kGreedy; ++i)
      threads.emplace_back(attacker, daemon.port, std::cref(greedy), true, std::cref(stop),
                           std::ref(connects));
    for (int i = 0; chosen("slowloris") && i < kSlowLoris; ++i)
      threads.emplace_back(attacker, daemon.port, std::cref(slow), false, std::cref(stop),
                           std::ref(connects));
  } else if (scenario == "unauthenticated") {
    for (int i = 0; i < kSilent; ++i)
      threads.emplace_back(attacker, daemon.port, std::cref(silent), false, std::cref(stop),
                           std::ref(connects));
    for (int i = 0; i < 2; ++i)
      threads.emplace_back(flood, daemon.port, std::cref(stop), std::ref(connects));
  }

  RunResult r;
  std::atomic<int> newcomers{0}, locked_out{0};
  std::thread newcomer([&] {
    while (!stop) {
      ++newcomers;
      try {
        StoreClient::connect(client).add("/newcomers", 1);
      } catch (const StoreError&) {
        ++locked_out;
      }
      std::this_thread::sleep_for(kNewcomerEvery);
    }
  });
  std::vector<double> latencies_ms;
  const auto end = Clock::now() + std::chrono::duration<double>(o.seconds);
  auto next_sample = Clock::now();
  while (Clock::now() < end) {
    const auto start = Clock::now();
    legit.add("/n", 1);
    latencies_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    if (Clock::now() >= next_sample) {
      r.rss_peak_kib = std::max(r.rss_peak_kib, daemon.rss_kib("VmRSS:"));
      next_sample += 50ms;
    }
  }
  r.rss_peak_kib = std::max(r.rss_peak_kib, daemon.rss_kib("VmHWM:"));
  r.rss_end_kib = daemon.rss_kib("VmRSS:");
  stop = true;
  for (auto& t : threads) t.join();
  newcomer.join();
  std::sort(latencies_ms.begin(), latencies_ms.end());
  auto at = [&](double q) {
    return latencies_ms[std::min(
        latencies_ms.size() - 1,
        static_cast<std::size_t>(q * static_cast<double>(latencies_ms.size())))];
  };
  r.round_trips = latencies_ms.size();
  r.p50_ms = at(0.50);
  r.p99_ms = at(0.99);
  r.max_ms = latencies_ms.back();
  r.attack_connects = connects;
  r.newcomers = newcomers;
  r.locked_out = locked_out;
  return r;
}

template <typename T, typename F>
double median(const std::vector<T>& v, F f) {
  std::vector<double> x;
  for (const auto& e : v) x.push_back(static_cast<double>(f(e)));
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"dist-store-attack-bench: round trips and server memory under attack"};
  app.add_option("--rendezvous", o.rendezvous, "The dist-rendezvous binary")->required();
  app.add_option("--scenario", o.scenario, "memory or unauthenticated")
      ->check(CLI::IsMember({"memory", "unauthenticated"}))
      ->capture_default_str();
  app.add_option("--attacks", o.attacks, "Attacks of the memory scenario: wait greedy slowloris")
      ->check(CLI::IsMember({"wait", "greedy", "slowloris"}))
      ->capture_default_str();
  app.add_option("--cap-mib", o.cap_mib, "--max-total-bytes of the server, MiB")
      ->capture_default_str();
  app.add_option("--max-connections", o.max_connections, "--max-connections of the server")
      ->capture_default_str();
  app.add_option("--seconds", o.seconds, "Length of one run")->capture_default_str();
  app.add_option("--runs", o.runs, "Runs of each (anchor, attacked), interleaved")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  dist::store::raise_open_file_limit();
  ::signal(SIGPIPE, SIG_IGN);

  const std::string token_file = "/tmp/dist-store-attack-bench-token-" + std::to_string(::getpid());
  const std::string secret = "bench-secret";
  std::ofstream(token_file) << secret << "\n";
  ::chmod(token_file.c_str(), 0600);

  std::vector<RunResult> anchor, attacked;
  for (int i = 0; i < o.runs; ++i) {
    anchor.push_back(run(o, "none", token_file, secret));
    attacked.push_back(run(o, o.scenario, token_file, secret));
  }
  ::unlink(token_file.c_str());

  std::printf(
      "| scenario | runs | round trips | p50 ms | p99 ms | max ms | server peak RSS MiB | "
      "RSS at end MiB | attack connections | newcomers locked out |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& [name, results] :
       {std::pair{std::string("none (anchor)"), &anchor}, std::pair{o.scenario, &attacked}}) {
    const auto& v = *results;
    int locked = 0, tried = 0;
    for (const auto& r : v) {
      locked += r.locked_out;
      tried += r.newcomers;
    }
    std::printf("| %s | %d | %.0f | %.3f | %.3f | %.1f | %.1f | %.1f | %.0f | %d of %d |\n",
                name.c_str(), o.runs, median(v, [](auto& r) { return r.round_trips; }),
                median(v, [](auto& r) { return r.p50_ms; }),
                median(v, [](auto& r) { return r.p99_ms; }),
                median(v, [](auto& r) { return r.max_ms; }),
                median(v, [](auto& r) { return r.rss_peak_kib; }) / 1024.0,
                median(v, [](auto& r) { return r.rss_end_kib; }) / 1024.0,
                median(v, [](auto& r) { return r.attack_connects; }), locked, tried);
  }
  std::printf("cap (--max-total-bytes) %llu MiB, --max-connections %llu, %.0f s per run; medians\n",
              static_cast<unsigned long long>(o.cap_mib),
              static_cast<unsigned long long>(o.max_connections), o.seconds);
  return 0;
}
