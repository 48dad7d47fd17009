// dist-launch --hosts: this process is the job (hosts_job.h). One io_context runs the store, the
// signals (signalfd), every host's process and output. How the job ends:
//   - every agent said it succeeded: 0;
//   - an agent ended with a failure: if the job failed as a whole (the store says so: a worker's
//     failure, with no restart left, ends every agent, each on its own), the others are left to
//     end by themselves, bounded; otherwise (that host alone failed: a bad option there, a
//     rendezvous timeout) the others are told to stop. The exit code is that agent's;
//   - a host never ran its agent (ssh failed) or was lost (the agent died, its connection
//     dropped): the others are told to stop; 1, with a message naming the host;
//   - a stop signal here: forwarded to every agent; 128 + signal once they are gone.
// Agents told to stop that are still there after their --shutdown-timeout and kAgentStopGrace
// have their processes killed: a remote agent then loses its pipe and stops on its own.
#include "dist/launcher/hosts_job.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <utility>  // first: Asio 1.18's awaitable.hpp uses std::exchange without it

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <climits>
#include <filesystem>
#include <memory>

#include "dist/agent/agent_launch.h"
#include "dist/agent/signals.h"
#include "dist/store/errors.h"
#include "dist/store/token.h"
#include "hosts/host_agent.h"
#include "hosts/launch_plan.h"
#include "hosts/ssh_command.h"
#include "lifecycle/signal_watcher.h"
#include "processes/process.h"
#include "rendezvous/schema.h"
#include "store/store.h"

namespace dist::launcher {
using agent::AgentLaunch;
using agent::Console;
using agent::encode_agent_launch;
using agent::is_forward_only;
using agent::kRemoteAgentCommand;
using agent::make_rendezvous_store;
using agent::signal_name;
using agent::SignalWatcher;
using agent::StoreHost;
using agent::Task;
using agent::TcpStoreTarget;
using agent::this_host;
namespace schema = agent::schema;
namespace asio = boost::asio;

namespace {

constexpr int kExitLaunchError = 1;
// Agents told to stop get their own --shutdown-timeout to stop their workers, and this much more
// to report and leave, before their processes are killed here.
constexpr std::chrono::milliseconds kAgentStopGrace{10'000};
// After the job failed as a whole, how long the other agents get to end by themselves beyond
// --shutdown-timeout (each stops its workers, collects every node's failures, reports).
constexpr std::chrono::milliseconds kJobEndGrace{10'000};
// Reading the job's state from the store this process hosts (a loopback connection).
constexpr std::chrono::milliseconds kOwnStoreTimeout{5'000};

std::string this_executable() {
  std::error_code ec;
  const auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "/proc/self/exe" : path.string();
}

}  // namespace

bool is_launching_host(const std::string& host) {
  if (host == "localhost" || host == "127.0.0.1" || host == "::1") return true;
  const std::string name = this_host();
  return host == name || host == name.substr(0, name.find('.'));
}

class HostsJob {
 public:
  explicit HostsJob(const HostsJobConfig& config)
      : config_(config), signals_(io_, watched_signals(config)), stop_timer_(io_) {}
  ~HostsJob() { shut_down(); }
  HostsJob(const HostsJob&) = delete;
  HostsJob& operator=(const HostsJob&) = delete;

  int run() {
    signals_.start([this](SignalWatcher::Received r) { on_signal(r); });
    if (start()) io_.run();
    shut_down();
    if (stop_signal_ != 0) return 128 + stop_signal_;
    if (launch_error_) return kExitLaunchError;
    return job_exit_code_;
  }

 private:
  static std::vector<int> watched_signals(const HostsJobConfig& config) {
    std::vector<int> s = agent::take_handled_signals(config.signals_to_handle);
    s.push_back(SIGCHLD);
    return s;
  }

  // What every host's agent is told of the console its workers' lines end on: this one.
  AgentLaunch::Console console_view() const {
    AgentLaunch::Console view;
    view.one_stream = console_->one_stream();
    winsize size{};
    if (console_->is_terminal(agent::ConsoleStream::kStdout) &&
        ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0) {
      view.columns = size.ws_col;
      view.lines = size.ws_row;
    }
    return view;
  }

  // The store (several hosts), then every host's agent at once: ssh connections are slow (key
  // exchange), and made one after another they would add up.
  bool start() {
    const std::size_t nodes = config_.hosts.size();
    std::uint16_t store_port = 0;
    HostsJobConfig job = config_;
    if (job.token.empty()) job.token = store::generate_secret();
    token_ = job.token;
    if (nodes > 1) {
      store::ServerOptions options;
      options.secret = job.token;  // every agent proves it; workers as `unauthenticated` says
      options.unauthenticated = job.unauthenticated;
      options.keepalive = {config_.keep_alive_interval_seconds, config_.keep_alive_interval_seconds,
                           std::max(1, config_.keep_alive_max_attempt - 1)};
      try {
        store_.emplace(io_, "", config_.master_port.value_or(0), options);
      } catch (const store::StoreError& e) {
        spdlog::error("cannot host the job's rendezvous store: {}", e.what());
        launch_error_ = true;
        return false;
      }
      store_port = store_->port();
    }
    const std::string launcher_host = this_host();
    const std::string self = this_executable();
    const std::string remote = remote_agent_command(config_.remote_command);
    spdlog::info("job {}: {} host{}{}", config_.run_id, nodes, nodes == 1 ? "" : "s",
                 store_ ? ", store on " + store_->bound_address() : "");
    for (std::size_t rank = 0; rank < nodes; ++rank) {
      const std::string& name = config_.hosts[rank].name;
      const bool local = is_launching_host(name);
      const std::vector<std::string> argv =
          local ? std::vector<std::string>{self, kRemoteAgentCommand}
                : ssh_command_line(config_.ssh, name, remote, config_.keep_alive_interval_seconds,
                                   config_.keep_alive_max_attempt);
      auto& agent = agents_.emplace_back(std::make_unique<HostAgent>(io_, console_, name, !local));
      AgentLaunch launch = plan_agent_launch(job, rank, store_port, launcher_host, local);
      launch.console = console_view();
      try {
        agent->start(argv, encode_agent_launch(launch), [this, a = agent.get()] { on_end(*a); });
      } catch (const std::exception& e) {
        spdlog::error("{}", e.what());
        launch_error_ = true;
        stop_all(SIGTERM);
        break;
      }
      spdlog::debug("host {} (node {}): {}", name, rank, local ? "this host" : argv.front());
    }
    return !all_ended();
  }

  void on_signal(const SignalWatcher::Received& r) {
    const int signal = r.signal;
    if (signal == SIGCHLD) return reap();
    if (is_forward_only(signal)) {
      spdlog::info("forwarding {} to every host", signal_name(signal));
      for (auto& agent : agents_) agent->forward(signal);
      return;
    }
    const agent::StopSignal received{signal, r.sender, r.code, std::chrono::steady_clock::now()};
    if (stop_signal_ != 0) {
      if (agent::is_passed_on(first_stop_, received)) {
        spdlog::info("{} again: the same stop passed on, not a second one", signal_name(signal));
        return;
      }
      spdlog::warn("{} again: every host's agent kills its workers now", signal_name(signal));
      for (auto& agent : agents_) agent->forward(signal);
      return;
    }
    stop_signal_ = signal;
    first_stop_ = received;
    console_->hurry();  // told to stop: a slow reader of the console is not waited for at exit
    spdlog::warn("{} received: stopping every host's agent (grace period {} ms)",
                 signal_name(signal), config_.shutdown_timeout.count());
    mark_stopping(signal);
    stop_all(signal);
  }

  void reap() {
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      for (auto& agent : agents_) {
        if (agent->pid() == pid && agent->running()) agent->reaped(status);
      }
    }
  }

  void on_end(HostAgent& agent) {
    // A host's own trouble is said whatever else happens; only what this process caused (a stop
    // signal here, a kill at the stop's deadline) is not.
    const bool caused_here = stop_signal_ != 0 || killed_;
    if (!agent.ready()) {
      if (!caused_here) {
        spdlog::error("{}", agent.start_failure(config_.remote_command));
        launch_error_ = true;
      }
      if (!stopping_) stop_all(SIGTERM);
    } else if (!agent.agent_exit()) {
      if (!caused_here) {
        const int status = agent.exit_status();
        const std::string what = agent.over_ssh() ? "ssh client" : "agent";
        spdlog::error(
            "lost host {}: its {} {} before the agent said it was done{}", agent.host(), what,
            WIFSIGNALED(status) ? "was killed by " + signal_name(WTERMSIG(status))
                                : "ended with exit code " + std::to_string(WEXITSTATUS(status)),
            stopping_ ? "" : ": stopping the other hosts");
        launch_error_ = true;
      }
      if (!stopping_) stop_all(SIGTERM);
    } else if (*agent.agent_exit() != 0 && job_exit_code_ == 0) {
      job_exit_code_ = *agent.agent_exit();
      if (!stopping_) launch(failed_as_a_whole(), agent.host());
    }
    if (all_ended()) io_.stop();
  }

  // The stop, in the store before it reaches any host: an agent that sees another leave first
  // (that host had the signal sooner) reads why, and stops as told rather than fails.
  void mark_stopping(int signal) {
    if (!store_) return;
    try {
      store_->set_agent_keys(config_.run_id,
                             {{std::string(schema::kLauncherStop), std::to_string(signal)}});
    } catch (const store::StoreError& e) {
      spdlog::debug("cannot mark the job stopping in its store: {}", e.what());
    }
  }

  // Whether the job failed for every host (an agent marked it over: the others end by
  // themselves), or for that host alone.
  Task<bool> failed_as_a_whole() {
    store::ClientOptions options;
    options.host = "127.0.0.1";
    options.port = store_->port();
    options.connect_timeout = kOwnStoreTimeout;
    options.timeout = kOwnStoreTimeout;
    options.secret = token_;  // the agents' keys are for authenticated clients only
    auto store = make_rendezvous_store(io_, TcpStoreTarget{options}, config_.run_id);
    co_await store->open();
    const bool over = (co_await store->try_get(std::string(schema::kJobOver))).has_value();
    store->close();
    co_return over;
  }

  void launch(Task<bool> task, std::string host) {
    if (!store_) return stop_others_after(host, false);  // one host: no one else
    asio::co_spawn(io_, std::move(task), [this, host](std::exception_ptr e, bool over) {
      if (e) over = false;  // cannot tell: stopping the others is safe
      stop_others_after(host, over);
    });
  }

  void stop_others_after(const std::string& host, bool job_over) {
    if (stopping_ || all_ended()) return;
    if (!job_over) {
      spdlog::warn("host {}'s agent ended with exit code {}: stopping the other hosts", host,
                   job_exit_code_);
      return stop_all(SIGTERM);
    }
    // Every agent ends by itself; should one not, it is stopped like the rest would be.
    arm_stop_timer(config_.shutdown_timeout + kJobEndGrace, [this] {
      spdlog::warn("the job failed, and some hosts' agents have not ended yet: stopping them");
      stop_all(SIGTERM);
    });
  }

  void stop_all(int signal) {
    stopping_ = true;
    for (auto& agent : agents_) agent->forward(signal);
    arm_stop_timer(config_.shutdown_timeout + kAgentStopGrace, [this] {
      for (auto& agent : agents_) {
        if (!agent->running()) continue;
        spdlog::warn("host {}'s agent did not stop in time: killing its {}", agent->host(),
                     is_launching_host(agent->host()) ? "process" : "ssh client");
        killed_ = true;
        agent->kill();
      }
    });
  }

  template <typename Then>
  void arm_stop_timer(std::chrono::milliseconds after, Then then) {
    stop_timer_.expires_after(after);
    stop_timer_.async_wait([then](const boost::system::error_code& ec) {
      if (!ec) then();
    });
  }

  bool all_ended() const {
    for (const auto& agent : agents_) {
      if (agent->pid() > 0 && !agent->ended()) return false;
    }
    return true;
  }

  // Whatever still runs is killed (only a path that missed the end gets here with a process),
  // then the cancelled handlers run while the objects they use still exist.
  void shut_down() {
    if (shut_down_) return;
    shut_down_ = true;
    for (auto& agent : agents_) {
      if (!agent->running()) continue;
      agent->kill();
      int status = 0;
      while (::waitpid(agent->pid(), &status, 0) < 0 && errno == EINTR) {
      }
      agent->reaped(status);
    }
    stop_timer_.cancel();
    if (store_) store_->stop();
    signals_.cancel();
    io_.restart();
    while (io_.poll() > 0) {
    }
  }

  const HostsJobConfig& config_;
  std::string token_;  // the job's: given, or generated at the start
  std::shared_ptr<Console> console_ = Console::process();
  asio::io_context io_;  // first: destroyed last, after everything that uses it
  SignalWatcher signals_;
  asio::steady_timer stop_timer_;
  std::optional<StoreHost> store_;
  std::vector<std::unique_ptr<HostAgent>> agents_;  // by node rank
  bool stopping_ = false;
  bool launch_error_ = false;  // a host never ran its agent, or was lost
  bool shut_down_ = false;
  bool killed_ = false;  // agents' processes killed at the stop's deadline
  int stop_signal_ = 0;
  agent::StopSignal first_stop_;  // (the same passed on is no second one)
  int job_exit_code_ = 0;         // the first agent's that ended with a failure
};

int run_hosts_job(const HostsJobConfig& config) {
  if (config.hosts.empty()) {
    spdlog::error("no hosts to run the job on");
    return kExitLaunchError;
  }
  HostsJob job(config);
  return job.run();
}

}  // namespace dist::launcher
