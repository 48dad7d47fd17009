#include "processes/leftovers.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <cerrno>

#include "dist/agent/signals.h"
#include "processes/job_processes.h"

namespace dist::agent {

bool Leftovers::gone() {
  if (!has_children()) return true;  // the fast path: a subreaper with no child has no descendant
  switch (stage_) {
    case Stage::kNone: {
      stage_ = Stage::kTerminated;
      const Sent sent = signal_all(SIGTERM);
      spdlog::warn(
          "the workers left {} process(es) running: SIGTERM now, SIGKILL at the shutdown timeout",
          sent.signalled);
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

Leftovers::Sent Leftovers::signal_all(int signal) const {
  Sent sent;
  for (const ProcessRef& p : job_processes(agent_id_, janitor_)) {
    if (signal_process(p, signal)) {
      ++sent.signalled;
      spdlog::debug("{} to pid {}, left by the workers", signal_name(signal), p.pid);
    } else if (errno == EPERM) {
      ++sent.refused;
    }
  }
  return sent;
}

}  // namespace dist::agent
