// dist-watchdog-worker: a worker for the watchdog tests and bench, on the SDK's heartbeat and file
// timer client. Runs its arguments as actions, in order:
//   exit-on-attempt N CODE     exit with CODE when $TORCHELASTIC_RESTART_COUNT is N
//   exit-if-rank R CODE        exit with CODE when $RANK is R
//   beat                       one dist::sdk::heartbeat()
//   beat-every MS              beat now, then a thread beats every MS ms
//   pidfile FILE               write this process's pid to FILE (whole: written aside, renamed)
//   stamp FILE                 write CLOCK_MONOTONIC (ns) to FILE (whole, as pidfile); an '@' in
//                              FILE stands for $TORCHELASTIC_RESTART_COUNT
//   timer SCOPE MS [SIGNAL]    a file timer on SCOPE expiring in MS (signal: SIGKILL by default)
//   release SCOPE              release the timer on SCOPE
//   no-core                    RLIMIT_CORE 0: a SIGABRT leaves no core file
//   ignore SIGNAL              ignore SIGNAL (a number)
//   stop-if-rank R             raise SIGSTOP when $RANK is R
//   sleep MS                   sleep MS, without beating from this thread
//   steps N MS                 N training steps (dist::sdk::step()), MS ms apart
//   pause MS REASON            a pause of its own (dist::sdk::Pause) of MS ms
//   hang                       sleep until killed
#include <signal.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "dist/sdk/file_timer.h"
#include "dist/sdk/heartbeat.h"
#include "dist/sdk/progress.h"

namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

void write_whole(const std::string& path, const std::string& text) {
  const std::string aside = path + ".part";
  std::ofstream(aside) << text << "\n";
  std::rename(aside.c_str(), path.c_str());
}

long long monotonic_ns() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<long long>(now.tv_sec) * 1'000'000'000LL + now.tv_nsec;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "dist-watchdog-worker: %s needs an argument\n", a.c_str());
        std::exit(64);
      }
      return argv[++i];
    };
    try {
      if (a == "exit-on-attempt") {
        const std::string attempt = next();
        const int code = std::stoi(next());
        if (env_or("TORCHELASTIC_RESTART_COUNT", "") == attempt) return code;
      } else if (a == "exit-if-rank") {
        const std::string rank = next();
        const int code = std::stoi(next());
        if (env_or("RANK", "") == rank) return code;
      } else if (a == "beat") {
        dist::sdk::heartbeat();
      } else if (a == "beat-every") {
        const auto period = std::chrono::milliseconds(std::stol(next()));
        // The first beat before the next action: a test that stops this worker once its pidfile
        // is there then knows the agent watches it (a worker that never beat is not watched).
        dist::sdk::heartbeat();
        std::thread([period] {
          while (true) {
            dist::sdk::heartbeat();
            std::this_thread::sleep_for(period);
          }
        }).detach();
      } else if (a == "pidfile") {
        write_whole(next(), std::to_string(::getpid()));
      } else if (a == "stamp") {
        std::string file = next();
        if (const auto at = file.find('@'); at != std::string::npos) {
          file.replace(at, 1, env_or("TORCHELASTIC_RESTART_COUNT", "0"));
        }
        write_whole(file, std::to_string(monotonic_ns()));
      } else if (a == "timer") {
        const std::string scope = next();
        const auto after = std::chrono::milliseconds(std::stol(next()));
        int signal = SIGKILL;
        if (i + 1 < argc && std::isdigit(static_cast<unsigned char>(argv[i + 1][0]))) {
          signal = std::stoi(next());
        }
        dist::sdk::FileTimerClient(dist::sdk::FileTimerClient::path_from_environment(), signal)
            .acquire(scope, std::chrono::system_clock::now() + after);
      } else if (a == "release") {
        dist::sdk::FileTimerClient().release(next());
      } else if (a == "no-core") {
        const rlimit none{0, 0};
        setrlimit(RLIMIT_CORE, &none);
      } else if (a == "ignore") {
        signal(std::stoi(next()), SIG_IGN);
      } else if (a == "stop-if-rank") {
        if (env_or("RANK", "") == next()) raise(SIGSTOP);
      } else if (a == "sleep") {
        std::this_thread::sleep_for(std::chrono::milliseconds(std::stol(next())));
      } else if (a == "steps") {
        const long n = std::stol(next());
        const auto gap = std::chrono::milliseconds(std::stol(next()));
        for (long s = 0; s < n; ++s) {
          std::this_thread::sleep_for(gap);
          dist::sdk::step();
        }
      } else if (a == "pause") {
        const auto length = std::chrono::milliseconds(std::stol(next()));
        const dist::sdk::Pause pause(next());
        std::this_thread::sleep_for(length);
      } else if (a == "hang") {
        while (true) pause();
      } else {
        std::fprintf(stderr, "dist-watchdog-worker: unknown action '%s'\n", a.c_str());
        return 64;
      }
    } catch (const dist::sdk::FileTimerError& e) {
      std::fprintf(stderr, "dist-watchdog-worker: %s\n", e.what());
      return 65;
    }
  }
  return 0;
}
