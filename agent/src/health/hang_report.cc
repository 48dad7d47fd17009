#include "health/hang_report.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <tuple>

namespace dist::agent {
namespace {

namespace slot = worker_contract::heartbeat_slot;

// I/O between the looks that is a rank's own work. Reads are counted from a higher floor: the
// progress hook's sampler reads /proc about fifty times a second.
constexpr std::uint64_t kActiveWriteBytes = 64 * 1024;
constexpr std::uint64_t kActiveReadBytes = 1024 * 1024;

// The next thread block's header at or after `at`; npos when there is none.
std::size_t next_header(std::string_view dump, std::size_t at) {
  std::size_t header = std::string::npos;
  for (const std::string_view start : {"Thread 0x", "Current thread 0x", "Stack (most recent"}) {
    const std::size_t found = dump.find(start, at);
    if (found != std::string::npos) header = std::min(header, found);
  }
  return header;
}

// faulthandler's blocks: "Thread 0x... (most recent call first):" or "Current thread 0x... ...",
// then "  File "<path>", line <n> in <function>" lines, up to a blank line (every thread's) or the
// next block (faulthandler's one thread's "Stack (most recent call first):" ends with none). The
// main thread is the interpreter's first, and faulthandler lists the newest first (the sampler's
// dump too): the last block.
std::vector<std::string_view> thread_blocks(std::string_view dump) {
  std::vector<std::string_view> blocks;
  std::size_t header = next_header(dump, 0);
  while (header != std::string::npos) {
    const std::size_t body = dump.find('\n', header);
    if (body == std::string::npos) break;
    const std::size_t next = next_header(dump, body);
    const std::size_t end = std::min({dump.find("\n\n", body), next, dump.size()});
    blocks.push_back(dump.substr(body + 1, end - body - 1));
    header = next;
  }
  return blocks;
}

// Whether a file is torch's own: in an installed torch ("...-packages/torch/"), or in one of
// torch's subpackages wherever its source tree is (a user's own folder named torch is not torch).
bool is_torchs(std::string_view file) {
  if (file.find("-packages/torch/") != std::string_view::npos) return true;
  const std::size_t at = file.rfind("/torch/");
  if (at == std::string_view::npos) return false;
  const std::string_view rest = file.substr(at + 7);
  for (const std::string_view part :
       {"_tensor.py", "functional.py", "serialization.py", "_ops.py", "autograd/", "nn/",
        "distributed/", "optim/", "utils/", "cuda/", "amp/", "_dynamo/", "_inductor/",
        "multiprocessing/", "_C/", "fx/", "jit/"}) {
    if (rest.starts_with(part)) return true;
  }
  return false;
}

// Where in torch a file is ("distributed/distributed_c10d.py"); empty when it is not torch's.
// A file of Python's standard library (".../lib/python3.11/threading.py", "<frozen ...>"), not
// a package installed beside it.
bool is_standard_librarys(std::string_view file) {
  if (file.starts_with("<frozen ")) return true;
  const std::size_t at = file.find("/lib/python3");
  return at != std::string_view::npos && file.find("-packages/", at) == std::string_view::npos;
}

std::string_view torch_part(std::string_view file) {
  if (!is_torchs(file)) return {};
  return file.substr(file.rfind("/torch/") + 7);
}

std::optional<PythonFrame> parse_frame(std::string_view line) {
  constexpr std::string_view kFile = "File \"";
  const std::size_t file = line.find(kFile);
  if (file == std::string::npos) return std::nullopt;
  const std::size_t file_end = line.find("\", line ", file + kFile.size());
  if (file_end == std::string::npos) return std::nullopt;
  PythonFrame f;
  f.file = std::string(line.substr(file + kFile.size(), file_end - file - kFile.size()));
  std::size_t at = file_end + 8;
  while (at < line.size() && line[at] >= '0' && line[at] <= '9') {
    f.line = f.line * 10 + (line[at++] - '0');
  }
  const std::size_t in = line.find(" in ", at);
  if (in != std::string::npos) f.function = std::string(line.substr(in + 4));
  f.in_torch = is_torchs(f.file);
  f.hook =
      f.file.ends_with("/_dist_launch_progress.py") || f.file.ends_with("/dist_launch/progress.py");
  return f;
}

std::string frame_text(const PythonFrame& f) {
  return fmt::format("{}:{} in {}", f.file, f.line, f.function);
}

// The main thread's functions, outermost to innermost, with or without their lines.
std::vector<std::tuple<std::string, std::string, int>> functions(std::string_view dump,
                                                                 bool with_lines) {
  std::vector<std::tuple<std::string, std::string, int>> out;
  for (const auto& f : main_thread_frames(dump)) {
    out.emplace_back(f.file, f.function, with_lines ? f.line : 0);
  }
  return out;
}

// Whether the torch hook's sampler ran between the looks: what it wrote is current. A sampler
// that did not (the interpreter held by a thread that keeps the GIL) left its last word behind,
// which is no longer true.
bool sampler_alive(const RankLook& l) {
  return (l.second.features & slot::kSampler) && l.second.sampled_ns != l.first.sampled_ns;
}

// The slot's pending collective, when it can be believed: the SDK's always, the sampler's while
// it runs.
bool pending(const RankLook& l) {
  const SlotReading& s = l.second;
  if (s.pending_since_ns == 0) return false;
  return s.pending_group == 0 || sampler_alive(l);
}

bool sdk_dump(std::string_view dump) {
  return dump.find("dist::sdk stack of pid") != std::string::npos;
}

bool python_dumps(const RankLook& l) {
  return l.stacks_first && l.stacks_second && !sdk_dump(*l.stacks_second);
}

bool stack_moved(const RankLook& l, bool with_lines) {
  return python_dumps(l) &&
         functions(*l.stacks_first, with_lines) != functions(*l.stacks_second, with_lines);
}

// The counters that move when a rank makes progress (work_ns and wait_ns move with the clock).
bool counters_moved(const SlotReading& a, const SlotReading& b) {
  return b.steps != a.steps || b.beats != a.beats || b.collectives_done != a.collectives_done ||
         b.collectives_issued != a.collectives_issued || b.resumed_ns != a.resumed_ns ||
         b.groups != a.groups;
}

double look_seconds(const RankLook& l) {
  return std::chrono::duration<double>(l.second.at - l.first.at).count();
}

bool stopped(const RankLook& l) {
  return l.before.state == 'T' && l.after.state == 'T';
}

double seconds_since(std::chrono::nanoseconds now, std::uint64_t stamp_ns) {
  return std::chrono::duration<double>(now - std::chrono::nanoseconds(stamp_ns)).count();
}

double blocked_seconds(const SlotReading& s) {
  return seconds_since(s.at, s.pending_since_ns);
}

std::string megabytes(std::uint64_t bytes) {
  return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6);
}

struct Position {
  bool waiting = false;
  bool known = false;  // whether it is known to be waiting or not
  std::string where;
};

// Where a Python rank's main thread is, from its stack: the innermost frame of the user's (and
// the torch function it is in). Without the sampler, a main thread inside torch.distributed or
// autograd is taken for waiting.
Position python_position(const std::vector<PythonFrame>& frames, bool sampled) {
  const auto outside_torch = [](const PythonFrame& f) { return !f.in_torch && !f.hook; };
  // The script's own line where there is one: a wait in the standard library (a future's
  // result(), a queue's get()) is said as where the script called it.
  auto user = std::find_if(frames.begin(), frames.end(), [&](const PythonFrame& f) {
    return outside_torch(f) && !is_standard_librarys(f.file);
  });
  if (user == frames.end()) user = std::find_if(frames.begin(), frames.end(), outside_torch);
  const PythonFrame& top = frames.front();
  if (outside_torch(top)) {
    if (user == frames.begin() || !is_standard_librarys(top.file)) {
      return {false, true, "at " + frame_text(top)};
    }
    return {false, true,
            fmt::format("at {}, in the standard library ({}, {}:{})", frame_text(*user),
                        top.function, top.file, top.line)};
  }
  const std::string_view part = torch_part(top.file);
  const bool communicates = part.starts_with("distributed/") || part.starts_with("autograd/") ||
                            part == "nn/parallel/distributed.py" || part == "_tensor.py";
  const std::string in_torch = fmt::format("torch ({}, {}:{})", top.function, top.file, top.line);
  if (communicates && !sampled) {
    return {true, true,
            "waiting in " + in_torch +
                (user != frames.end() ? " from " + frame_text(*user) : std::string())};
  }
  if (user == frames.end()) return {false, true, "in " + in_torch};
  return {false, true, "at " + frame_text(*user) + ", in " + in_torch};
}

Position position_of(const RankLook& look) {
  const SlotReading& s = look.second;
  const char state = look.after.state;
  if (state == 'T') return {false, true, "stopped (state T: SIGSTOP)"};
  if (state == 't') return {false, true, "stopped by a debugger (state t)"};
  if (state == 'D') {
    return {false, true,
            fmt::format("in uninterruptible I/O (state D{})",
                        look.after.wchan.empty() ? "" : ", in " + look.after.wchan)};
  }
  if (pending(look)) {
    return {true, true,
            fmt::format("waiting in {} for {:.1f} s", pending_text(s), blocked_seconds(s))};
  }
  if (look.stacks_second && !sdk_dump(*look.stacks_second)) {
    const auto frames = main_thread_frames(*look.stacks_second);
    if (!frames.empty()) return python_position(frames, sampler_alive(look));
  }
  if (s.collectives_issued > 0 && s.groups.empty()) {  // the SDK's groups count: nothing pending
    return {false, true,
            fmt::format("not in a collective (steps {}, collectives {} done)", s.steps,
                        s.collectives_done)};
  }
  return {false, false,
          fmt::format("no stack (state {}{})", state,
                      look.after.wchan.empty() ? "" : ", in " + look.after.wchan)};
}

// What the sampler saw the main thread in, in words.
std::vector<std::string> activity_words(std::uint32_t activity) {
  std::vector<std::string> words;
  if (activity & slot::kActivityCheckpoint) words.emplace_back("in torch.distributed.checkpoint");
  if (activity & slot::kActivitySave) words.emplace_back("in torch.save/torch.load");
  if (activity & slot::kActivityData) words.emplace_back("loading data (torch.utils.data)");
  if (activity & slot::kActivityCompile) words.emplace_back("compiling (torch.compile)");
  if (activity & slot::kActivityBackward) {
    words.emplace_back("in backward");
  } else if (activity & slot::kActivityForward) {
    words.emplace_back("in a forward pass");
  }
  if (activity & slot::kActivityCheckpointThread) {
    words.emplace_back("a thread of its own in torch.distributed.checkpoint (an async save)");
  }
  if (activity & slot::kActivityThreads) {
    words.emplace_back("a thread of its own beside it may issue a collective");
  }
  return words;
}

// Whether a rank's processes computed between the looks: they ran kIdleCpuShare of a core, or, on
// a crowded machine, ran less but were runnable most of the time, waiting for a CPU (seen under
// CI's load: a rank evaluating at CPU 6% was taken for idle). A thread that only wakes often (a
// 1 ms poll) may wait for a CPU at each wake, but is not runnable most of the time.
bool computes(double cpu, double queued) {
  return cpu >= kIdleCpuShare || cpu + queued >= kRunnableShare;
}

// What a rank was doing between the looks: in words, whether it works, and whether it is idle in
// work of its own (RankWhere::own_work).
struct Doing {
  std::string text;
  bool active = false;
  bool own_work = false;
};
Doing doing_of(const RankLook& l) {
  std::vector<std::string> parts;
  const SlotReading& s = l.second;
  const double seconds = std::max(look_seconds(l), 1e-3);
  if (s.paused()) {
    parts.push_back(fmt::format("paused: {} (for {:.1f} s)",
                                s.pause_reason.empty() ? "no reason given" : s.pause_reason,
                                seconds_since(s.at, s.paused_since_ns)));
  }
  bool active = false;
  bool own_work = false;
  const double cpu = cpu_share(l.before, l.after, seconds);
  const double queued = cpu_queued_share(l.before, l.after, seconds);
  if (computes(cpu, queued)) {
    parts.push_back(
        cpu >= kIdleCpuShare
            ? fmt::format("computing (CPU {:.0f}%)", cpu * 100)
            : fmt::format("computing (CPU {:.0f}%, waiting for a CPU {:.0f}% of the time)",
                          cpu * 100, std::min(queued, 1.0) * 100));
    active = true;
  }
  // The dumps written between the two readings (the first look's, a late answer) are not the
  // rank's own.
  const std::uint64_t dumped =
      std::max<std::uint64_t>(l.stack_bytes, l.stacks_first ? l.stacks_first->size() : 0);
  const auto grew = [](std::uint64_t a, std::uint64_t b) { return b > a ? b - a : 0; };
  const std::uint64_t written = grew(l.before.write_bytes + dumped, l.after.write_bytes);
  const std::uint64_t read = grew(l.before.read_bytes, l.after.read_bytes);
  if (written >= kActiveWriteBytes) {
    parts.push_back(fmt::format("writing ({} in {:.1f} s)", megabytes(written), seconds));
    active = true;
  }
  if (read >= kActiveReadBytes) {
    parts.push_back(fmt::format("reading ({} in {:.1f} s)", megabytes(read), seconds));
    active = true;
  }
  if (stack_moved(l, /*with_lines=*/true)) {
    parts.emplace_back("its stack moving");
    active = true;
  }
  const bool sampled = sampler_alive(l);
  if (sampled) {
    for (auto& w : activity_words(s.activity)) parts.push_back(std::move(w));
    // Inside torch.save, torch.distributed.checkpoint, a DataLoader or torch.compile the rank
    // works even when its own process is idle: blocked on a network file system, waiting for
    // its loader's or compiler's worker processes.
    constexpr std::uint32_t kWorkOfItsOwn = slot::kActivitySave | slot::kActivityCheckpoint |
                                            slot::kActivityCheckpointThread | slot::kActivityData |
                                            slot::kActivityCompile;
    own_work = !active && (s.activity & kWorkOfItsOwn) != 0;
  } else if ((s.features & slot::kSampler) && l.after.state != 'T' && l.after.state != 't') {
    parts.emplace_back("its Python not running (a thread holds the GIL)");
  }
  if (!active && !own_work && !s.paused() && l.after.blocked_writing) {
    // Output of its own that its reader does not take (a slow log service, a full pipe): work
    // held up outside the job, as a slow file system holds up a torch.save.
    parts.push_back("blocked " + l.after.blocked_on + " (its reader takes no more)");
    own_work = true;
  }
  if (!active && !own_work && !s.paused()) {
    if (!l.after.awaits_input.empty()) {
      parts.insert(parts.begin(), "waiting for input " + l.after.awaits_input);
    } else if (!l.after.blocked_on.empty()) {
      parts.insert(parts.begin(), "idle (blocked " + l.after.blocked_on + ")");
    } else if (!l.after.awaits_child.empty()) {
      parts.insert(parts.begin(), "idle (waiting for " + l.after.awaits_child + " to end)");
    } else {
      parts.insert(parts.begin(), l.after.wchan.empty() ? std::string("idle")
                                                        : "idle (asleep in " + l.after.wchan + ")");
    }
  }
  std::string text;
  for (const auto& p : parts) text += (text.empty() ? "" : ", ") + p;
  return {text, active, own_work};
}

// The ids of a rank's process groups, in its slot's order (group_label's fallback).
std::vector<std::uint64_t> group_order(const SlotReading& s) {
  std::vector<std::uint64_t> order;
  for (const auto& [id, seq] : s.groups) order.push_back(id);
  return order;
}

// Whether rank a has issued fewer collectives than rank b and none more: in every process group
// both are in (torch's counts), or in the SDK's one sequence. Empty when it is not; otherwise what
// says so ("16 collectives of process group 0, rank 1 at 17").
std::string behind_in_collectives(const SlotReading& a, const SlotReading& b, int b_rank,
                                  const std::set<std::uint64_t>& uncounted) {
  if (a.groups.empty() || b.groups.empty()) {
    if (!a.groups.empty() || !b.groups.empty() || a.collectives_issued >= b.collectives_issued) {
      return "";
    }
    return fmt::format("{} collectives, rank {} at {}", a.collectives_issued, b_rank,
                       b.collectives_issued);
  }
  std::string first_lower;
  for (std::size_t i = 0; i < a.groups.size(); ++i) {
    const auto [id, seq] = a.groups[i];
    if (uncounted.contains(id)) continue;
    const auto other = std::find_if(b.groups.begin(), b.groups.end(),
                                    [id = id](const auto& g) { return g.first == id; });
    if (other == b.groups.end()) continue;
    if (seq > other->second) return "";
    if (seq < other->second && first_lower.empty()) {
      const std::uint64_t fewer = other->second - seq;
      first_lower = fmt::format("{} collective{} fewer than rank {} in {}", fewer,
                                fewer > 1 ? "s" : "", b_rank, group_label(id, group_order(a)));
    }
  }
  return first_lower;
}

// Whom a torch rank waiting in a collective waits for: a rank of that collective's group that
// has not issued it yet (fewer collectives in that group). None when none here is known to be, or
// when what the slot says it waits in cannot be believed (pending()).
std::optional<std::size_t> waits_for(const std::vector<RankLook>& looks, std::size_t i,
                                     const std::set<std::uint64_t>& uncounted, std::string& text) {
  const SlotReading& mine = looks[i].second;
  if (!pending(looks[i]) || mine.pending_group == 0 || uncounted.contains(mine.pending_group))
    return std::nullopt;
  const auto& groups = mine.groups;
  const auto index = std::find_if(groups.begin(), groups.end(),
                                  [&](const auto& g) { return g.first == mine.pending_group; });
  if (index == groups.end()) return std::nullopt;
  for (std::size_t j = 0; j < looks.size(); ++j) {
    if (j == i) continue;
    const auto& theirs = looks[j].second.groups;
    const auto g = std::find_if(theirs.begin(), theirs.end(),
                                [&](const auto& e) { return e.first == mine.pending_group; });
    if (g == theirs.end() || g->second >= mine.pending_seq) continue;
    text = fmt::format("waiting for rank {} (it issued {} in {})", looks[j].worker.rank, g->second,
                       group_label(mine.pending_group, group_order(mine)));
    return j;
  }
  return std::nullopt;
}

// Whether the collective a torch rank waits in was issued by every other rank here in its group
// (their counts are at or past it; one of them at least is in the group), and the rank is behind
// in no other group: what its counts show behind is the collective it waits in, and it waits for
// no rank here. They may read as behind all the same: torch 2.x numbers a send or a receive in
// the group's sequence on its two ranks alone (monitored_barrier's too, more of them on rank 0),
// so after one the counts of a group differ rank to rank for the rest of the job.
bool waits_in_what_every_peer_issued(const std::vector<RankLook>& looks, std::size_t i,
                                     const std::set<std::uint64_t>& uncounted) {
  const SlotReading& mine = looks[i].second;
  if (!pending(looks[i]) || mine.pending_group == 0 || uncounted.contains(mine.pending_group)) {
    return false;
  }
  bool peer = false;
  for (std::size_t j = 0; j < looks.size(); ++j) {
    if (j == i) continue;
    for (const auto& [id, seq] : looks[j].second.groups) {
      const auto own = std::find_if(mine.groups.begin(), mine.groups.end(),
                                    [id = id](const auto& e) { return e.first == id; });
      if (own == mine.groups.end() || uncounted.contains(id)) continue;
      if (id == mine.pending_group) {
        if (seq < mine.pending_seq) return false;  // a peer has not issued it yet
        peer = true;
      } else if (own->second < seq) {
        return false;  // behind in another group (a peer may wait for it there)
      }
    }
  }
  return peer;
}

// The ranks the others wait for: behind the others (fewer steps, or at as many steps fewer
// collectives issued and none more), else not waiting while others wait, else (alone) the rank
// itself. A rank waiting in a collective that every other rank here has issued, behind in no
// other group, is not behind whatever its counts say: it waits for no one here (counts that
// sends and receives skewed had named the ranks waiting for a rank at work, and an explicit
// --hang-timeout ended them). `where` of those behind says by how much. A rank behind in one group
// while it waits in another group's collective for a rank that has not issued it (a tensor-parallel
// pair waiting for its partner while the data-parallel group waits for both) is not one: it waits
// too, and the rank it waits for is, unless that one waits in turn for such a rank (a cycle:
// collectives that never match, for the proof; they all stand).
std::vector<bool> suspects(const std::vector<RankLook>& looks, std::vector<RankWhere>& ranks,
                           const std::vector<Position>& positions) {
  // torch 2.x numbers a send or a receive in its group's sequence on its two ranks only: in a
  // group where a rank waits in one (a pipeline), the counts differ rank to rank by the sends and
  // receives each made, and say nothing of who is behind or whom a rank waits for.
  std::set<std::uint64_t> uncounted;
  for (const auto& l : looks) {
    if (pending(l) && l.second.pending_group != 0 &&
        l.second.pending_op == static_cast<std::uint32_t>(slot::Collective::kSendRecv)) {
      uncounted.insert(l.second.pending_group);
    }
  }
  std::vector<bool> out(looks.size(), false);
  std::vector<std::string> behind_of(looks.size()), waits(looks.size());
  std::vector<std::optional<std::size_t>> waited_for(looks.size());
  for (std::size_t i = 0; i < looks.size(); ++i) {
    const SlotReading& mine = looks[i].second;
    for (std::size_t j = 0; j < looks.size() && behind_of[i].empty(); ++j) {
      const SlotReading& theirs = looks[j].second;
      if (mine.steps < theirs.steps) {
        behind_of[i] =
            fmt::format("{} steps, rank {} at {}", mine.steps, looks[j].worker.rank, theirs.steps);
      } else if (mine.steps == theirs.steps) {
        behind_of[i] = behind_in_collectives(mine, theirs, looks[j].worker.rank, uncounted);
      }
    }
    if (behind_of[i].empty() || !positions[i].waiting) continue;
    waited_for[i] = waits_for(looks, i, uncounted, waits[i]);
    if (!waited_for[i] && waits_in_what_every_peer_issued(looks, i, uncounted)) {
      behind_of[i].clear();
    }
  }
  bool any_behind = false, cycle = true;
  for (std::size_t i = 0; i < looks.size(); ++i) {
    if (behind_of[i].empty()) continue;
    any_behind = true;
    out[i] = !waited_for[i];
    // The rank a behind waiter waits for, unless that one is a behind waiter in turn.
    const auto j = waited_for[i];
    const bool chained = j && !behind_of[*j].empty() && waited_for[*j];
    if (j && !chained) out[*j] = true;
    cycle = cycle && chained;
  }
  for (std::size_t i = 0; i < looks.size() && any_behind; ++i) {
    if (behind_of[i].empty()) continue;
    if (cycle) out[i] = true;  // each waits for another behind waiter: they stand
    ranks[i].where += out[i] ? "; behind the others: " + behind_of[i] : "; " + waits[i];
  }
  if (any_behind) return out;
  const bool someone_waits =
      std::any_of(positions.begin(), positions.end(), [](const Position& p) { return p.waiting; });
  for (std::size_t i = 0; i < looks.size(); ++i) {
    if (someone_waits) {
      out[i] = positions[i].known && !positions[i].waiting;
    } else if (looks.size() == 1) {
      out[i] = positions[i].known;  // alone here, not waiting: it is stuck on its own
    }
  }
  return out;
}

// Marks the proven ranks: stopped, or in collectives that can never match.
void prove(const std::vector<RankLook>& looks, const std::vector<CollectiveState>& elsewhere,
           double min_wait_s, HangFinding& finding) {
  std::vector<std::string> stopped_ranks;
  for (std::size_t i = 0; i < looks.size(); ++i) {
    if (!stopped(looks[i])) continue;
    finding.ranks[i].proven = true;
    stopped_ranks.push_back(std::to_string(looks[i].worker.rank));
  }
  std::vector<CollectiveState> states = elsewhere;
  for (const auto& l : looks) states.push_back(collective_state(l, min_wait_s));
  const auto mismatch = prove_mismatch(states);
  if (mismatch) {
    for (std::size_t i = 0; i < looks.size(); ++i) {
      if (std::binary_search(mismatch->causes.begin(), mismatch->causes.end(),
                             looks[i].worker.rank)) {
        finding.ranks[i].proven = true;
      }
    }
  }
  std::string proof;
  if (!stopped_ranks.empty()) {
    std::string names;
    for (const auto& r : stopped_ranks) names += (names.empty() ? "" : ", ") + r;
    proof = fmt::format("rank{} {} stopped (SIGSTOP or SIGTSTP): no progress until continued",
                        stopped_ranks.size() > 1 ? "s" : "", names);
  }
  if (mismatch) proof += (proof.empty() ? "" : "; ") + mismatch->why;
  if (!proof.empty()) finding.proof = proof;
}

}  // namespace

bool HangFinding::any_cause() const {
  return std::any_of(ranks.begin(), ranks.end(), [](const RankWhere& r) { return r.cause; });
}

bool RankWhere::idle_suspect() const {
  return suspect && !active && !own_work && !paused;
}

bool HangFinding::idle_suspect() const {
  return std::any_of(ranks.begin(), ranks.end(),
                     [](const RankWhere& r) { return r.idle_suspect(); });
}

bool HangFinding::idle_suspects_await_input() const {
  return std::all_of(ranks.begin(), ranks.end(),
                     [](const RankWhere& r) { return !r.idle_suspect() || r.awaits_input; });
}

bool HangFinding::idle_suspects_await_children() const {
  return std::all_of(ranks.begin(), ranks.end(),
                     [](const RankWhere& r) { return !r.idle_suspect() || r.awaits_child; });
}

bool HangFinding::any_paused() const {
  return std::any_of(ranks.begin(), ranks.end(), [](const RankWhere& r) { return r.paused; });
}

std::string pending_text(const SlotReading& s) {
  if (s.pending_since_ns == 0) return "";
  if (s.pending_group == 0) {  // the SDK's one sequence: the oldest pending one
    return collective_text(s.pending_op, s.collectives_done + 1, 0, {});
  }
  return collective_text(s.pending_op, s.pending_seq, s.pending_group, group_order(s));
}

double waited_seconds(const RankLook& look) {
  return pending(look) ? blocked_seconds(look.second) : 0;
}

CollectiveState collective_state(const RankLook& l, double min_wait_s) {
  CollectiveState c;
  c.rank = l.worker.rank;
  const SlotReading& a = l.first;
  const SlotReading& b = l.second;
  const bool torch = !b.groups.empty();
  if (torch) {
    for (const auto& [id, seq] : b.groups) {
      c.seqs[id] = seq;
      c.order.push_back(id);
    }
    c.sizes = b.group_sizes;
  } else if (b.collectives_issued > 0) {
    c.seqs[0] = b.collectives_issued;
  }
  const bool same_wait = pending(l) && a.pending_since_ns == b.pending_since_ns &&
                         a.pending_group == b.pending_group && a.pending_seq == b.pending_seq &&
                         a.pending_op == b.pending_op && !counters_moved(a, b);
  const double seconds = std::max(look_seconds(l), 1e-3);
  const bool idle = !computes(cpu_share(l.before, l.after, seconds),
                              cpu_queued_share(l.before, l.after, seconds));
  // (A thread of its own beside the main one may issue what its peers wait for: no wait of its.)
  const bool alone = (b.activity & slot::kActivityThreads) == 0;
  if (same_wait && idle && alone && blocked_seconds(b) >= min_wait_s &&
      (torch || b.pending_group == 0)) {
    c.wait = CollectiveState::Wait{torch ? b.pending_group : 0,
                                   torch ? b.pending_seq : b.collectives_done + 1, b.pending_op,
                                   blocked_seconds(b)};
  }
  return c;
}

std::vector<PythonFrame> main_thread_frames(std::string_view dump) {
  const auto blocks = thread_blocks(dump);
  std::vector<PythonFrame> frames;
  if (blocks.empty()) return frames;
  std::istringstream lines{std::string(blocks.back())};
  for (std::string line; std::getline(lines, line);) {
    if (auto f = parse_frame(line)) frames.push_back(std::move(*f));
  }
  return frames;
}

HangFinding examine(const std::vector<RankLook>& looks, HangRule rule,
                    const std::vector<CollectiveState>& elsewhere, double min_proven_wait_s) {
  HangFinding finding;
  // A rank held stopped is proof whatever the others do meanwhile.
  const bool held = std::any_of(looks.begin(), looks.end(), stopped);
  for (const auto& look : looks) {
    if (held) break;
    if (counters_moved(look.first, look.second)) {
      finding.moving =
          fmt::format("rank {} made progress while it was looked at", look.worker.rank);
      return finding;
    }
    if (rule == HangRule::kTimeout && stack_moved(look, /*with_lines=*/false)) {
      finding.moving =
          fmt::format("rank {} is working (its stack moved between two looks)", look.worker.rank);
      return finding;
    }
  }
  std::vector<Position> positions;
  for (const auto& look : looks) positions.push_back(position_of(look));
  finding.ranks.resize(looks.size());
  for (std::size_t i = 0; i < looks.size(); ++i) {
    RankWhere& r = finding.ranks[i];
    r.where = positions[i].where;
    r.waiting = positions[i].waiting;
    r.paused = looks[i].second.paused();
    const Doing doing = doing_of(looks[i]);
    r.doing = doing.text;
    r.active = doing.active;
    r.own_work = doing.own_work;
    r.awaits_input = !looks[i].after.awaits_input.empty();
    r.awaits_child = !looks[i].after.awaits_child.empty();
  }
  const auto suspected = suspects(looks, finding.ranks, positions);
  for (std::size_t i = 0; i < looks.size(); ++i) finding.ranks[i].suspect = suspected[i];
  prove(looks, elsewhere, min_proven_wait_s, finding);
  const bool paused = finding.any_paused();
  for (auto& r : finding.ranks) {
    const bool ended_suspect =
        rule == HangRule::kTimeout || (rule == HangRule::kBound && !r.active);
    r.cause = r.proven || (ended_suspect && r.suspect && !paused);
  }
  return finding;
}

}  // namespace dist::agent
