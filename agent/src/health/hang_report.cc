#include "health/hang_report.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <sstream>
#include <tuple>

namespace dist::agent {
namespace {

namespace slot = rendezvous::worker_contract::heartbeat_slot;

// faulthandler's blocks: "Thread 0x... (most recent call first):" or "Current thread 0x... ...",
// then "  File "<path>", line <n> in <function>" lines. The main thread is the interpreter's first,
// and faulthandler lists the newest first: the last block.
std::vector<std::string_view> thread_blocks(std::string_view dump) {
  std::vector<std::string_view> blocks;
  std::size_t at = 0;
  while (true) {
    std::size_t header = std::string::npos;
    for (const std::string_view start : {"Thread 0x", "Current thread 0x", "Stack (most recent"}) {
      const std::size_t found = dump.find(start, at);
      if (found != std::string::npos) header = std::min(header, found);
    }
    if (header == std::string::npos) break;
    const std::size_t body = dump.find('\n', header);
    if (body == std::string::npos) break;
    std::size_t end = dump.find("\n\n", body);
    if (end == std::string::npos) end = dump.size();
    blocks.push_back(dump.substr(body + 1, end - body - 1));
    at = end;
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

// The main thread's functions, outermost to innermost, without line numbers: a loop that stays in
// one function reads the same twice, work that moves on does not.
std::vector<std::tuple<std::string, std::string>> functions(std::string_view dump) {
  std::vector<std::tuple<std::string, std::string>> out;
  for (const auto& f : main_thread_frames(dump)) out.emplace_back(f.file, f.function);
  return out;
}

bool sdk_dump(std::string_view dump) {
  return dump.find("dist::sdk stack of pid") != std::string::npos;
}

// The counters that move when a rank works.
bool counters_moved(const SlotReading& a, const SlotReading& b) {
  return b.steps != a.steps || b.beats != a.beats || b.collectives_done != a.collectives_done ||
         b.collectives_issued != a.collectives_issued || b.work_ns != a.work_ns;
}

struct Position {
  bool waiting = false;
  bool known = false;  // whether it is known to be waiting or not
  std::string where;
};

Position position_of(const RankLook& look) {
  const SlotReading& s = look.second;
  if (look.state == 'T' || look.state == 't') {
    return {false, true, "stopped (state T: SIGSTOP or a debugger)"};
  }
  if (look.state == 'D') {
    return {false, true,
            fmt::format("in uninterruptible I/O (state D{})",
                        look.wchan.empty() ? "" : ", in " + look.wchan)};
  }
  if (s.pending_since_ns != 0) {
    const double waited =
        std::chrono::duration<double>(s.at - std::chrono::nanoseconds(s.pending_since_ns)).count();
    return {true, true,
            fmt::format("waiting in {} #{} for {:.1f} s", collective_name(s.pending_op),
                        s.collectives_done + 1, waited)};
  }
  if (look.stacks_second && !sdk_dump(*look.stacks_second)) {
    const auto frames = main_thread_frames(*look.stacks_second);
    if (!frames.empty()) {
      const auto user = std::find_if(frames.begin(), frames.end(),
                                     [](const PythonFrame& f) { return !f.in_torch && !f.hook; });
      if (!frames.front().in_torch && !frames.front().hook) {
        return {false, true, "at " + frame_text(frames.front())};
      }
      std::string where = fmt::format("waiting in torch ({}, {}:{})", frames.front().function,
                                      frames.front().file, frames.front().line);
      if (user != frames.end()) where += " from " + frame_text(*user);
      return {true, true, where};
    }
  }
  if (s.collectives_issued > 0) {  // the SDK's groups count: nothing pending
    return {false, true,
            fmt::format("not in a collective (steps {}, collectives {} done)", s.steps,
                        s.collectives_done)};
  }
  return {false, false,
          fmt::format("no stack (state {}{})", look.state,
                      look.wchan.empty() ? "" : ", in " + look.wchan)};
}

}  // namespace

bool HangFinding::any_cause() const {
  return std::any_of(ranks.begin(), ranks.end(), [](const RankWhere& r) { return r.cause; });
}

std::string_view collective_name(std::uint32_t pending_op) {
  switch (static_cast<slot::Collective>(pending_op)) {
    case slot::Collective::kAllReduce:
      return "all_reduce";
    case slot::Collective::kBroadcast:
      return "broadcast";
    case slot::Collective::kAllGather:
      return "all_gather";
    case slot::Collective::kReduceScatter:
      return "reduce_scatter";
    case slot::Collective::kBarrier:
      return "barrier";
    case slot::Collective::kOther:
      return "a collective";
    case slot::Collective::kNone:
      break;
  }
  return "none";
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

HangFinding examine(const std::vector<RankLook>& looks) {
  HangFinding finding;
  for (const auto& look : looks) {
    if (counters_moved(look.first, look.second)) {
      finding.moving =
          fmt::format("rank {} made progress while it was looked at", look.worker.rank);
      return finding;
    }
    if (look.stacks_first && look.stacks_second && !sdk_dump(*look.stacks_second) &&
        functions(*look.stacks_first) != functions(*look.stacks_second)) {
      finding.moving =
          fmt::format("rank {} is working (its stack moved between two looks)", look.worker.rank);
      return finding;
    }
  }
  std::vector<Position> positions;
  for (const auto& look : looks) positions.push_back(position_of(look));
  finding.ranks.resize(looks.size());
  for (std::size_t i = 0; i < looks.size(); ++i) {
    finding.ranks[i].where = positions[i].where;
    finding.ranks[i].waiting = positions[i].waiting;
  }
  const auto mark = [&](auto is_cause) {
    bool any = false;
    for (std::size_t i = 0; i < looks.size(); ++i) {
      if (is_cause(i)) finding.ranks[i].cause = any = true;
    }
    return any;
  };
  if (mark([&](std::size_t i) { return looks[i].state == 'T' || looks[i].state == 't'; })) {
    return finding;
  }
  const auto progress = [&](std::size_t i) {
    return std::make_tuple(looks[i].second.steps, looks[i].second.collectives_issued);
  };
  std::size_t ahead = 0;
  for (std::size_t i = 1; i < looks.size(); ++i) {
    if (progress(i) > progress(ahead)) ahead = i;
  }
  if (mark([&](std::size_t i) { return progress(i) < progress(ahead); })) {
    const auto& lead = looks[ahead].second;
    for (std::size_t i = 0; i < looks.size(); ++i) {
      if (!finding.ranks[i].cause) continue;
      const auto& s = looks[i].second;
      finding.ranks[i].where += fmt::format(
          "; behind the others: {} steps and {} collectives, rank {} at {} and {}", s.steps,
          s.collectives_issued, looks[ahead].worker.rank, lead.steps, lead.collectives_issued);
    }
    return finding;
  }
  const bool someone_waits =
      std::any_of(positions.begin(), positions.end(), [](const Position& p) { return p.waiting; });
  if (someone_waits) {
    mark([&](std::size_t i) { return positions[i].known && !positions[i].waiting; });
  } else if (looks.size() == 1 && positions[0].known) {
    finding.ranks[0].cause = true;  // alone here, not waiting: it is stuck on its own
  }
  return finding;
}

}  // namespace dist::agent
