// What TCP sockets have carried, as the kernel counts it: the measure of "bytes on the wire" that
// a process group gives beside its ring formulas.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dist::sdk::detail {

// A TCP socket of this process, by descriptor and inode (a descriptor closed and
// reused since is another socket).
struct TcpSocket {
  int fd = -1;
  std::uint64_t inode = 0;
};

// This process's connected TCP sockets whose local address is `listening` (connections it
// accepted there) or whose peer's is one of `peers` (connections it made to them); addresses as
// Gloo writes them, "[127.0.0.1]:8092" (a "$sequence" suffix ignored).
std::vector<TcpSocket> tcp_sockets_of(const std::string& listening,
                                      const std::vector<std::string>& peers);

// Every connected TCP socket of this process now but those with an end at `apart_from_port` (a
// store's: its clients' connections, and the server's side of them when it runs in this process).
std::vector<TcpSocket> connected_tcp_sockets(std::uint16_t apart_from_port);

// Every TCP socket of this process now, connected or listening, but those with an end at
// `apart_from_port` (a store's, as above).
std::vector<TcpSocket> tcp_sockets(std::uint16_t apart_from_port);

// Shuts `socket` down (both ways, without closing it: it is not the caller's to close), so that
// whatever waits on it wakes with an error; a listening one stops listening (what waits to accept
// on it fails). False when it is no longer that socket (closed since)
// or the shutdown failed.
bool shut_down(const TcpSocket& socket);

// The payload bytes `socket` has sent (TCP_INFO's tcpi_bytes_sent: what left this host,
// retransmissions included, headers not; Linux 4.19 and later); nullopt when it is no longer
// that socket or the kernel does not count it.
std::optional<std::uint64_t> tcp_bytes_sent(const TcpSocket& socket);

}  // namespace dist::sdk::detail
