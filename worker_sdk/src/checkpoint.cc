#include "dist/sdk/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace dist::sdk {
namespace {

constexpr char kMagic[8] = {'D', 'I', 'S', 'T', 'C', 'K', 'P', '1'};

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

void save_checkpoint(const std::filesystem::path& path, const Checkpoint& checkpoint) {
  // Layout: magic, step, count, then per tensor: name length, name, element count, floats;
  // finally the FNV-1a checksum of everything before it.
  std::string bytes(kMagic, sizeof kMagic);
  put_u64(bytes, checkpoint.step);
  put_u64(bytes, checkpoint.tensors.size());
  for (const auto& [name, values] : checkpoint.tensors) {
    put_u64(bytes, name.size());
    bytes += name;
    put_u64(bytes, values.size());
    bytes.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
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
  if (bytes.size() < sizeof kMagic + 24 || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
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
  Checkpoint c;
  c.step = u64();
  const std::uint64_t count = u64();
  for (std::uint64_t t = 0; t < count; ++t) {
    const std::uint64_t name_size = u64();
    if (end - pos < name_size) throw corrupt("truncated name");
    std::string name = bytes.substr(pos, name_size);
    pos += name_size;
    const std::uint64_t n = u64();
    if ((end - pos) / sizeof(float) < n) throw corrupt("truncated tensor '" + name + "'");
    std::vector<float> values(n);
    // An empty tensor's data() may be null, and memcpy from or to null is undefined even for 0.
    if (n > 0) std::memcpy(values.data(), bytes.data() + pos, n * sizeof(float));
    pos += n * sizeof(float);
    c.tensors.emplace(std::move(name), std::move(values));
  }
  if (pos != end) throw corrupt("trailing bytes");
  return c;
}

}  // namespace dist::sdk
