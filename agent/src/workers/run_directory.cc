#include "workers/run_directory.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dist/store/token.h"

namespace dist::agent {

namespace fs = std::filesystem;

namespace {

fs::path make_unique_directory(const fs::path& parent, const std::string& prefix) {
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) {
    throw std::runtime_error("cannot create log directory " + parent.string() + ": " +
                             ec.message());
  }
  std::string pattern = (parent / (prefix + "XXXXXX")).string();
  if (!::mkdtemp(pattern.data())) {
    throw std::runtime_error("cannot create a directory in " + parent.string() + ": " +
                             std::strerror(errno));
  }
  return pattern;
}

// Where a temporary run directory goes (see the header). A temporary directory the user chose, in
// any of the variables temp_directory_path() reads, is theirs.
fs::path temporary_parent(const OutputConfig& config) {
  bool chosen = false;
  for (const char* name : {"TMPDIR", "TMP", "TEMP", "TEMPDIR"}) {
    const char* value = std::getenv(name);
    chosen = chosen || (value && *value);
  }
  const bool small = !config.writes_log_files() && config.duplicate_stdout_filters.empty() &&
                     config.duplicate_stderr_filters.empty();
  if (!chosen && small) {
    if (auto memory = shared_memory_directory(); !memory.empty()) return memory;
  }
  return fs::temp_directory_path();
}

// Removes `name` in the directory `parent` and everything under it, never following a symbolic
// link. An empty directory (a worker's that wrote nothing, the common case) costs one rmdir(2),
// where std::filesystem::remove_all opens, inspects and reads each: 11 directories of a launch of
// 8 took about 90 system calls. Best effort: what cannot be removed stays.
void remove_tree(int parent, const char* name) {
  if (::unlinkat(parent, name, AT_REMOVEDIR) == 0 || errno == ENOENT) return;
  if (errno == ENOTDIR) {
    ::unlinkat(parent, name, 0);
    return;
  }
  if (errno != ENOTEMPTY && errno != EEXIST) return;
  const int dir = ::openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dir < 0) return;
  std::vector<std::pair<std::string, bool>> entries;  // name, is a directory
  // On the heap: a deep tree recurses once per level.
  auto buffer = std::make_unique<std::array<dirent64, 64>>();
  for (ssize_t n; (n = ::getdents64(dir, buffer->data(), sizeof *buffer)) > 0;) {
    for (ssize_t at = 0; at < n;) {
      const auto* entry =
          reinterpret_cast<const dirent64*>(reinterpret_cast<const char*>(buffer->data()) + at);
      at += entry->d_reclen;
      const std::string_view entry_name = entry->d_name;
      if (entry_name == "." || entry_name == "..") continue;
      entries.emplace_back(entry_name, entry->d_type == DT_DIR || entry->d_type == DT_UNKNOWN);
    }
  }
  for (const auto& [entry, is_directory] : entries) {
    if (is_directory || ::unlinkat(dir, entry.c_str(), 0) != 0) remove_tree(dir, entry.c_str());
  }
  ::close(dir);
  ::unlinkat(parent, name, AT_REMOVEDIR);
}

}  // namespace

fs::path shared_memory_directory() {
  constexpr char kSharedMemory[] = "/dev/shm";
  constexpr long kTmpfsMagic = 0x01021994;
  struct statfs info {};
  if (::statfs(kSharedMemory, &info) == 0 && info.f_type == kTmpfsMagic &&
      ::access(kSharedMemory, W_OK | X_OK) == 0) {
    return kSharedMemory;
  }
  return {};
}

RunDirectory::RunDirectory(const JobConfig& job, const OutputConfig& config,
                           const std::string& host) {
  temporary_ = config.log_dir.empty();
  // The run id (--rdzv-id, a string of the user's) names a directory in --log-dir, never a path:
  // each '/' in it is a '_' ("../x" made the run's logs outside --log-dir).
  std::string prefix = job.run_id + "_";
  std::replace(prefix.begin(), prefix.end(), '/', '_');
  root_ = temporary_ ? make_unique_directory(temporary_parent(config), "dist-launch-")
                     : make_unique_directory(config.log_dir, prefix);
  run_dir_ = root_;
  if (job.elastic) {  // node ranks change from round to round
    run_dir_ /= "node_" + host + "_" + std::to_string(::getpid());
  } else if (job.max_nodes > 1) {
    run_dir_ /= "node_" + std::to_string(job.node_rank);
  }
  std::error_code ec;
  fs::create_directories(run_dir_, ec);
  if (ec) {
    throw std::runtime_error("cannot create log directory " + run_dir_.string() + ": " +
                             ec.message());
  }
}

fs::path RunDirectory::attempt(int round, int local_rank) const {
  return run_dir_ / ("attempt_" + std::to_string(round)) / std::to_string(local_rank);
}

namespace {

// How deep prune_empty_tree goes: root/node_*/attempt_*/<local rank>/ and a little more.
constexpr int kMaxPruneDepth = 6;

bool prune_empty(int parent, const char* name, int depth) {
  const int fd = ::openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errno != ENOENT;
  bool left = false;
  alignas(dirent64) char buffer[4096];
  while (true) {
    const ssize_t n = ::getdents64(fd, buffer, sizeof buffer);
    if (n <= 0) {
      left = left || n < 0;
      break;
    }
    for (ssize_t at = 0; at < n;) {
      const auto* entry = reinterpret_cast<const dirent64*>(buffer + at);
      at += entry->d_reclen;
      const char* entry_name = entry->d_name;
      if (std::strcmp(entry_name, ".") == 0 || std::strcmp(entry_name, "..") == 0) continue;
      struct stat st {};
      if (::fstatat(fd, entry_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        left = true;
      } else if (S_ISDIR(st.st_mode) && depth < kMaxPruneDepth) {
        left = prune_empty(fd, entry_name, depth + 1) || left;
      } else if (S_ISREG(st.st_mode) && st.st_size == 0) {
        left = ::unlinkat(fd, entry_name, 0) != 0 || left;
      } else {
        left = true;
      }
    }
  }
  ::close(fd);
  return left || ::unlinkat(parent, name, AT_REMOVEDIR) != 0;
}

}  // namespace

bool prune_empty_tree(int parent, const char* name) {
  return prune_empty(parent, name, 0);
}

std::string RunDirectory::finish(bool keep, const std::string& why) {
  if (!temporary_) return "";
  // Kept, what says something: the empty files (a stack file no rank was asked to fill, a log
  // that got nothing) go, and a directory left with nothing is not kept (in /dev/shm, memory:
  // jobs that failed used to leave one each, most of them empty).
  if (keep && prune_empty_tree(AT_FDCWD, root_.c_str()))
    return "worker logs and error files kept in " + root_.string() +
           (why.empty() ? "" : " (" + why + ")");
  remove_tree(AT_FDCWD, root_.c_str());
  return "";
}

std::string provide_token_file(const RendezvousConfig& config, const RunDirectory& dir,
                               std::string& written) {
  if (config.secret.empty() || !config.token_file.empty()) return config.token_file;
  const std::string path = (dir.path() / "token").string();
  store::write_secret_file(path, config.secret);
  return written = path;
}

}  // namespace dist::agent
