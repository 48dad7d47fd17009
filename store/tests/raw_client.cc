#include "raw_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>

#include "protocol.h"

namespace dist::store::testing {

RawClient::RawClient(const std::string& host, std::uint16_t port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    throw std::runtime_error("RawClient: connect failed: " + std::string(std::strerror(errno)));
  }
}

RawClient::~RawClient() {
  ::close(fd_);
}

void RawClient::send(const std::string& bytes) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) throw std::runtime_error("RawClient: send failed");
    sent += static_cast<std::size_t>(n);
  }
}

void RawClient::shutdown() {
  ::shutdown(fd_, SHUT_RDWR);
}

std::optional<std::string> RawClient::read(std::size_t n, std::chrono::milliseconds timeout) {
  std::string out(n, '\0');
  std::size_t got = 0;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (got < n) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    pollfd p{fd_, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) != 1) return std::nullopt;
    const ssize_t r = ::recv(fd_, out.data() + got, n - got, 0);
    if (r <= 0) return std::nullopt;
    got += static_cast<std::size_t>(r);
  }
  return out;
}

bool RawClient::closed_by_server(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buffer[4096];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    pollfd p{fd_, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) != 1) return false;
    const ssize_t r = ::recv(fd_, buffer, sizeof buffer, 0);
    if (r <= 0) return true;  // EOF or reset; any bytes before it (an error frame) are skipped
  }
}

std::uint8_t RawClient::read_u8() {
  auto s = read(1);
  if (!s) throw std::runtime_error("RawClient: no reply byte");
  return static_cast<std::uint8_t>((*s)[0]);
}

std::int64_t RawClient::read_i64() {
  auto s = read(8);
  if (!s) throw std::runtime_error("RawClient: no int64 reply");
  std::int64_t v;
  std::memcpy(&v, s->data(), 8);
  return v;
}

std::uint32_t RawClient::read_u32() {
  auto s = read(4);
  if (!s) throw std::runtime_error("RawClient: no uint32 reply");
  std::uint32_t v;
  std::memcpy(&v, s->data(), 4);
  return v;
}

std::string RawClient::read_bytes() {
  const auto n = static_cast<std::size_t>(read_i64());
  if (n == 0) return {};
  auto s = read(n);
  if (!s) throw std::runtime_error("RawClient: short byte string");
  return *s;
}

std::string u8(std::uint8_t v) {
  return std::string(1, static_cast<char>(v));
}
std::string u32(std::uint32_t v) {
  return std::string(reinterpret_cast<const char*>(&v), 4);
}
std::string u64(std::uint64_t v) {
  return std::string(reinterpret_cast<const char*>(&v), 8);
}
std::string i64(std::int64_t v) {
  return std::string(reinterpret_cast<const char*>(&v), 8);
}
std::string str(const std::string& s) {
  return u64(s.size()) + s;
}
std::string list(const std::vector<std::string>& keys) {
  std::string out = u64(keys.size());
  for (const auto& k : keys) out += str(k);
  return out;
}
std::string validate() {
  return u8(wire::current::kValidate) + u32(wire::kValidateMagic);
}

}  // namespace dist::store::testing
