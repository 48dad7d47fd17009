#include "processes/leftovers.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>

#include "dist/agent/signals.h"
#include "output/valid_text.h"
#include "processes/job_processes.h"

namespace dist::agent {

namespace {

// "pid 123 (sleep)": the process's name from /proc (its comm), or the pid alone once it is gone.
std::string name_of(pid_t pid) {
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(comm, name);
  return "pid " + std::to_string(pid) + (name.empty() ? "" : " (" + valid_utf8(name) + ")");
}

// Whether every child of this process (zombies included) is one of `spared`, by each thread's
// /proc/self/task/<tid>/children. False when the kernel does not list them (CONFIG_PROC_CHILDREN).
bool only_spared_children(const std::vector<pid_t>& spared) {
  std::error_code ec;
  bool listed = false;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream children(task.path() / "children");
    if (!children) return false;
    listed = true;
    for (pid_t pid; children >> pid;) {
      if (std::find(spared.begin(), spared.end(), pid) == spared.end()) return false;
    }
  }
  return listed;
}

}  // namespace

bool Leftovers::gone() {
  if (!has_children()) return true;  // the fast path: a subreaper with no child has no descendant
  // The same when the only children are the agent's own helpers (an orphan of theirs is a child).
  if (!spared_.empty()) {
    std::vector<pid_t> own = spared_;
    own.push_back(janitor_);  // a child too (has_children() does not count it: no exit signal)
    if (only_spared_children(own)) return true;
  }
  switch (stage_) {
    case Stage::kNone:
      stage_ = Stage::kGrace;
      return false;
    case Stage::kGrace:
      return false;
    case Stage::kGraceOver: {
      stage_ = Stage::kTerminated;
      const Sent sent = signal_all(SIGTERM, /*named=*/true);
      if (sent.signalled > 0) {
        spdlog::warn(
            "the workers left {} process(es) running ({}): SIGTERM now, SIGKILL at the shutdown "
            "timeout",
            sent.signalled, sent.named);
      }
      return false;
    }
    case Stage::kTerminated:
      return false;
    case Stage::kKilled: {
      // Again on every exit: a process forked just before the last SIGKILL got none. The rest are
      // dying or zombies: their exits come, the agent reaps them, and has_children() says so.
      const Sent sent = signal_all(SIGKILL);
      if (sent.signalled == 0 && sent.refused > 0) {
        spdlog::warn(
            "{} process(es) the workers left cannot be killed (another user's): leaving them",
            sent.refused);
        return true;
      }
      return false;
    }
  }
  return true;
}

int Leftovers::kill() {
  stage_ = Stage::kKilled;
  return signal_all(SIGKILL).signalled;
}

Leftovers::Sent Leftovers::signal_all(int signal, bool named) const {
  Sent sent;
  for (const ProcessRef& p : job_processes(agent_id_, janitor_)) {
    if (std::find(spared_.begin(), spared_.end(), p.pid) != spared_.end()) continue;
    constexpr int kNamed = 4;  // said by name (read before the signal: it may end the process)
    const std::string name = !named ? "" : sent.signalled < kNamed ? name_of(p.pid) : "...";
    if (signal_process(p, signal)) {
      if (named && sent.signalled <= kNamed) sent.named += (sent.named.empty() ? "" : ", ") + name;
      ++sent.signalled;
      spdlog::debug("{} to pid {}, left by the workers", signal_name(signal), p.pid);
    } else if (errno == EPERM) {
      ++sent.refused;
    }
  }
  return sent;
}

}  // namespace dist::agent
