#include "dist/store/token.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "dist/store/errors.h"
#include "sha256.h"

namespace dist::store {

namespace {
constexpr std::size_t kSecretBytes = 32;
}

std::string generate_secret() {
  std::array<unsigned char, kSecretBytes> bytes{};
  try {
    crypto::random_bytes(bytes);
  } catch (const std::system_error& e) {
    throw StoreError(StoreErrc::kInvalidArgument,
                     std::string("no random bytes for a token: ") + e.what());
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string secret;
  secret.reserve(2 * bytes.size());
  for (unsigned char b : bytes) {
    secret.push_back(kHex[b >> 4]);
    secret.push_back(kHex[b & 0xf]);
  }
  return secret;
}

void write_secret_file(const std::string& path, const std::string& secret) {
  auto fail = [&](const std::string& why) {
    return StoreError(StoreErrc::kInvalidArgument,
                      "cannot write the token file '" + path + "': " + why);
  };
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, S_IRUSR | S_IWUSR);
  if (fd < 0) throw fail(std::strerror(errno));
  const std::string content = secret + "\n";
  std::size_t written = 0;
  while (written < content.size()) {
    const ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n < 0 ? std::strerror(errno) : "nothing written";
      ::close(fd);
      ::unlink(path.c_str());
      throw fail(why);
    }
    written += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(path.c_str());
    throw fail(why);
  }
}

}  // namespace dist::store
