// dist-inplace-worker: a worker on the SDK's InPlaceRecovery for the agent's in-place tests and
// bench/recovery_bench.py. Trains nothing: each step all-reduces values that depend on the step
// and the rank and folds them into its state, so that every rank ends with the digest of a run
// without failures only if the recovery gave it the right state.
//
//   --steps N                 steps (default 40)
//   --step-ms MS              sleep after each step (default 0)
//   --step-ms-of R:MS         the process that started as rank R sleeps MS instead (a straggler)
//   --count-steps             each step counted for the agent (dist::sdk::step(): its hang and
//                             straggler detection), with its own work, from the end of the last
//                             step to the step's collective, as the SDK's DDP measures it
//   --crash R:S[:G[:A]]       rank R exits with code 3 as step S begins, in generation G
//                             (default 0) of restart attempt A (default 0); repeatable
//   --crash-every R:K         rank R exits with code 3 as step K x (G + 1) begins, in each
//                             generation G of restart attempt 0: a recovery every K steps, one
//                             survivor (rank 0 when R is not 0) living through all of them
//   --resources PATH          rank 0 appends "<generation> <rss_kb> <threads> <fds> <keys>
//                             <bytes>" to PATH as it starts and after each recovery: its own
//                             resident memory, threads and open descriptors, and the workers'
//                             store's keys and their values' bytes
//   --fail-in-recovery R[:PATH]
//                             rank R exits with code 4 as its recovery begins (it has read the
//                             new generation), on restart attempt 0; with PATH, once PATH exists
//                             (at most 60 s later), so that a test can choose the moment
//   --fail-after-recovery R   rank R exits with code 4 once its group was rebuilt and its state
//                             received in a generation after 0 (before the group says it
//                             recovered, when R is not its root), on restart attempt 0, if R's
//                             process started in generation 0
//   --stall-in-recovery       on restart attempt 0, every rank stops for good (sleeps until it
//                             is killed) where its recovery begins, and so does each
//                             replacement as it starts: the group never says it recovered
//   --crash-at-exit R:after|R:before
//                             rank R exits with code 3 once the job is over (after the final
//                             barrier), on restart attempt 0: `after` once every other rank's
//                             process is gone (reaped by the agent); `before`: at once, while the
//                             others wait, the job over, until R's replacement has started
//                             (DIR/born_R_0_1, at most 60 s), then exit 0
//   --fail-at-start R:G        rank R exits with code 5 as it starts in generation G, before it
//                             connects to anything (a newcomer's worker that dies before it
//                             says it arrived), on restart attempt 0
//   --exit-after-publishing R:G
//                             rank R, as it starts in generation G on restart attempt 0, exits
//                             with code 6 as soon as its group's set-up has published its
//                             addresses, before it connects to any peer (the SDK's
//                             DIST_SDK_FAULT=exit-after-publishing)
//   --hold-at-start R:G[:PATH]
//                             rank R waits as it starts in generation G, before init(), on
//                             restart attempt 0 (a replacement slow to start: minutes of
//                             imports): until it is killed, or with PATH until PATH exists
//   --finish-at-file PATH     the ranks end their loop, together, at the first step before which
//                             one of them sees PATH exist (all-reduced)
//   --finish-when-asked       the ranks end their loop, together, at the first step before which
//                             one of them was asked to regroup (a node joins), without regrouping;
//                             or, when the request came between that check and the unit's (the
//                             group regrouped), at the step after
//   --child                   every process starts a child in its process group (as a
//                             DataLoader's workers are) that exits as soon as a signal comes
//   --out DIR                 DIR/start_<rank>_<attempt>_<generation>: "<pid>", written at start
//                             (DIR/born_<rank>_<attempt>_<generation> as the process begins,
//                             before init(), which a replacement leaves once its group is built);
//                             DIR/final_<rank>: "<pid> <step> <digest> <generation> <world
//                             size>" at the end (the rank and world of then: a lost node's
//                             survivors go on in a smaller world);
//                             DIR/signal_<rank>_<pid>: the signal number, if SIGTERM/SIGINT came
//
// Prints "rank R pid P generation G attempt A" at start and "rank R pid P step S digest D" at the
// end, and "rank R step S" after each step with --step-ms.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dist/sdk/init.h"
#include "dist/sdk/progress.h"
#include "dist/sdk/recovery.h"
#include "progress_slot.h"  // (the SDK's own: the work its DDP measures)

namespace {

using namespace dist::sdk;

struct Crash {
  int rank = -1, step = -1, generation = 0, attempt = 0;
};

struct Options {
  int steps = 40;
  int step_ms = 0;
  Crash slow;  // rank and step (its MS)
  bool count_steps = false;
  bool child = false;
  std::vector<Crash> crashes;
  int fail_in_recovery = -1;
  int fail_after_recovery = -1;
  std::string fail_in_recovery_file;
  Crash fail_at_start;          // its step unused
  Crash hold_at_start;          // its step unused
  Crash exit_after_publishing;  // its step unused
  std::string hold_file;
  std::string finish_file;
  Crash crash_every;  // rank and step (every K)
  std::string resources;
  bool finish_when_asked = false;
  bool stall_in_recovery = false;
  int crash_at_exit = -1;
  bool crash_after_peers = false;
  std::string out;
};

std::string g_signal_file;

void on_signal(int s) {
  if (g_signal_file.empty()) return;
  const std::string text = std::to_string(s) + "\n";
  const int fd = ::open(g_signal_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    [[maybe_unused]] const auto n = ::write(fd, text.data(), text.size());
    ::close(fd);
  }
  std::_Exit(128 + s);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  std::getline(in, text);
  return text;
}

void write_file(const std::string& path, const std::string& content) {
  const std::string temp = path + ".partial";  // tests poll for the name: never half written
  std::ofstream(temp) << content;
  std::rename(temp.c_str(), path.c_str());
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--finish-when-asked" || flag == "--stall-in-recovery" || flag == "--count-steps" ||
        flag == "--child") {
      (flag == "--finish-when-asked" ? o.finish_when_asked
       : flag == "--count-steps"     ? o.count_steps
       : flag == "--child"           ? o.child
                                     : o.stall_in_recovery) = true;
      --i;  // no value
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "dist-inplace-worker: %s needs a value\n", flag.c_str());
      std::exit(2);
    }
    const std::string value = argv[i + 1];
    if (flag == "--steps") {
      o.steps = std::stoi(value);
    } else if (flag == "--step-ms") {
      o.step_ms = std::stoi(value);
    } else if (flag == "--step-ms-of") {
      std::sscanf(value.c_str(), "%d:%d", &o.slow.rank, &o.slow.step);
    } else if (flag == "--crash") {
      Crash c;
      std::sscanf(value.c_str(), "%d:%d:%d:%d", &c.rank, &c.step, &c.generation, &c.attempt);
      o.crashes.push_back(c);
    } else if (flag == "--crash-every") {
      std::sscanf(value.c_str(), "%d:%d", &o.crash_every.rank, &o.crash_every.step);
    } else if (flag == "--resources") {
      o.resources = value;
    } else if (flag == "--fail-in-recovery") {
      const auto colon = value.find(':');
      o.fail_in_recovery = std::stoi(value.substr(0, colon));
      if (colon != std::string::npos) o.fail_in_recovery_file = value.substr(colon + 1);
    } else if (flag == "--fail-after-recovery") {
      o.fail_after_recovery = std::stoi(value);
    } else if (flag == "--crash-at-exit") {
      const auto colon = value.find(':');
      o.crash_at_exit = std::stoi(value.substr(0, colon));
      o.crash_after_peers = colon != std::string::npos && value.substr(colon + 1) == "after";
    } else if (flag == "--fail-at-start") {
      std::sscanf(value.c_str(), "%d:%d", &o.fail_at_start.rank, &o.fail_at_start.generation);
    } else if (flag == "--exit-after-publishing") {
      std::sscanf(value.c_str(), "%d:%d", &o.exit_after_publishing.rank,
                  &o.exit_after_publishing.generation);
    } else if (flag == "--hold-at-start") {
      int end = 0;
      std::sscanf(value.c_str(), "%d:%d%n", &o.hold_at_start.rank, &o.hold_at_start.generation,
                  &end);
      if (end > 0 && value[static_cast<std::size_t>(end)] == ':') {
        o.hold_file = value.substr(static_cast<std::size_t>(end) + 1);
      }
    } else if (flag == "--finish-at-file") {
      o.finish_file = value;
    } else if (flag == "--out") {
      o.out = value;
    } else {
      std::fprintf(stderr, "dist-inplace-worker: unknown option %s\n", flag.c_str());
      std::exit(2);
    }
  }
  return o;
}

// The launcher's environment, read before init() does (which connects to the store).
int env_int(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::atoi(value) : 0;
}

// --stall-in-recovery: stopped for good, as a worker blocked where nothing fails (a survivor whose
// recovery waits on something that never comes). Only a signal ends it.
[[noreturn]] void stall(int rank, const char* where) {
  std::fprintf(stderr, "rank %d: stalling %s\n", rank, where);
  std::fflush(stderr);
  for (;;) ::pause();
}

// "<rss_kb> <threads>" of this process (/proc/self/status) and its open descriptors.
std::string own_resources() {
  std::ifstream status("/proc/self/status");
  long rss = -1, threads = -1;
  for (std::string line; std::getline(status, line);) {
    if (line.starts_with("VmRSS:")) rss = std::atol(line.c_str() + 6);
    if (line.starts_with("Threads:")) threads = std::atol(line.c_str() + 8);
  }
  long fds = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++fds;
  return std::to_string(rss) + " " + std::to_string(threads) + " " +
         std::to_string(fds - 1);  // less the directory's own descriptor
}

// "<keys> <bytes>": the store's keys and the sum of their values' sizes.
std::string store_contents(dist::store::StoreClient& store) {
  const auto keys = store.list_keys();
  std::size_t bytes = 0;
  for (const auto& key : keys) bytes += store.try_get(key).value_or("").size();
  return std::to_string(keys.size()) + " " + std::to_string(bytes);
}

// Waits (at most 60 s) for `done`; false if it never was.
bool wait_for(const std::function<bool()>& done) {
  for (int waited_ms = 0; waited_ms < 60'000; waited_ms += 10) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

int run(const Options& o) {
  if (o.child && ::fork() == 0) {
    for (const int s : {SIGTERM, SIGINT, SIGHUP}) ::signal(s, SIG_DFL);
    for (;;) ::pause();  // a signal's default ends it
  }
  if (!o.out.empty()) {
    write_file(o.out + "/born_" + std::to_string(env_int("RANK")) + "_" +
                   std::to_string(env_int("TORCHELASTIC_RESTART_COUNT")) + "_" +
                   std::to_string(env_int("DIST_LAUNCH_GENERATION")),
               std::to_string(::getpid()));
  }
  if (o.fail_at_start.rank >= 0 && env_int("RANK") == o.fail_at_start.rank &&
      env_int("DIST_LAUNCH_GENERATION") == o.fail_at_start.generation &&
      env_int("TORCHELASTIC_RESTART_COUNT") == 0) {
    std::fprintf(stderr, "rank %d: failing as it starts, before it arrived\n",
                 o.fail_at_start.rank);
    std::fflush(stderr);
    std::_Exit(5);
  }
  if (o.hold_at_start.rank >= 0 && env_int("RANK") == o.hold_at_start.rank &&
      env_int("DIST_LAUNCH_GENERATION") == o.hold_at_start.generation &&
      env_int("TORCHELASTIC_RESTART_COUNT") == 0) {
    if (o.hold_file.empty()) stall(o.hold_at_start.rank, "as it starts, before init()");
    std::fprintf(stderr, "rank %d: held as it starts, until %s exists\n", o.hold_at_start.rank,
                 o.hold_file.c_str());
    std::fflush(stderr);
    while (!std::filesystem::exists(o.hold_file)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // (Before init(), which a replacement leaves only once its generation's group is built.)
  if (o.stall_in_recovery && env_int("TORCHELASTIC_RESTART_COUNT") == 0 &&
      env_int("DIST_LAUNCH_GENERATION") > 0) {
    const char* timeout = std::getenv("DIST_LAUNCH_IN_PLACE_TIMEOUT_MS");
    const std::string where = "as it starts as a replacement (in-place timeout " +
                              std::string(timeout ? timeout : "unset") + " ms)";
    stall(env_int("RANK"), where.c_str());
  }
  if (o.exit_after_publishing.rank >= 0 && env_int("RANK") == o.exit_after_publishing.rank &&
      env_int("DIST_LAUNCH_GENERATION") == o.exit_after_publishing.generation &&
      env_int("TORCHELASTIC_RESTART_COUNT") == 0) {
    ::setenv("DIST_SDK_FAULT", "exit-after-publishing", 1);
  }
  Distributed dist = init();
  const int rank = dist.env.rank, attempt = dist.env.restart_count;
  const long pid = static_cast<long>(::getpid());
  if (!o.out.empty()) {
    g_signal_file = o.out + "/signal_" + std::to_string(rank) + "_" + std::to_string(pid);
    write_file(o.out + "/start_" + std::to_string(rank) + "_" + std::to_string(attempt) + "_" +
                   std::to_string(dist.env.generation),
               std::to_string(pid));
  }
  for (const int s : {SIGTERM, SIGINT}) ::signal(s, on_signal);
  std::printf("rank %d pid %ld generation %d attempt %d\n", rank, pid, dist.env.generation,
              attempt);
  std::fflush(stdout);

  std::vector<double> sum(64, 0.0);
  std::uint64_t step = 0;
  std::uint64_t step_end_ns = 0;  // --count-steps
  // The step's own work ends at its first collective, where it may wait for its peers.
  const auto own_work_ends = [&] {
    if (step_end_ns == 0) return;
    dist::sdk::detail::add_work(dist::sdk::detail::monotonic_ns() - step_end_ns);
    step_end_ns = 0;
  };
  InPlaceRecovery recovery(dist);
  recovery.state().add("sum", std::span<double>(sum));
  recovery.state().add("step", step);
  const bool first_process = dist.env.generation == 0;
  recovery.on_group(
      [&](ProcessGroup&) {
        if (rank == o.fail_after_recovery && attempt == 0 && first_process &&
            recovery.generation() > 0) {
          std::fprintf(stderr, "rank %d: failing once its group was rebuilt\n", rank);
          std::fflush(stderr);
          std::_Exit(4);
        }
      },
      [&] {
        if (o.stall_in_recovery && attempt == 0) {
          stall(rank, "as its recovery begins");
        }
        if (rank == o.fail_in_recovery && attempt == 0) {
          for (int waited_ms = 0;
               !o.fail_in_recovery_file.empty() &&
               !std::filesystem::exists(o.fail_in_recovery_file) && waited_ms < 60'000;
               waited_ms += 10) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          }
          std::fprintf(stderr, "rank %d: failing as its recovery begins\n", rank);
          std::fflush(stderr);
          std::_Exit(4);
        }
      });
  recovery.start();
  // Whether every rank ends its loop now: one rank's reason is all of theirs.
  const int first_generation = dist.env.generation;
  const auto finishing = [&] {
    if (o.finish_file.empty() && !o.finish_when_asked) return false;
    const bool mine = (!o.finish_file.empty() && std::filesystem::exists(o.finish_file)) ||
                      (o.finish_when_asked &&
                       (recovery.regroup_asked() || recovery.generation() > first_generation));
    std::vector<double> any{mine ? 1.0 : 0.0};
    own_work_ends();
    dist.group->all_reduce(std::span<double>(any), ReduceOp::kMax);
    if (any[0] > 0 && rank == 0) {
      std::printf("rank 0: the ranks end their loop at step %llu\n",
                  static_cast<unsigned long long>(step));
    }
    return any[0] > 0;
  };
  std::optional<dist::store::StoreClient> counting;
  int counted_generation = -1;
  const auto count_resources = [&] {
    if (o.resources.empty() || dist.env.rank != 0 || counted_generation == dist.env.generation) {
      return;
    }
    if (!counting) counting.emplace(connect_store(dist.env));
    counted_generation = dist.env.generation;
    const std::string line = std::to_string(dist.env.generation) + " " + own_resources() + " " +
                             store_contents(*counting) + "\n";
    std::ofstream(o.resources, std::ios::app) << line;
  };
  while (step < static_cast<std::uint64_t>(o.steps) && !finishing()) {
    count_resources();
    recovery.run([&] {
      const int current = dist.env.rank;  // a lost node's survivors are renumbered
      if (current == o.crash_every.rank && attempt == 0 && o.crash_every.step > 0 &&
          step == static_cast<std::uint64_t>(o.crash_every.step) * (dist.env.generation + 1)) {
        std::fflush(stdout);
        std::_Exit(3);
      }
      for (const Crash& c : o.crashes) {
        if (c.rank == current && c.step == static_cast<int>(step) &&
            c.generation == dist.env.generation && c.attempt == attempt) {
          std::fprintf(stderr, "rank %d: crashing at step %llu\n", current,
                       static_cast<unsigned long long>(step));
          std::fflush(stdout);
          std::fflush(stderr);
          std::_Exit(3);
        }
      }
      std::vector<double> v(sum.size());
      for (std::size_t i = 0; i < v.size(); ++i) {
        v[i] = std::sin(static_cast<double>(step * 131 + i) + current * 0.25);
      }
      own_work_ends();
      dist.group->all_reduce(std::span<double>(v), ReduceOp::kSum);
      for (std::size_t i = 0; i < v.size(); ++i) sum[i] = sum[i] * 0.99 + v[i];
      ++step;
    });
    if (o.count_steps) {
      dist::sdk::step();
      step_end_ns = dist::sdk::detail::monotonic_ns();
    }
    const int step_ms = o.slow.rank == rank ? o.slow.step : o.step_ms;
    if (step_ms > 0) {
      std::printf("rank %d step %llu\n", dist.env.rank, static_cast<unsigned long long>(step));
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
    }
  }
  std::uint64_t digest = 1469598103934665603ull;
  for (const double x : sum) {
    std::uint64_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    digest = (digest ^ bits) * 1099511628211ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(digest));
  std::printf("rank %d pid %ld step %llu digest %s\n", dist.env.rank, pid,
              static_cast<unsigned long long>(step), hex);
  std::fflush(stdout);
  if (!o.out.empty()) {
    write_file(o.out + "/final_" + std::to_string(dist.env.rank),
               std::to_string(pid) + " " + std::to_string(step) + " " + hex + " " +
                   std::to_string(dist.env.generation) + " " + std::to_string(dist.env.world_size));
  }
  dist.group->barrier();  // no rank leaves while another may still need it
  if (o.crash_at_exit >= 0 && attempt == 0 && dist.env.generation == 0) {
    if (dist.env.rank == o.crash_at_exit) {
      if (o.crash_after_peers) {
        wait_for([&] {  // each peer reaped: its pid no longer exists
          for (int r = 0; r < dist.env.world_size; ++r) {
            if (r == rank) continue;
            const long peer =
                std::atol(read_file(o.out + "/start_" + std::to_string(r) + "_0_0").c_str());
            if (peer > 0 && ::kill(static_cast<pid_t>(peer), 0) == 0) return false;
          }
          return true;
        });
      }
      std::fprintf(stderr, "rank %d: crashing at exit\n", rank);
      std::fflush(stderr);
      std::_Exit(3);
    }
    if (!o.crash_after_peers) {
      const std::string born = o.out + "/born_" + std::to_string(o.crash_at_exit) + "_0_1";
      if (!wait_for([&] { return std::filesystem::exists(born); })) {
        std::fprintf(stderr, "rank %d: no replacement of rank %d started\n", rank, o.crash_at_exit);
        return 1;
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    const std::string line = "dist-inplace-worker: error: " + std::string(e.what()) + "\n";
    [[maybe_unused]] const auto n = ::write(STDERR_FILENO, line.data(), line.size());
    return 1;
  }
}
