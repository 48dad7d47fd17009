#include "warm/scratch.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "warm/clone_exec.h"
#include "workers/run_directory.h"

namespace dist::agent::warm {

namespace fs = std::filesystem;

namespace {

constexpr char kShell[] = "/bin/sh";

// /dev/shm when it is a writable tmpfs, else TMPDIR's directory.
fs::path scratch_parent() {
  if (auto memory = shared_memory_directory(); !memory.empty()) return memory;
  return fs::temp_directory_path();
}

}  // namespace

Scratch::Scratch(std::string_view agent_id) {
  const fs::path parent = scratch_parent();
  std::string pattern = (parent / ("dist-launch-" + std::string(agent_id) + "-XXXXXX")).string();
  if (!::mkdtemp(pattern.data())) {
    throw std::runtime_error("cannot create a directory in " + parent.string() + ": " +
                             std::strerror(errno));
  }
  path_ = pattern;
  start_guardian();
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
