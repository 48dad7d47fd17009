// Signals as the command line and the failure report spell them, and who sent one.
//
// Slurm signals every process of a job step itself (scancel, the time limit, srun's forwarded
// Ctrl-C: slurmstepd kills the step's whole process tree, workers in their own process groups
// included), so an agent that forwarded such a signal would deliver it twice.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

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

// The signals a launcher or agent acts on, of `handled` (--signals-to-handle): all of them but
// SIGHUP when this process was started ignoring it (nohup: the job is to go on when its terminal
// hangs up; the workers inherit the ignore). Another handled signal started ignored (SIGINT and
// SIGQUIT of a shell script's background job) is acted on, as torchrun does, and set back to its
// default action here, blocked first in this thread (the caller reads it from a signalfd): the
// workers it is forwarded to must not inherit the ignore. Said (debug) when SIGHUP is left alone.
std::vector<int> take_handled_signals(const std::vector<int>& handled);

// One stop signal, as a signalfd reads it.
struct StopSignal {
  int signal = 0;
  pid_t sender = 0;  // 0: the kernel (a terminal's Ctrl-C)
  int code = 0;      // si_code
  std::chrono::steady_clock::time_point at;
};
// Within this of the first stop, the same signal from another sender is the first one passed on;
// from the same sender, within the second (GNU timeout signals its child, then its process group,
// the child in it: two at once).
inline constexpr std::chrono::milliseconds kPassedOnStopWindow{1000};
inline constexpr std::chrono::milliseconds kSameSenderStopWindow{100};
// Whether `again`, a stop signal after `first`, is `first` passed on rather than a second request
// (which kills the workers at once): the same signal, moments later, from another sender, or at
// once from the same one. A terminal sends Ctrl-C to its whole foreground process group, and a
// wrapper in it passes its own on (`timeout`, a script's trap, a Python parent): one Ctrl-C, two
// signals. A second Ctrl-C comes from the terminal again, later; a second `kill`, from the same
// shell, later too.
bool is_passed_on(const StopSignal& first, const StopSignal& again);

}  // namespace dist::agent
