#include "warm/scratch.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
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

// When `pid` started (Unix seconds), nullopt when no such process runs.
std::optional<std::time_t> started_at(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return std::nullopt;
  const auto close = text.rfind(')');  // the command may hold spaces and parentheses
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  for (int i = 3; i < 22 && fields >> field; ++i) {
  }
  unsigned long long ticks = 0;
  if (!(fields >> ticks)) return std::nullopt;
  std::ifstream boot("/proc/stat");
  long long btime = 0;
  for (std::string line; std::getline(boot, line);) {
    if (line.starts_with("btime ")) btime = std::stoll(line.substr(6));
  }
  return static_cast<std::time_t>(btime + static_cast<long long>(ticks / ::sysconf(_SC_CLK_TCK)));
}

// Scratch directories of agents that are gone (an agent and its guardian killed together: Slurm
// after KillWait, an OOM kill of the whole group) hold their snapshots' memory until someone
// removes them. Only dist-launch's own (the name scratch directories have, this user's), and only
// when their agent (the pid in the name) runs no more, or that pid is now a later process.
void sweep_dead_agents(const fs::path& parent) {
  static const std::regex kName(R"(dist-launch-(\d+)-[0-9a-f]{12}-[A-Za-z0-9]{6})");
  std::error_code ec;
  int removed = 0;
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, kName)) continue;
    struct stat st {};
    if (::lstat(entry.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != ::geteuid()) {
      continue;
    }
    const auto owner = started_at(static_cast<pid_t>(std::stol(m[1].str())));
    if (owner && *owner <= st.st_mtime + 1) continue;  // its agent may still run
    std::error_code removing;
    fs::remove_all(entry.path(), removing);
    if (!removing) ++removed;
  }
  if (removed > 0) {
    spdlog::info("removed {} shared-memory director{} of dist-launch agents that are gone ({})",
                 removed, removed == 1 ? "y" : "ies", parent.string());
  }
}

}  // namespace

Scratch::Scratch(std::string_view agent_id) {
  const fs::path parent = scratch_parent();
  sweep_dead_agents(parent);
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
