// dist-signal-probe: what Slurm's tests learn about the SIGTERMs a process receives.
//   dist-signal-probe once READY RESULT   block SIGTERM, write the pid to READY, wait for one
//                                          SIGTERM, write to RESULT what sent_by_slurm_step says of
//                                          it and the sender's name, exit 0
//   dist-signal-probe count READY LOG      write the pid to READY, then append one line per SIGTERM
//                                          to LOG (the sender's name) and keep running
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "dist/agent/signals.h"

namespace {

constexpr int kMaxSignals = 64;
constexpr auto kPollInterval = std::chrono::milliseconds(5);

std::atomic<int> g_received{0};
pid_t g_senders[kMaxSignals];

// Each delivery is counted in the handler itself, so back-to-back signals are not folded into one
// (only those the kernel merges while one is still pending are).
void on_sigterm(int, siginfo_t* info, void*) {
  const int n = g_received.load();
  if (n < kMaxSignals) g_senders[n] = info->si_pid;
  g_received.store(n + 1);
}

int once(const char* ready, const char* result) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigprocmask(SIG_BLOCK, &set, nullptr);
  std::ofstream(ready) << ::getpid() << "\n";
  siginfo_t info{};
  if (sigwaitinfo(&set, &info) != SIGTERM) return 1;
  std::ofstream(result) << "sent_by_slurm_step=" << dist::agent::sent_by_slurm_step(info)
                        << " sender=" << dist::agent::process_command_name(info.si_pid) << "\n";
  return 0;
}

int count(const char* ready, const char* log) {
  struct sigaction sa {};
  sa.sa_sigaction = on_sigterm;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGTERM, &sa, nullptr);
  std::ofstream(ready) << ::getpid() << "\n";
  for (int written = 0;; std::this_thread::sleep_for(kPollInterval)) {
    for (const int n = std::min(g_received.load(), kMaxSignals); written < n; ++written) {
      std::ofstream(log, std::ios::app)
          << dist::agent::process_command_name(g_senders[written]) << "\n";
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 4 ? argv[1] : "";
  if (mode == "once") return once(argv[2], argv[3]);
  if (mode == "count") return count(argv[2], argv[3]);
  std::fprintf(stderr, "usage: dist-signal-probe once READY RESULT | count READY LOG\n");
  return 64;
}
