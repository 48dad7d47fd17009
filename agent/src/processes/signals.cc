#include "dist/agent/signals.h"

#include <signal.h>
#include <string.h>

#include <spdlog/spdlog.h>

#include <cctype>
#include <fstream>

namespace dist::agent {

// Realtime signals as kill -l names them: SIGRTMIN+N up to the middle, SIGRTMAX-N past it.
std::string signal_name(int signal) {
  if (signal >= SIGRTMIN && signal <= SIGRTMAX) {
    if (signal == SIGRTMIN) return "SIGRTMIN";
    if (signal == SIGRTMAX) return "SIGRTMAX";
    return signal - SIGRTMIN <= (SIGRTMAX - SIGRTMIN) / 2
               ? "SIGRTMIN+" + std::to_string(signal - SIGRTMIN)
               : "SIGRTMAX-" + std::to_string(SIGRTMAX - signal);
  }
  const char* abbrev = ::sigabbrev_np(signal);
  return abbrev ? std::string("SIG") + abbrev : "SIG" + std::to_string(signal);
}

int signal_number(const std::string& name) {
  std::string n = name;
  if (n.rfind("SIG", 0) == 0) n = n.substr(3);
  if (!n.empty() && std::isdigit(static_cast<unsigned char>(n[0]))) {
    try {
      const int v = std::stoi(n);
      return v > 0 && v < NSIG ? v : -1;
    } catch (...) {
      return -1;
    }
  }
  for (int s = 1; s < NSIG; ++s) {
    const char* abbrev = ::sigabbrev_np(s);
    if (abbrev && n == abbrev) return s;
    if (s >= SIGRTMIN && s <= SIGRTMAX && "SIG" + n == signal_name(s)) return s;
  }
  return -1;
}

bool is_forward_only(int signal) {
  return signal == SIGUSR1 || signal == SIGUSR2;
}

std::string process_command_name(pid_t pid) {
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(comm, name);
  return name;
}

bool sent_by_slurm_step(int si_code, pid_t sender) {
  return si_code == SI_USER && sender > 0 && process_command_name(sender) == "slurmstepd";
}

bool sent_by_slurm_step(const siginfo_t& info) {
  return sent_by_slurm_step(info.si_code, info.si_pid);
}

std::vector<int> take_handled_signals(const std::vector<int>& handled) {
  std::vector<int> taken;
  for (const int s : handled) {
    struct sigaction current {};
    if (::sigaction(s, nullptr, &current) != 0 || current.sa_handler != SIG_IGN) {
      taken.push_back(s);
      continue;
    }
    if (s == SIGHUP) {
      spdlog::debug("SIGHUP is ignored (nohup): the job goes on when its terminal hangs up");
      continue;
    }
    sigset_t one;  // blocked first (the caller reads it from a signalfd): never its default
    sigemptyset(&one);
    sigaddset(&one, s);
    ::pthread_sigmask(SIG_BLOCK, &one, nullptr);
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    ::sigaction(s, &default_action, nullptr);
    taken.push_back(s);
  }
  return taken;
}

bool is_passed_on(const StopSignal& first, const StopSignal& again) {
  if (again.signal != first.signal) return false;
  const auto after = again.at - first.at;
  const bool same_sender = again.sender == first.sender && again.code == first.code;
  return same_sender ? after < kSameSenderStopWindow : after < kPassedOnStopWindow;
}

}  // namespace dist::agent
