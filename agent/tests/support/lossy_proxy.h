// A TCP proxy in front of one etcd member that can lose an answer: the next request whose bytes
// contain a given text reaches the member, and when its answer starts coming back the proxy cuts
// the connection instead. A client sees what it sees when a member dies right after applying its
// request: no answer, the request applied.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace dist::agent::testing {

class LossyProxy {
 public:
  LossyProxy(const std::string& target_ip, int target_port)
      : target_ip_(target_ip), target_port_(target_port) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = address("127.0.0.1", 0);
    socklen_t len = sizeof a;
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listener_, 64) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      throw std::runtime_error("lossy proxy: cannot listen");
    }
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~LossyProxy() {
    stopping_ = true;
    ::shutdown(listener_, SHUT_RDWR);  // ends the accept()
    acceptor_.join();
    for (auto& t : relays_) t.join();
    ::close(listener_);
  }
  LossyProxy(const LossyProxy&) = delete;
  LossyProxy& operator=(const LossyProxy&) = delete;

  int port() const { return port_; }
  // The next request containing `text` loses its answer (once).
  void lose_answer_to(const std::string& text) {
    std::lock_guard lock(mutex_);
    armed_ = text;
  }
  int answers_lost() const { return lost_; }

 private:
  static constexpr int kPollMs = 50;

  static sockaddr_in address(const std::string& ip, int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
    return a;
  }

  void accept_loop() {
    for (;;) {
      const int client = ::accept(listener_, nullptr, nullptr);
      if (client < 0 || stopping_) {
        if (client >= 0) ::close(client);
        return;
      }
      relays_.emplace_back([this, client] { relay(client); });
    }
  }

  // Takes the armed text when `bytes` contain it.
  bool takes_armed(const std::string& bytes) {
    std::lock_guard lock(mutex_);
    if (armed_.empty() || bytes.find(armed_) == std::string::npos) return false;
    armed_.clear();
    return true;
  }

  void relay(int client) {
    const int member = ::socket(AF_INET, SOCK_STREAM, 0);
    const sockaddr_in a = address(target_ip_, target_port_);
    if (::connect(member, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
      ::close(member);
      ::close(client);
      return;
    }
    bool losing = false;  // the request in flight loses its answer
    char buffer[16384];
    while (!stopping_) {
      pollfd fds[2] = {{client, POLLIN, 0}, {member, POLLIN, 0}};
      if (::poll(fds, 2, kPollMs) <= 0) continue;
      if (fds[0].revents) {
        const auto n = ::recv(client, buffer, sizeof buffer, 0);
        if (n <= 0) break;
        if (takes_armed(std::string(buffer, static_cast<std::size_t>(n)))) losing = true;
        if (::send(member, buffer, static_cast<std::size_t>(n), MSG_NOSIGNAL) != n) break;
      }
      if (fds[1].revents) {
        const auto n = ::recv(member, buffer, sizeof buffer, 0);
        if (n <= 0) break;
        if (losing) {  // the member applied the request and answers: the answer goes nowhere
          ++lost_;
          break;
        }
        if (::send(client, buffer, static_cast<std::size_t>(n), MSG_NOSIGNAL) != n) break;
      }
    }
    ::close(member);
    ::close(client);
  }

  std::string target_ip_;
  int target_port_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> lost_{0};
  std::mutex mutex_;  // armed_
  std::string armed_;
  std::thread acceptor_;
  std::vector<std::thread> relays_;  // the acceptor's until it has ended
};

}  // namespace dist::agent::testing
