#include "health/worker_watchdogs.h"

#include <signal.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <fstream>

#include "dist/contract/worker_contract.h"
#include "health/agent_stall.h"
#include "processes/process.h"

namespace dist::agent {
namespace {

// Held stopped by the kernel (SIGSTOP, SIGTSTP, a tracer): /proc/<pid>/stat says T or t.
bool is_stopped(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return false;
  const auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return false;
  const char state = line[close + 2];
  return state == 'T' || state == 't';
}

std::string describe(const Worker& w) {
  return fmt::format("worker {} (local rank {}, pid {})", w.rank, w.local_rank, w.pid);
}

}  // namespace

WorkerWatchdogs::WorkerWatchdogs(boost::asio::io_context& io, const WatchdogOptions& options,
                                 Telemetry& telemetry, HangOptions hang, bool in_place,
                                 bool heartbeats_shown)
    : io_(io), options_(options), telemetry_(telemetry), stall_tick_(io) {
  if (options.file_timer) {
    const std::string path =
        options.timer_file.empty() ? default_timer_file_path() : options.timer_file;
    timers_.emplace(io, path, [this](const TimerExpiry& t) { on_timer_expired(t); });
    spdlog::info("serving torch's file timer at {} (TORCHELASTIC_TIMER_FILE)", path);
  }
  const bool hangs_found = !hang.timeout.off;
  if (hangs_found || in_place || options.worker_heartbeat_timeout.count() > 0 || heartbeats_shown) {
    heartbeats_.emplace(
        io, options.worker_heartbeat_timeout,
        [this](int local_rank, std::chrono::nanoseconds silent) { on_silent(local_rank, silent); });
  }
  if (hangs_found) {
    hang_.emplace(io, std::move(hang), *heartbeats_, telemetry,
                  [this](int local_rank, const std::string& reason, bool collateral,
                         std::chrono::nanoseconds silent) {
                    on_hung(local_rank, reason, collateral, silent);
                  });
  }
}

void WorkerWatchdogs::prepare(int local_rank, const std::filesystem::path& dir, Variables& env,
                              std::vector<int>& fds) {
  namespace contract = worker_contract;
  if (timers_) env["TORCHELASTIC_TIMER_FILE"] = timers_->path();
  if (heartbeats_) {
    const int fd = heartbeats_->open(local_rank);
    env[contract::heartbeat_slot::kFdVariable] = std::to_string(fd);
    fds.push_back(fd);
  }
  if (hang_) {
    if (static_cast<std::size_t>(local_rank) >= stack_files_.size()) {
      stack_files_.resize(static_cast<std::size_t>(local_rank) + 1);
    }
    stack_files_[static_cast<std::size_t>(local_rank)] = dir / "stacks.txt";
    env[contract::kStackSignalVariable] = std::to_string(stack_signal());
    env[contract::kStackFileVariable] = (dir / "stacks.txt").string();
  }
}

void WorkerWatchdogs::started(const Worker& worker) {
  if (!running_) {
    running_ = true;
    tick_for_stalls();
  }
  if (static_cast<std::size_t>(worker.local_rank) >= workers_.size()) {
    workers_.resize(static_cast<std::size_t>(worker.local_rank) + 1);
  }
  workers_[static_cast<std::size_t>(worker.local_rank)] = Watched{worker, true, "", false, nullptr};
  if (heartbeats_) heartbeats_->watch(worker.local_rank);
  if (hang_) hang_->started(worker, stack_files_.at(static_cast<std::size_t>(worker.local_rank)));
}

void WorkerWatchdogs::exited(int local_rank, bool succeeded) {
  // A worker's exit may be the first thing the agent sees after a stall (continued after its
  // workers, one ended meanwhile): seen from the tick, before the exit stops the timers.
  stall_seen_now(monotonic_now());
  if (static_cast<std::size_t>(local_rank) >= workers_.size()) return;
  Watched& w = workers_[static_cast<std::size_t>(local_rank)];
  w.running = false;
  w.abort_grace.reset();
  if (hang_) hang_->exited(local_rank, succeeded);
  if (heartbeats_) heartbeats_->forget(local_rank);
}

// The agent's stalls are seen by its timers coming late (agent_stall.h): while workers run, this
// tick comes every second and says when it is due next, so that whichever watchdog's handler runs
// first after a stall sees it from there.
void WorkerWatchdogs::tick_for_stalls() {
  const auto due = monotonic_now() + kProgressSampleInterval;
  expect_tick(due);
  stall_tick_.expires_after(kProgressSampleInterval);
  stall_tick_.async_wait(
      [this, due, alive = std::weak_ptr<char>(alive_)](const boost::system::error_code& ec) {
        if (ec || alive.expired() || !running_) return;
        agent_stalled(due, monotonic_now());
        tick_for_stalls();
      });
}

void WorkerWatchdogs::stopping() {
  stall_seen_now(monotonic_now());  // (a stop signal first after a stall, as exited())
  running_ = false;
  expect_tick(std::nullopt);
  stall_tick_.cancel();
  if (timers_) timers_->clear();
  if (hang_) hang_->stopping();
  if (heartbeats_) heartbeats_->forget_all();
}

void WorkerWatchdogs::regrouped(int round, int rank_offset) {
  for (auto& w : workers_) {
    w.worker.round = round;
    w.worker.rank = rank_offset + w.worker.local_rank;
  }
  if (hang_) hang_->regrouped(round, rank_offset);
}

void WorkerWatchdogs::ask_to_regroup(int round) {
  if (heartbeats_) heartbeats_->ask_to_regroup(round);
}

std::string WorkerWatchdogs::reason(int local_rank) const {
  if (static_cast<std::size_t>(local_rank) >= workers_.size()) return "";
  return workers_[static_cast<std::size_t>(local_rank)].reason;
}

bool WorkerWatchdogs::collateral(int local_rank) const {
  if (static_cast<std::size_t>(local_rank) >= workers_.size()) return false;
  return workers_[static_cast<std::size_t>(local_rank)].collateral;
}

std::vector<WorkerProgress> WorkerWatchdogs::progress() const {
  std::vector<WorkerProgress> out;
  for (const auto& w : workers_) {
    if (!w.running) continue;
    WorkerProgress p;
    p.worker = w.worker;
    if (heartbeats_) {
      p.silence = heartbeats_->silence(w.worker.local_rank);
      p.beats = heartbeats_->beats(w.worker.local_rank);
    }
    if (hang_) hang_->fill(p);
    out.push_back(p);
  }
  return out;
}

void WorkerWatchdogs::job_view(const schema::JobView& view) {
  if (hang_) hang_->job_view(view);
}

// The worker whose process group holds `pid` (its own, or one it started there).
WorkerWatchdogs::Watched* WorkerWatchdogs::owner_of(pid_t pid) {
  const pid_t group = ::getpgid(pid);
  for (auto& w : workers_) {
    if (w.running && (w.worker.pid == pid || w.worker.pid == group)) return &w;
  }
  return nullptr;
}

void WorkerWatchdogs::on_timer_expired(const TimerExpiry& timer) {
  Watched* w = running_ ? owner_of(timer.pid) : nullptr;
  if (!w) {
    spdlog::warn(
        "file timer of pid {} (scope '{}') expired, but pid {} is not in a running worker's "
        "process group: not signalled",
        timer.pid, timer.scope_id, timer.pid);
    return;
  }
  telemetry_.timer_expired(w->worker, timer);
  if (timer.signal <= 0) {  // as torch: reported, nothing killed
    spdlog::warn("{}: file timer expired (scope '{}'); the request names no signal: not killed",
                 describe(w->worker), timer.scope_id);
    return;
  }
  w->reason = fmt::format("timer expired (scope '{}')", timer.scope_id);
  spdlog::error("{}: {}: sending {} to pid {}", describe(w->worker), w->reason,
                signal_name(timer.signal), timer.pid);
  ::kill(timer.pid, timer.signal);
}

void WorkerWatchdogs::on_silent(int local_rank, std::chrono::nanoseconds silent) {
  if (!running_ || static_cast<std::size_t>(local_rank) >= workers_.size()) return;
  Watched& w = workers_[static_cast<std::size_t>(local_rank)];
  if (!w.running) return;
  const double timeout_s = std::chrono::duration<double>(options_.worker_heartbeat_timeout).count();
  w.reason = fmt::format("no heartbeat for {:g} s (hung?)", timeout_s);
  const bool stopped = is_stopped(w.worker.pid);
  const int signal = stopped ? SIGKILL : SIGABRT;
  telemetry_.worker_hung(w.worker, silent, signal);
  spdlog::error("{}: {}: last beat {:.3f} s ago{}; sending {}", describe(w.worker), w.reason,
                std::chrono::duration<double>(silent).count(), stopped ? ", process stopped" : "",
                signal_name(signal));
  if (stopped) return signal_group(w.worker.pid, SIGKILL);
  ::kill(w.worker.pid, SIGABRT);
  w.abort_grace = std::make_unique<boost::asio::steady_timer>(io_, kHungWorkerAbortGrace);
  const pid_t pid = w.worker.pid;
  w.abort_grace->async_wait([this, local_rank, pid, alive = std::weak_ptr<char>(alive_)](
                                const boost::system::error_code& ec) {
    if (ec || alive.expired()) return;
    const Watched& still = workers_[static_cast<std::size_t>(local_rank)];
    if (!still.running || still.worker.pid != pid) return;
    spdlog::warn("{}: still running {} ms after SIGABRT: sending SIGKILL", describe(still.worker),
                 kHungWorkerAbortGrace.count());
    signal_group(pid, SIGKILL);
  });
}

// The hang detector's verdict: killed at once (its stacks are taken), the reason kept for the
// failure report.
void WorkerWatchdogs::on_hung(int local_rank, const std::string& reason, bool collateral,
                              std::chrono::nanoseconds silent) {
  if (!running_ || static_cast<std::size_t>(local_rank) >= workers_.size()) return;
  Watched& w = workers_[static_cast<std::size_t>(local_rank)];
  if (!w.running) return;
  w.reason = reason;
  w.collateral = collateral;
  telemetry_.worker_hung(w.worker, silent, SIGKILL);
  spdlog::error("{}: {}: sending SIGKILL", describe(w.worker), reason);
  signal_group(w.worker.pid, SIGKILL);
}

}  // namespace dist::agent
