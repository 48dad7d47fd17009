// The agent's private directory in shared memory, for what warm restarts and snapshots need: the
// zygote's script, the dist_launch module put on the Python workers' path, the snapshots
// themselves (snapshot_store.h). In /dev/shm (so a snapshot is a copy in memory, not a write to
// disk), else in TMPDIR; mode 0700.
//
// It must not outlive the agent, however the agent ends: memory in /dev/shm is not freed until the
// files are removed. The destructor removes it; if the agent is SIGKILLed, a guardian does: a
// `/bin/sh` started with the read end of a pipe whose write end only the agent holds, which removes
// the directory once that pipe closes. The guardian carries no job marker (the janitor leaves it
// be: it must outlive the agent), ignores the terminal's signals and has no PR_SET_PDEATHSIG; the
// worker group's stop spares it (guardian()). If both are killed together (Slurm after KillWait,
// an OOM kill of the group), the next agent on the machine removes the directory: its .alive file,
// locked (flock) by its agent for as long as that agent lives, is no longer locked.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <string_view>

namespace dist::agent::warm {

class Scratch {
 public:
  // Creates <shm or TMPDIR>/dist-launch-<agent id>/ and its guardian. Throws std::runtime_error
  // when the directory cannot be made (no guardian: a warning, and the directory may be left
  // behind by a SIGKILL).
  explicit Scratch(std::string_view agent_id);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // The guardian's pid, -1 when there is none.
  pid_t guardian() const { return guardian_; }

  // Writes `content` to path()/relative (directories made as needed), atomically; returns the
  // path. Throws std::runtime_error naming the file.
  std::filesystem::path write_file(const std::filesystem::path& relative,
                                   std::string_view content) const;

 private:
  void hold_alive_lock();
  void start_guardian();

  std::filesystem::path path_;
  pid_t guardian_ = -1;
  int guardian_pipe_ = -1;  // its write end: closed, the guardian removes path_ and exits
  int alive_fd_ = -1;       // path_/.alive, locked while this agent lives (the sweep's sign)
};

}  // namespace dist::agent::warm
