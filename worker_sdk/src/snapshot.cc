#include "dist/sdk/snapshot.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "dist/contract/worker_contract.h"

namespace dist::sdk {
namespace {

namespace fs = std::filesystem;

// As python/dist_launch/snapshot.py (the variables: the worker contract's).
constexpr const char* kDirVariable = worker_contract::kSnapshotDirVariable;
constexpr const char* kMemoryVariable = worker_contract::kSnapshotMemoryVariable;
constexpr const char* kPersistVariable = worker_contract::kSnapshotPersistVariable;
constexpr std::size_t kKeep = 2;
constexpr char kMagic[8] = {'D', 'L', 'S', 'N', 'A', 'P', '0', '1'};
constexpr char kFooter[8] = {'D', 'L', 'S', 'N', 'A', 'P', 'O', 'K'};
constexpr std::uint64_t kAlign = 64;
constexpr int kFormat = 1;
constexpr std::size_t kPrefixBytes = 16;  // magic, header length
constexpr std::size_t kFooterBytes = 16;  // "DLSNAPOK", total size

std::uint64_t align(std::uint64_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

int local_rank() {
  const std::string v = env("LOCAL_RANK");
  return v.empty() ? 0 : std::stoi(v);
}

std::string step_name(std::uint64_t step) {
  std::string digits = std::to_string(step);
  return "step_" + std::string(20 - std::min<std::size_t>(20, digits.size()), '0') + digits +
         ".snap";
}

std::optional<std::uint64_t> step_of(const std::string& name) {
  if (!name.starts_with("step_") || !name.ends_with(".snap") || name.size() <= 10) return {};
  const std::string digits = name.substr(5, name.size() - 10);
  if (digits.empty() || digits.size() > 20 ||
      !std::all_of(digits.begin(), digits.end(), ::isdigit)) {
    return {};
  }
  try {
    return std::stoull(digits);
  } catch (const std::out_of_range&) {
    return {};
  }
}

fs::path rank_dir(const fs::path& root, int rank) {
  return root / ("local_rank_" + std::to_string(rank));
}

std::set<std::uint64_t> complete_steps(const fs::path& dir) {
  std::set<std::uint64_t> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (auto s = step_of(entry.path().filename().string())) steps.insert(*s);
  }
  return steps;
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

// The partial saves of workers that died while saving.
void sweep_torn(const fs::path& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(".tmp.")) continue;
    const auto dot = name.rfind('.');
    const pid_t pid = static_cast<pid_t>(std::atol(name.c_str() + dot + 1));
    if (pid > 0 && pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH) {
      fs::remove(entry.path(), ec);
    }
  }
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

std::string who(std::uint64_t step) {
  return "the snapshot of local rank " + std::to_string(local_rank()) + " at step " +
         std::to_string(step);
}

// The file's layout: header, then each tensor at a 64-byte boundary, then the footer.
struct Layout {
  std::string header;
  std::vector<std::uint64_t> offsets;
  std::uint64_t size = 0;
};

std::string header_json(const Checkpoint& s, const std::vector<std::uint64_t>& offsets,
                        std::uint64_t size) {
  nlohmann::json tensors = nlohmann::json::array();
  std::size_t i = 0;
  for (const auto& [name, values] : s.tensors) {
    tensors.push_back({{"name", name},
                       {"kind", "raw"},
                       {"dtype", "float32"},
                       {"shape", {values.size()}},
                       {"offset", offsets.empty() ? 0 : offsets[i]},
                       {"nbytes", values.size() * sizeof(float)},
                       {"requires_grad", false},
                       {"parameter", false}});
    ++i;
  }
  return nlohmann::json{{"format", kFormat},
                        {"step", s.step},
                        {"local_rank", local_rank()},
                        {"writer", "c++"},
                        {"skeleton", {{"kind", "none"}, {"offset", 0}, {"size", 0}}},
                        {"tensors", tensors},
                        {"size", size}}
      .dump();
}

Layout plan(const Checkpoint& s) {
  Layout l;
  l.header = header_json(s, {}, 0);
  while (true) {  // the offsets depend on the header's length, which depends on them
    std::vector<std::uint64_t> offsets;
    std::uint64_t at = align(kPrefixBytes + l.header.size());
    for (const auto& [name, values] : s.tensors) {
      offsets.push_back(at);
      at = align(at + values.size() * sizeof(float));
    }
    const std::uint64_t size = at + kFooterBytes;
    std::string header = header_json(s, offsets, size);
    if (header.size() <= l.header.size()) {
      header.resize(l.header.size(), ' ');
      l = {header, offsets, size};
      return l;
    }
    l.header = header;
  }
}

void pwrite_all(int fd, const void* data, std::size_t n, std::uint64_t offset, std::uint64_t step) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw SnapshotError("cannot write " + who(step) + ": " + std::strerror(errno));
    p += w;
    n -= static_cast<std::size_t>(w);
    offset += static_cast<std::uint64_t>(w);
  }
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

// Under the store's lock: a file of `size` bytes, allocated (the oldest snapshot's memory reused
// when this rank keeps kKeep), within the limit. Returns its descriptor; `temporary` its path.
int reserve(const fs::path& root, const fs::path& dir, std::uint64_t step, std::uint64_t size,
            fs::path& temporary) {
  const std::string limit_text = env(kMemoryVariable);
  const std::uint64_t limit = limit_text.empty() ? 0 : std::stoull(limit_text);
  Lock lock(root);
  sweep_torn(dir);
  const auto complete = complete_steps(dir);
  std::optional<std::string> recycled;
  if (complete.contains(step)) {
    recycled = step_name(step);
  } else if (complete.size() >= kKeep) {
    recycled = step_name(*complete.begin());
  }
  temporary = dir / (".tmp." + step_name(step) + "." + std::to_string(::getpid()));
  const std::uint64_t reused = recycled ? allocated(dir / *recycled) : 0;
  const std::uint64_t used = usage(root);
  const std::uint64_t needed = size > reused ? size - reused : 0;
  if (limit > 0 && used + needed > limit) {
    throw SnapshotMemoryError(who(step) + " needs " + human(static_cast<double>(size)) +
                              ": the snapshots hold " + human(static_cast<double>(used)) +
                              " of --snapshot-memory " + human(static_cast<double>(limit)) +
                              " (each local rank keeps 2 and writes a third while saving); raise "
                              "--snapshot-memory or save less");
  }
  std::error_code ec;
  if (recycled) fs::rename(dir / *recycled, temporary, ec);
  const int fd = ::open(temporary.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0)
    throw SnapshotError("cannot create " + temporary.string() + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_size) > size) {
    [[maybe_unused]] const int ignored = ::ftruncate(fd, static_cast<off_t>(size));
  }
  const int error = ::posix_fallocate(fd, 0, static_cast<off_t>(size));
  if (error != 0) {
    ::close(fd);
    fs::remove(temporary, ec);
    throw SnapshotMemoryError("cannot allocate " + human(static_cast<double>(size)) + " for " +
                              who(step) + ": " + std::strerror(error));
  }
  return fd;
}

std::vector<fs::path> roots() {
  std::vector<fs::path> out;
  for (const char* name : {kDirVariable, kPersistVariable}) {
    if (!env(name).empty()) out.emplace_back(env(name));
  }
  return out;
}

std::map<int, std::set<std::uint64_t>> steps_by_rank() {
  std::map<int, std::set<std::uint64_t>> found;
  for (const auto& root : roots()) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(root, ec)) {
      const std::string name = entry.path().filename().string();
      if (!name.starts_with("local_rank_")) continue;
      const int rank = std::atoi(name.c_str() + 11);
      found[rank].merge(complete_steps(entry.path()));
    }
  }
  return found;
}

std::optional<Checkpoint> read_snapshot(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  ::fstat(fd, &st);
  std::string data(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = ::pread(fd, data.data() + got, data.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  if (got != data.size() || data.size() < kPrefixBytes + kFooterBytes) return std::nullopt;
  std::uint64_t header_len = 0, total = 0;
  std::memcpy(&header_len, data.data() + 8, 8);
  std::memcpy(&total, data.data() + data.size() - 8, 8);
  if (std::memcmp(data.data(), kMagic, 8) != 0 ||
      std::memcmp(data.data() + data.size() - kFooterBytes, kFooter, 8) != 0 ||
      total != data.size() || kPrefixBytes + header_len > data.size()) {
    return std::nullopt;
  }
  const auto header = nlohmann::json::parse(data.substr(kPrefixBytes, header_len), nullptr, false);
  if (header.is_discarded() || header.value("format", 0) != kFormat) return std::nullopt;
  Checkpoint c;
  try {
    c.step = header.at("step").get<std::uint64_t>();
    for (const auto& t : header.at("tensors")) {
      const std::string name = t.at("name").get<std::string>();
      if (t.at("dtype").get<std::string>() != "float32") {
        throw SnapshotError(path.string() + ": tensor '" + name + "' is " +
                            t.at("dtype").get<std::string>() +
                            ": the C++ SDK reads float32 tensors");
      }
      const auto offset = t.at("offset").get<std::uint64_t>();
      const auto nbytes = t.at("nbytes").get<std::uint64_t>();
      if (offset > data.size() || nbytes > data.size() - offset) return std::nullopt;
      std::vector<float> values(nbytes / sizeof(float));
      std::memcpy(values.data(), data.data() + offset, values.size() * sizeof(float));
      c.tensors[name] = std::move(values);
    }
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;  // a damaged header: the next one
  }
  return c;
}

}  // namespace

bool snapshots_enabled() {
  return !env(kDirVariable).empty();
}

bool save_snapshot(const Checkpoint& s) {
  const std::string root_text = env(kDirVariable);
  if (root_text.empty()) return false;
  const fs::path root = root_text;
  const fs::path dir = rank_dir(root, local_rank());
  std::error_code ec;
  fs::create_directories(dir, ec);
  const Layout l = plan(s);
  fs::path temporary;
  const int fd = reserve(root, dir, s.step, l.size, temporary);
  try {
    std::string prefix(kMagic, sizeof kMagic);
    const std::uint64_t header_len = l.header.size();
    prefix.append(reinterpret_cast<const char*>(&header_len), 8);
    prefix += l.header;
    pwrite_all(fd, prefix.data(), prefix.size(), 0, s.step);
    std::size_t i = 0;
    for (const auto& [name, values] : s.tensors) {
      pwrite_all(fd, values.data(), values.size() * sizeof(float), l.offsets[i++], s.step);
    }
    std::string footer(kFooter, sizeof kFooter);
    footer.append(reinterpret_cast<const char*>(&l.size), 8);
    pwrite_all(fd, footer.data(), footer.size(), l.size - kFooterBytes, s.step);
  } catch (...) {
    ::close(fd);
    fs::remove(temporary, ec);
    throw;
  }
  ::close(fd);
  fs::rename(temporary, dir / step_name(s.step), ec);
  if (ec) throw SnapshotError("cannot complete " + who(s.step) + ": " + ec.message());
  return true;
}

std::vector<std::uint64_t> snapshot_steps() {
  const auto by_rank = steps_by_rank();
  const auto it = by_rank.find(local_rank());
  if (it == by_rank.end()) return {};
  return {it->second.begin(), it->second.end()};
}

std::optional<Checkpoint> load_snapshot(std::optional<std::uint64_t> step) {
  const int rank = local_rank();
  std::vector<std::uint64_t> candidates;
  if (step) {
    candidates.push_back(*step);
  } else {
    const auto by_rank = steps_by_rank();
    const auto mine_it = by_rank.find(rank);
    if (mine_it == by_rank.end()) return std::nullopt;
    std::set<std::uint64_t> common = mine_it->second;
    for (const auto& [other, steps] : by_rank) {
      if (steps.empty()) continue;
      std::erase_if(common, [&](std::uint64_t s) { return !steps.contains(s); });
    }
    candidates.assign(common.rbegin(), common.rend());
    for (auto s = mine_it->second.rbegin(); s != mine_it->second.rend(); ++s) {
      if (!common.contains(*s)) candidates.push_back(*s);
    }
  }
  for (const auto candidate : candidates) {
    for (const auto& root : roots()) {
      if (auto c = read_snapshot(rank_dir(root, rank) / step_name(candidate))) return c;
    }
  }
  return std::nullopt;
}

}  // namespace dist::sdk
