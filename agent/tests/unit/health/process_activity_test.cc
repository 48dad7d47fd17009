// What the kernel says of a thread, read by the hang detector before it signals a Python worker's
// main thread for its stack: real processes that wait in the kernel or run.
#include "health/process_activity.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace dist::agent {
namespace {

using namespace std::chrono_literals;

// A forked child running `body` (which never returns), killed and reaped at the end of the test;
// the constructor returns once the child has said it is about to run it.
class Child {
 public:
  template <typename Body>
  explicit Child(Body body) {
    int ready[2];
    EXPECT_EQ(::pipe(ready), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(ready[0]);
      const char byte = 1;
      if (::write(ready[1], &byte, 1) != 1) ::_exit(2);
      body();
      ::_exit(0);
    }
    ::close(ready[1]);
    char byte = 0;
    EXPECT_EQ(::read(ready[0], &byte, 1), 1);
    ::close(ready[0]);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }

  // Whether its main thread waited in the kernel over `between`, as the hang detector reads it.
  bool main_thread_waited_in_kernel(std::chrono::milliseconds between) const {
    const auto before = read_thread_run(pid_, pid_);
    std::this_thread::sleep_for(between);
    const auto now = read_thread_run(pid_, pid_);
    EXPECT_TRUE(before && now);
    return before && now && thread_waited_in_kernel(*before, *now);
  }

 private:
  pid_t pid_ = -1;
};

[[noreturn]] void spin() {
  std::atomic<std::uint64_t> count{0};
  for (;;) count.fetch_add(1, std::memory_order_relaxed);
}

// Three busy processes on one CPU: each runs about a third of the time and waits for the CPU
// the rest, which the reading counts (a rank that computes on a crowded machine is not idle).
TEST(ProcessActivity, CountsTheTimeItsMainThreadWaitedForACpu) {
  cpu_set_t allowed, one;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  CPU_ZERO(&one);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) {
      CPU_SET(cpu, &one);  // the first this process may run on
      break;
    }
  }
  const auto pinned_spin = [one] {
    if (::sched_setaffinity(0, sizeof(one), &one) != 0) ::_exit(3);
    spin();
  };
  Child a(pinned_spin), b(pinned_spin), c(pinned_spin);
  if (!read_cpu_use(a.pid())) GTEST_SKIP() << "this kernel keeps no scheduler statistics";
  const ProcessActivity before = read_activity(a.pid());
  const auto start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(1s);
  const ProcessActivity after = read_activity(a.pid());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double ran = cpu_share(before, after, seconds);
  const double queued = cpu_queued_share(before, after, seconds);
  EXPECT_GT(queued, 0.3) << "ran " << ran;
  EXPECT_LT(ran, 0.7) << "queued " << queued;
  EXPECT_GT(ran + queued, 0.8) << "runnable all the time";
  // A sleeping process waits for no CPU.
  Child sleeper([] {
    for (;;) ::pause();
  });
  const ProcessActivity asleep_before = read_activity(sleeper.pid());
  std::this_thread::sleep_for(200ms);
  EXPECT_LT(cpu_queued_share(asleep_before, read_activity(sleeper.pid()), 0.2), 0.05);
}

// A worker at work whose child (a DataLoader's worker) ends between two readings: the child's
// CPU time leaves the sum, which fell below the first reading's, and the rank read as idle.
TEST(ProcessActivity, AChildThatEndsBetweenReadingsTakesNoneOfTheWorkersCpuAway) {
  Child worker([] {
    if (::fork() == 0) spin();
    std::atomic<std::uint64_t> count{0};
    for (;;) {
      count.fetch_add(1, std::memory_order_relaxed);
      ::waitpid(-1, nullptr, WNOHANG);  // its child, once killed
    }
  });
  // Its child has run 2 s: more than the worker will run between the readings.
  const auto ticks = static_cast<std::uint64_t>(::sysconf(_SC_CLK_TCK));
  ProcessActivity before;
  pid_t child = 0;
  for (const auto deadline = std::chrono::steady_clock::now() + 30s;
       std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(50ms)) {
    before = read_activity(worker.pid());
    for (const auto& p : before.each) {
      if (p.pid != worker.pid() && p.cpu_ticks >= 2 * ticks) child = p.pid;
    }
    if (child) break;
  }
  ASSERT_NE(child, 0) << "the child ran 2 s within 30 s";
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  std::this_thread::sleep_for(1s);
  const ProcessActivity after = read_activity(worker.pid());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(after.processes, 1) << "the child reaped";
  EXPECT_LT(after.cpu_ticks, before.cpu_ticks) << "the sums fell";
  EXPECT_GT(cpu_share(before, after, seconds), 0.2) << "the worker itself spun all along";
}

TEST(ThreadRun, AThreadAsleepInTheKernelWaitedThere) {
  Child sleeper([] {
    for (;;) ::pause();
  });
  // The first reading may catch the child on its way into pause(): a few tries.
  bool waited = false;
  for (int i = 0; i < 5 && !waited; ++i) waited = sleeper.main_thread_waited_in_kernel(300ms);
  EXPECT_TRUE(waited);
  const auto run = read_thread_run(sleeper.pid(), sleeper.pid());
  ASSERT_TRUE(run);
  EXPECT_EQ(run->state, 'S');
}

TEST(ThreadRun, AThreadThatRunsNeverWaitedInTheKernel) {
  Child spinner([] { spin(); });
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(spinner.main_thread_waited_in_kernel(300ms));
  const auto run = read_thread_run(spinner.pid(), spinner.pid());
  ASSERT_TRUE(run);
  EXPECT_EQ(run->state, 'R');
  EXPECT_GT(run->on_cpu, 0ns);
}

TEST(ThreadRun, TheMainThreadIsReadNotTheProcess) {
  // The main thread blocked in a read while another thread of the process runs: the main thread
  // waited in the kernel (a worker whose main thread waits in a collective while a thread of its
  // own computes).
  int never[2];
  ASSERT_EQ(::pipe(never), 0);
  Child busy([&] {
    std::thread([] { spin(); }).detach();
    char byte = 0;
    for (;;) (void)!::read(never[0], &byte, 1);
  });
  bool waited = false;
  for (int i = 0; i < 5 && !waited; ++i) waited = busy.main_thread_waited_in_kernel(300ms);
  EXPECT_TRUE(waited);
  ::close(never[0]);
  ::close(never[1]);
}

// Two processes that compute on the one CPU they may use: each waits for it about half the time it
// could run (more with other load on that CPU), which is what tells the hang detector that its
// workers' steps are set by the scheduler (hang_detector.cc, cpus_oversubscribed).
TEST(CpuUse, TwoProcessesComputingOnOneCpuEachWaitForIt) {
  cpu_set_t mine;
  ASSERT_EQ(::sched_getaffinity(0, sizeof mine, &mine), 0);
  int cpu = 0;
  while (!CPU_ISSET(cpu, &mine)) ++cpu;
  const auto pinned_spin = [cpu] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (::sched_setaffinity(0, sizeof one, &one) != 0) ::_exit(3);
    spin();
  };
  if (!read_cpu_use(::getpid())) {
    GTEST_SKIP() << "this kernel keeps no scheduler statistics (/proc/<pid>/schedstat)";
  }
  Child a(pinned_spin), b(pinned_spin);
  Child idle([] {
    for (;;) ::pause();
  });
  const auto before_a = read_cpu_use(a.pid());
  const auto before_b = read_cpu_use(b.pid());
  const auto before_idle = read_cpu_use(idle.pid());
  std::this_thread::sleep_for(800ms);
  const auto after_a = read_cpu_use(a.pid());
  const auto after_b = read_cpu_use(b.pid());
  const auto after_idle = read_cpu_use(idle.pid());
  ASSERT_TRUE(before_a && before_b && before_idle && after_a && after_b && after_idle);
  for (const auto& [before, after] : {std::pair{*before_a, *after_a}, {*before_b, *after_b}}) {
    const auto ran = after.ran - before.ran;
    const auto waited = after.waited - before.waited;
    // (Each runs about 400 ms of the 800 on an idle CPU; on a loaded machine, whose other
    // processes share that CPU too, far less: 90 ms once, with a test run beside it.)
    EXPECT_GT(ran, 20ms);
    EXPECT_GT(waited, 100ms);
    EXPECT_GE(static_cast<double>(waited.count()) / static_cast<double>((ran + waited).count()),
              0.3);
  }
  EXPECT_LT(after_idle->ran - before_idle->ran, 50ms);
  EXPECT_LT(after_idle->waited - before_idle->waited, 50ms);
}

TEST(CpuUse, AProcessThatIsGoneHasNoReading) {
  pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ::waitpid(gone, nullptr, 0);
  EXPECT_FALSE(read_cpu_use(gone));
}

TEST(ThreadRun, AThreadThatIsGoneHasNoReading) {
  pid_t gone = -1;
  {
    Child child([] {
      for (;;) ::pause();
    });
    gone = child.pid();
  }
  EXPECT_FALSE(read_thread_run(gone, gone));
}

}  // namespace
}  // namespace dist::agent

namespace dist::agent {
namespace {

// The child's reading once its main thread sleeps (waiting for `wanted` to be said, at most 30 s).
ProcessActivity asleep(const Child& child, bool wanted) {
  ProcessActivity a;
  for (const auto end = std::chrono::steady_clock::now() + 30s;
       std::chrono::steady_clock::now() < end; std::this_thread::sleep_for(5ms)) {
    a = read_activity(child.pid());
    if (a.state == 'S' && (!wanted || !a.awaits_input.empty())) break;
  }
  return a;
}

// A rank at a debugger's prompt or input() reads its terminal or its stdin: the hang report says
// it waits for input (a read of any other descriptor, or a sleep, is not that).
TEST(AwaitsInput, AReadOfATerminalOrOfStdinIsWaitingForInput) {
  {
    Child sleeping([] { ::pause(); });
    std::ifstream call("/proc/" + std::to_string(sleeping.pid()) + "/syscall");
    std::string number;
    if (!(call >> number)) {  // (Yama's ptrace_scope 2 or 3, a sandbox's /proc)
      GTEST_SKIP() << "a child's /proc/<pid>/syscall cannot be read here";
    }
  }
  const int terminal = ::posix_openpt(O_RDWR | O_NOCTTY);
  ASSERT_GE(terminal, 0);
  ASSERT_EQ(::grantpt(terminal), 0);
  ASSERT_EQ(::unlockpt(terminal), 0);
  const std::string name = ::ptsname(terminal);
  const int user_side = ::open(name.c_str(), O_RDWR | O_NOCTTY);
  ASSERT_GE(user_side, 0);
  {
    Child at_terminal([&] {
      char c;
      [[maybe_unused]] ssize_t n = ::read(user_side, &c, 1);
    });
    EXPECT_EQ(asleep(at_terminal, true).awaits_input, "at its terminal (" + name + ")");
  }
  int keyboard[2], other[2];
  ASSERT_EQ(::pipe(keyboard), 0);
  ASSERT_EQ(::pipe(other), 0);
  {
    Child on_stdin([&] {
      ::dup2(keyboard[0], STDIN_FILENO);
      char c;
      [[maybe_unused]] ssize_t n = ::read(STDIN_FILENO, &c, 1);
    });
    EXPECT_TRUE(asleep(on_stdin, true).awaits_input.starts_with("on its stdin (pipe:["));
  }
  {
    Child on_a_pipe([&] {
      char c;
      [[maybe_unused]] ssize_t n = ::read(other[0], &c, 1);
    });
    EXPECT_EQ(asleep(on_a_pipe, false).awaits_input, "");
  }
  {
    Child sleeping([] { ::pause(); });
    EXPECT_EQ(asleep(sleeping, false).awaits_input, "");
  }
  for (const int fd : {terminal, user_side, keyboard[0], keyboard[1], other[0], other[1]}) {
    ::close(fd);
  }
}

// A rank waiting for a child of its own to end (subprocess.run) says which child (the hang report
// said it "does nothing"); a sleep of its own is no such wait.
TEST(AwaitsChild, AWaitForAChildOfItsOwnSaysWhichChild) {
  Child parent([] {
    const pid_t kid = ::fork();
    if (kid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // ends with its parent, the test's child
      ::prctl(PR_SET_NAME, "sleeper");
      for (;;) ::pause();
    }
    ::waitpid(kid, nullptr, 0);
  });
  ProcessActivity a;
  for (const auto end = std::chrono::steady_clock::now() + 30s;
       std::chrono::steady_clock::now() < end &&
       a.awaits_child.find("sleeper") == std::string::npos;
       std::this_thread::sleep_for(5ms)) {
    a = read_activity(parent.pid());
  }
  EXPECT_TRUE(a.awaits_child.starts_with("its child ")) << a.awaits_child;
  EXPECT_TRUE(a.awaits_child.ends_with(" (sleeper)")) << a.awaits_child;
  Child sleeping([] { ::pause(); });
  EXPECT_EQ(asleep(sleeping, false).awaits_child, "");
}

// A rank blocked writing to a reader that takes no more (a log service that reads slowly), or
// reading a socket, says the socket's peer; Python waits on a socket with a timeout in poll().
TEST(BlockedOn, AWriteOrAReadOfASocketOrAPollForOneSaysThePeer) {
  {
    Child sleeping([] { ::pause(); });
    std::ifstream call("/proc/" + std::to_string(sleeping.pid()) + "/syscall");
    std::string number;
    if (!(call >> number)) GTEST_SKIP() << "a child's /proc/<pid>/syscall cannot be read here";
  }
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t length = sizeof address;
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string peer = "127.0.0.1:" + std::to_string(ntohs(address.sin_port));
  const auto connected = [&] {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(::connect(s, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    return s;
  };
  const auto blocked = [](const Child& child) {
    ProcessActivity a;
    for (const auto end = std::chrono::steady_clock::now() + 30s;
         std::chrono::steady_clock::now() < end && a.blocked_on.empty();
         std::this_thread::sleep_for(5ms)) {
      a = read_activity(child.pid());
    }
    return a;
  };
  const int writer = connected();
  const int accepted = ::accept(listener, nullptr, nullptr);  // and never read
  {
    Child writing([&] {
      std::vector<char> chunk(1 << 20, 'x');
      for (;;) [[maybe_unused]] ssize_t n = ::send(writer, chunk.data(), chunk.size(), 0);
    });
    const ProcessActivity a = blocked(writing);
    EXPECT_EQ(a.blocked_on, "writing to a socket to " + peer);
    EXPECT_TRUE(a.blocked_writing);
    EXPECT_EQ(a.awaits_input, "");
  }
  {
    Child polling([&] {  // the socket is full: as Python's sendall with a timeout waits
      pollfd p{writer, POLLOUT, 0};
      for (;;) ::poll(&p, 1, 60'000);
    });
    const ProcessActivity a = blocked(polling);
    EXPECT_EQ(a.blocked_on, "writing to a socket to " + peer);
    EXPECT_TRUE(a.blocked_writing);
  }
  const int reader = connected();
  const int quiet = ::accept(listener, nullptr, nullptr);  // and never write
  {
    Child reading([&] {
      char c;
      for (;;) [[maybe_unused]] ssize_t n = ::recv(reader, &c, 1, 0);
    });
    const ProcessActivity a = blocked(reading);
    EXPECT_EQ(a.blocked_on, "reading from a socket to " + peer);
    EXPECT_FALSE(a.blocked_writing);
  }
  {
    Child sleeping([] { ::pause(); });  // no descriptor
    EXPECT_EQ(asleep(sleeping, false).blocked_on, "");
  }
  for (const int fd : {listener, writer, accepted, reader, quiet}) ::close(fd);
}

// The stack signal's handler (SA_RESTART) breaks a poll() or a sleep of C code that holds the GIL
// (EINTR: a job failed of it); a read or a lock goes on after it.
TEST(RestartsAfterAHandler, AReadOrALockDoesAPollOrASleepDoesNot) {
  {
    Child sleeping([] { ::pause(); });
    std::ifstream call("/proc/" + std::to_string(sleeping.pid()) + "/syscall");
    std::string number;
    if (!(call >> number)) GTEST_SKIP() << "a child's /proc/<pid>/syscall cannot be read here";
  }
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const auto in_call = [](const Child& child, long number) {
    for (const auto end = std::chrono::steady_clock::now() + 30s;
         std::chrono::steady_clock::now() < end; std::this_thread::sleep_for(5ms)) {
      std::ifstream call("/proc/" + std::to_string(child.pid()) + "/syscall");
      long n = -1;
      if (call >> n && n == number) return true;
    }
    return false;
  };
  {
    Child reading([&] {
      char c;
      for (;;) [[maybe_unused]] ssize_t n = ::read(pipe_fds[0], &c, 1);
    });
    ASSERT_TRUE(in_call(reading, SYS_read));
    EXPECT_TRUE(restarts_after_a_handler(reading.pid()));
  }
  {
    Child polling([&] {
      pollfd p{pipe_fds[0], POLLIN, 0};
      for (;;) ::poll(&p, 1, 60'000);
    });
#ifdef SYS_poll
    ASSERT_TRUE(in_call(polling, SYS_poll));
#else
    ASSERT_TRUE(in_call(polling, SYS_ppoll));
#endif
    EXPECT_FALSE(restarts_after_a_handler(polling.pid()));
  }
  {
    Child sleeping([] {
      for (;;) ::sleep(60);
    });
    ASSERT_TRUE(in_call(sleeping, SYS_clock_nanosleep) || in_call(sleeping, SYS_nanosleep));
    EXPECT_FALSE(restarts_after_a_handler(sleeping.pid()));
  }
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
}

}  // namespace
}  // namespace dist::agent
