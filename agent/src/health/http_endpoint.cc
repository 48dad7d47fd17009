#include "health/http_endpoint.h"

#include <algorithm>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <cctype>
#include <stdexcept>

namespace dist::agent {
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

constexpr std::chrono::milliseconds kAcceptRetryDelay{100};

const char* reason_phrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

// Every address of the machine: "::" with IPv4 mapped in, or 0.0.0.0 where IPv6 is off.
tcp::acceptor bind_any(asio::io_context& io, std::uint16_t port) {
  tcp::acceptor acceptor(io);
  boost::system::error_code ec;
  for (const tcp protocol : {tcp::v6(), tcp::v4()}) {
    ec.clear();
    acceptor = tcp::acceptor(io);
    acceptor.open(protocol, ec);
    if (ec) continue;
    if (protocol == tcp::v6()) acceptor.set_option(asio::ip::v6_only(false), ec);
    acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    acceptor.bind(tcp::endpoint(protocol, port), ec);
    if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (!ec) return acceptor;
  }
  throw std::runtime_error("cannot listen on port " + std::to_string(port) + ": " + ec.message());
}

}  // namespace

// One client: its request head read (bounded in size and time), one response written, closed.
class HttpEndpoint::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HttpEndpoint& endpoint, tcp::socket socket)
      : endpoint_(endpoint),
        alive_(endpoint.alive_),
        socket_(std::move(socket)),
        deadline_(socket_.get_executor()) {
    ++endpoint_.open_connections_;
  }
  ~Connection() {
    if (!alive_.expired()) --endpoint_.open_connections_;
  }

  void start() {
    deadline_.expires_after(kHttpRequestTimeout);
    deadline_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->close();
    });
    asio::async_read_until(socket_, asio::dynamic_buffer(request_, kMaxHttpRequestBytes),
                           "\r\n\r\n",
                           [self = shared_from_this()](const boost::system::error_code& ec,
                                                       std::size_t) { self->on_request(ec); });
  }

 private:
  void on_request(const boost::system::error_code& ec) {
    if (ec || alive_.expired()) return close();
    const HttpResponse r = endpoint_.respond(request_);
    const bool head = request_.starts_with("HEAD ");
    response_ = "HTTP/1.1 " + std::to_string(r.status) + " " + reason_phrase(r.status) +
                "\r\nContent-Type: " + r.content_type +
                "\r\nContent-Length: " + std::to_string(r.body.size()) +
                "\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n";
    if (!head) response_ += r.body;
    asio::async_write(socket_, asio::buffer(response_),
                      [self = shared_from_this()](const boost::system::error_code&, std::size_t) {
                        self->close();
                      });
  }

  void close() {
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    deadline_.cancel();
  }

  HttpEndpoint& endpoint_;
  std::weak_ptr<char> alive_;
  tcp::socket socket_;
  asio::steady_timer deadline_;
  std::string request_;
  std::string response_;
};

HttpEndpoint::HttpEndpoint(asio::io_context& io, std::uint16_t port,
                           std::map<std::string, Handler> routes)
    : acceptor_(bind_any(io, port)), retry_(io), routes_(std::move(routes)) {
  port_ = acceptor_.local_endpoint().port();
  accept();
}

HttpEndpoint::~HttpEndpoint() {
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  retry_.cancel();
}

void HttpEndpoint::accept() {
  acceptor_.async_accept([this, alive = std::weak_ptr<char>(alive_)](
                             const boost::system::error_code& ec, tcp::socket socket) {
    if (alive.expired() || ec == asio::error::operation_aborted) return;
    if (ec) {  // out of descriptors, say: retried later rather than in a busy loop
      retry_.expires_after(kAcceptRetryDelay);
      retry_.async_wait([this, alive](const boost::system::error_code& e) {
        if (!e && !alive.expired()) accept();
      });
      return;
    }
    if (open_connections_ < kMaxHttpConnections) {
      std::make_shared<Connection>(*this, std::move(socket))->start();
    }  // else: the socket closes as it goes out of scope
    accept();
  });
}

namespace {

std::string lowercase(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string trimmed(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

// "GET /metrics?x=1 HTTP/1.1\r\nAccept: text/html\r\n...": none when the request line is not
// three words.
std::optional<HttpRequest> parse_http_request(const std::string& head) {
  const auto line_end = head.find("\r\n");
  const std::string line = head.substr(0, line_end);
  const auto first = line.find(' ');
  const auto second = first == std::string::npos ? first : line.find(' ', first + 1);
  if (second == std::string::npos) return std::nullopt;
  HttpRequest r;
  r.method = line.substr(0, first);
  const std::string target = line.substr(first + 1, second - first - 1);
  const auto question = target.find('?');
  r.path = target.substr(0, question);
  if (question != std::string::npos) r.query = target.substr(question + 1);
  for (auto at = line_end; at != std::string::npos && at + 2 < head.size();) {
    const auto next = head.find("\r\n", at + 2);
    const std::string header =
        head.substr(at + 2, next == std::string::npos ? next : next - at - 2);
    const auto colon = header.find(':');
    if (colon != std::string::npos) {
      r.headers[lowercase(trimmed(header.substr(0, colon)))] = trimmed(header.substr(colon + 1));
    }
    at = next;
  }
  return r;
}

}  // namespace

std::string HttpRequest::header(const std::string& lowercase_name) const {
  const auto it = headers.find(lowercase_name);
  return it == headers.end() ? "" : it->second;
}

std::optional<std::string> HttpRequest::parameter(const std::string& name) const {
  std::size_t at = 0;
  while (at <= query.size()) {
    const auto end = std::min(query.find('&', at), query.size());
    const std::string pair = query.substr(at, end - at);
    const auto eq = pair.find('=');
    if (pair.substr(0, eq) == name) return eq == std::string::npos ? "" : pair.substr(eq + 1);
    at = end + 1;
  }
  return std::nullopt;
}

bool HttpRequest::accepts_html() const {
  return lowercase(header("accept")).find("text/html") != std::string::npos;
}

HttpResponse HttpEndpoint::respond(const std::string& head) const {
  const auto request = parse_http_request(head);
  if (!request) return {400, "text/plain; charset=utf-8", "bad request\n"};
  if (request->method != "GET" && request->method != "HEAD") {
    return {405, "text/plain; charset=utf-8", "only GET and HEAD\n"};
  }
  const auto route = routes_.find(request->path);
  if (route == routes_.end()) {
    std::string known;
    for (const auto& [p, handler] : routes_) known += " " + p;
    return {404, "text/plain; charset=utf-8", "not found; served:" + known + "\n"};
  }
  return route->second(*request);
}

}  // namespace dist::agent
