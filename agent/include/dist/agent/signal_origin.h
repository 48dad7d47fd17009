// Who sent a signal. Slurm signals every process of a job step itself (scancel, the time limit,
// srun's forwarded Ctrl-C: slurmstepd kills the step's whole process tree, workers in their own
// process groups included), so an agent that forwarded such a signal would deliver it twice.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <fstream>
#include <string>

namespace dist::agent {

// The command name of process `pid` (/proc/PID/comm, at most 15 characters); empty when it is gone.
inline std::string process_command_name(pid_t pid) {
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(comm, name);
  return name;
}

// True when a signal with this si_code from this sender is a kill() by slurmstepd: every process of
// the step received the same signal, the workers included. (signalfd: ssi_code and ssi_pid.)
inline bool sent_by_slurm_step(int si_code, pid_t sender) {
  return si_code == SI_USER && sender > 0 && process_command_name(sender) == "slurmstepd";
}

// The same, from a SA_SIGINFO handler's or sigwaitinfo's siginfo_t.
inline bool sent_by_slurm_step(const siginfo_t& info) {
  return sent_by_slurm_step(info.si_code, info.si_pid);
}

}  // namespace dist::agent
