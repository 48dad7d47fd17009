// One host's agent as dist-launch --hosts sees it: the process the launcher started for it (an ssh
// client running `dist-launch remote-agent` there, or that agent itself on this host), its stdin
// (the launch message, then control lines: agent_launch.h), and its output, passed to the console
// a whole line at a time. What ssh or the remote shell said before the agent ran is kept, to
// explain a start that failed.
#pragma once

#include <sys/types.h>

#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/agent/console.h"
#include "output/log_pump.h"

namespace dist::launcher {

class HostAgent {
 public:
  HostAgent(boost::asio::io_context& io, std::shared_ptr<agent::Console> console, std::string host,
            bool over_ssh);
  ~HostAgent();
  HostAgent(const HostAgent&) = delete;
  HostAgent& operator=(const HostAgent&) = delete;

  // Starts `argv` (searched on PATH) in a process group of its own, with the launch message on
  // its stdin. `on_end` runs once the process is reaped (reaped()) and its output drained. Throws
  // std::runtime_error when it cannot start.
  void start(const std::vector<std::string>& argv, std::string launch_message,
             std::function<void()> on_end);
  // A control line: the agent acts as if it had received `signal`.
  void forward(int signal);
  // Ends stdin: the agent stops, as when the launcher is gone.
  void hang_up();
  // SIGKILL to the process's group (the ssh client, or this host's agent: its janitor then kills
  // its workers).
  void kill();
  // The process exited with wait() status `status`.
  void reaped(int status);

  const std::string& host() const { return host_; }
  bool over_ssh() const { return over_ssh_; }
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !exited_; }
  bool ended() const { return ended_; }
  bool ready() const { return ready_; }                          // the agent said it runs
  std::optional<int> agent_exit() const { return agent_exit_; }  // the code it said it leaves with
  int exit_status() const { return status_; }  // the process's, as waitpid gave it
  // Why the agent never ran, naming the host: what ssh or the remote shell said, explained.
  std::string start_failure(const std::string& remote_command) const;
  // What ssh said last (for a connection lost after the agent ran); empty if nothing.
  std::string last_words() const;

 private:
  class Output;
  void write_next();
  void on_stderr_record(std::string_view record, std::string& batch);

  boost::asio::io_context& io_;
  std::shared_ptr<agent::Console> console_;
  std::string host_;
  bool over_ssh_;
  pid_t pid_ = -1;
  bool exited_ = false;
  bool ended_ = false;
  int status_ = 0;
  bool ready_ = false;
  std::optional<int> agent_exit_;
  std::deque<std::string> early_lines_;  // stderr before the ready line (ssh's, the shell's)
  std::function<void()> on_end_;
  std::optional<boost::asio::posix::stream_descriptor> stdin_;
  std::deque<std::string> to_write_;
  bool writing_ = false;
  std::unique_ptr<Output> stdout_, stderr_;
};

}  // namespace dist::launcher
