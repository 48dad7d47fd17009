#include "workers/failure_report.h"

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <ctime>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>

#include "output/valid_text.h"
#include "processes/process.h"

namespace dist::agent {
namespace {

std::string format_time(std::chrono::system_clock::time_point t) {
  const std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  ::localtime_r(&secs, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d_%H:%M:%S", &tm);
  return buf;
}

// `text`'s lines, the first as it is, the others indented under it (a field's value).
std::string indented(const std::string& text) {
  std::ostringstream out;
  std::istringstream lines(text);
  std::string line;
  bool first = true;
  while (std::getline(lines, line)) {
    out << (first ? "" : "              ") << line << "\n";
    first = false;
  }
  if (first) out << "\n";
  return out.str();
}

// The message, cut at kMessageShown bytes (on a character's boundary) when the traceback has it
// whole: a megabyte's message is printed once, not twice.
constexpr std::size_t kMessageShown = 2000;
std::string message_shown(const WorkerFailure& f) {
  if (f.message.size() <= kMessageShown || f.traceback.find(f.message) == std::string::npos) {
    return f.message;
  }
  return std::string(utf8_prefix(f.message, kMessageShown)) + "... (" +
         std::to_string(f.message.size()) + " bytes: whole in the traceback)";
}

std::string describe(const WorkerFailure& f, std::size_t index) {
  std::ostringstream out;
  out << "[" << index << "]:\n"
      << "  time      : " << format_time(f.time) << "\n"
      << "  host      : " << f.host << "\n"
      << "  rank      : " << f.worker.rank << " (local_rank: " << f.worker.local_rank << ")\n"
      << "  exitcode  : " << f.exit_code;
  if (f.exit_code < 0) out << " (" << signal_name(-f.exit_code) << ")";
  out << " (pid: " << f.worker.pid << ")\n"
      << "  error_file: " << (f.error_file.empty() ? "<N/A>" : f.error_file) << "\n";
  if (!f.message.empty()) out << "  message   : " << indented(message_shown(f));
  std::string traceback = f.traceback;
  if (traceback.empty()) {
    traceback = f.exit_code < 0
                    ? "Signal " + std::to_string(-f.exit_code) + " (" + signal_name(-f.exit_code) +
                          ") received by PID " + std::to_string(f.worker.pid)
                    : "To enable traceback see: "
                      "https://pytorch.org/docs/stable/elastic/errors.html";
  }
  out << "  traceback : " << indented(traceback);
  return out.str();
}

}  // namespace

std::optional<std::chrono::system_clock::time_point> written_at(const std::string& path) {
  struct stat file {};
  if (::stat(path.c_str(), &file) != 0) return std::nullopt;
  return std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::seconds(file.st_mtim.tv_sec) +
          std::chrono::nanoseconds(file.st_mtim.tv_nsec)));
}

void read_error_file(WorkerFailure& failure) {
  if (failure.error_file.empty()) return;
  std::ifstream in(failure.error_file);
  if (!in) return;
  // When the error was written, to the tick: torch's whole seconds would tie two failures of one
  // second (then settled by rank, wrongly) or put the later one first.
  if (const auto written = written_at(failure.error_file)) failure.time = *written;
  try {
    // Python writes a name that is not UTF-8 as lone surrogate escapes, which nlohmann refuses.
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    const nlohmann::json j = nlohmann::json::parse(lenient_json(text));
    const nlohmann::json& m = j.at("message");
    if (m.is_string()) {
      failure.message = m.get<std::string>();
      return;
    }
    failure.message = m.value("message", "");
    if (m.contains("extraInfo")) {
      const nlohmann::json& extra = m.at("extraInfo");
      failure.traceback = extra.value("py_callstack", "");
    }
  } catch (const std::exception&) {
    failure.message = "(error file " + failure.error_file + " is not valid JSON)";
  }
}

bool copy_root_cause_error_file(const WorkerFailure& root, const std::string& destination) {
  nlohmann::json j;
  std::string copy;
  if (std::ifstream in(root.error_file); !root.error_file.empty() && in) {
    copy.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    try {
      j = nlohmann::json::parse(lenient_json(copy));
    } catch (const std::exception&) {
      j = nullptr;  // copied as it is, as torch copies a file it cannot amend
    }
  } else if (!root.message.empty()) {  // written on another node: what its report carried here
    j = {{"message",
          {{"message", root.message},
           {"extraInfo",
            {{"py_callstack", root.traceback},
             {"timestamp", std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
                                              root.time.time_since_epoch())
                                              .count())}}}}}};
  } else {
    return false;  // no error file (torch's @record writes none then either)
  }
  if (j.is_object() && j.contains("message") && j["message"].is_object()) {
    j["message"]["errorCode"] = root.exit_code;  // (torch's: -N for a signal)
    copy = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  std::ofstream out(destination, std::ios::trunc);
  out << copy;
  out.close();
  if (!out) throw std::runtime_error("cannot write " + destination);
  return true;
}

int exit_code_of(const WorkerFailure& failure) {
  if (failure.ended_by_the_stop) return 1;
  return failure.exit_code < 0 ? 128 + -failure.exit_code : failure.exit_code;
}

bool looks_collateral(const WorkerFailure& failure) {
  // What Gloo, NCCL, torch.distributed and the SDK say when a peer is gone, lower-cased.
  static constexpr std::string_view kPeerGone[] = {
      "connection reset by peer",
      "connection closed by peer",
      "broken pipe",
      "the peer exited or crashed",
      "peer rank",
      "remote process exited",
      "communicator was aborted",
      "nccl communicator was aborted",
      "collective was aborted",
      "econnreset",
      "epipe",
      "connection refused",
      "connection closed",
  };
  std::string text = failure.message + "\n" + failure.traceback;
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const std::string_view pattern : kPeerGone) {
    if (text.find(pattern) != std::string::npos) return true;
  }
  return failure.exit_code == 75;  // the SDK's exit after an NCCL abort
}

std::size_t root_cause_index(const std::vector<WorkerFailure>& failures) {
  const auto before = [](const WorkerFailure& a, const WorkerFailure& b) {
    if (a.collateral != b.collateral) return !a.collateral;
    if (a.time != b.time) return a.time < b.time;
    // Of two at once, the one that exited with its own error over one the stop's signal ended.
    if (a.ended_by_the_stop != b.ended_by_the_stop) return !a.ended_by_the_stop;
    if (a.error_file.empty() != b.error_file.empty()) return !a.error_file.empty();
    return a.worker.rank < b.worker.rank;
  };
  return static_cast<std::size_t>(std::min_element(failures.begin(), failures.end(), before) -
                                  failures.begin());
}

namespace {

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (const int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out.empty() ? "none" : out;
}

// One worker's failure, whichever node's record it came from (a time read back from the store is
// rounded: not compared).
bool same_worker(const WorkerFailure& a, const WorkerFailure& b) {
  return a.worker.pid == b.worker.pid && a.worker.rank == b.worker.rank && a.host == b.host;
}

// A replaced worker's entry: its failure, then what became of it.
std::string describe_replacement(const InPlaceReplacement& r, std::size_t index) {
  return describe(r.failure, index) + "  recovery  : replaced in place by pid " +
         std::to_string(r.new_pid) + " (generation " + std::to_string(r.generation) +
         "); survivors kept running: rank" + (r.survivors.size() == 1 ? " " : "s ") +
         rank_list(r.survivors) + "\n";
}

}  // namespace

std::vector<InPlaceReplacement> merge_replacements(const std::vector<InPlaceReplacement>& own,
                                                   const std::vector<InPlaceReplacement>& others) {
  std::vector<InPlaceReplacement> all = own;
  for (const InPlaceReplacement& r : others) {
    const bool known = std::any_of(all.begin(), all.end(), [&](const InPlaceReplacement& k) {
      return same_worker(k.failure, r.failure);
    });
    if (!known) all.push_back(r);
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const InPlaceReplacement& a, const InPlaceReplacement& b) {
                     if (a.failure.time != b.failure.time) return a.failure.time < b.failure.time;
                     return a.failure.worker.rank < b.failure.worker.rank;
                   });
  return all;
}

std::string format_replacement(const std::string& script, const InPlaceReplacement& r) {
  const std::string rule(60, '=');
  const std::string thin(60, '-');
  std::ostringstream out;
  out << rule << "\n"
      << script << " worker " << r.failure.worker.rank << " FAILED, replaced in place\n"
      << thin << "\n"
      << describe_replacement(r, 0) << rule << "\n";
  return valid_utf8(out.str());
}

std::string format_report(const std::string& script, const std::vector<WorkerFailure>& failures,
                          const std::vector<InPlaceReplacement>& replaced) {
  const std::string rule(60, '=');
  const std::string thin(60, '-');
  const std::size_t root = root_cause_index(failures);
  std::ostringstream out;
  out << rule << "\n" << script << " FAILED\n" << thin << "\nFailures:\n";
  std::size_t shown = 0;
  for (std::size_t i = 0; i < failures.size(); ++i) {
    if (i != root) out << describe(failures[i], ++shown);
  }
  if (shown == 0) out << "  <NO_OTHER_FAILURES>\n";
  out << thin << "\nRoot Cause (first observed failure):\n" << describe(failures[root], 0);
  // The root cause itself replaced in place, the recovery of which failed: said there, not
  // listed again among the replacements the job went on after; nor are the failures folded into
  // that recovery (a later generation superseding it) or that ended with it: their replacements
  // are said with it.
  const WorkerFailure& f = failures[root];
  const auto own = std::find_if(replaced.begin(), replaced.end(), [&](const InPlaceReplacement& r) {
    return same_worker(r.failure, f);
  });
  std::vector<const InPlaceReplacement*> before;
  std::vector<const InPlaceReplacement*> with_it;
  for (const auto& r : replaced) {
    if (own == replaced.end()) {  // no recovery of the root cause's: each one the job went on after
      before.push_back(&r);
      continue;
    }
    if (&r == &*own) continue;
    const bool ended = std::any_of(failures.begin(), failures.end(), [&](const WorkerFailure& w) {
      return same_worker(r.failure, w);
    });
    (ended || r.generation >= own->generation ? with_it : before).push_back(&r);
  }
  if (own != replaced.end()) {
    out << "  recovery  : replaced in place by pid " << own->new_pid << " (generation "
        << own->generation << "), a recovery that did not complete\n";
  }
  for (const InPlaceReplacement* r : with_it) {
    out << "  with it   : rank " << r->failure.worker.rank << " (pid " << r->failure.worker.pid
        << (r->failure.host.empty() ? "" : " on " + r->failure.host) << ") replaced by pid "
        << r->new_pid << " (generation " << r->generation << "), in the same recovery\n";
  }
  if (!before.empty()) {
    out << thin << "\nReplaced in place before (the job went on):\n";
    for (std::size_t i = 0; i < before.size(); ++i) out << describe_replacement(*before[i], i);
  }
  out << rule << "\n";
  return valid_utf8(out.str());
}

}  // namespace dist::agent
