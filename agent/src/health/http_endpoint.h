// A small HTTP/1.1 server on the agent's io_context for read-only endpoints (the metrics, the
// health check, the status page): GET or HEAD, one request per connection, answered and closed.
// Nothing a client does can block the agent or keep others out:
//   - its request head must arrive whole within kHttpHeadTimeout (a client that trickles it, a
//     slowloris, is dropped then), in at most kMaxHttpRequestBytes (431 past that);
//   - its response must be taken within kHttpWriteTimeout (a client that never reads is dropped);
//   - past kMaxHttpConnections open at once, a new connection takes the place of the oldest one
//     still sending its head, from the client address that holds the most such connections: the
//     client holding connections open loses them, while a client that sends its request at once
//     is answered;
//   - a request that is not HTTP/1.x (binary junk, HTTP/0.9, a request line without a version)
//     is answered 400 (505 for another version) as soon as its first line is in;
//   - a handler that throws is answered 500, with a warning; the endpoint serves on.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dist::agent {

inline constexpr std::chrono::milliseconds kHttpHeadTimeout{2000};
inline constexpr std::chrono::milliseconds kHttpWriteTimeout{10'000};
inline constexpr std::size_t kMaxHttpRequestBytes = 8192;
inline constexpr std::size_t kMaxHttpConnections = 64;

// The same, for one endpoint (the tests make them short).
struct HttpLimits {
  std::chrono::milliseconds head_timeout = kHttpHeadTimeout;
  std::chrono::milliseconds write_timeout = kHttpWriteTimeout;
  std::size_t max_connections = kMaxHttpConnections;
};

// Where an endpoint listens.
struct HttpListen {
  // None: every address of the machine ("::" with IPv4 mapped in, or 0.0.0.0 where IPv6 is off),
  // as an unspecified address (0.0.0.0, ::) in the list also means.
  std::vector<boost::asio::ip::address> addresses;
  std::uint16_t port = 0;  // 0: a free one, the same on every address
};

// The addresses `text` names: an IP address ("127.0.0.1", "::1", "[::1]"; "0.0.0.0" and "::":
// every interface), or a host name, resolved (each of its addresses, in the resolver's order).
// Throws std::runtime_error saying why when it names none.
std::vector<boost::asio::ip::address> listen_addresses(const std::string& text);

// What a handler sees of a request: its method, path, query (after '?', undecoded) and its
// headers (names lowercased).
struct HttpRequest {
  std::string method;
  std::string path;
  std::string query;
  std::map<std::string, std::string> headers;
  std::uint16_t local_port = 0;  // the endpoint's port

  std::string header(const std::string& lowercase_name) const;
  // A query parameter's value, percent-decoded ("since" in "since=12.5&x=1"), none when absent.
  std::optional<std::string> parameter(const std::string& name) const;
  // The client accepts HTML (a browser: "Accept: text/html,...").
  bool accepts_html() const;
  // Whether its Host is one a web page of another site cannot have made a browser send: none
  // (HTTP/1.0), localhost, or an IP address. An endpoint on loopback asks it of what it serves
  // only to this machine's users, so that a page they visit cannot read it under a name of its
  // own that resolves to 127.0.0.1 (DNS rebinding).
  bool names_loopback_or_address() const;
  // Whether the request presents `token`: as `Authorization: Bearer <token>` (Prometheus'
  // authorization: credentials_file), as the password of `Authorization: Basic` (what a browser
  // asks for after a 401), or as `?token=<token>`. Compared in constant time.
  bool presents(std::string_view token) const;
};

struct HttpResponse {
  HttpResponse() = default;
  HttpResponse(int status, std::string content_type, std::string body)
      : status(status), content_type(std::move(content_type)), body(std::move(body)) {}

  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // more, e.g. WWW-Authenticate
};

// 401 for a request without the token: a browser then asks for it (any user name, the token as
// the password); `how` says the user how to give it.
HttpResponse unauthorized(const std::string& how);
// 403 for a request to a loopback endpoint under another name (names_loopback_or_address()).
HttpResponse misdirected(const HttpRequest& request);

class HttpEndpoint {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  // Serves `routes` (by path, the query ignored) where `listen` says. Throws std::runtime_error
  // naming the address and port when it cannot bind.
  HttpEndpoint(boost::asio::io_context& io, const HttpListen& listen,
               std::map<std::string, Handler> routes, HttpLimits limits = {});
  ~HttpEndpoint();
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  std::uint16_t port() const { return port_; }
  // Connections open now (on the io_context's thread).
  std::size_t open_connections() const { return connections_.size(); }

 private:
  class Connection;
  struct Listener;
  void accept(Listener& listener);
  void admit(boost::asio::ip::tcp::socket socket);
  void forget(Connection* connection);
  HttpResponse respond(const std::string& request_head) const;
  HttpResponse handle(const HttpRequest& request) const;

  std::vector<std::unique_ptr<Listener>> listeners_;
  std::map<std::string, Handler> routes_;
  HttpLimits limits_;
  std::uint16_t port_ = 0;
  std::list<Connection*> connections_;  // open ones, oldest first
  mutable std::uint64_t handler_failures_ = 0;
  std::shared_ptr<char> alive_ = std::make_shared<char>();
};

}  // namespace dist::agent
