#include "warm/scratch.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <regex>
#include <stdexcept>

#include "warm/clone_exec.h"
#include "workers/run_directory.h"

namespace dist::agent::warm {

namespace fs = std::filesystem;

namespace {

constexpr char kShell[] = "/bin/sh";

constexpr char kAliveFile[] = ".alive";  // locked (flock) by its agent for the directory's life

// Scratch directories of agents that are gone (an agent and its guardian killed together: Slurm
// after KillWait, an OOM kill of the whole group) hold their snapshots' memory until someone
// removes them. Only dist-launch's own (the name scratch directories have, this user's), and only
// when nobody holds the lock on its .alive file: its agent's lock goes only with the agent, in
// whatever pid namespace it runs. A directory without one (being made) is left alone.
void sweep_dead_agents(const fs::path& parent) {
  static const std::regex kName(R"(dist-launch-\d+-[0-9a-f]{12}-[A-Za-z0-9]{6})");
  std::error_code ec;
  int removed = 0;
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    if (!std::regex_match(entry.path().filename().string(), kName)) continue;
    struct stat st {};
    if (::lstat(entry.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != ::geteuid()) {
      continue;
    }
    const int alive =
        ::open((entry.path() / kAliveFile).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (alive < 0) continue;
    const bool gone = ::flock(alive, LOCK_EX | LOCK_NB) == 0;
    if (gone) {
      std::error_code removing;
      fs::remove_all(entry.path(), removing);
      if (!removing) ++removed;
    }
    ::close(alive);
  }
  if (removed > 0) {
    spdlog::info("removed {} shared-memory director{} of dist-launch agents that are gone ({})",
                 removed, removed == 1 ? "y" : "ies", parent.string());
  }
}

}  // namespace

Scratch::Scratch(std::string_view agent_id) {
  const fs::path memory = shared_memory_directory();
  const fs::path parent = memory.empty() ? fs::temp_directory_path() : memory;
  if (!memory.empty()) sweep_dead_agents(memory);  // never a TMPDIR other hosts may share
  std::string pattern = (parent / ("dist-launch-" + std::string(agent_id) + "-XXXXXX")).string();
  if (!::mkdtemp(pattern.data())) {
    throw std::runtime_error("cannot create a directory in " + parent.string() + ": " +
                             std::strerror(errno));
  }
  path_ = pattern;
  hold_alive_lock();
  start_guardian();
}

// Locked before it is named .alive: a sweep never finds it unlocked while this agent lives.
void Scratch::hold_alive_lock() {
  const fs::path partial = path_ / (std::string(kAliveFile) + ".new");
  alive_fd_ = ::open(partial.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (alive_fd_ < 0 || ::flock(alive_fd_, LOCK_EX) != 0 ||
      ::rename(partial.c_str(), (path_ / kAliveFile).c_str()) != 0) {
    spdlog::warn("cannot lock {} ({}): a later agent will not sweep it if this one is killed",
                 (path_ / kAliveFile).string(), std::strerror(errno));
  }
}

void Scratch::start_guardian() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    spdlog::warn("cannot start the guardian of {} ({}): a SIGKILL of this agent would leave it",
                 path_.string(), std::strerror(errno));
    return;
  }
  ExecSpec spec;
  spec.executable = kShell;
  // `read` returns at the pipe's EOF: the agent exited or was killed.
  spec.argv = {"dist-launch-scratch-guardian", "-c", "read _; rm -rf -- \"$0\"", path_.string()};
  spec.env = {"PATH=/usr/bin:/bin"};
  const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  spec.fds = {{fds[0], 0}, {null, 1}, {null, 2}};
  spec.ignore_signals = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGUSR1, SIGUSR2};
  try {
    const Cloned guardian = clone_exec(spec);
    if (guardian.pidfd >= 0) ::close(guardian.pidfd);
    guardian_ = guardian.pid;
    guardian_pipe_ = fds[1];
  } catch (const std::exception& e) {
    spdlog::warn("cannot start the guardian of {} ({}): a SIGKILL of this agent would leave it",
                 path_.string(), e.what());
    ::close(fds[1]);
  }
  ::close(fds[0]);
  if (null >= 0) ::close(null);
}

Scratch::~Scratch() {
  std::error_code ec;
  fs::remove_all(path_, ec);
  if (alive_fd_ >= 0) ::close(alive_fd_);
  if (guardian_pipe_ >= 0) ::close(guardian_pipe_);
  if (guardian_ > 0) reap_cloned(guardian_);
}

fs::path Scratch::write_file(const fs::path& relative, std::string_view content) const {
  const fs::path target = path_ / relative;
  std::error_code ec;
  fs::create_directories(target.parent_path(), ec);
  const fs::path partial = target.string() + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    if (!out) throw std::runtime_error("cannot write " + partial.string());
  }
  fs::rename(partial, target, ec);
  if (ec) throw std::runtime_error("cannot write " + target.string() + ": " + ec.message());
  return target;
}

}  // namespace dist::agent::warm
