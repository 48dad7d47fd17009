// Ports for tests that start agents: never a fixed one.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>

namespace dist::agent::testing {

// The lowest port the kernel hands out by itself (bind to port 0, a connect's source port):
// net.ipv4.ip_local_port_range's first number.
inline int first_ephemeral_port() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 32768;
  range >> low;
  return low;
}

// True when `port` on `host` can be bound now (and it is released again).
inline bool can_bind(const std::string& host, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return bound;
}

// A port free now on `host`, for an agent to bind. It is drawn at random below the kernel's
// ephemeral ports: a port the kernel just handed out could be handed out again, to any
// connection's source port on the machine, before the agent binds it ("Address already in use").
// Below that range only another test drawing the same number can take it.
inline int free_port(const std::string& host) {
  thread_local std::mt19937 draw{std::random_device{}()};
  const int high = first_ephemeral_port();
  const int low = high > 12000 ? high - 10000 : 1024;
  std::uniform_int_distribution<int> pick(low, high - 1);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int port = pick(draw);
    if (can_bind(host, port)) return port;
  }
  throw std::runtime_error("no free port on " + host + " in [" + std::to_string(low) + ", " +
                           std::to_string(high) + ")");
}

}  // namespace dist::agent::testing
