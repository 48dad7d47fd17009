#include "health/hang_detector.h"

#include <signal.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

namespace dist::agent {
namespace {

namespace slot = rendezvous::worker_contract::heartbeat_slot;
namespace fs = std::filesystem;

constexpr std::chrono::milliseconds kDumpPoll{50};
constexpr std::size_t kMaxStackBytes = 256 * 1024;  // read of one dump

double seconds(std::chrono::nanoseconds d) {
  return std::chrono::duration<double>(d).count();
}

std::string read_small(const fs::path& path) {
  std::ifstream in(path);
  std::string text;
  std::getline(in, text, '\0');
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// /proc/<pid>/stat's state letter ('?' when the process is gone).
char process_state(pid_t pid) {
  const std::string stat = read_small("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?';
}

// Whether `pid` catches `signal` (/proc/<pid>/status SigCgt): a realtime signal nobody catches
// would end the process.
bool catches(pid_t pid, int signal) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("SigCgt:")) continue;
    const unsigned long long mask = std::strtoull(line.c_str() + 7, nullptr, 16);
    return (mask >> (signal - 1)) & 1ULL;
  }
  return false;
}

std::uintmax_t size_of(const fs::path& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  return ec ? 0 : size;
}

std::string read_from(const fs::path& path, std::uintmax_t offset) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(offset));
  std::string text(kMaxStackBytes, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  return text;
}

std::string describe(const WorkerRef& w) {
  return fmt::format("rank {} (local rank {}, pid {})", w.rank, w.local_rank, w.pid);
}

}  // namespace

int stack_signal() {
  return SIGRTMAX - 5;  // clear of glibc's and of the realtime signals programs commonly take
}

HangDetector::HangDetector(boost::asio::io_context& io, HangOptions options,
                           const HeartbeatMonitor& slots, Telemetry& telemetry, Kill kill)
    : io_(io),
      options_(std::move(options)),
      slots_(slots),
      telemetry_(telemetry),
      kill_(std::move(kill)),
      sampler_(io),
      investigation_(io) {}

void HangDetector::started(const WorkerRef& worker, fs::path stack_file) {
  Watched& w = workers_[worker.local_rank];
  w = Watched{};
  w.worker = worker;
  w.stack_file = std::move(stack_file);
  w.running = true;
  if (!running_) {
    running_ = true;
    quiet_since_ = monotonic_now();
    stragglers_.clear();
    arm_sample();
  }
}

void HangDetector::exited(int local_rank) {
  const auto it = workers_.find(local_rank);
  if (it != workers_.end()) it->second.running = false;
}

void HangDetector::stopping() {
  running_ = false;
  investigating_ = false;
  sampler_.cancel();
  investigation_.cancel();
  for (auto& [_, w] : workers_) w.running = false;
}

void HangDetector::arm_sample() {
  sampler_.expires_after(kProgressSampleInterval);
  sampler_.async_wait(
      [this, alive = std::weak_ptr<char>(alive_)](const boost::system::error_code& ec) {
        if (ec || alive.expired() || !running_) return;
        sample();
        arm_sample();
      });
}

void HangDetector::sample() {
  const auto now = monotonic_now();
  std::map<int, std::optional<double>> own_work, step_time;
  bool every_rank_measures_work = true;
  std::optional<std::pair<std::chrono::nanoseconds, std::chrono::nanoseconds>> overdue;
  for (auto& [local_rank, w] : workers_) {
    const slot::Slot* s = w.running ? slots_.slot(local_rank) : nullptr;
    if (!s) continue;
    w.history.add(read_slot(*s, now));
    own_work[w.worker.rank] = w.history.work_seconds_per_step();
    every_rank_measures_work = every_rank_measures_work && own_work[w.worker.rank].has_value();
    const auto rate = w.history.steps_per_second();
    if (rate && *rate > 0) step_time[w.worker.rank] = 1 / *rate;
    const auto timeout = w.history.hang_timeout(options_.timeout);
    const auto last = w.history.last().last_progress();
    if (!timeout || !last) continue;
    const auto silent = now - std::max(*last, quiet_since_);
    if (silent >= *timeout && (!overdue || silent > overdue->first)) overdue = {{silent, *timeout}};
  }
  for (const auto& change : stragglers_.update(every_rank_measures_work ? own_work : step_time)) {
    const auto it = std::find_if(workers_.begin(), workers_.end(), [&](const auto& entry) {
      return entry.second.worker.rank == change.rank;
    });
    if (it == workers_.end()) continue;
    const char* what = every_rank_measures_work ? "work per step" : "step time";
    if (change.straggler) {
      spdlog::warn("{} is a straggler: its {} is {:.2f}x the other ranks' median",
                   describe(it->second.worker), what, change.ratio);
    } else {
      spdlog::info("{} is no longer a straggler ({} {:.2f}x the median)",
                   describe(it->second.worker), what, change.ratio);
    }
    telemetry_.straggler(it->second.worker, change.straggler, change.ratio, what);
  }
  if (overdue && !investigating_) investigate(overdue->first, overdue->second);
}

void HangDetector::investigate(std::chrono::nanoseconds silent, std::chrono::nanoseconds timeout) {
  investigating_ = true;
  silent_ = silent;
  timeout_ = timeout;
  spdlog::warn("no progress for {:.1f} s (hang timeout {:.1f} s): looking at where every rank is",
               seconds(silent), seconds(timeout));
  look(/*first=*/true);
}

// Reads every running rank's slot and state, and asks those that can for their stacks.
void HangDetector::look(bool first) {
  const auto now = monotonic_now();
  const int signal = stack_signal();
  for (auto& [local_rank, w] : workers_) {
    const slot::Slot* s = w.running ? slots_.slot(local_rank) : nullptr;
    if (!s) {
      w.look.reset();
      continue;
    }
    const SlotReading reading = read_slot(*s, now);
    if (first) {
      w.look = RankLook{};
      w.look->worker = w.worker;
      w.look->first = reading;
    } else if (!w.look) {
      continue;  // started meanwhile: not part of this look
    }
    w.look->second = reading;
    const auto dumper = static_cast<pid_t>(reading.dump_pid);
    const bool ours = dumper > 0 && (dumper == w.worker.pid || ::getpgid(dumper) == w.worker.pid);
    const pid_t watched = ours ? dumper : w.worker.pid;
    w.look->state = process_state(watched);
    if (watched != w.worker.pid && process_state(w.worker.pid) == 'T') w.look->state = 'T';
    w.look->wchan = read_small("/proc/" + std::to_string(watched) + "/wchan");
    if (w.look->wchan == "0") w.look->wchan.clear();
    w.stacks_offset = size_of(w.stack_file);
    w.signalled = ours && (reading.features & slot::kStacksOnSignal) && catches(dumper, signal) &&
                  ::kill(dumper, signal) == 0;
  }
  await_dumps(first, std::chrono::steady_clock::now() + kStackDumpWait);
}

bool HangDetector::dumps_arrived() const {
  return std::all_of(workers_.begin(), workers_.end(), [](const auto& entry) {
    const Watched& w = entry.second;
    return !w.look || !w.signalled || size_of(w.stack_file) > w.stacks_offset;
  });
}

// Waits for the signalled ranks' dumps (at most until `deadline`: a rank in the kernel's hold
// writes nothing), keeps what each wrote, and goes on: to the second look, or to the verdict.
void HangDetector::await_dumps(bool first, std::chrono::steady_clock::time_point deadline) {
  const bool arrived = dumps_arrived();
  const bool late = std::chrono::steady_clock::now() >= deadline;
  // One more poll after the last dump began, for the rest of it.
  investigation_.expires_after(kDumpPoll);
  investigation_.async_wait(
      [this, first, deadline, arrived, late,
       alive = std::weak_ptr<char>(alive_)](const boost::system::error_code& ec) {
        if (ec || alive.expired() || !running_ || !investigating_) return;
        if (!arrived && !late) return await_dumps(first, deadline);
        for (auto& [_, w] : workers_) {
          if (!w.look || !w.signalled) continue;
          std::string text = read_from(w.stack_file, w.stacks_offset);
          if (text.empty()) continue;
          (first ? w.look->stacks_first : w.look->stacks_second) = std::move(text);
        }
        if (!first) return conclude();
        investigation_.expires_after(kConfirmGap);
        investigation_.async_wait(
            [this, alive = std::weak_ptr<char>(alive_)](const boost::system::error_code& e) {
              if (e || alive.expired() || !running_ || !investigating_) return;
              look(/*first=*/false);
            });
      });
}

void HangDetector::conclude() {
  std::vector<RankLook> looks;
  std::vector<Watched*> ranks;
  for (auto& [_, w] : workers_) {
    if (!w.running || !w.look) continue;
    looks.push_back(*w.look);
    ranks.push_back(&w);
  }
  const HangFinding finding = examine(looks);
  if (finding.moving) {
    spdlog::info("not a hang: {}; the next look comes after another hang timeout", *finding.moving);
    quiet_since_ = monotonic_now();
    investigating_ = false;
    return;
  }
  act(finding, ranks);
}

std::string HangDetector::hang_reason() const {
  return fmt::format("no progress for {:.1f} s (hang timeout {:.1f} s)",
                     seconds(silent_ + kConfirmGap), seconds(timeout_));
}

void HangDetector::act(const HangFinding& finding, const std::vector<Watched*>& ranks) {
  const bool all_wait = std::all_of(finding.ranks.begin(), finding.ranks.end(),
                                    [](const RankWhere& r) { return r.waiting; });
  const bool none_known = std::none_of(
      finding.ranks.begin(), finding.ranks.end(),
      [](const RankWhere& r) { return r.waiting || r.where.rfind("no stack", 0) != 0; });
  std::string verdict;
  if (finding.any_cause()) {
    verdict = "the cause: the rank(s) marked";
  } else if (all_wait && options_.other_nodes) {
    verdict = fmt::format(
        "every rank here waits for a peer: a rank on another node? (killed in {} s unless its node "
        "finds it)",
        kVictimGrace.count());
  } else if (all_wait || none_known) {
    verdict = all_wait ? "every rank waits for another (a collective some never reached?)"
                       : "where they wait is unknown";
  } else {
    spdlog::warn(
        "no progress for {:.1f} s, but no rank here waits for another: not taken for a hang",
        seconds(silent_));
    quiet_since_ = monotonic_now();
    investigating_ = false;
    return;
  }
  std::string block = fmt::format("hang on {}: {}; {}. Where each rank was:", options_.host,
                                  hang_reason(), verdict);
  std::vector<HangRank> report;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const RankWhere& r = finding.ranks[i];
    block += fmt::format("\n  {}: {}{}", describe(ranks[i]->worker), r.where,
                         r.cause ? "   <- hung" : "");
    report.push_back({ranks[i]->worker, r.cause, r.waiting, r.where});
  }
  for (const auto* w : ranks) {
    if (w->look && (w->look->stacks_first || w->look->stacks_second)) {
      block += fmt::format("\n  stacks: {}",
                           w->stack_file.parent_path().parent_path().string() + "/*/stacks.txt");
      break;
    }
  }
  spdlog::error("{}", block);
  telemetry_.hang(report, silent_ + kConfirmGap, timeout_);
  investigating_ = false;
  std::vector<int> grace_ranks;
  std::vector<std::string> grace_reasons;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const RankWhere& r = finding.ranks[i];
    const int local_rank = ranks[i]->worker.local_rank;
    if (finding.any_cause()) {
      if (r.cause)
        kill_(local_rank, fmt::format("hung: {}; {}", r.where, hang_reason()), false, silent_);
    } else if (all_wait && options_.other_nodes) {
      grace_ranks.push_back(local_rank);
      grace_reasons.push_back(
          fmt::format("hung: {}, for a peer on another node; {}", r.where, hang_reason()));
    } else {
      kill_(local_rank, fmt::format("hung: {}; {}", r.where, hang_reason()), false, silent_);
    }
  }
  if (!grace_ranks.empty()) kill_after_grace(std::move(grace_ranks), std::move(grace_reasons));
}

void HangDetector::kill_after_grace(std::vector<int> local_ranks,
                                    std::vector<std::string> reasons) {
  investigating_ = true;  // no new look meanwhile
  investigation_.expires_after(kVictimGrace);
  investigation_.async_wait(
      [this, local_ranks = std::move(local_ranks), reasons = std::move(reasons),
       alive = std::weak_ptr<char>(alive_)](const boost::system::error_code& ec) {
        if (ec || alive.expired() || !running_) return;
        investigating_ = false;
        for (std::size_t i = 0; i < local_ranks.size(); ++i) {
          const auto it = workers_.find(local_ranks[i]);
          if (it != workers_.end() && it->second.running)
            kill_(local_ranks[i], reasons[i], true, silent_);
        }
      });
}

void HangDetector::fill(WorkerProgress& p) const {
  const auto it = workers_.find(p.worker.local_rank);
  if (it == workers_.end() || !it->second.running) return;
  const StepHistory& h = it->second.history;
  const SlotReading& r = h.last();
  p.steps = r.steps;
  if (r.last_step_ns != 0)
    p.since_step = monotonic_now() - std::chrono::nanoseconds(r.last_step_ns);
  p.step_seconds = h.step_seconds_p50();
  p.steps_per_second = h.steps_per_second();
  if (const auto timeout = h.hang_timeout(options_.timeout)) p.hang_timeout_s = seconds(*timeout);
  p.straggler = stragglers_.straggler(p.worker.rank);
  if (r.pending_since_ns != 0) {
    p.pending_collective =
        fmt::format("{} #{}", collective_name(r.pending_op), r.collectives_done + 1);
  }
}

}  // namespace dist::agent
