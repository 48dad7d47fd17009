// What the kernel says a worker is doing, for the hang detector (hang_detector.h): its state, the
// CPU time and the I/O of its process and every process under it (a DataLoader's workers, a
// trainer it runs), read from /proc. Two readings a few seconds apart tell a rank that works
// (computes, reads, writes) from one that only waits.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dist::agent {

// One process's counters in a reading (ProcessActivity::each).
struct ProcessCounters {
  pid_t pid = 0;
  std::uint64_t cpu_ticks = 0;
  std::uint64_t cpu_queued_ns = 0;
};

struct ProcessActivity {
  char state = '?';             // /proc/<pid>/stat's state letter of the process itself
  std::uint64_t cpu_ticks = 0;  // user + system, of the process and its descendants now alive
  // Nanoseconds their main threads were runnable but waited for a CPU (schedstat's run delay): a
  // rank that wants to compute on a machine with more runnable threads than CPUs.
  std::uint64_t cpu_queued_ns = 0;
  std::uint64_t read_bytes = 0;       // rchar: read(), recv() and the like, files and sockets alike
  std::uint64_t write_bytes = 0;      // wchar
  std::uint64_t storage_written = 0;  // write_bytes: what went to storage (checkpoints)
  std::string wchan;                  // where the kernel has it wait; empty when running
  // Its main thread blocked reading a terminal or its stdin (a debugger's prompt, input()): "at
  // its terminal (/dev/pts/3)", "on its stdin (pipe:[4711])"; empty otherwise.
  std::string awaits_input;
  // Otherwise, its main thread blocked reading or writing another descriptor (or polling one for
  // either): "writing to a socket to 10.0.0.7:5000", "reading from a pipe (pipe:[4711])", a
  // file's path; blocked_writing when it writes (its reader takes no more).
  std::string blocked_on;
  bool blocked_writing = false;
  // Otherwise, its main thread waiting for a child of its own to end (subprocess.run, os.wait):
  // "its child 4711 (sleep)", "one of its children 4711 (sleep), 4712 (python3)"; empty
  // otherwise.
  std::string awaits_child;
  int processes = 0;  // read (0: the process is gone)
  // The same counters process by process: between two readings only the processes in both (and
  // those born since) count, so that a DataLoader worker that exits meanwhile takes its total
  // out of neither (the sum would fall, and a rank at work read as idle).
  std::vector<ProcessCounters> each;
};

// The worker `pid` and its descendants now; processes = 0 when it is gone.
ProcessActivity read_activity(pid_t pid);
// Whether `pid` is on its way out: a SIGKILL pending (sent, the process not yet scheduled to die
// of it), exiting (PF_EXITING), or a zombie. False once it is reaped, or for no pid (<= 0).
bool on_its_way_out(pid_t pid);
// Whether the call `pid`'s main thread is blocked in goes on after a signal handler with
// SA_RESTART has run (a read, a write, a lock): poll(), select(), epoll_wait(), nanosleep() and
// the like fail with EINTR instead, whatever the handler's flags (signal(7)), which C code that
// holds the GIL may not expect (a C poll() of 70 s returned EINTR at 31 s and the job failed).
// False when it runs, or the call cannot be read.
bool restarts_after_a_handler(pid_t pid);
// The state letter and CPU ticks of `pid` alone (one read of /proc/<pid>/stat); none when it is
// gone.
struct ProcessStat {
  char state = '?';  // R running, S/D waiting, T stopped by a signal, t by a tracer, Z gone
  std::uint64_t cpu_ticks = 0;
};
std::optional<ProcessStat> read_process_stat(pid_t pid);

// One thread's state and the time it has spent on a CPU, read at `at`: whether it waited in the
// kernel all the while between two readings (thread_waited_in_kernel) is what makes a signal to
// it safe for a handler that reads the interpreter's frames (hang_detector.cc).
struct ThreadRun {
  char state = '?';
  std::chrono::nanoseconds on_cpu{0};  // /proc/<pid>/task/<tid>/schedstat, else the stat's ticks
  std::chrono::steady_clock::time_point at;
};
std::optional<ThreadRun> read_thread_run(pid_t pid, pid_t tid);
// How `pid`'s main thread used the CPUs since it started (/proc/<pid>/schedstat): the time it ran
// on one, and the time it was runnable but waited for one (a machine with more runnable threads
// than CPUs); none where the kernel keeps no scheduler statistics, or the process is gone.
struct CpuUse {
  std::chrono::nanoseconds ran{0}, waited{0};
};
std::optional<CpuUse> read_cpu_use(pid_t pid);
// Whether the thread stayed off the CPU between the readings (at most 1% of the time on it: a
// timed wait that wakes to sleep again) and waits in the kernel now (S or D): it stands at a call
// into the kernel, not in the middle of anything in user space.
bool thread_waited_in_kernel(const ThreadRun& before, const ThreadRun& now);

// The CPU a reading's processes used between two readings, as a share of one core (1.0 = one core
// busy all the time): process by process where both readings have them (read_activity's), else
// from the totals.
double cpu_share(const ProcessActivity& before, const ProcessActivity& after, double seconds);
double cpu_share(std::uint64_t ticks_before, std::uint64_t ticks_after, double seconds);
// The time their main threads waited for a CPU between two readings, as a share of the seconds
// between them: what the CPU share misses of a rank that computes on a crowded machine.
double cpu_queued_share(const ProcessActivity& before, const ProcessActivity& after,
                        double seconds);

}  // namespace dist::agent
