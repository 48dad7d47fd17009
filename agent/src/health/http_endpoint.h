// A small HTTP/1.1 server on the agent's io_context for read-only endpoints (the metrics, the
// health check, the status page): GET or HEAD, one request per connection, answered and closed. A
// client that does not send its request head within kHttpRequestTimeout, or sends more than
// kMaxHttpRequestBytes, is dropped; past kMaxHttpConnections open at once, new ones are closed at
// once. Nothing a client does can block the agent.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace dist::agent {

inline constexpr std::chrono::milliseconds kHttpRequestTimeout{5000};
inline constexpr std::size_t kMaxHttpRequestBytes = 8192;
inline constexpr int kMaxHttpConnections = 32;

// What a handler sees of a request: its method, path, query (after '?', undecoded) and the
// headers it may need (names lowercased).
struct HttpRequest {
  std::string method;
  std::string path;
  std::string query;
  std::map<std::string, std::string> headers;

  std::string header(const std::string& lowercase_name) const;
  // A query parameter's value ("since" in "since=12.5&x=1"), none when absent.
  std::optional<std::string> parameter(const std::string& name) const;
  // The client accepts HTML (a browser: "Accept: text/html,...").
  bool accepts_html() const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

class HttpEndpoint {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  // Serves `routes` (by path, the query ignored) on every address of the machine at `port` (0: a
  // free one). Throws std::runtime_error naming the port when it cannot bind.
  HttpEndpoint(boost::asio::io_context& io, std::uint16_t port,
               std::map<std::string, Handler> routes);
  ~HttpEndpoint();
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  std::uint16_t port() const { return port_; }

 private:
  class Connection;
  void accept();
  HttpResponse respond(const std::string& request_head) const;

  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer retry_;
  std::map<std::string, Handler> routes_;
  std::uint16_t port_ = 0;
  int open_connections_ = 0;
  std::shared_ptr<char> alive_ = std::make_shared<char>();
};

}  // namespace dist::agent
