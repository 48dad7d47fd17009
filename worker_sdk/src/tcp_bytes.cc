// Apart from the unity build: <linux/tcp.h>'s struct tcp_info (with the byte counters) cannot
// share a translation unit with glibc's <netinet/tcp.h> (without them).
#include "tcp_bytes.h"

#include <arpa/inet.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <utility>

namespace dist::sdk::detail {
namespace {

// "[ip]:port" of a socket address, as Gloo's tcp::Address::str() writes it: its port is the
// field as stored, in network byte order (on a little-endian host the port's bytes swapped:
// 39253 is written 21913), which is how its addresses are published and named in its errors.
std::optional<std::string> gloo_text(const sockaddr_storage& address) {
  char host[INET6_ADDRSTRLEN] = {};
  unsigned port = 0;
  if (address.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(address);
    if (!::inet_ntop(AF_INET, &in.sin_addr, host, sizeof host)) return std::nullopt;
    port = in.sin_port;
  } else if (address.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(address);
    if (!::inet_ntop(AF_INET6, &in6.sin6_addr, host, sizeof host)) return std::nullopt;
    port = in6.sin6_port;
  } else {
    return std::nullopt;
  }
  return "[" + std::string(host) + "]:" + std::to_string(port);
}

std::string without_sequence(const std::string& address) {
  return address.substr(0, address.find('$'));
}

// The inode of socket `fd`, from its /proc link ("socket:[12345]"): a path, not the descriptor,
// so that looking at descriptors other threads own (and may be closing) touches none of them.
std::optional<std::uint64_t> inode_of(int fd) {
  char target[64] = {};
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t length = ::readlink(link.c_str(), target, sizeof target - 1);
  constexpr std::string_view kPrefix = "socket:[";
  const std::string_view text(target, length > 0 ? static_cast<std::size_t>(length) : 0);
  if (!text.starts_with(kPrefix) || !text.ends_with(']')) return std::nullopt;
  std::uint64_t inode = 0;
  const auto digits = text.substr(kPrefix.size(), text.size() - kPrefix.size() - 1);
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), inode);
  if (error != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return inode;
}

// Every connected TCP socket of this process, with its addresses as Gloo writes them and its
// ports (host order).
struct Connected {
  TcpSocket socket;
  std::string local, peer;
  std::uint16_t local_port = 0, peer_port = 0;
};

std::uint16_t port_of(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port);
  }
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port);
  }
  return 0;
}

// Every socket descriptor of this process, with its inode (a descriptor closed while listed is
// skipped).
std::vector<TcpSocket> socket_descriptors() {
  std::vector<TcpSocket> found;
  std::error_code error;  // never thrown
  for (std::filesystem::directory_iterator it("/proc/self/fd", error), end; !error && it != end;
       it.increment(error)) {
    int fd = -1;
    try {
      fd = std::stoi(it->path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    if (const auto inode = inode_of(fd)) found.push_back({fd, *inode});
  }
  return found;
}

std::vector<Connected> connected_sockets() {
  std::vector<Connected> found;
  for (const TcpSocket& socket : socket_descriptors()) {
    sockaddr_storage local{}, peer{};
    socklen_t local_length = sizeof local, peer_length = sizeof peer;
    if (::getsockname(socket.fd, reinterpret_cast<sockaddr*>(&local), &local_length) != 0 ||
        ::getpeername(socket.fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) != 0) {
      continue;  // not connected (a listening one)
    }
    const auto local_text = gloo_text(local), peer_text = gloo_text(peer);
    if (!local_text || !peer_text) continue;
    found.push_back({socket, *local_text, *peer_text, port_of(local), port_of(peer)});
  }
  return found;
}

// Every listening TCP socket of this process, with its port (host order).
std::vector<std::pair<TcpSocket, std::uint16_t>> listening_sockets() {
  std::vector<std::pair<TcpSocket, std::uint16_t>> found;
  for (const TcpSocket& socket : socket_descriptors()) {
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    int type = 0, accepting = 0;
    socklen_t type_length = sizeof type, accepting_length = sizeof accepting;
    if (::getsockname(socket.fd, reinterpret_cast<sockaddr*>(&local), &length) != 0 ||
        (local.ss_family != AF_INET && local.ss_family != AF_INET6) ||
        ::getsockopt(socket.fd, SOL_SOCKET, SO_TYPE, &type, &type_length) != 0 ||
        type != SOCK_STREAM ||
        ::getsockopt(socket.fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &accepting_length) != 0 ||
        accepting == 0) {
      continue;
    }
    found.emplace_back(socket, port_of(local));
  }
  return found;
}

}  // namespace

std::vector<TcpSocket> tcp_sockets_of(const std::string& listening,
                                      const std::vector<std::string>& peers) {
  const std::string own = without_sequence(listening);
  std::vector<std::string> others;
  for (const auto& p : peers) others.push_back(without_sequence(p));
  std::vector<TcpSocket> found;
  for (const Connected& c : connected_sockets()) {
    if (c.local == own || std::find(others.begin(), others.end(), c.peer) != others.end()) {
      found.push_back(c.socket);
    }
  }
  return found;
}

std::vector<TcpSocket> connected_tcp_sockets(std::uint16_t apart_from_port) {
  std::vector<TcpSocket> found;
  for (const Connected& c : connected_sockets()) {
    if (c.local_port != apart_from_port && c.peer_port != apart_from_port) {
      found.push_back(c.socket);
    }
  }
  return found;
}

std::vector<TcpSocket> tcp_sockets(std::uint16_t apart_from_port) {
  std::vector<TcpSocket> found = connected_tcp_sockets(apart_from_port);
  for (const auto& [socket, port] : listening_sockets()) {
    if (port != apart_from_port) found.push_back(socket);
  }
  return found;
}

bool shut_down(const TcpSocket& socket) {
  if (inode_of(socket.fd) != socket.inode) return false;  // closed since: not ours any more
  return ::shutdown(socket.fd, SHUT_RDWR) == 0;
}

std::optional<std::uint64_t> tcp_bytes_sent(const TcpSocket& socket) {
  // (A descriptor closed and reused between this check and the read is a window the group's
  // owner closes: its sockets live as long as the group.)
  if (inode_of(socket.fd) != socket.inode) return std::nullopt;
  tcp_info info{};
  socklen_t length = sizeof info;
  if (::getsockopt(socket.fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0) return std::nullopt;
  if (length < offsetof(tcp_info, tcpi_bytes_sent) + sizeof info.tcpi_bytes_sent) {
    return std::nullopt;  // a kernel older than 4.19
  }
  return info.tcpi_bytes_sent;
}

}  // namespace dist::sdk::detail
