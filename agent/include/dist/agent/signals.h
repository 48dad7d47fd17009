// Signals as the command line and the failure report spell them, and who sent one.
//
// Slurm signals every process of a job step itself (scancel, the time limit, srun's forwarded
// Ctrl-C: slurmstepd kills the step's whole process tree, workers in their own process groups
// included), so an agent that forwarded such a signal would deliver it twice.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <string>

namespace dist::agent {

// "SIGTERM" for 15; "SIG15" when unknown.
std::string signal_name(int signal);
// 15 for "SIGTERM", "TERM" or "15"; -1 when unknown.
int signal_number(const std::string& name);

// SIGUSR1 and SIGUSR2 (Slurm's warning before a time limit): forwarded to the workers, and the job
// keeps running; the other handled signals stop it.
bool is_forward_only(int signal);

// The command name of process `pid` (/proc/PID/comm, at most 15 characters); empty when it is gone.
std::string process_command_name(pid_t pid);

// True when a signal with this si_code from this sender is a kill() by slurmstepd: every process of
// the step received the same signal, the workers included. (signalfd: ssi_code and ssi_pid.)
bool sent_by_slurm_step(int si_code, pid_t sender);
// The same, from a SA_SIGINFO handler's or sigwaitinfo's siginfo_t.
bool sent_by_slurm_step(const siginfo_t& info);

}  // namespace dist::agent
