#include "dist/sdk/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace dist::sdk {
namespace {

// Version 1: tensors only (what a checkpoint without blobs still writes); version 2 adds blobs.
constexpr char kMagic[8] = {'D', 'I', 'S', 'T', 'C', 'K', 'P', '1'};
constexpr char kMagicBlobs[8] = {'D', 'I', 'S', 'T', 'C', 'K', 'P', '2'};

std::uint64_t fnv1a(const char* data, std::size_t n, std::uint64_t h = 0xCBF29CE484222325ull) {
  for (std::size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(data[i]);
    h *= 0x100000001B3ull;
  }
  return h;
}

void put_u64(std::string& out, std::uint64_t v) {
  out.append(reinterpret_cast<char*>(&v), 8);
}

[[noreturn]] void fail(const std::string& what, const std::filesystem::path& path) {
  throw CheckpointError(what + " '" + path.string() + "': " + std::strerror(errno));
}

void write_all(int fd, const std::string& data, const std::filesystem::path& path) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("cannot write checkpoint", path);
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace

std::size_t dtype_size(const std::string& dtype) {
  static const std::map<std::string, std::size_t> sizes = {
      {"float32", 4}, {"float64", 8}, {"float16", 2},   {"bfloat16", 2},
      {"int8", 1},    {"int16", 2},   {"int32", 4},     {"int64", 8},
      {"uint8", 1},   {"bool", 1},    {"complex64", 8}, {"complex128", 16}};
  const auto found = sizes.find(dtype);
  return found == sizes.end() ? 0 : found->second;
}

void save_checkpoint(const std::filesystem::path& path, const Checkpoint& checkpoint) {
  if (!checkpoint.typed.empty()) {
    throw CheckpointError("cannot write " + path.string() + ": '" +
                          checkpoint.typed.begin()->first +
                          "' is a typed tensor, which checkpoint files do not keep (snapshots "
                          "do: dist::sdk::save_snapshot)");
  }
  // Layout: magic, step, count, then per tensor: name length, name, element count, floats;
  // version 2 then: count, per blob: name length, name, byte count, bytes; finally the FNV-1a
  // checksum of everything before it.
  const bool blobs = !checkpoint.blobs.empty();
  std::string bytes(blobs ? kMagicBlobs : kMagic, sizeof kMagic);
  put_u64(bytes, checkpoint.step);
  put_u64(bytes, checkpoint.tensors.size());
  for (const auto& [name, values] : checkpoint.tensors) {
    put_u64(bytes, name.size());
    bytes += name;
    put_u64(bytes, values.size());
    bytes.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  }
  if (blobs) {
    put_u64(bytes, checkpoint.blobs.size());
    for (const auto& [name, blob] : checkpoint.blobs) {
      put_u64(bytes, name.size());
      bytes += name;
      put_u64(bytes, blob.size());
      bytes += blob;
    }
  }
  put_u64(bytes, fnv1a(bytes.data(), bytes.size()));

  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : ".";
  std::error_code ec;  // a directory that cannot be made fails the open below, naming the path
  std::filesystem::create_directories(dir, ec);
  const std::filesystem::path temp = path.string() + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create", temp);
  try {
    write_all(fd, bytes, temp);
    if (::fsync(fd) != 0) fail("cannot fsync", temp);
  } catch (...) {
    ::close(fd);
    ::unlink(temp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temp.c_str());
    errno = error;
    fail("cannot rename the new checkpoint onto", path);
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {  // make the rename itself durable
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::optional<Checkpoint> load_checkpoint(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!std::filesystem::exists(path)) return std::nullopt;
    fail("cannot open checkpoint", path);
  }
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto corrupt = [&](const std::string& why) {
    return CheckpointError("checkpoint '" + path.string() + "' is damaged (" + why +
                           "); delete it to start over");
  };
  const bool version1 =
      bytes.size() >= sizeof kMagic && std::memcmp(bytes.data(), kMagic, sizeof kMagic) == 0;
  const bool version2 = bytes.size() >= sizeof kMagic &&
                        std::memcmp(bytes.data(), kMagicBlobs, sizeof kMagicBlobs) == 0;
  if (bytes.size() < sizeof kMagic + 24 || (!version1 && !version2)) {
    throw corrupt("not a dist-launch checkpoint");
  }
  std::uint64_t stored = 0;
  std::memcpy(&stored, bytes.data() + bytes.size() - 8, 8);
  if (stored != fnv1a(bytes.data(), bytes.size() - 8)) throw corrupt("checksum mismatch");

  std::size_t pos = sizeof kMagic;
  const std::size_t end = bytes.size() - 8;
  auto u64 = [&]() {
    if (end - pos < 8) throw corrupt("truncated");
    std::uint64_t v = 0;
    std::memcpy(&v, bytes.data() + pos, 8);
    pos += 8;
    return v;
  };
  auto text = [&](std::uint64_t size) {
    if (end - pos < size) throw corrupt("truncated name");
    std::string s = bytes.substr(pos, size);
    pos += size;
    return s;
  };
  Checkpoint c;
  c.step = u64();
  const std::uint64_t count = u64();
  for (std::uint64_t t = 0; t < count; ++t) {
    std::string name = text(u64());
    const std::uint64_t n = u64();
    if ((end - pos) / sizeof(float) < n) throw corrupt("truncated tensor '" + name + "'");
    std::vector<float> values(n);
    // An empty tensor's data() may be null, and memcpy from or to null is undefined even for 0.
    if (n > 0) std::memcpy(values.data(), bytes.data() + pos, n * sizeof(float));
    pos += n * sizeof(float);
    c.tensors.emplace(std::move(name), std::move(values));
  }
  const std::uint64_t blobs = version2 ? u64() : 0;
  for (std::uint64_t b = 0; b < blobs; ++b) {
    std::string name = text(u64());
    const std::uint64_t size = u64();
    if (end - pos < size) throw corrupt("truncated blob '" + name + "'");
    c.blobs.emplace(std::move(name), bytes.substr(pos, size));
    pos += size;
  }
  if (pos != end) throw corrupt("trailing bytes");
  return c;
}

}  // namespace dist::sdk
