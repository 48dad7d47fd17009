// An endpoint on 127.0.0.1 that behaves like an etcd member in trouble, for failover and
// cancellation tests: a socket nobody accepts from, so the kernel alone answers.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>
#include <string>

namespace dist::store::testing {

class SilentEndpoint {
 public:
  enum class Kind {
    // Bound, not listening: every connection is refused, as by a member that is down.
    kRefuses,
    // Handshakes complete and requests are taken, never answered: a frozen process.
    kAnswersNothing,
    // The accept queue is full (one connection waits in it), so the kernel drops every new
    // handshake: a host cut off, as a client sees it.
    kConnectsNever,
  };

  explicit SilentEndpoint(Kind kind) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof a;
    const int backlog = kind == Kind::kConnectsNever ? 0 : kAnsweringBacklog;
    if (listener_ < 0 || ::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        (kind != Kind::kRefuses && ::listen(listener_, backlog) != 0) ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &length) != 0) {
      close_all();
      throw std::runtime_error("silent endpoint: cannot listen on 127.0.0.1");
    }
    port_ = ntohs(a.sin_port);
    if (kind == Kind::kConnectsNever) {
      filler_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (filler_ < 0 || ::connect(filler_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        close_all();
        throw std::runtime_error("silent endpoint: cannot fill the accept queue");
      }
    }
  }
  ~SilentEndpoint() { close_all(); }
  SilentEndpoint(const SilentEndpoint&) = delete;
  SilentEndpoint& operator=(const SilentEndpoint&) = delete;

  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  // Room for every connection a test opens: none is refused.
  static constexpr int kAnsweringBacklog = 64;

  void close_all() {
    if (filler_ >= 0) ::close(filler_);
    if (listener_ >= 0) ::close(listener_);
  }

  int listener_ = -1;
  int filler_ = -1;
  int port_ = 0;
};

}  // namespace dist::store::testing
