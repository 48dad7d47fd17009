// The zygote of --warm-restart: a Python interpreter, on the workers' own interpreter, that has
// imported the heavy modules (torch, numpy, --preload's) once, and from which the Python workers of
// every attempt are forked (python/dist_launch/_zygote.py: the protocol, and how a forked worker
// becomes exactly what `python -u SCRIPT ARGS` would have started).
//
// The agent side: the zygote is the agent's child (clone_exec.h), dies with it
// (PR_SET_PDEATHSIG; it carries the job's marker, so the janitor finds it too), and talks over a
// SOCK_SEQPACKET socket. Starting it returns at once; its readiness (or its refusal: an import that
// failed, threads or CUDA started by the imports) and its exit (its pidfd, or the worker group's
// reaping loop: reaped()) arrive on the io_context and are passed to the listener. spawn() is
// synchronous and short: the worker's descriptors go over as SCM_RIGHTS, and the reply is the
// worker's pid, a process that is the agent's child by then (reparented to the agent, a child
// subreaper), in a process group of its own, that dies with the agent. Between requests the
// zygote forks standbys: workers forked ahead, the agent's children already, waiting for a
// request (a spawn is then a message, not two forks); it announces each ("standby <pid>").
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dist::agent::warm {

class ZygoteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a zygote is started with. Two specs that differ make two different zygotes.
struct ZygoteSpec {
  std::string python;                  // the workers' interpreter, as they run it (argv[0])
  std::string executable;              // python resolved on PATH
  std::vector<std::string> flags;      // the interpreter's options before the script, e.g. "-u"
  std::string script;                  // _zygote.py, written by the agent
  std::optional<std::string> preload;  // "MOD,MOD"; none: torch, torch._dynamo, numpy
  std::string path0;                   // the workers' sys.path[0]
  std::vector<std::string> env;        // the zygote's environment (what every worker shares)
  std::string env_file;  // where it is written for the zygote (a wrapper may change the real one)
  std::string log;       // the zygote's stdout and stderr go to this file
  std::vector<int> reset_signals;     // the agent's handled signals, back to SIG_DFL
  std::size_t command_line_room = 0;  // bytes a worker's command line may take (ps shows it)
  int standbys = 0;  // workers forked ahead of their requests (a spawn is then a message)
  bool operator==(const ZygoteSpec&) const = default;
};

// A worker to fork.
struct WorkerRequest {
  std::vector<std::string> argv;  // as the cold worker's: python -u SCRIPT ARGS
  std::vector<std::string> env;   // its whole environment
  std::string cwd;
  std::vector<std::pair<int, int>> fds;  // (descriptor here, its number in the worker): 0, 1, 2...
};

class Zygote {
 public:
  enum class State { kStarting, kReady, kFailed, kExited };
  using Listener = std::function<void(State)>;

  // Starts the interpreter; throws ZygoteError when it cannot even be run. `listener` hears of
  // each change of state (on the io_context; never from inside a call of this class).
  Zygote(boost::asio::io_context& io, ZygoteSpec spec, Listener listener);
  ~Zygote();  // SIGKILLs and reaps it
  Zygote(const Zygote&) = delete;
  Zygote& operator=(const Zygote&) = delete;

  State state() const { return state_; }
  pid_t pid() const { return pid_; }
  const ZygoteSpec& spec() const { return spec_; }
  // Why it failed or exited (its refusal, or its exit status and its log's last lines).
  const std::string& failure() const { return failure_; }
  // Once ready: what it preloaded and how long that took.
  const std::vector<std::string>& preloaded() const { return preloaded_; }
  double preload_seconds() const { return preload_seconds_; }
  // Once ready: whether the interpreter or a preloaded module's file changed since (an upgrade
  // in place): a worker forked from it would not be what a cold start now gives.
  bool stale() const;

  // The worker group's reaping loop (waitpid(-1)) reaped it: its exit status.
  void reaped(int status);
  // Workers it forked ahead of their requests, already this process's children, waiting; they
  // exit when the zygote does. True (and forgotten) when `pid` was one of them.
  const std::vector<pid_t>& standbys() const { return standbys_; }
  bool forget_standby(pid_t pid);

  // Forks a worker; returns its pid. Throws ZygoteError (the zygote is not ready, refused the
  // request, or did not answer within `timeout`: it is then killed and fails).
  pid_t spawn(const WorkerRequest& request, std::chrono::milliseconds timeout);

 private:
  struct FileIdentity {
    std::string path;
    dev_t device = 0;
    ino_t inode = 0;
    long long mtime_ns = 0;
    long long size = 0;
    bool operator==(const FileIdentity&) const = default;
  };
  static std::optional<FileIdentity> identify(const std::string& path);

  bool take_notice(const std::string& message);
  void await_message();
  void await_exit();
  void on_message();
  void on_exit();
  void exited(int status);
  void fail(std::string why);
  void notify(State state);
  std::string log_tail() const;

  boost::asio::io_context& io_;
  ZygoteSpec spec_;
  Listener listener_;
  State state_ = State::kStarting;
  pid_t pid_ = -1;
  bool reaped_ = false;
  int control_ = -1;  // our end of the control socket
  std::unique_ptr<boost::asio::posix::stream_descriptor> control_wait_;
  std::unique_ptr<boost::asio::posix::stream_descriptor> pidfd_wait_;  // null: no pidfd here
  std::string failure_;
  std::vector<std::string> preloaded_;
  double preload_seconds_ = 0;
  std::vector<FileIdentity> files_;  // the interpreter's and the preloaded modules'
  std::vector<pid_t> standbys_;
  std::shared_ptr<char> alive_ = std::make_shared<char>();
};

const char* to_string(Zygote::State state);

}  // namespace dist::agent::warm
