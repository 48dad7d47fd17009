#include "warm/snapshot_store.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "dist/contract/snapshot_format.h"
#include "warm/snapshot_replicas.h"

namespace dist::agent::warm {

namespace fs = std::filesystem;

namespace {

using snapshot_format::kFooterBytes;
using snapshot_format::kFooterTag;
using snapshot_format::kMagic;
using snapshot_format::kMaxHeaderBytes;
using snapshot_format::kPrefixBytes;
constexpr const char* kRankPrefix = snapshot_format::kRankFolderPrefix;
constexpr char kSnapshotSuffix[] = ".snap";
constexpr char kStepPrefix[] = "step_";

bool is_snapshot(const std::string& name) {
  return name.starts_with(kStepPrefix) && name.ends_with(kSnapshotSuffix);
}

bool read_at(int fd, void* into, std::size_t n, off_t offset) {
  auto* p = static_cast<char*>(into);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, offset);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<std::size_t>(got);
    offset += got;
  }
  return true;
}

std::string human(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double n = static_cast<double>(bytes);
  int u = 0;
  while (n >= 1024 && u < 4) {
    n /= 1024;
    ++u;
  }
  char text[32];
  std::snprintf(text, sizeof text, u == 0 ? "%.0f %s" : "%.1f %s", n, units[u]);
  return text;
}

// This process's cgroup memory limit (v2 memory.max, or v1 memory.limit_in_bytes); nullopt when
// none is set or it cannot be read. Shared memory counts against it.
std::optional<std::uint64_t> cgroup_memory_limit() {
  std::ifstream groups("/proc/self/cgroup");
  for (std::string line; std::getline(groups, line);) {
    const auto first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    fs::path file;
    if (controllers.empty()) {
      file = fs::path("/sys/fs/cgroup") / path.substr(1) / "memory.max";
    } else if (controllers == "memory" || controllers.find("memory,") != std::string::npos ||
               controllers.ends_with(",memory")) {
      file = fs::path("/sys/fs/cgroup/memory") / path.substr(1) / "memory.limit_in_bytes";
    } else {
      continue;
    }
    std::ifstream in(file);
    std::string value;
    if (!(in >> value) || value == "max") continue;
    try {
      const std::uint64_t limit = std::stoull(value);
      if (limit < (1ULL << 60)) return limit;  // v1 writes "no limit" as a huge number
    } catch (const std::exception&) {
    }
  }
  return std::nullopt;
}

// --snapshot-memory must fit where the snapshots live: a save past the file system's size or the
// cgroup's memory fails (ENOSPC) or kills the job (the OOM killer) halfway through training.
void check_fits(std::uint64_t limit, const fs::path& directory) {
  struct statvfs info {};
  if (::statvfs(directory.c_str(), &info) == 0) {
    const std::uint64_t size = static_cast<std::uint64_t>(info.f_blocks) * info.f_frsize;
    const std::uint64_t free = static_cast<std::uint64_t>(info.f_bavail) * info.f_frsize;
    if (limit > size) {
      throw std::runtime_error(
          "--snapshot-memory " + human(limit) + " is more than " +
          directory.parent_path().parent_path().string() + "'s file system holds (" + human(size) +
          " in all, " + human(free) +
          " free): lower --snapshot-memory, or give the container more shared memory (docker "
          "--shm-size, a larger /dev/shm)");
    }
    if (limit > free) {
      spdlog::warn("--snapshot-memory {}: only {} of {} is free now; saves past it will fail",
                   human(limit), human(free), directory.parent_path().parent_path().string());
    }
  }
  if (const auto cgroup = cgroup_memory_limit(); cgroup && limit > *cgroup) {
    throw std::runtime_error("--snapshot-memory " + human(limit) +
                             " is more than this job's memory limit (its cgroup's, " +
                             human(*cgroup) +
                             "), which shared memory counts against: lower "
                             "--snapshot-memory, or raise the limit");
  }
}

// Half the free space of the file system `dir` is on: the default bound with --snapshot-dir alone.
// (and half the cgroup's memory limit, where there is one).
std::uint64_t default_limit(const fs::path& dir) {
  struct statvfs info {};
  std::uint64_t limit = 1ULL << 30;
  if (::statvfs(dir.c_str(), &info) == 0) {
    limit = static_cast<std::uint64_t>(info.f_bavail) * info.f_frsize / 2;
  }
  if (const auto cgroup = cgroup_memory_limit()) limit = std::min(limit, *cgroup / 2);
  return limit;
}

void fsync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Copies `in` (from its start) to `out`; false with errno on failure (0: `in` shrank, its writer
// rewrote it).
bool copy_all(int in, int out, off_t size) {
  off_t offset = 0;
  while (offset < size) {
    const ssize_t n = ::sendfile(out, in, &offset, static_cast<std::size_t>(size - offset));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) errno = 0;
    if (n <= 0) return false;
  }
  return true;
}

}  // namespace

std::vector<Saved> snapshots_in(const fs::path& rank_dir) {
  std::vector<Saved> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(rank_dir, ec)) {
    if (!is_snapshot(entry.path().filename().string())) continue;
    if (auto stamp = read_stamp(entry.path())) found.push_back({entry.path(), *stamp});
  }
  std::sort(found.begin(), found.end(),
            [](const Saved& a, const Saved& b) { return a.stamp.saved_at < b.stamp.saved_at; });
  return found;
}

std::string snapshot_name(std::uint64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "%s%020llu%s", kStepPrefix,
                static_cast<unsigned long long>(step), kSnapshotSuffix);
  return name;
}

std::string header_of(int fd) {
  char prefix[kPrefixBytes];
  if (!read_at(fd, prefix, sizeof prefix, 0)) return {};
  std::uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, prefix + 8, 8);
  if (header_bytes > kMaxHeaderBytes) return {};
  std::string bytes(prefix, sizeof prefix);
  bytes.resize(kPrefixBytes + header_bytes);
  if (!read_at(fd, bytes.data() + kPrefixBytes, header_bytes, kPrefixBytes)) return {};
  return bytes;
}

namespace {

std::string header_of_file(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string bytes = header_of(fd);
  ::close(fd);
  return bytes;
}

}  // namespace

std::string job_folder(const std::string& job) {
  if (job.empty()) return "none";
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string name;
  for (const char c : job) {
    const bool safe = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '_' || c == '-' || (c == '.' && !name.empty());
    if (safe) {
      name += c;
    } else {  // one job, one folder: distinct ids never share one
      const auto byte = static_cast<unsigned char>(c);
      name += {'%', kHex[byte >> 4], kHex[byte & 15]};
    }
  }
  return name;
}

std::optional<SaveStamp> read_stamp(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return std::nullopt;
  const auto size = static_cast<std::uint64_t>(st.st_size);
  char prefix[kPrefixBytes];
  char footer[kFooterBytes];
  if (size < kPrefixBytes + kFooterBytes || !read_at(fd, prefix, sizeof prefix, 0)) {
    return std::nullopt;
  }
  std::uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, prefix + 8, 8);
  if (std::memcmp(prefix, kMagic, 8) != 0 || header_bytes > kMaxHeaderBytes ||
      kPrefixBytes + header_bytes + kFooterBytes > size) {
    return std::nullopt;
  }
  std::string header(header_bytes, '\0');
  if (!read_at(fd, header.data(), header.size(), kPrefixBytes) ||
      !read_at(fd, footer, sizeof footer, static_cast<off_t>(size - kFooterBytes))) {
    return std::nullopt;
  }
  std::uint64_t total = 0, footer_id = 0;
  std::memcpy(&total, footer + 8, 8);
  std::memcpy(&footer_id, footer + 16, 8);
  if (std::memcmp(footer, kFooterTag, 8) != 0 || total != size || footer_id == 0) {
    return std::nullopt;
  }
  const auto json = nlohmann::json::parse(header, nullptr, false);
  if (!json.is_object()) return std::nullopt;
  SaveStamp stamp;
  try {
    stamp.save_id = json.at("save_id").get<std::uint64_t>();
    stamp.saved_at = json.at("saved_at").get<std::int64_t>();
    stamp.step = json.value("step", std::uint64_t{0});
    stamp.job = json.value("job", std::string());
    stamp.rank = json.value("rank", std::int64_t{-1});
    stamp.world_size = json.value("world_size", std::int64_t{0});
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
  if (stamp.save_id != footer_id)
    return std::nullopt;  // the header of one save, the footer of another
  return stamp;
}

SnapshotStore::SnapshotStore(const WarmOptions& options, const Scratch& scratch,
                             const std::string& job, const std::string& run,
                             const std::string& secret, const std::string& host,
                             const std::string& bind)
    : directory_(scratch.path() / "snapshots"), persist_dir_(options.snapshot_dir) {
  std::error_code ec;
  fs::create_directories(directory_, ec);
  if (ec) throw std::runtime_error("cannot create " + directory_.string() + ": " + ec.message());
  memory_limit_ =
      options.snapshot_memory_bytes ? options.snapshot_memory_bytes : default_limit(directory_);
  if (options.snapshot_memory_bytes) check_fits(memory_limit_, directory_);
  environment_[kSnapshotDirVariable] = directory_.string();
  environment_[kSnapshotMemoryVariable] = std::to_string(memory_limit_);
  environment_[kSnapshotRunVariable] = run;
  if (!persist_dir_.empty()) {
    persist_dir_ = fs::absolute(persist_dir_, ec) / job_folder(job);
    fs::create_directories(persist_dir_, ec);
    if (ec) {
      throw std::runtime_error("cannot create --snapshot-dir " + persist_dir_.string() + ": " +
                               ec.message());
    }
    environment_[kSnapshotPersistVariable] = persist_dir_.string();
    if (job == "none") {
      spdlog::warn(
          "--snapshot-dir without --rdzv-id: this job's snapshots go to {}, which every "
          "job without an id shares (and resumes from): give each job its --rdzv-id",
          persist_dir_.string());
    }
    announce_earlier_snapshots();
  }
  spdlog::debug("snapshots in {} (at most {} bytes){}", directory_.string(), memory_limit_,
                persist_dir_.empty() ? "" : ", persisted to " + persist_dir_.string());
  if (!persist_dir_.empty()) persister_ = std::thread([this] { run_persister(); });
  if (options.snapshot_replicas > 0) {
    replicas_ = std::make_unique<SnapshotReplicas>(
        ReplicaOptions{options.snapshot_replicas, job, secret, host, bind}, directory_,
        scratch.path() / "replicas");
  }
}

SnapshotStore::~SnapshotStore() {
  replicas_.reset();
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

void SnapshotStore::use_store(const store::Endpoint& endpoint) {
  if (replicas_) replicas_->use_store(endpoint);
}

bool SnapshotStore::restore(int first_rank, int count, int other_nodes,
                            std::function<void()> done) {
  if (!replicas_ || other_nodes <= 0) return false;
  std::vector<int> ranks;
  for (int r = first_rank; r < first_rank + count; ++r) ranks.push_back(r);
  ranks = replicas_->missing(ranks);
  if (ranks.empty()) return false;
  replicas_->restore(std::move(ranks), other_nodes, std::move(done));
  return true;
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

// A resume of the job from --snapshot-dir is said, with what it will find.
void SnapshotStore::announce_earlier_snapshots() const {
  std::error_code ec;
  int ranks = 0;
  std::optional<Saved> newest;
  for (const auto& entry : fs::directory_iterator(persist_dir_, ec)) {
    if (!entry.path().filename().string().starts_with(kRankPrefix)) continue;
    const auto saved = snapshots_in(entry.path());
    if (saved.empty()) continue;
    ++ranks;
    if (!newest || saved.back().stamp.saved_at > newest->stamp.saved_at) newest = saved.back();
  }
  if (!newest) return;
  spdlog::info(
      "--snapshot-dir {} holds this job's snapshots from an earlier run ({} rank{}, the "
      "newest {}): workers that load() resume from them",
      persist_dir_.string(), ranks, ranks == 1 ? "" : "s",
      (newest->path.parent_path().filename() / newest->path.filename()).string());
}

void SnapshotStore::persist_all() {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(directory_, ec)) {
    const std::string rank = entry.path().filename().string();
    if (!rank.starts_with(kRankPrefix)) continue;
    const auto saved = snapshots_in(entry.path());
    if (saved.empty() || persisted_[rank] == saved.back().stamp.save_id) continue;
    const Saved& newest = saved.back();
    if (persist(persist_dir_ / rank, newest.path, newest.stamp.save_id)) {
      persisted_[rank] = newest.stamp.save_id;
    }
  }
}

// One snapshot to disk, atomically; the rank's older persisted saves beyond kPersistedPerRank go
// (the oldest saved first, whichever run saved them). False (with a warning) when it could not be
// copied; false, quietly, when the writer rewrote the file meanwhile (the copy is not the save it
// names: a newer one is taken next time).
bool SnapshotStore::persist(const fs::path& rank_dir, const fs::path& source,
                            std::uint64_t save_id) {
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
  // The copy was read front to back, as a worker's load() reads: it is whole when its header's and
  // footer's save ids agree, the save it names is the one listed, and its header is the file's
  // header now (not one read while the writer rewrote it).
  const auto copied = ok ? read_stamp(partial) : std::nullopt;
  const bool whole =
      copied && copied->save_id == save_id && header_of(in) == header_of_file(partial);
  ::close(in);
  if (!ok || !whole) {
    fs::remove(partial, ec);
    if (!ok && error != 0) {
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
  // The two newest saves stay (never the one just copied, whatever another host's clock said).
  auto saved = snapshots_in(rank_dir);
  for (std::size_t i = 0; i + kPersistedPerRank < saved.size(); ++i) {
    if (saved[i].path != target) fs::remove(saved[i].path, ec);
  }
  spdlog::debug("snapshot {} persisted to {}", source.filename().string(), rank_dir.string());
  return true;
}

nlohmann::ordered_json SnapshotStore::status() const {
  std::uint64_t used = 0;
  auto ranks = nlohmann::ordered_json::array();
  std::error_code ec;
  std::vector<std::pair<int, Saved>> newest;
  for (const auto& entry : fs::recursive_directory_iterator(directory_, ec)) {
    struct stat st {};
    if (::lstat(entry.path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      used += static_cast<std::uint64_t>(st.st_blocks) * 512;
    }
  }
  for (const auto& entry : fs::directory_iterator(directory_, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(kRankPrefix)) continue;
    const auto saved = snapshots_in(entry.path());
    if (saved.empty()) continue;
    try {
      newest.emplace_back(std::stoi(name.substr(std::strlen(kRankPrefix))), saved.back());
    } catch (const std::exception&) {
    }
  }
  std::sort(newest.begin(), newest.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [rank, save] : newest) {
    ranks.push_back({{"rank", rank},
                     {"step", save.stamp.step},
                     {"saved_at", static_cast<double>(save.stamp.saved_at) / 1e9}});
  }
  nlohmann::ordered_json all = {
      {"memory_used_bytes", used},
      {"memory_limit_bytes", memory_limit_},
      {"persisted_to", persist_dir_.empty() ? nlohmann::ordered_json()
                                            : nlohmann::ordered_json(persist_dir_.string())},
      {"ranks", std::move(ranks)}};
  if (replicas_) all["replicas"] = replicas_->status();
  return all;
}

void SnapshotStore::list_ranks(int first_rank, int count) {
  const fs::path ranks = directory_ / snapshot_format::kRanksFile;
  const fs::path partial = directory_ / (std::string(snapshot_format::kRanksFile) + ".tmp");
  std::ofstream out(partial, std::ios::trunc);
  for (int r = first_rank; r < first_rank + count; ++r) out << r << '\n';
  out.close();
  std::error_code ec;
  fs::rename(partial, ranks, ec);
  if (ec) spdlog::warn("cannot list this node's ranks in {}: {}", ranks.string(), ec.message());
}

void SnapshotStore::begin_attempt(int first_rank, int count) {
  if (replicas_) replicas_->cancel_restores();  // an earlier attempt's puts nothing in place now
  list_ranks(first_rank, count);
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
