#include "health/hang_detector.h"

#include <sched.h>
#include <signal.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <thread>

#include "health/agent_stall.h"
#include "health/process_activity.h"
#include "rendezvous/rendezvous.h"

namespace dist::agent {
namespace {

namespace slot = worker_contract::heartbeat_slot;
namespace fs = std::filesystem;

// The CPUs this process may run on (its affinity: a cgroup's cpuset, taskset), as its workers.
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

constexpr std::chrono::milliseconds kDumpPoll{50};
constexpr std::size_t kMaxStackBytes = 256 * 1024;  // read of one dump
// A rank's work per step is compared each second only when that second's reading saw it step.
constexpr std::chrono::nanoseconds kFreshReading{0};

double seconds(std::chrono::nanoseconds d) {
  return std::chrono::duration<double>(d).count();
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

std::string describe(const Worker& w) {
  return fmt::format("rank {} (local rank {}, pid {})", w.rank, w.local_rank, w.pid);
}

}  // namespace

int stack_signal() {
  return SIGRTMAX - 5;  // clear of glibc's and of the realtime signals programs commonly take
}

HangDetector::HangDetector(boost::asio::io_context& io, HangOptions options,
                           HeartbeatMonitor& slots, Telemetry& telemetry, Kill kill)
    : io_(io),
      options_(std::move(options)),
      slots_(slots),
      telemetry_(telemetry),
      kill_(std::move(kill)),
      sampler_(io),
      investigation_(io) {}

void HangDetector::started(const Worker& worker, fs::path stack_file) {
  Watched& w = workers_[worker.local_rank];
  const bool again = w.worker.pid > 0 && w.worker.round == worker.round;
  w = Watched{};
  w.replacement = again;
  w.worker = worker;
  w.stack_file = std::move(stack_file);
  w.running = true;
  w.started_at = monotonic_now();
  if (!running_) {
    running_ = true;
    quiet_since_ = monotonic_now();
    episode_.reset();
    last_report_.clear();
    stragglers_.clear();
    arm_sample();
  }
}

void HangDetector::regrouped(int round, int rank_offset) {
  // Stragglers are told again in the new round, among its ranks: a flag of the old one is cleared
  // as it was raised, under the rank it named (the status page and the event log would otherwise
  // keep the worker flagged for good).
  clear_stragglers("the job regrouped, and its ranks are compared again in the new round");
  for (auto& [local_rank, w] : workers_) {
    w.worker.round = round;
    w.worker.rank = rank_offset + local_rank;
    w.replacement = false;  // a replacement of the last round is a survivor of this one
    w.look.reset();
  }
  // What was seen under the old numbers: the job view (its ranks are the last round's, this
  // node's own among them), a look under way, the stragglers (as after a restart).
  view_.reset();
  if (investigating_) {
    investigating_ = false;
    investigation_.cancel();
  }
}

void HangDetector::exited(int local_rank, bool succeeded) {
  const auto it = workers_.find(local_rank);
  if (it == workers_.end()) return;
  Watched& w = it->second;
  // Its last steps: a worker that ends right after its progress resumed made them since the last
  // sample, and a silence that ended is said as ended even when the job ends with it.
  const slot::Slot* s = w.running ? slots_.slot(local_rank) : nullptr;
  if (s) w.history.add(read_slot(*s, monotonic_now()));
  w.running = false;
  w.succeeded = succeeded;
  if (!episode_ || !running_) return;
  // Past the silence: every rank here stepped since, or ended with 0 (a rank that finishes its
  // evaluation and exits is not hung; a failed one, or one a watchdog ended, keeps it open).
  bool some_ended = false;
  for (const auto& [_, other] : workers_) {
    const auto last = other.history.last().last_progress();
    if (last && *last > *episode_) continue;
    if (!other.running && other.succeeded) {
      some_ended = true;
      continue;
    }
    return;
  }
  progress_resumed(monotonic_now(), some_ended);
}

void HangDetector::stopping() {
  running_ = false;
  investigating_ = false;
  sampler_.cancel();
  investigation_.cancel();
  for (auto& [_, w] : workers_) w.running = false;
  view_.reset();  // the next round's ranks are not this one's
}

void HangDetector::arm_sample() {
  const auto due = monotonic_now() + kProgressSampleInterval;
  sampler_.expires_after(kProgressSampleInterval);
  sampler_.async_wait(
      [this, due, alive = std::weak_ptr<char>(alive_)](const boost::system::error_code& ec) {
        if (ec || alive.expired() || !running_) return;
        if (agent_stalled(due, monotonic_now())) after_agent_stall();
        sample();
        arm_sample();
      });
}

// The agent did not run for a while (agent_stall.h): what was read before is stale. A look under
// way is dropped (its second reading would compare across the stall, and a worker not yet
// continued would look stopped), and a stop counts from when it is seen again.
void HangDetector::after_agent_stall() {
  if (investigating_) {
    investigating_ = false;
    investigation_.cancel();
    spdlog::info("the look at every rank begun before the agent's stall is dropped");
  }
  for (auto& [_, w] : workers_) {
    w.look.reset();
    w.stopped_since.reset();
  }
}

// A Python worker whose interpreter never loaded the hook (python -I, -E or -S; a wrapper that
// set its own PYTHONPATH): said once, since nothing of it can be seen.
void HangDetector::check_hook(Watched& w, const SlotReading& r, std::chrono::nanoseconds now) {
  if (!options_.python_workers || hook_missing_said_ || now - w.started_at < kHookLoadGrace ||
      (r.features & slot::kProgressHook)) {
    return;
  }
  hook_missing_said_ = true;
  spdlog::warn(
      "{}: dist-launch's progress hook is not in this Python worker (its interpreter ignored "
      "PYTHONPATH or site.py: python -I, -E or -S, or a wrapper set PYTHONPATH of its own): its "
      "steps are not counted and a hang in it goes unseen. Run the script with plain python, or "
      "call dist_launch.progress.install() in it",
      describe(w.worker));
}

void HangDetector::sample() {
  const auto now = monotonic_now();
  std::map<int, std::optional<double>> own_work, step_time;
  bool every_rank_measures_work = true;
  // The most silent overdue worker: its silence since the last look (quiet_since_) and since its
  // last progress, and its hang timeout.
  struct Overdue {
    std::chrono::nanoseconds since_look, since_progress, timeout;
  };
  std::optional<Overdue> overdue;
  std::optional<std::chrono::nanoseconds> least_recent;  // the oldest last progress, not paused
  for (auto& [local_rank, w] : workers_) {
    const slot::Slot* s = w.running ? slots_.slot(local_rank) : nullptr;
    if (!s) continue;
    SlotReading reading = read_slot(*s, now);
    if (const auto cpu = read_cpu_use(w.worker.pid)) {
      reading.on_cpu_ns = static_cast<std::uint64_t>(cpu->ran.count());
      reading.run_queue_ns = static_cast<std::uint64_t>(cpu->waited.count());
    }
    const SlotReading previous = w.history.last();
    w.history.add(reading);
    track_blocked(w, previous, reading);
    check_hook(w, reading, now);
    every_rank_measures_work = every_rank_measures_work && w.history.measures_work();
    own_work[w.worker.rank] = w.history.recent_work_seconds_per_step(kFreshReading);
    const auto rate = w.history.steps_per_second();
    if (rate && *rate > 0) step_time[w.worker.rank] = 1 / *rate;
    // (A rank in a pause it declared made no progress either: the others' since a report are
    // not every rank's.)
    const auto last = reading.last_progress();
    if (last && (!least_recent || *last < *least_recent)) least_recent = *last;
    if (reading.paused()) continue;  // a pause the worker declared is no silence
    const auto timeout = w.history.hang_timeout(options_.timeout);
    if (!timeout || !last) continue;
    // (Less the agent's own stalls: nobody watched then, and the worker was likely held too.)
    const auto silent = ran_since(std::max(*last, quiet_since_), now);
    if (silent >= *timeout && (!overdue || silent > overdue->since_look)) {
      overdue = Overdue{silent, ran_since(*last, now), *timeout};
    }
  }
  if (episode_ && (!least_recent || *least_recent > *episode_)) progress_resumed(now);
  // One node: its ranks against each other, every second. Several: the job view's turn.
  if (!options_.other_nodes) {
    if (cpus_oversubscribed()) {
      clear_stragglers(kWaitForCpus);
    } else {
      flag_stragglers(every_rank_measures_work ? own_work : step_time,
                      every_rank_measures_work ? "work per step" : "step time");
    }
  }
  if (investigating_) return;
  if (const auto held = held_stopped(now)) return investigate_stopped(*held);
  if (overdue) investigate(overdue->since_progress, overdue->timeout);
}

// More runnable threads than CPUs (8 workers on a 2-core machine, say): the median rank waits for
// a CPU kCpuWaitShare of the time it could run (entered there, left below kCpuWaitShareLeft, so
// that it does not flip from one reading to the next around it). Every step is slower for it, and
// which rank is the slowest is the scheduler's choice, a different one from one second to the
// next: by their work (wall-clock time), and by the CPU time they use too (a process preempted
// more often refills its caches more: 1.3x between identical ranks at 8 on 2 CPUs). No rank is
// taken for a straggler then. Said once.
bool HangDetector::crowded(std::optional<double> median_wait, bool& state, std::string_view who) {
  if (!median_wait) return state;
  if (*median_wait >= kCpuWaitShare) {
    state = true;
  } else if (*median_wait < kCpuWaitShareLeft) {
    state = false;
  }
  if (state && !cpu_wait_said_) {
    cpu_wait_said_ = true;
    const int cpus = usable_cpus();
    spdlog::info(
        "{} wait for a CPU {:.0f}% of the time they could run (more runnable threads than the {} "
        "CPU{} here): their steps are slower for it, and while it lasts ranks are not compared "
        "with each other (the scheduler, not a rank, sets which one is slower)",
        who, 100 * *median_wait, cpus, cpus == 1 ? "" : "s");
  }
  return state;
}

bool HangDetector::cpus_oversubscribed() {
  std::vector<double> shares;
  for (const auto& [local_rank, w] : workers_) {
    if (!w.running) continue;
    if (const auto share = w.history.cpu_wait_share()) shares.push_back(*share);
  }
  std::optional<double> median;
  if (!shares.empty()) {
    std::sort(shares.begin(), shares.end());
    median = shares[shares.size() / 2];
  }
  return crowded(median, crowded_here_, "the workers here");
}

// The ranks flagged before the machine became crowded are not stragglers now either: cleared, and
// said so (a flag that just stopped being updated would stand for the rest of the job).
void HangDetector::clear_stragglers(std::string_view why) {
  for (const auto& [_, w] : workers_) {
    if (!w.running || !stragglers_.straggler(w.worker.rank)) continue;
    const double ratio = stragglers_.ratio(w.worker.rank).value_or(0);
    spdlog::info("{} is no longer taken for a straggler: {}", describe(w.worker), why);
    telemetry_.straggler(w.worker, false, ratio, "work per step");
  }
  stragglers_.clear();
}

// A worker held stopped by a signal (SIGSTOP, SIGTSTP; /proc says T) cannot go on until someone
// continues it, and every peer waits for it in its next collective: proof, once it stood
// kStoppedProof (a stop and a continue within a moment is left alone), without waiting for a
// hang timeout. Returns the longest hold of such a worker. Not when every worker here is
// stopped: a pause of the node's job (a user's kill -STOP of the lot, a scheduler's suspend),
// said once, and ended only past the bound (conclude: paused_here), as any rank that does
// nothing. Unless ranks of other nodes are seen waiting
// in a collective well after that, or in their group's set-up since before it or as a replacement
// of a failed worker (waited_on): they wait for these, as for one stopped worker among running
// ones. A debugger's stop (t) is never one.
std::optional<std::chrono::nanoseconds> HangDetector::held_stopped(std::chrono::nanoseconds now) {
  if (options_.timeout.off) return std::nullopt;
  const Holds h = holds(now);
  if (h.stopped == 0) all_stopped_said_ = pause_look_said_ = false;
  if (h.stopped < h.running) return h.longest;
  // Every worker here stopped, the last `shortest` ago.
  if (h.longest && waited_on(*h.shortest)) return h.longest;
  // With other nodes, said once a view that could show them waiting came and did not.
  const auto unseen = kPauseSpread + 2 * kJobViewInterval;
  if (h.longest && !all_stopped_said_ && (!options_.other_nodes || *h.shortest >= unseen)) {
    all_stopped_said_ = true;
    spdlog::warn(
        "every worker on {} is held stopped (SIGSTOP or SIGTSTP): taken for a pause of the job, "
        "not ended while no other node's rank waits for them; continue them with SIGCONT",
        options_.host);
  }
  return std::nullopt;
}

// Whether ranks of other nodes wait for these, as a view made at least kPauseSpread after
// every worker here stopped (`stopped_for` ago) shows them: a pause of the whole job reaches its
// nodes within moments of each other, and a stopped rank is never published as waiting, so such
// a view of a paused job lists none. (The view's time is node 0's clock, the stop's this node's:
// the nodes' clocks are taken to agree within a second, as the heartbeats' times are.)
bool HangDetector::waited_on(std::chrono::nanoseconds stopped_for) const {
  if (!view_) return false;
  const double stopped_at =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() -
      seconds(stopped_for);
  if (view_->time < stopped_at + static_cast<double>(kPauseSpread.count())) return false;
  // A rank in its group's set-up counts when it waited from before the last of these was seen
  // stopped (a survivor or a regrouped rank that the stop caught mid-recovery), or replaces a
  // failed worker (a failure, no pause, brought it: its peer was stopped before or after). A
  // newcomer that came since may be the only process a pause of the job missed.
  const auto waits = waiting_elsewhere();
  return std::any_of(waits.begin(), waits.end(), [&](const schema::BlockedRank* b) {
    return !b->in_setup() || b->seq == schema::kSetupOfAReplacement ||
           view_->time - b->seconds <= stopped_at;
  });
}

// Whether the worker has been blocked in the same collective since the previous sample (the
// sampler still running, for torch's), how busy its process was meanwhile, and since when the
// kernel holds it stopped (one read of /proc/<pid>/stat for both).
void HangDetector::track_blocked(Watched& w, const SlotReading& previous, const SlotReading& now) {
  const auto stat = read_process_stat(w.worker.pid);
  const auto ticks = stat ? std::optional(stat->cpu_ticks) : std::nullopt;
  if (ticks && w.cpu_ticks && previous.at.count() > 0) {
    w.cpu_share = cpu_share(*w.cpu_ticks, *ticks, seconds(now.at - previous.at));
  }
  w.cpu_ticks = ticks;
  // Held stopped by a signal; a tracer's stop ('t': a debugger at a breakpoint) is not one.
  if (stat && stat->state == 'T') {
    if (!w.stopped_since) {
      w.stopped_since = now.at;
      spdlog::info("{} is held stopped (SIGSTOP or SIGTSTP)", describe(w.worker));
    }
  } else if (w.stopped_since) {
    // Said too, so that the log never ends on a stop that is over (a host's processes continued
    // one by one: the agent may see a worker still stopped a moment after itself).
    spdlog::info("{} runs again (seen stopped for {:.1f} s)", describe(w.worker),
                 seconds(now.at - *w.stopped_since));
    w.stopped_since.reset();
  }
  const bool same =
      now.pending_since_ns != 0 && now.pending_since_ns == previous.pending_since_ns &&
      now.pending_group == previous.pending_group && now.pending_seq == previous.pending_seq &&
      now.pending_op == previous.pending_op &&
      (now.pending_group == 0 || now.sampled_ns != previous.sampled_ns);
  w.blocked_readings = same ? w.blocked_readings + 1 : 0;
  const bool same_setup = now.setup_since_ns != 0 && now.setup_since_ns == previous.setup_since_ns;
  w.setup_readings = same_setup ? w.setup_readings + 1 : 0;
}

// Ranks flagged or cleared as stragglers: said, and into the event log. Only this node's ranks
// are said here (with several nodes, each node says its own).
void HangDetector::flag_stragglers(const std::map<int, std::optional<double>>& seconds_per_step,
                                   std::string_view measure) {
  for (const auto& change : stragglers_.update(seconds_per_step)) {
    const auto it = std::find_if(workers_.begin(), workers_.end(), [&](const auto& entry) {
      return entry.second.running && entry.second.worker.rank == change.rank;
    });
    if (it == workers_.end()) continue;
    const char* others = options_.other_nodes ? "the job's other ranks'" : "the other ranks'";
    if (change.straggler) {
      spdlog::warn("{} is a straggler: its {} is {:.2f}x {} median", describe(it->second.worker),
                   measure, change.ratio, others);
    } else {
      spdlog::info("{} is no longer a straggler ({} {:.2f}x the median)",
                   describe(it->second.worker), measure, change.ratio);
    }
    telemetry_.straggler(it->second.worker, change.straggler, change.ratio, measure);
  }
}

void HangDetector::job_view(const schema::JobView& view) {
  if (!running_) return;
  view_ = view;
  view_at_ = std::chrono::steady_clock::now();
  // Every rank's work per step as the view lists it; this node's own as measured now. None while
  // the job's median rank waits for a CPU (crowded).
  if (crowded(view.median_cpu_wait, crowded_job_, "the job's ranks"))
    return clear_stragglers(kWaitForCpus);
  std::map<int, std::optional<double>> work;
  for (const auto& [rank, seconds] : view.work) work[rank] = seconds;
  for (const auto& [_, w] : workers_) {
    if (w.running) work[w.worker.rank] = w.history.recent_work_seconds_per_step(kJobViewInterval);
  }
  flag_stragglers(work, "work per step");
}

// The other nodes' ranks the job view lists as waiting (in a collective, or in their group's
// set-up), from a view fresh enough to prove with.
std::vector<const schema::BlockedRank*> HangDetector::waiting_elsewhere() const {
  std::vector<const schema::BlockedRank*> waiting;
  if (!view_ || std::chrono::steady_clock::now() - view_at_ > 3 * kJobViewInterval) return waiting;
  for (const auto& b : view_->blocked) {
    const bool ours = std::any_of(workers_.begin(), workers_.end(), [&](const auto& entry) {
      return entry.second.running && entry.second.worker.rank == b.rank;
    });
    if (!ours) waiting.push_back(&b);
  }
  return waiting;
}

// The other nodes' ranks blocked in a collective, from a job view fresh enough to prove with.
std::vector<CollectiveState> HangDetector::elsewhere() const {
  std::vector<CollectiveState> states;
  for (const schema::BlockedRank* b : waiting_elsewhere()) {
    if (b->in_setup()) continue;
    CollectiveState c;
    c.rank = b->rank;
    for (const auto& [id, seq] : b->groups) {
      c.seqs[id] = seq;
      c.order.push_back(id);
    }
    c.sizes = b->sizes;
    // (No wait: it proves nothing, and the proofs drop it (conclude()), so that its groups lack
    // a member that stands still.)
    if (!b->threads) c.wait = CollectiveState::Wait{b->group, b->seq, b->op, b->seconds};
    states.push_back(std::move(c));
  }
  return states;
}

// Every rank made progress since the silence a report was made of: said, and the marks go.
void HangDetector::progress_resumed(std::chrono::nanoseconds now, bool some_ended) {
  const auto silent = now - *episode_;
  if (some_ended) {
    spdlog::info(
        "the suspected hang is over: every rank here made progress or exited with 0, {:.1f} s "
        "after the silence began",
        seconds(silent));
  } else {
    spdlog::info("progress again on every rank here, after {:.1f} s without it", seconds(silent));
  }
  telemetry_.hang_cleared(silent, some_ended);
  for (auto& [_, w] : workers_) w.reported.reset();
  episode_.reset();
  last_report_.clear();
}

void HangDetector::investigate(std::chrono::nanoseconds silent, std::chrono::nanoseconds timeout) {
  investigating_ = true;
  stopped_look_ = false;
  silent_ = silent;
  timeout_ = timeout;
  spdlog::log(last_report_.empty() ? spdlog::level::info : spdlog::level::debug,
              "no progress for {:.1f} s (hang timeout {:.1f} s): looking at where every rank is",
              seconds(silent), seconds(timeout));
  look(/*first=*/true);
}

// A rank held stopped (held_stopped): the same look at every rank, its second at once (no
// confirmation gap: a stopped process cannot move), so that the proof ends it within a few
// seconds of its stop, not a hang timeout later.
void HangDetector::investigate_stopped(std::chrono::nanoseconds held) {
  investigating_ = true;
  stopped_look_ = true;
  silent_ = held;
  timeout_ = kStoppedProof;
  spdlog::info("a worker is held stopped for {:.1f} s: looking at where every rank is",
               seconds(held));
  look(/*first=*/true);
}

// Reads every running rank's slot and processes, and asks those that can for their stacks (not
// a stopped one: it runs no handler until it is continued): in the slot, where the worker's
// sampler answers with every thread's (holding the GIL), else by the signal, for the main
// thread's (worker_contract.h).
void HangDetector::look(bool first) {
  const auto now = monotonic_now();
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
    ProcessActivity& activity = first ? w.look->before : w.look->after;
    activity = read_activity(w.worker.pid);
    const auto dumper = static_cast<pid_t>(reading.dump_pid);
    const bool ours = dumper > 0 && (dumper == w.worker.pid || ::getpgid(dumper) == w.worker.pid);
    if (!first && ours && dumper != w.worker.pid && w.look->after.state != 'T') {
      // The Python process under a wrapper is the one that hangs.
      const ProcessActivity inner = read_activity(dumper);
      if (inner.state == 'T' || inner.state == 'D') w.look->after.state = inner.state;
      if (w.look->after.wchan.empty()) w.look->after.wchan = inner.wchan;
      if (!inner.awaits_input.empty() || !inner.blocked_on.empty()) {  // over the wrapper's
        w.look->after.awaits_input = inner.awaits_input;
        w.look->after.blocked_on = inner.blocked_on;
        w.look->after.blocked_writing = inner.blocked_writing;
      }
    }
    const std::uintmax_t stack_size = size_of(w.stack_file);
    if (!first) w.look->stack_bytes = stack_size - std::min(stack_size, w.stacks_offset);
    w.stacks_offset = stack_size;
    w.asked = w.signalled = w.signal_due = false;
    w.main_thread.reset();
    if (!ours || activity.state == 'T') continue;
    const bool python = reading.features & slot::kProgressHook;
    if (python) w.main_thread = read_thread_run(dumper, dumper);
    if (reading.features & slot::kStacksOnAsk) {
      w.asked = slots_.ask_for_stacks(local_rank);
    } else if (python) {
      w.signal_due = reading.features & slot::kStacksOnSignal;
    } else if (reading.features & slot::kStacksOnSignal) {
      w.signalled = signal_for_stack(w);
    }
  }
  await_dumps(first, std::chrono::steady_clock::now() + kStackDumpWait);
}

// The stack signal, when the dumping process's handler is there (a realtime signal nobody
// catches would end the process): to a C++ worker as a process (the kernel picks a thread that
// does not block it: a trainer may take its signals on a thread of its own); to a Python worker's
// main thread (its tid is its pid), whose stack faulthandler writes, only when that thread has
// waited in the kernel since the look asked (a syscall, a lock, a GIL held by a deadlocked C
// call): the handler then runs where the thread returns from the kernel, its frames whole.
// faulthandler reads the interpreter's frames with nothing to stop them changing: a thread
// interrupted as it runs Python code can be in the middle of pushing or popping one, and the
// dump then follows pointers not yet or no longer valid (SIGSEGV: 3 runs in 39 of a healthy 3-rank
// DDP job signalled every 10 ms, CPython 3.11). A Python thread that is running is not stuck where
// a stack could tell more than the sampler's last look: it keeps its stack to itself.
bool HangDetector::signal_for_stack(const Watched& w) {
  const auto dumper = static_cast<pid_t>(w.look->second.dump_pid);
  const int signal = stack_signal();
  if (!catches(dumper, signal)) return false;
  if (!(w.look->second.features & slot::kProgressHook)) return ::kill(dumper, signal) == 0;
  const auto now = read_thread_run(dumper, dumper);
  if (!w.main_thread || !now || !thread_waited_in_kernel(*w.main_thread, *now)) {
    spdlog::debug("{}: its main thread is running (state {}): no stack signal", describe(w.worker),
                  now ? now->state : '?');
    return false;
  }
  // A call that a handler would break (a C call's poll() or sleep() under the GIL: EINTR) is
  // left alone: the report does without its stack.
  if (!restarts_after_a_handler(dumper)) {
    spdlog::debug("{}: its main thread waits in a call a signal would break: no stack signal",
                  describe(w.worker));
    return false;
  }
  return ::tgkill(dumper, dumper, signal) == 0;
}

bool HangDetector::dump_grew(const Watched& w) {
  return size_of(w.stack_file) > w.stacks_offset;
}

bool HangDetector::dumps_arrived() const {
  return std::all_of(workers_.begin(), workers_.end(), [](const auto& entry) {
    const Watched& w = entry.second;
    return !w.look || !(w.asked || w.signalled || w.signal_due) || dump_grew(w);
  });
}

// Waits for the signalled ranks' dumps (at most until `deadline`: a rank in the kernel's hold
// writes nothing), keeps what each wrote, and goes on: to the second look, or to the verdict.
void HangDetector::await_dumps(bool first, std::chrono::steady_clock::time_point deadline) {
  const auto now = std::chrono::steady_clock::now();
  const auto asked_at = deadline - kStackDumpWait;  // look() set the deadline as it asked
  if (now >= asked_at + kStackAskWait) {
    for (auto& [_, w] : workers_) {
      if (w.look && (w.asked || w.signal_due) && !w.signalled && !dump_grew(w) &&
          (w.look->second.features & slot::kStacksOnSignal)) {
        w.signalled = signal_for_stack(w);
      }
      w.signal_due = false;
    }
  }
  const bool arrived = dumps_arrived();
  const bool late = now >= deadline;
  // One more poll after the last dump began, for the rest of it.
  investigation_.expires_after(kDumpPoll);
  investigation_.async_wait(
      [this, first, deadline, arrived, late, due = monotonic_now() + kDumpPoll,
       alive = std::weak_ptr<char>(alive_)](const boost::system::error_code& ec) {
        if (ec || alive.expired() || !running_ || !investigating_) return;
        if (agent_stalled(due, monotonic_now())) return after_agent_stall();
        if (!arrived && !late) return await_dumps(first, deadline);
        for (auto& [_, w] : workers_) {
          if (!w.look || !(w.asked || w.signalled)) continue;
          std::string text = read_from(w.stack_file, w.stacks_offset);
          if (text.empty()) continue;
          (first ? w.look->stacks_first : w.look->stacks_second) = std::move(text);
        }
        if (!first) return conclude();
        const std::chrono::nanoseconds gap =
            stopped_look_ ? std::chrono::nanoseconds(0) : std::chrono::nanoseconds(kConfirmGap);
        investigation_.expires_after(gap);
        investigation_.async_wait(
            [this, due = monotonic_now() + gap,
             alive = std::weak_ptr<char>(alive_)](const boost::system::error_code& e) {
              if (e || alive.expired() || !running_ || !investigating_) return;
              if (agent_stalled(due, monotonic_now())) return after_agent_stall();
              look(/*first=*/false);
            });
      });
}

// The longest collective timeout the job's workers said (this node's, and the other nodes' in
// the job view: a rank here may be waited for in a collective elsewhere with a timeout of its
// own), plus kBoundMargin: past it a healthy job's collectives would have failed by themselves.
// None when no worker said one.
std::optional<std::chrono::nanoseconds> HangDetector::bound() const {
  std::uint64_t longest_ms = view_ ? view_->collective_timeout_ms : 0;
  for (const auto& [_, w] : workers_) {
    if (w.running) longest_ms = std::max(longest_ms, w.history.last().collective_timeout_ms);
  }
  if (longest_ms == 0) return std::nullopt;
  // (A timeout of "forever", timedelta(days=999999), would overflow nanoseconds: a year is as
  // good as forever for a bound.)
  constexpr std::uint64_t kLongestMs = 366ULL * 24 * 3600 * 1000;
  return std::chrono::milliseconds(std::min(longest_ms, kLongestMs)) + kBoundMargin;
}

// The bound in words: "90 s and a margin of 60 s: 150 s".
std::string HangDetector::bound_text() const {
  const auto limit = bound();
  if (!limit) return "";
  return fmt::format("{:.0f} s and a margin of {} s: {:.0f} s", seconds(*limit - kBoundMargin),
                     kBoundMargin.count(), seconds(*limit));
}

HangRule HangDetector::rule() const {
  if (options_.timeout.fixed) return HangRule::kTimeout;
  // Past the bound, a healthy job's wait in a collective would have failed by itself. Its
  // silence alone says nothing: a phase without steps whose collectives complete (an evaluation
  // that all-reduces its scores while one rank scores slowly) goes on for as long as it likes.
  const auto limit = bound();
  return limit && silent_ + kConfirmGap >= *limit && longest_wait_ >= *limit ? HangRule::kBound
                                                                             : HangRule::kProof;
}

void HangDetector::conclude() {
  std::vector<RankLook> looks;
  std::vector<Watched*> ranks;
  for (auto& [_, w] : workers_) {
    if (!w.running || !w.look) continue;
    looks.push_back(*w.look);
    ranks.push_back(&w);
  }
  // A proof needs waits this old at least: kMinProvenWaitSeconds, or a shorter explicit timeout.
  const double min_wait = std::min(kMinProvenWaitSeconds, seconds(timeout_));
  // Other nodes' waits, published after kPublishedWaitSeconds, prove only as old as ever.
  std::vector<CollectiveState> others = elsewhere();
  double longest_wait_s = 0;
  for (const RankLook& look : looks)
    longest_wait_s = std::max(longest_wait_s, waited_seconds(look));
  // (Every other node's rank blocked in a collective, one with a thread of its own too: it
  // proves nothing, but it waits, and its wait is what brings the bound.)
  for (const schema::BlockedRank* b : waiting_elsewhere()) {
    if (!b->in_setup()) longest_wait_s = std::max(longest_wait_s, b->seconds);
  }
  longest_wait_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(longest_wait_s));
  std::erase_if(others, [](const CollectiveState& c) {
    return !c.wait || c.wait->seconds < kMinProvenWaitSeconds;
  });
  HangFinding finding = examine(looks, rule(), others, min_wait);
  // No collective of anyone's waits for a rank that is alone in the job: it holds nobody up (not
  // a suspect: no warning, no HUNG?), and the job's collective timeout bounds nothing of its own
  // (its work after the others finished, a job of one rank). Only a proof ends it.
  if (alone_in_job(finding)) {
    for (auto& r : finding.ranks) r.cause = r.suspect = r.proven;
  }
  if (finding.moving) {
    spdlog::log(last_report_.empty() ? spdlog::level::info : spdlog::level::debug,
                "not a hang: {}; the next look comes after another hang timeout", *finding.moving);
    quiet_since_ = monotonic_now();
    investigating_ = false;
    return;
  }
  // A pause of the job (every worker here held stopped, no other node's rank seen waiting for
  // them: held_stopped) is no proof at the hang timeout either, only past the bound. (It was: a
  // job whose workers a user stopped for a minute was ended at 33 s, after the agent had said it
  // would not be.)
  if (rule() == HangRule::kProof && paused_here()) {
    spdlog::log(pause_look_said_ ? spdlog::level::debug : spdlog::level::info,
                "{}: every worker on {} is held stopped, a pause of the job: not ended{}",
                hang_reason(), options_.host,
                bound() ? fmt::format(" before the job's collective timeout and its margin "
                                      "({:.0f} s)",
                                      seconds(*bound()))
                        : "");
    pause_look_said_ = true;
    quiet_since_ = monotonic_now();
    investigating_ = false;
    return;
  }
  act(finding, ranks);
}

// One node, one worker of it running (the others finished, or it never had others), not waiting
// in a collective: no rank of the job can be waiting for it.
bool HangDetector::alone_in_job(const HangFinding& finding) const {
  if (options_.other_nodes || finding.ranks.size() != 1 || finding.ranks[0].waiting) return false;
  return std::count_if(workers_.begin(), workers_.end(),
                       [](const auto& w) { return w.second.running; }) == 1;
}

// The running workers held stopped, and for how long (the agent's stalls not counted).
HangDetector::Holds HangDetector::holds(std::chrono::nanoseconds now) const {
  Holds h;
  for (const auto& [_, w] : workers_) {
    if (!w.running) continue;
    ++h.running;
    if (!w.stopped_since) continue;
    ++h.stopped;
    const auto held = ran_since(*w.stopped_since, now);
    if (!h.shortest || held < *h.shortest) h.shortest = held;
    if (held >= kStoppedProof && (!h.longest || held > *h.longest)) h.longest = held;
  }
  return h;
}

// Every running worker here held stopped, and no other node's rank seen waiting for them.
bool HangDetector::paused_here() const {
  const Holds h = holds(monotonic_now());
  return h.running > 0 && h.stopped == h.running && !waited_on(*h.shortest);
}

std::string HangDetector::hang_reason() const {
  if (stopped_look_) {
    return fmt::format("a rank held stopped for {:.1f} s (proof after {:.0f} s)", seconds(silent_),
                       seconds(timeout_));
  }
  return fmt::format("no progress for {:.1f} s (hang timeout {:.1f} s)",
                     seconds(silent_ + kConfirmGap), seconds(timeout_));
}

// Where each rank was and what it was doing, one line each.
std::string HangDetector::rank_block(const HangFinding& finding, const std::vector<Watched*>& ranks,
                                     bool stacks) const {
  std::string block;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const RankWhere& r = finding.ranks[i];
    block += fmt::format("\n  {}: {}{}{}", describe(ranks[i]->worker), r.where,
                         r.doing.empty() ? "" : "; " + r.doing, r.cause ? "   <- hung" : "");
  }
  for (const auto* w : ranks) {
    if (stacks && w->look && (w->look->stacks_first || w->look->stacks_second)) {
      block += fmt::format("\n  stacks: {}",
                           w->stack_file.parent_path().parent_path().string() + "/*/stacks.txt");
      break;
    }
  }
  return block;
}

HangReport HangDetector::telemetry_report(const HangFinding& finding,
                                          const std::vector<Watched*>& ranks, bool acted,
                                          const std::string& verdict) const {
  HangReport report;
  report.silent = stopped_look_ ? silent_ : silent_ + kConfirmGap;
  report.timeout = timeout_;
  report.acted = acted;
  report.verdict = verdict;
  report.proof = finding.proof;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const RankWhere& r = finding.ranks[i];
    report.ranks.push_back({ranks[i]->worker, r.cause, r.waiting, r.where, r.doing, r.suspect,
                            r.active, r.paused, r.proven});
  }
  return report;
}

// --hang-timeout auto, nothing proven: what is seen is said, nothing is done.
void HangDetector::report(const HangFinding& finding, const std::vector<Watched*>& ranks) {
  std::vector<std::string> suspects, paused, idle;
  bool all_wait = !ranks.empty();
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const RankWhere& r = finding.ranks[i];
    if (r.suspect) suspects.push_back(std::to_string(ranks[i]->worker.rank));
    if (r.idle_suspect()) idle.push_back(std::to_string(ranks[i]->worker.rank));
    if (r.paused) paused.push_back(std::to_string(ranks[i]->worker.rank));
    all_wait = all_wait && r.waiting;
  }
  const auto list = [](const std::vector<std::string>& v) {
    std::string text;
    for (const auto& x : v) text += (text.empty() ? "" : ", ") + x;
    return text;
  };
  const bool many = suspects.size() > 1;
  const bool alone = alone_in_job(finding);
  const bool warn = (finding.idle_suspect() && !alone) || (all_wait && !options_.other_nodes);
  std::string verdict;
  if (!paused.empty()) {
    verdict = fmt::format("rank{} {} declared a pause of {} own: not a hang",
                          paused.size() > 1 ? "s" : "", list(paused),
                          paused.size() > 1 ? "their" : "its");
  } else if (alone) {
    verdict = fmt::format(
        "rank {} is the job's only running rank{} and waits in no collective: no rank waits for "
        "it, work of its own (nothing is ended)",
        ranks[0]->worker.rank, workers_.size() > 1 ? " (the others finished)" : "");
  } else if (finding.idle_suspect()) {
    // Of several, only the idle ones are said to do nothing (one may compute meanwhile).
    const bool some = idle.size() < suspects.size();
    const bool many_idle = idle.size() > 1;
    verdict = fmt::format(
        "suspected hang: the others wait for rank{} {}, {}{} {} (nothing is ended: a rank is "
        "ended only on proof that it cannot go on, or past the job's collective timeout{})",
        many ? "s" : "", list(suspects), some ? "of which rank" : "which",
        some ? (many_idle ? "s " : " ") + list(idle) : std::string(),
        finding.idle_suspects_await_input()
            ? (many_idle ? "wait for input (a debugger's prompt, input()?)"
                         : "waits for input (a debugger's prompt, input()?)")
        : finding.idle_suspects_await_children()
            ? (many_idle ? "wait for processes of their own, idle too"
                         : "waits for a process of its own, idle too")
            : (many_idle ? "do nothing" : "does nothing"),
        bound() ? ", " + bound_text() : "");
  } else if (!suspects.empty()) {
    verdict =
        fmt::format("rank{} {} {} working and the others wait for {}: not a hang", many ? "s" : "",
                    list(suspects), many ? "are" : "is", many ? "them" : "it");
  } else if (all_wait) {
    verdict = options_.other_nodes
                  ? "every rank here waits in a collective, for a rank on another node (its "
                    "node's agent reports it) or a slow transfer"
                  : "every rank waits in a collective and none of them provably cannot go on "
                    "(a slow transfer, or a hang nothing here can prove)";
  } else {
    verdict = "no rank here is known to wait for another";
  }
  // The same finding is said once; the next looks only when it changes.
  std::string key = verdict;
  for (const auto& r : finding.ranks) {
    key += fmt::format("|{}{}{}{}", r.suspect, r.active, r.paused, r.waiting);
  }
  const bool repeated = key == last_report_;
  const std::string block =
      fmt::format("{} on {}: {}; {}. Where each rank is:{}", warn ? "hang suspected" : "no step",
                  options_.host, hang_reason(), verdict, rank_block(finding, ranks, warn));
  spdlog::log(repeated ? spdlog::level::debug
              : warn   ? spdlog::level::warn
                       : spdlog::level::info,
              "{}", block);
  if (!repeated) {
    HangReport said = telemetry_report(finding, ranks, /*acted=*/false, verdict);
    said.warned = warn;
    telemetry_.hang(std::move(said));
  }
  last_report_ = key;
  for (std::size_t i = 0; i < ranks.size(); ++i) ranks[i]->reported = finding.ranks[i];
  if (!episode_) {
    std::optional<std::chrono::nanoseconds> oldest;
    for (const auto* w : ranks) {
      const auto last = w->look->second.last_progress();
      if (last && (!oldest || *last < *oldest)) oldest = *last;
    }
    episode_ = oldest.value_or(monotonic_now() - silent_);
  }
  quiet_since_ = monotonic_now();
  investigating_ = false;
}

void HangDetector::act(const HangFinding& finding, const std::vector<Watched*>& ranks) {
  const HangRule r = rule();
  if (!finding.any_cause() && r != HangRule::kTimeout) return report(finding, ranks);
  const bool all_wait = std::all_of(finding.ranks.begin(), finding.ranks.end(),
                                    [](const RankWhere& w) { return w.waiting; });
  const bool none_known = std::none_of(
      finding.ranks.begin(), finding.ranks.end(),
      [](const RankWhere& w) { return w.waiting || w.where.rfind("no stack", 0) != 0; });
  std::string verdict;
  if (finding.any_cause()) {
    verdict = finding.proof ? *finding.proof : "the cause: the rank(s) marked";
    if (r == HangRule::kBound && !finding.proof) {
      verdict = fmt::format(
          "a rank waited in one collective past the job's collective timeout ({}), the rank(s) "
          "marked do nothing",
          bound_text());
    }
  } else if (finding.any_paused()) {
    spdlog::info("{}, but a rank declared a pause of its own: not taken for a hang{}",
                 hang_reason(), rank_block(finding, ranks, /*stacks=*/false));
    quiet_since_ = monotonic_now();
    investigating_ = false;
    return;
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
  spdlog::error("hang on {}: {}; {}. Where each rank was:{}", options_.host, hang_reason(), verdict,
                rank_block(finding, ranks));
  telemetry_.hang(telemetry_report(finding, ranks, /*acted=*/true, verdict));
  investigating_ = false;
  std::vector<int> grace_ranks;
  std::vector<std::string> grace_reasons;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const RankWhere& w = finding.ranks[i];
    const int local_rank = ranks[i]->worker.local_rank;
    const std::string why = w.proven && finding.proof ? *finding.proof : hang_reason();
    if (finding.any_cause()) {
      if (w.cause) kill_(local_rank, fmt::format("hung: {}; {}", w.where, why), false, silent_);
    } else if (all_wait && options_.other_nodes) {
      grace_ranks.push_back(local_rank);
      grace_reasons.push_back(
          fmt::format("hung: {}, for a peer on another node; {}", w.where, hang_reason()));
    } else {
      kill_(local_rank, fmt::format("hung: {}; {}", w.where, hang_reason()), false, silent_);
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
  const Watched& w = it->second;
  const StepHistory& h = w.history;
  const SlotReading& r = h.last();
  p.steps = r.steps;
  if (r.last_step_ns != 0)
    p.since_step = monotonic_now() - std::chrono::nanoseconds(r.last_step_ns);
  p.step_seconds = h.step_seconds_p50();
  p.steps_per_second = h.steps_per_second();
  if (const auto timeout = h.hang_timeout(options_.timeout)) p.hang_timeout_s = seconds(*timeout);
  p.straggler = stragglers_.straggler(p.worker.rank);
  p.pending_collective = pending_text(r);
  if (p.pending_collective.empty() && r.setup_since_ns != 0) {
    p.pending_collective = collective_name(static_cast<std::uint32_t>(slot::Collective::kSetup));
  }
  p.paused = r.paused();
  if (p.paused)
    p.doing = "paused: " + (r.pause_reason.empty() ? "no reason given" : r.pause_reason);
  if (w.reported) {
    p.suspect = w.reported->suspect && !w.reported->active && !w.reported->paused;
    if (!p.paused) p.doing = w.reported->doing;
  }
  p.work_seconds = h.recent_work_seconds_per_step(kJobViewInterval);  // what the view compares
  p.cpu_wait = h.cpu_wait_share();  // (whether the job's ranks are crowded)
  p.collective_timeout_ms = r.collective_timeout_ms;
  const double blocked_s =
      r.pending_since_ns == 0
          ? 0
          : seconds(monotonic_now() - std::chrono::nanoseconds(r.pending_since_ns));
  const double setup_s =
      r.setup_since_ns == 0 ? 0
                            : seconds(monotonic_now() - std::chrono::nanoseconds(r.setup_since_ns));
  // A rank held stopped waits for nobody: it is the one waited for.
  const bool idle = w.cpu_share < kIdleCpuShare && !w.stopped_since;
  if (w.blocked_readings >= kStableBlockedReadings && idle && blocked_s >= kPublishedWaitSeconds) {
    schema::BlockedRank b;
    b.rank = w.worker.rank;
    b.op = r.pending_op;
    b.seconds = blocked_s;
    if (r.pending_group != 0) {
      b.groups = r.groups;
      b.sizes = r.group_sizes;
      b.threads = (r.activity & slot::kActivityThreads) != 0;
      b.group = r.pending_group;
      b.seq = r.pending_seq;
    } else {  // the SDK's one sequence, as group 0
      b.groups = {{0, r.collectives_issued}};
      b.seq = r.collectives_done + 1;
    }
    p.blocked = std::move(b);
  } else if (w.setup_readings >= kStableBlockedReadings && idle &&
             setup_s >= kPublishedWaitSeconds) {
    // Waiting in its group's set-up (a process group's rendezvous, an in-place generation): for
    // every rank of the group. Not a collective: no sequence to prove a mismatch with.
    schema::BlockedRank b;
    b.rank = w.worker.rank;
    b.op = static_cast<std::uint32_t>(slot::Collective::kSetup);
    b.seq = w.replacement ? schema::kSetupOfAReplacement : 0;
    b.seconds = setup_s;
    p.blocked = std::move(b);
  }
}

}  // namespace dist::agent
