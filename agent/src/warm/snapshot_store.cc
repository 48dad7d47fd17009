#include "warm/snapshot_store.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace dist::agent::warm {

namespace fs = std::filesystem;

namespace {

constexpr char kRankPrefix[] = "local_rank_";
constexpr char kSnapshotSuffix[] = ".snap";
constexpr char kStepPrefix[] = "step_";

bool is_snapshot(const std::string& name) {
  return name.starts_with(kStepPrefix) && name.ends_with(kSnapshotSuffix);
}

// The complete snapshots in a rank's folder, oldest first (the names sort by step).
std::vector<std::string> snapshots_in(const fs::path& rank_dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(rank_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (is_snapshot(name)) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Half the free space of the file system `dir` is on: the default bound with --snapshot-dir alone.
std::uint64_t default_limit(const fs::path& dir) {
  struct statvfs info {};
  if (::statvfs(dir.c_str(), &info) != 0) return 1ULL << 30;
  return static_cast<std::uint64_t>(info.f_bavail) * info.f_frsize / 2;
}

void fsync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Copies `in` (from its start) to `out`; false with errno on failure.
bool copy_all(int in, int out, off_t size) {
  off_t offset = 0;
  while (offset < size) {
    const ssize_t n = ::sendfile(out, in, &offset, static_cast<std::size_t>(size - offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
  }
  return true;
}

}  // namespace

SnapshotStore::SnapshotStore(const WarmOptions& options, const Scratch& scratch)
    : directory_(scratch.path() / "snapshots"), persist_dir_(options.snapshot_dir) {
  std::error_code ec;
  fs::create_directories(directory_, ec);
  if (ec) throw std::runtime_error("cannot create " + directory_.string() + ": " + ec.message());
  memory_limit_ =
      options.snapshot_memory_bytes ? options.snapshot_memory_bytes : default_limit(directory_);
  environment_[kSnapshotDirVariable] = directory_.string();
  environment_[kSnapshotMemoryVariable] = std::to_string(memory_limit_);
  if (!persist_dir_.empty()) {
    persist_dir_ = fs::absolute(persist_dir_, ec);
    fs::create_directories(persist_dir_, ec);
    if (ec) {
      throw std::runtime_error("cannot create --snapshot-dir " + persist_dir_.string() + ": " +
                               ec.message());
    }
    environment_[kSnapshotPersistVariable] = persist_dir_.string();
  }
  spdlog::debug("snapshots in {} (at most {} bytes){}", directory_.string(), memory_limit_,
                persist_dir_.empty() ? "" : ", persisted to " + persist_dir_.string());
  if (!persist_dir_.empty()) persister_ = std::thread([this] { run_persister(); });
}

SnapshotStore::~SnapshotStore() {
  if (!persister_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  persister_.join();
  persist_all();  // what the last interval left
}

void SnapshotStore::persist_now() {
  if (!persister_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    urgent_ = true;
  }
  wake_.notify_all();
}

void SnapshotStore::run_persister() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, kPersistInterval, [this] { return stopping_ || urgent_; });
    if (stopping_) break;
    urgent_ = false;
    lock.unlock();
    persist_all();
    lock.lock();
  }
}

void SnapshotStore::persist_all() {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(directory_, ec)) {
    const std::string rank = entry.path().filename().string();
    if (!rank.starts_with(kRankPrefix)) continue;
    const auto names = snapshots_in(entry.path());
    if (names.empty() || persisted_[rank] == names.back()) continue;
    if (persist(persist_dir_ / rank, entry.path() / names.back())) persisted_[rank] = names.back();
  }
}

// One snapshot to disk, atomically; the rank's older persisted snapshots beyond
// kPersistedPerRank go. False (with a warning) when it could not be copied, or the writer reused
// the file meanwhile (a newer one is then taken next time).
bool SnapshotStore::persist(const fs::path& rank_dir, const fs::path& source) {
  std::error_code ec;
  fs::create_directories(rank_dir, ec);
  const int in = ::open(source.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return false;  // recycled by its rank since it was listed
  struct stat before {};
  ::fstat(in, &before);
  const fs::path target = rank_dir / source.filename();
  const fs::path partial =
      rank_dir / (".tmp." + source.filename().string() + "." + std::to_string(::getpid()));
  const int out = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  bool ok = out >= 0 && copy_all(in, out, before.st_size) && ::fsync(out) == 0;
  const int error = errno;
  if (out >= 0) ::close(out);
  ::close(in);
  struct stat after {};
  // A writer reuses its oldest file by renaming it first: still there under its name, the
  // copy is the snapshot it names.
  const bool unchanged = ::stat(source.c_str(), &after) == 0 && after.st_ino == before.st_ino;
  if (!ok || !unchanged) {
    fs::remove(partial, ec);
    if (!ok) {
      spdlog::warn("cannot persist the snapshot {} to {}: {}", source.string(), rank_dir.string(),
                   std::strerror(error));
    }
    return false;
  }
  fs::rename(partial, target, ec);
  if (ec) {
    spdlog::warn("cannot persist the snapshot {}: {}", target.string(), ec.message());
    fs::remove(partial, ec);
    return false;
  }
  fsync_directory(rank_dir);
  auto names = snapshots_in(rank_dir);
  while (names.size() > static_cast<std::size_t>(kPersistedPerRank)) {
    fs::remove(rank_dir / names.front(), ec);
    names.erase(names.begin());
  }
  spdlog::debug("snapshot {} persisted to {}", source.filename().string(), rank_dir.string());
  return true;
}

void SnapshotStore::sweep_torn() {
  std::error_code ec;
  for (const auto& rank : fs::directory_iterator(directory_, ec)) {
    std::error_code inner;
    for (const auto& file : fs::directory_iterator(rank.path(), inner)) {
      if (file.path().filename().string().starts_with(".tmp.")) {
        spdlog::debug("removing {}: a save its worker did not finish", file.path().string());
        fs::remove(file.path(), inner);
      }
    }
  }
}

}  // namespace dist::agent::warm
