// A blocking HTTP/1.1 request over a real TCP socket, for the tests of the agent's endpoints.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>

namespace dist::agent::testing {

struct HttpReply {
  int status = -1;  // -1: no reply (connection refused, timed out)
  std::string head;
  std::string body;
};

// `request` sent as it is (request line, headers and the blank line) to `host`:port; waits at most
// 5 s for the whole reply.
inline HttpReply http_exchange(int port, const std::string& request,
                               const std::string& host = "127.0.0.1") {
  HttpReply reply;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval limit{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return reply;
  }
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return reply;
  }
  std::string raw;
  char buffer[4096];
  ssize_t n;
  while ((n = ::recv(fd, buffer, sizeof buffer, 0)) > 0) raw.append(buffer, static_cast<size_t>(n));
  ::close(fd);
  const auto end_of_head = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || end_of_head == std::string::npos) return reply;
  reply.status = std::stoi(raw.substr(9, 3));
  reply.head = raw.substr(0, end_of_head);
  reply.body = raw.substr(end_of_head + 4);
  return reply;
}

// `request_line` as sent ("GET /metrics HTTP/1.1", and header lines after it), with Host: `host`;
// waits at most 5 s for the whole reply.
inline HttpReply http_request(int port, const std::string& request_line,
                              const std::string& host = "127.0.0.1") {
  return http_exchange(port, request_line + "\r\nHost: " + host + "\r\n\r\n", host);
}

}  // namespace dist::agent::testing
