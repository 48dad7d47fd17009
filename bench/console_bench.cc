// console-bench: what a console nobody reads costs the agent.
//
//   build/bin/console-bench [--launcher build/bin/dist-launch] [--seconds 30] [--runs 3]
//                           [--interval-ms 5] [--rate-mb-per-s 0]
//
// Each run starts dist-launch with one worker (this program again, as `--as-worker`) that prints
// 100-byte lines at --rate-mb-per-s (0: as fast as it can), the agent's stdout a pipe. For
// --seconds, a second store client (as another node or a worker would)
// times a SET and a GET round trip every --interval-ms against the agent's store; then the agent
// gets SIGTERM, timed until its exit status is collected.
//   blocked: nobody reads the pipe (`dist-launch ... | sleep 30`): the console is blocked for the
//            whole run. Targets: round trip p99 <= 5 ms, SIGTERM to exit <= 1 s.
//   drained: the anchor: this program reads the pipe as fast as it comes.
// Runs alternate (drained, blocked, drained, blocked, ...); the medians over the runs are printed.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "dist/store/client.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kStartTimeout = 30s;      // until the worker has written the store's port
constexpr auto kExitTimeout = 30s;       // after SIGTERM, before the agent is killed
constexpr auto kStoreCallTimeout = 10s;  // a call that takes longer ends the run's sampling
constexpr std::size_t kLineBytes = 100;
constexpr auto kWorkerBurstInterval = 10ms;  // a rate-limited worker writes a burst this often

struct Result {
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
  double sigterm_to_exit_ms = 0;
  std::size_t samples = 0;
  int exit_code = 0;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

double median(std::vector<double> v) {
  return percentile(std::move(v), 0.5);
}

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// The worker: says the store's port (MASTER_PORT) in port_file, then prints until killed.
int run_worker(const fs::path& port_file, double rate_mb_per_s) {
  const fs::path tmp = port_file.string() + ".tmp";
  std::ofstream(tmp) << std::getenv("MASTER_PORT") << "\n";
  fs::rename(tmp, port_file);
  std::string line(kLineBytes - 1, 'x');
  line += '\n';
  const double lines_per_burst = rate_mb_per_s * 1e6 / kLineBytes *
                                 std::chrono::duration<double>(kWorkerBurstInterval).count();
  const auto burst = std::max<std::size_t>(1, static_cast<std::size_t>(lines_per_burst));
  for (auto next = Clock::now();; next += kWorkerBurstInterval) {
    for (std::size_t k = 0; k < burst; ++k) {
      if (::write(STDOUT_FILENO, line.data(), line.size()) < 0) return 1;
    }
    if (rate_mb_per_s > 0) std::this_thread::sleep_until(next);
  }
}

Result run_once(const std::string& launcher, bool blocked, int seconds, int interval_ms,
                double rate_mb_per_s, const fs::path& dir) {
  const fs::path port_file = dir / "port";
  fs::remove(port_file);
  int console[2];
  if (::pipe2(console, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  const int errors =
      ::open((dir / "stderr").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const std::string rate = std::to_string(rate_mb_per_s);
  const pid_t agent = ::fork();
  if (agent == 0) {
    ::dup2(console[1], STDOUT_FILENO);
    ::dup2(errors, STDERR_FILENO);
    ::execl(launcher.c_str(), launcher.c_str(), "--no-python", self.c_str(), "--as-worker",
            port_file.c_str(), rate.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(console[1]);
  ::close(errors);
  std::atomic<bool> stop_reading{false};
  std::thread reader;
  if (!blocked) {
    reader = std::thread([fd = console[0], &stop_reading] {
      std::vector<char> buffer(1 << 16);
      while (!stop_reading && ::read(fd, buffer.data(), buffer.size()) > 0) {
      }
    });
  }

  const auto started = Clock::now();
  while (!fs::exists(port_file)) {
    if (Clock::now() - started > kStartTimeout)
      throw std::runtime_error("the worker never started");
    std::this_thread::sleep_for(10ms);
  }
  int port = 0;
  std::ifstream(port_file) >> port;
  dist::store::ClientOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.timeout = kStoreCallTimeout;
  options.connect_timeout = kStoreCallTimeout;

  std::vector<double> round_trips;
  auto t0 = Clock::now();
  try {  // a store that does not answer in time ends the sampling, its wait counted
    auto client = dist::store::StoreClient::connect(options);
    const auto end = Clock::now() + std::chrono::seconds(seconds);
    for (int k = 0; Clock::now() < end; ++k) {
      t0 = Clock::now();
      client.set("console_bench/key", std::to_string(k));
      client.get("console_bench/key");
      round_trips.push_back(ms_since(t0));
      std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
    }
  } catch (const dist::store::StoreError& e) {
    round_trips.push_back(ms_since(t0));
    std::fprintf(stderr, "store call failed: %s\n", e.what());
  }

  Result r;
  r.samples = round_trips.size();
  r.p50_ms = percentile(round_trips, 0.5);
  r.p99_ms = percentile(round_trips, 0.99);
  r.max_ms = percentile(round_trips, 1.0);
  const auto sigterm = Clock::now();
  ::kill(agent, SIGTERM);
  int status = 0;
  while (::waitpid(agent, &status, WNOHANG) == 0) {
    if (Clock::now() - sigterm > kExitTimeout) {
      ::kill(agent, SIGKILL);
      ::waitpid(agent, &status, 0);
      break;
    }
    std::this_thread::sleep_for(200us);
  }
  r.sigterm_to_exit_ms = ms_since(sigterm);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  stop_reading = true;
  if (reader.joinable()) reader.join();  // the agent is gone: the read ends
  ::close(console[0]);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--as-worker") {
    return run_worker(argv[2], std::atof(argv[3]));
  }
  CLI::App app{"console-bench: the agent's store and SIGTERM with a console nobody reads"};
  std::string launcher = "build/bin/dist-launch";
  int seconds = 30, runs = 3, interval_ms = 5;
  double rate_mb_per_s = 0;
  app.add_option("--launcher", launcher, "dist-launch to measure")->check(CLI::ExistingFile);
  app.add_option("--seconds", seconds, "How long the console stays blocked per run")
      ->check(CLI::PositiveNumber);
  app.add_option("--runs", runs, "Runs of each mode, interleaved")->check(CLI::PositiveNumber);
  app.add_option("--interval-ms", interval_ms, "Pause between store round trips")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--rate-mb-per-s", rate_mb_per_s, "The worker's output rate (0: unlimited)")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);

  const fs::path dir = fs::temp_directory_path() / ("console-bench-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<double> p99[2], exit_ms[2];
  std::printf("%-8s %8s %9s %9s %9s %14s %4s\n", "mode", "samples", "p50 ms", "p99 ms", "max ms",
              "SIGTERM->exit", "rc");
  for (int run = 0; run < runs; ++run) {
    for (const bool blocked : {false, true}) {
      const Result r = run_once(launcher, blocked, seconds, interval_ms, rate_mb_per_s, dir);
      std::printf("%-8s %8zu %9.3f %9.3f %9.3f %11.1f ms %4d\n", blocked ? "blocked" : "drained",
                  r.samples, r.p50_ms, r.p99_ms, r.max_ms, r.sigterm_to_exit_ms, r.exit_code);
      std::fflush(stdout);
      p99[blocked].push_back(r.p99_ms);
      exit_ms[blocked].push_back(r.sigterm_to_exit_ms);
    }
  }
  for (const bool blocked : {false, true}) {
    std::printf("median over %d runs, %s: round trip p99 %.3f ms, SIGTERM to exit %.1f ms\n", runs,
                blocked ? "blocked" : "drained", median(p99[blocked]), median(exit_ms[blocked]));
  }
  fs::remove_all(dir);
  return 0;
}
