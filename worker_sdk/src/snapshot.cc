// Snapshot files, format 2: docs/SNAPSHOTS.md is the specification (identity, layout, the write
// order a reader relies on, freshness, eviction); python/dist_launch/snapshot.py writes and reads
// the same files.
#include "dist/sdk/snapshot.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "dist/contract/snapshot_format.h"
#include "dist/contract/worker_contract.h"

namespace dist::sdk {
namespace {

namespace fs = std::filesystem;
namespace contract = worker_contract;

// As python/dist_launch/snapshot.py (the variables: the worker contract's).
constexpr const char* kDirVariable = contract::kSnapshotDirVariable;
constexpr const char* kMemoryVariable = contract::kSnapshotMemoryVariable;
constexpr const char* kPersistVariable = contract::kSnapshotPersistVariable;
constexpr const char* kRunVariable = contract::kSnapshotRunVariable;
constexpr std::size_t kKeep = 2;  // saves per rank folder
using snapshot_format::kAlign;
using snapshot_format::kFooterBytes;
using snapshot_format::kFormat;
using snapshot_format::kHeldPrefix;
using snapshot_format::kMagic;
using snapshot_format::kMaxHeaderBytes;
using snapshot_format::kPrefixBytes;
using snapshot_format::kRanksFile;
constexpr const char (&kFooter)[8] = snapshot_format::kFooterTag;
constexpr std::string_view kRankPrefix = snapshot_format::kRankFolderPrefix;

std::uint64_t align(std::uint64_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

template <typename T>
std::optional<T> parse_integer(std::string_view text) {
  T v{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return {};
  return v;
}

template <typename T>
T env_integer(const char* name, T fallback) {
  const std::string text = env(name);
  if (text.empty()) return fallback;
  const auto v = parse_integer<T>(text);
  if (!v) {
    throw SnapshotError(std::string(name) + "='" + text +
                        "' is not an integer: a snapshot names its writer's job, rank and world "
                        "size (docs/SNAPSHOTS.md)");
  }
  return *v;
}

// Who this worker is: what its saves' headers name, and what a load checks.
struct Identity {
  std::string job;  // TORCHELASTIC_RUN_ID, "none" when unset
  std::string run;  // the agent's run (DIST_LAUNCH_SNAPSHOT_RUN)
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  long long generation = 0;
};

Identity identity() {
  Identity me;
  me.job = env(contract::kRunId);
  if (me.job.empty()) me.job = "none";
  me.run = env(kRunVariable);
  me.rank = env_integer<int>(contract::kRank, 0);
  me.world_size = env_integer<int>(contract::kWorldSize, 1);
  me.local_rank = env_integer<int>(contract::kLocalRank, 0);
  me.generation = env_integer<long long>(contract::kRestartCount, 0);
  return me;
}

std::string who(const Identity& me, std::uint64_t step) {
  return "the snapshot of rank " + std::to_string(me.rank) + " (local rank " +
         std::to_string(me.local_rank) + ") at step " + std::to_string(step);
}

std::string step_name(std::uint64_t step) {
  std::string digits = std::to_string(step);
  return "step_" + std::string(20 - std::min<std::size_t>(20, digits.size()), '0') + digits +
         ".snap";
}

std::optional<std::uint64_t> step_of(const std::string& name) {
  if (!name.starts_with("step_") || !name.ends_with(".snap") || name.size() <= 10) return {};
  const std::string digits = name.substr(5, name.size() - 10);
  if (digits.size() > 20 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return {};
  return parse_integer<std::uint64_t>(digits);
}

// "rank_<RANK>": its rank.
std::optional<int> rank_of_folder(const std::string& name) {
  if (!name.starts_with(kRankPrefix)) return {};
  const std::string digits = name.substr(kRankPrefix.size());
  if (!std::all_of(digits.begin(), digits.end(), ::isdigit)) return {};
  return parse_integer<int>(digits);
}

fs::path rank_dir(const fs::path& root, int rank) {
  return root / (std::string(kRankPrefix) + std::to_string(rank));
}

std::uint64_t new_save_id() {
  std::uint64_t id = 0;
  while (id == 0) {
    if (::getrandom(&id, sizeof id, 0) != static_cast<ssize_t>(sizeof id)) {
      std::random_device device;
      id = (static_cast<std::uint64_t>(device()) << 32) ^ device();
    }
  }
  return id;
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string human(double n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (n >= 1024 && u < 4) {
    n /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", n, units[u]);
  return buf;
}

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

bool read_at(int fd, void* into, std::size_t n, std::uint64_t offset) {
  auto* p = static_cast<char*>(into);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<std::size_t>(got);
    offset += static_cast<std::uint64_t>(got);
  }
  return true;
}

void pwrite_all(int fd, const void* data, std::size_t n, std::uint64_t offset,
                const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw SnapshotError("cannot write " + what + ": " + std::strerror(errno));
    p += w;
    n -= static_cast<std::size_t>(w);
    offset += static_cast<std::uint64_t>(w);
  }
}

// ---------------------------------------------------------------------------------------------
// Reading

// What a header says of a save: whose it is, which step, when.
struct Stamp {
  fs::path path;
  std::uint64_t step = 0;
  std::int64_t saved_at = 0;
  std::uint64_t save_id = 0;
  std::string job;
  std::string run;  // the agent's run that saved it
  int rank = 0;
  int world_size = 0;
  bool whole = false;  // the footer is there, of this size, and names the header's save_id
};

std::optional<Stamp> stamp_of(const nlohmann::json& header) {
  if (!header.is_object()) return std::nullopt;
  try {
    if (header.at("format").get<int>() != kFormat) return std::nullopt;
    Stamp s;
    s.step = header.at("step").get<std::uint64_t>();
    s.saved_at = header.at("saved_at").get<std::int64_t>();
    s.save_id = header.at("save_id").get<std::uint64_t>();
    s.job = header.at("job").get<std::string>();
    s.run = header.value("run", "");
    s.rank = header.at("rank").get<int>();
    s.world_size = header.at("world_size").get<int>();
    return s;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

// The file's header, and whether its footer is whole; without reading the data.
std::optional<Stamp> read_stamp(const fs::path& path) {
  Fd file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) return std::nullopt;
  struct stat st {};
  if (::fstat(file.fd, &st) != 0) return std::nullopt;
  const auto size = static_cast<std::uint64_t>(st.st_size);
  char prefix[kPrefixBytes];
  if (size < kPrefixBytes + kFooterBytes || !read_at(file.fd, prefix, sizeof prefix, 0)) {
    return std::nullopt;
  }
  std::uint64_t header_len = 0;
  std::memcpy(&header_len, prefix + 8, 8);
  if (std::memcmp(prefix, kMagic, 8) != 0 || header_len > kMaxHeaderBytes ||
      kPrefixBytes + header_len + kFooterBytes > size) {
    return std::nullopt;
  }
  std::string header(header_len, '\0');
  char footer[kFooterBytes];
  if (!read_at(file.fd, header.data(), header.size(), kPrefixBytes) ||
      !read_at(file.fd, footer, sizeof footer, size - kFooterBytes)) {
    return std::nullopt;
  }
  auto stamp = stamp_of(nlohmann::json::parse(header, nullptr, false));
  if (!stamp) return std::nullopt;
  std::uint64_t total = 0, footer_id = 0;
  std::memcpy(&total, footer + 8, 8);
  std::memcpy(&footer_id, footer + 16, 8);
  stamp->path = path;
  stamp->whole = std::memcmp(footer, kFooter, 8) == 0 && total == size && footer_id != 0 &&
                 footer_id == stamp->save_id;
  return stamp;
}

// Whether a save is this worker's to load: its job, and (kThisRank) its rank and world size.
bool belongs(const Stamp& s, const Identity& me, SnapshotScope scope) {
  if (s.job != me.job) return false;
  return scope == SnapshotScope::kReplicated ||
         (s.rank == me.rank && s.world_size == me.world_size);
}

// The snapshot in `path`, when it is whole (read front to back in one pass: the footer, read last,
// names the header's save_id, so a file being rewritten is never taken), of `step`, and this
// worker's in `scope`; else nullopt.
std::optional<Checkpoint> read_snapshot(const fs::path& path, std::uint64_t step,
                                        const Identity& me, SnapshotScope scope) {
  std::string data;
  {
    Fd file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
    if (file.fd < 0) return std::nullopt;
    struct stat st {};
    if (::fstat(file.fd, &st) != 0) return std::nullopt;
    data.resize(static_cast<std::size_t>(st.st_size));
    if (!read_at(file.fd, data.data(), data.size(), 0)) return std::nullopt;
    if (data.size() < kPrefixBytes + kFooterBytes) return std::nullopt;
    // The header again, after the footer: not one read while it was being written.
    std::uint64_t header_len = 0;
    std::memcpy(&header_len, data.data() + 8, 8);
    if (header_len > data.size() - kPrefixBytes - kFooterBytes) return std::nullopt;
    std::string again(kPrefixBytes + header_len, '\0');
    if (!read_at(file.fd, again.data(), again.size(), 0) ||
        std::memcmp(again.data(), data.data(), again.size()) != 0) {
      return std::nullopt;
    }
  }
  const std::uint64_t size = data.size();
  std::uint64_t header_len = 0, total = 0, footer_id = 0;
  std::memcpy(&header_len, data.data() + 8, 8);
  std::memcpy(&total, data.data() + size - 16, 8);
  std::memcpy(&footer_id, data.data() + size - 8, 8);
  if (std::memcmp(data.data(), kMagic, 8) != 0 ||
      std::memcmp(data.data() + size - kFooterBytes, kFooter, 8) != 0 || total != size ||
      footer_id == 0 || header_len > size - kPrefixBytes - kFooterBytes) {
    return std::nullopt;
  }
  const auto header = nlohmann::json::parse(data.substr(kPrefixBytes, header_len), nullptr, false);
  const auto stamp = stamp_of(header);
  if (!stamp || stamp->save_id != footer_id || stamp->step != step || !belongs(*stamp, me, scope)) {
    return std::nullopt;  // torn (two saves' header and footer), or not this worker's
  }
  Checkpoint c;
  c.step = stamp->step;
  try {
    if (header.contains("size") && header.at("size").get<std::uint64_t>() != size) {
      return std::nullopt;
    }
    for (const auto& t : header.at("tensors")) {
      const std::string name = t.at("name").get<std::string>();
      const auto offset = t.at("offset").get<std::uint64_t>();
      const auto nbytes = t.at("nbytes").get<std::uint64_t>();
      if (offset > size || nbytes > size - offset) return std::nullopt;
      const std::string dtype = t.at("dtype").get<std::string>();
      const auto shape = t.at("shape").get<std::vector<std::int64_t>>();
      if (dtype == "float32" && shape.size() == 1) {  // what `tensors` holds exactly
        std::vector<float> values(nbytes / sizeof(float));
        std::memcpy(values.data(), data.data() + offset, values.size() * sizeof(float));
        c.tensors[name] = std::move(values);
        continue;
      }
      if (dtype_size(dtype) == 0) {
        throw SnapshotError(path.string() + ": tensor '" + name + "' is " + dtype +
                            ", a type the C++ SDK does not know");
      }
      TypedTensor typed{dtype, shape, {}};
      typed.bytes.assign(data.begin() + static_cast<std::ptrdiff_t>(offset),
                         data.begin() + static_cast<std::ptrdiff_t>(offset + nbytes));
      c.typed[name] = std::move(typed);
    }
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;  // a damaged header: the next one
  }
  return c;
}

std::vector<fs::path> roots() {
  std::vector<fs::path> out;
  for (const char* name : {kDirVariable, kPersistVariable}) {
    if (!env(name).empty()) out.emplace_back(env(name));
  }
  return out;
}

// Each rank folder under the roots (shared memory, then disk): rank -> its folders.
std::map<int, std::vector<fs::path>> rank_folders() {
  std::map<int, std::vector<fs::path>> found;
  for (const auto& root : roots()) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(root, ec)) {
      if (const auto rank = rank_of_folder(entry.path().filename().string())) {
        if (entry.is_directory(ec)) found[*rank].push_back(entry.path());
      }
    }
  }
  return found;
}

// The snapshot files in `dir` (by name), and their steps.
std::vector<std::pair<std::uint64_t, fs::path>> step_files(const fs::path& dir) {
  std::vector<std::pair<std::uint64_t, fs::path>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (auto s = step_of(entry.path().filename().string())) found.emplace_back(*s, entry.path());
  }
  return found;
}

// The saves a load may return, in `scope` (`step`'s only, when given), by their headers and
// footers: this rank's folder's (kThisRank), or every rank folder's (kReplicated); and, under
// kThisRank, the steps that every rank folder here has, counting only the whole saves of this job
// and world size in their own rank's folder (a folder with none aside).
struct Found {
  std::vector<Stamp> saves;
  std::set<std::uint64_t> common;
};

Found find_saves(const Identity& me, SnapshotScope scope, std::optional<std::uint64_t> step) {
  const bool replicated = scope == SnapshotScope::kReplicated;
  Found found;
  std::map<int, std::set<std::uint64_t>> steps;  // rank folder -> its whole saves' steps
  for (const auto& [rank, dirs] : rank_folders()) {
    const bool candidate = replicated || rank == me.rank;
    if (step && !candidate) continue;  // `step`'s: no steps to count
    for (const auto& dir : dirs) {
      for (const auto& [s, path] : step_files(dir)) {
        if (step && s != *step) continue;
        auto stamp = read_stamp(path);
        if (!stamp || !stamp->whole || stamp->step != s || stamp->rank != rank ||
            stamp->job != me.job || (!replicated && stamp->world_size != me.world_size)) {
          continue;  // torn, being rewritten, or foreign: never returned, never counted
        }
        steps[rank].insert(s);
        if (candidate) found.saves.push_back(std::move(*stamp));
      }
    }
  }
  if (replicated || step) return found;
  bool first = true;
  for (auto& [rank, saved] : steps) {
    if (first) {
      found.common = std::move(saved);
      first = false;
    } else {
      std::erase_if(found.common, [&](std::uint64_t s) { return !saved.contains(s); });
    }
  }
  return found;
}

// ---------------------------------------------------------------------------------------------
// Writing

// The file's layout: header, then each tensor at a 64-byte boundary, then the footer.
struct Layout {
  std::string header;
  std::vector<std::uint64_t> offsets;
  std::uint64_t size = 0;
};

struct Save {
  const Checkpoint& snapshot;
  const Identity& me;
  std::int64_t saved_at;
  std::uint64_t save_id;
};

// One tensor as the file keeps it: `tensors` (float32, one dimension), then `typed`.
struct Entry {
  const std::string* name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  const void* data;
  std::uint64_t nbytes;
};

// Throws SnapshotError for a typed tensor whose bytes are not its shape's, a dtype not known, or a
// name in both maps.
std::vector<Entry> entries_of(const Checkpoint& s) {
  std::vector<Entry> all;
  for (const auto& [name, values] : s.tensors) {
    all.push_back({&name,
                   "float32",
                   {static_cast<std::int64_t>(values.size())},
                   values.data(),
                   values.size() * sizeof(float)});
  }
  for (const auto& [name, t] : s.typed) {
    const std::size_t item = dtype_size(t.dtype);
    std::uint64_t count = 1;
    for (const auto n : t.shape) {
      if (n < 0) throw SnapshotError("typed tensor '" + name + "': a negative dimension");
      count *= static_cast<std::uint64_t>(n);
    }
    if (item == 0) {
      throw SnapshotError("typed tensor '" + name + "': dtype '" + t.dtype +
                          "' is not one of float32, float64, float16, bfloat16, int8, int16, "
                          "int32, int64, uint8, bool, complex64, complex128");
    }
    if (count * item != t.bytes.size()) {
      throw SnapshotError("typed tensor '" + name + "': " + std::to_string(t.bytes.size()) +
                          " bytes, but its shape of " + t.dtype + " needs " +
                          std::to_string(count * item));
    }
    if (s.tensors.contains(name)) {
      throw SnapshotError("'" + name + "' is both a float tensor and a typed one");
    }
    all.push_back({&name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  }
  return all;
}

std::string header_json(const Save& save, const std::vector<Entry>& entries,
                        const std::vector<std::uint64_t>& offsets, std::uint64_t size) {
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  std::size_t i = 0;
  for (const Entry& e : entries) {
    tensors.push_back({{"name", *e.name},
                       {"kind", "raw"},
                       {"dtype", e.dtype},
                       {"shape", e.shape},
                       {"offset", offsets.empty() ? 0 : offsets[i]},
                       {"nbytes", e.nbytes},
                       {"requires_grad", false},
                       {"parameter", false}});
    ++i;
  }
  const Identity& me = save.me;
  return nlohmann::ordered_json{{"format", kFormat},
                                {"job", me.job},
                                {"run", me.run},
                                {"rank", me.rank},
                                {"world_size", me.world_size},
                                {"local_rank", me.local_rank},
                                {"generation", me.generation},
                                {"step", save.snapshot.step},
                                {"saved_at", save.saved_at},
                                {"save_id", save.save_id},
                                {"writer", "c++"},
                                {"skeleton", {{"kind", "none"}, {"offset", 0}, {"size", 0}}},
                                {"tensors", tensors},
                                {"size", size}}
      .dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

Layout plan(const Save& save, const std::vector<Entry>& entries) {
  Layout l;
  l.header = header_json(save, entries, {}, 0);
  while (true) {  // the offsets depend on the header's length, which depends on them
    std::vector<std::uint64_t> offsets;
    std::uint64_t at = align(kPrefixBytes + l.header.size());
    for (const Entry& e : entries) {
      offsets.push_back(at);
      at = align(at + e.nbytes);
    }
    const std::uint64_t size = at + kFooterBytes;
    std::string header = header_json(save, entries, offsets, size);
    if (header.size() <= l.header.size()) {
      header.resize(l.header.size(), ' ');
      l = {header, offsets, size};
      return l;
    }
    l.header = header;
  }
}

std::uint64_t allocated(const fs::path& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<std::uint64_t>(st.st_blocks) * 512 : 0;
}

std::uint64_t usage(const fs::path& root) {
  std::uint64_t total = 0;
  std::error_code ec;
  for (const auto& entry : fs::recursive_directory_iterator(root, ec)) {
    if (entry.is_regular_file(ec)) total += allocated(entry.path());
  }
  return total;
}

// Closes a descriptor on every way out of a scope (-1: none).
struct ClosedOnExit {
  int& fd;
  ~ClosedOnExit() {
    if (fd >= 0) ::close(fd);
  }
};

// A descriptor of `path` holding its exclusive flock, or -1 where a load maps it (holds the shared
// flock) or it is gone.
int lock_for_rewrite(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// The partial saves of workers that died while saving, and the held files (kHeldPrefix) that no
// load maps any more.
void sweep_torn(const fs::path& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(kHeldPrefix)) {
      if (const int fd = lock_for_rewrite(entry.path()); fd >= 0) {
        fs::remove(entry.path(), ec);
        ::close(fd);
      }
      continue;
    }
    if (!name.starts_with(".tmp.")) continue;
    const auto pid = parse_integer<pid_t>(name.substr(name.rfind('.') + 1));
    if (pid && *pid > 0 && *pid != ::getpid() && ::kill(*pid, 0) != 0 && errno == ESRCH) {
      fs::remove(entry.path(), ec);
    }
  }
}

// A snapshot file and when it was saved (its header's saved_at; its mtime when the header cannot
// be read).
struct Aged {
  fs::path path;
  std::uint64_t step = 0;
  std::int64_t saved_at = 0;
};

// The snapshot files in `dir`, oldest saved first.
std::vector<Aged> by_age(const fs::path& dir) {
  std::vector<Aged> files;
  for (auto& [step, path] : step_files(dir)) {
    std::int64_t saved_at = 0;
    if (const auto stamp = read_stamp(path)) {
      saved_at = stamp->saved_at;
    } else if (struct stat st{}; ::stat(path.c_str(), &st) == 0) {
      saved_at = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
    }
    files.push_back({std::move(path), step, saved_at});
  }
  std::sort(files.begin(), files.end(), [](const Aged& a, const Aged& b) {
    return std::tie(a.saved_at, a.step) < std::tie(b.saved_at, b.step);
  });
  return files;
}

// The ranks the agent runs on this node (`.ranks`); nullopt when it does not say.
std::optional<std::set<int>> listed_ranks(const fs::path& root) {
  std::ifstream in(root / kRanksFile);
  if (!in) return std::nullopt;
  std::set<int> ranks;
  std::string line;
  while (std::getline(in, line)) {
    const auto begin = line.find_first_not_of(" \t\r");
    const auto end = line.find_last_not_of(" \t\r");
    if (begin == std::string::npos) continue;
    if (auto rank = parse_integer<int>(std::string_view(line).substr(begin, end - begin + 1))) {
      ranks.insert(*rank);
    }
  }
  return ranks;
}

// Over the limit: evicts the snapshots of ranks this node no longer runs (folders whose rank
// `.ranks` does not list; never this worker's), oldest saved first, until `needed` more bytes fit.
// Returns the bytes the snapshots then hold.
std::uint64_t evict_other_ranks(const fs::path& root, int rank, std::uint64_t used,
                                std::uint64_t needed, std::uint64_t limit) {
  const auto listed = listed_ranks(root);
  if (!listed) return used;
  std::vector<Aged> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const auto folder = rank_of_folder(entry.path().filename().string());
    if (!folder || *folder == rank || listed->contains(*folder) || !entry.is_directory(ec)) {
      continue;
    }
    sweep_torn(entry.path());
    auto aged = by_age(entry.path());
    files.insert(files.end(), std::make_move_iterator(aged.begin()),
                 std::make_move_iterator(aged.end()));
  }
  std::stable_sort(files.begin(), files.end(),
                   [](const Aged& a, const Aged& b) { return a.saved_at < b.saved_at; });
  for (const auto& f : files) {
    if (used + needed <= limit) break;
    const std::uint64_t freed = allocated(f.path);
    if (fs::remove(f.path, ec)) used -= std::min(used, freed);
  }
  return usage(root);
}

struct Lock {
  int fd;
  explicit Lock(const fs::path& root)
      : fd(::open((root / ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600)) {
    if (fd < 0) throw SnapshotError("cannot open the snapshot lock in " + root.string());
    while (::flock(fd, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  ~Lock() { ::close(fd); }
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;
};

struct Reserved {
  int fd = -1;
  fs::path temporary;
  int rewrite_lock = -1;  // a recycled file's exclusive flock: released once the save is in place
};

// Under the store's lock: a file of `size` bytes for this save, allocated (the memory of this
// rank's oldest save reused when it keeps kKeep, or of the same step's file when the step is saved
// again), within the limit (evicting other ranks' snapshots first), its old and new footers zeroed.
Reserved reserve(const fs::path& root, const fs::path& dir, const Identity& me, std::uint64_t step,
                 std::uint64_t size) {
  const std::uint64_t limit = env_integer<std::uint64_t>(kMemoryVariable, 0);
  Lock lock(root);
  sweep_torn(dir);
  std::vector<Aged> kept = by_age(dir);
  std::optional<fs::path> recycled;
  const auto same =
      std::find_if(kept.begin(), kept.end(), [&](const Aged& f) { return f.step == step; });
  if (same != kept.end()) {
    recycled = same->path;
    kept.erase(same);
  } else if (kept.size() >= kKeep) {
    recycled = kept.front().path;
    kept.erase(kept.begin());
  }
  std::error_code ec;
  while (kept.size() + 1 > kKeep) {  // beyond the kKeep newest with this one (a copied-in file)
    fs::remove(kept.front().path, ec);
    kept.erase(kept.begin());
  }
  int rewrite_lock = -1;
  const ClosedOnExit unlock{rewrite_lock};  // unless handed to the save (below)
  if (recycled) {
    rewrite_lock = lock_for_rewrite(*recycled);
    if (rewrite_lock < 0) {  // a load maps it (or it is gone): it leaves the saves, unchanged
      fs::rename(*recycled, dir / (kHeldPrefix + recycled->filename().string()), ec);
      recycled.reset();
    }
  }
  const std::uint64_t reused = recycled ? allocated(*recycled) : 0;
  const std::uint64_t needed = size > reused ? size - reused : 0;
  std::uint64_t used = usage(root);
  if (limit > 0 && used + needed > limit)
    used = evict_other_ranks(root, me.rank, used, needed, limit);
  if (limit > 0 && used + needed > limit) {
    throw SnapshotMemoryError(who(me, step) + " needs " + human(static_cast<double>(size)) +
                              ": the snapshots hold " + human(static_cast<double>(used)) +
                              " of --snapshot-memory " + human(static_cast<double>(limit)) +
                              " (each rank keeps 2 and writes a third while saving); raise "
                              "--snapshot-memory or save less");
  }
  Reserved r;
  r.temporary = dir / (".tmp." + step_name(step) + "." + std::to_string(::getpid()));
  if (recycled) fs::rename(*recycled, r.temporary, ec);  // out of the folder before it changes
  r.fd = ::open(r.temporary.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (r.fd < 0) {
    throw SnapshotError("cannot create " + r.temporary.string() + " for " + who(me, step) + ": " +
                        std::strerror(errno));
  }
  try {
    // A reader of the recycled file may still be reading it: its footer goes before anything
    // else changes, then the size, then the new footer's place (docs/SNAPSHOTS.md, "Writing").
    const char zeros[kFooterBytes] = {};
    struct stat st {};
    const auto old_size = ::fstat(r.fd, &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
    if (old_size >= kFooterBytes) {
      pwrite_all(r.fd, zeros, kFooterBytes, old_size - kFooterBytes, who(me, step));
    }
    if (old_size > size && ::ftruncate(r.fd, static_cast<off_t>(size)) != 0) {
      throw SnapshotError("cannot resize " + r.temporary.string() + " for " + who(me, step) + ": " +
                          std::strerror(errno));
    }
    const int error = ::posix_fallocate(r.fd, 0, static_cast<off_t>(size));
    if (error != 0) {
      throw SnapshotMemoryError("cannot allocate " + human(static_cast<double>(size)) + " for " +
                                who(me, step) + ": " + std::strerror(error));
    }
    pwrite_all(r.fd, zeros, kFooterBytes, size - kFooterBytes, who(me, step));
  } catch (...) {
    ::close(r.fd);
    fs::remove(r.temporary, ec);
    throw;
  }
  r.rewrite_lock = std::exchange(rewrite_lock, -1);  // save_snapshot releases it
  return r;
}

}  // namespace

bool snapshots_enabled() {
  return !env(kDirVariable).empty();
}

bool save_snapshot(const Checkpoint& s) {
  const std::string root_text = env(kDirVariable);
  if (root_text.empty()) return false;
  const Identity me = identity();
  const fs::path root = root_text;
  const fs::path dir = rank_dir(root, me.rank);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw SnapshotError("cannot create " + dir.string() + ": " + ec.message());
  const Save save{s, me, now_ns(), new_save_id()};
  const std::vector<Entry> entries = entries_of(s);
  const Layout l = plan(save, entries);
  const Reserved r = reserve(root, dir, me, s.step, l.size);
  int rewrite_lock = r.rewrite_lock;  // a recycled file's: no load maps it before it is complete
  const ClosedOnExit unlock{rewrite_lock};
  const std::string what = who(me, s.step);
  try {
    // The data, then the header, then the footer: a reader that sees this save's header saw its
    // data too, and one that sees its footer saw its header.
    std::size_t i = 0;
    for (const Entry& e : entries) pwrite_all(r.fd, e.data, e.nbytes, l.offsets[i++], what);
    std::string prefix(kMagic, sizeof kMagic);
    const std::uint64_t header_len = l.header.size();
    prefix.append(reinterpret_cast<const char*>(&header_len), 8);
    prefix += l.header;
    pwrite_all(r.fd, prefix.data(), prefix.size(), 0, what);
    std::string footer(kFooter, sizeof kFooter);
    footer.append(reinterpret_cast<const char*>(&l.size), 8);
    footer.append(reinterpret_cast<const char*>(&save.save_id), 8);
    pwrite_all(r.fd, footer.data(), footer.size(), l.size - kFooterBytes, what);
  } catch (...) {
    ::close(r.fd);
    fs::remove(r.temporary, ec);
    throw;
  }
  ::close(r.fd);
  fs::rename(r.temporary, dir / step_name(s.step), ec);
  if (ec) throw SnapshotError("cannot complete " + what + ": " + ec.message());
  return true;
}

std::vector<std::uint64_t> snapshot_steps() {
  if (roots().empty()) return {};
  const Found found = find_saves(identity(), SnapshotScope::kThisRank, std::nullopt);
  std::map<std::uint64_t, std::int64_t> newest;  // step -> its newest save
  for (const auto& s : found.saves) {
    auto [it, added] = newest.emplace(s.step, s.saved_at);
    if (!added) it->second = std::max(it->second, s.saved_at);
  }
  std::vector<std::pair<std::int64_t, std::uint64_t>> order;
  for (const auto& [step, saved_at] : newest) order.emplace_back(saved_at, step);
  std::sort(order.begin(), order.end());
  std::vector<std::uint64_t> steps;
  for (const auto& [saved_at, step] : order) steps.push_back(step);
  return steps;
}

std::optional<Checkpoint> load_snapshot(std::optional<std::uint64_t> step, SnapshotScope scope) {
  if (roots().empty()) return std::nullopt;
  const Identity me = identity();
  Found found = find_saves(me, scope, step);
  // The steps every rank folder has first (kThisRank), of the run that saved this rank's newest
  // (an earlier run's step that every rank has never beats this run's), then the rest; each
  // newest saved first (a save and its copy on disk: shared memory's first).
  const auto newest =
      std::max_element(found.saves.begin(), found.saves.end(),
                       [](const Stamp& a, const Stamp& b) { return a.saved_at < b.saved_at; });
  const std::string newest_run = newest == found.saves.end() ? "" : newest->run;
  const auto preferred = [&](const Stamp& s) {
    return found.common.contains(s.step) && s.run == newest_run;
  };
  std::stable_sort(found.saves.begin(), found.saves.end(), [&](const Stamp& a, const Stamp& b) {
    return std::make_tuple(preferred(a), a.saved_at, a.step) >
           std::make_tuple(preferred(b), b.saved_at, b.step);
  });
  for (const auto& s : found.saves) {
    if (auto c = read_snapshot(s.path, s.step, me, scope)) return c;
  }
  return std::nullopt;
}

}  // namespace dist::sdk
