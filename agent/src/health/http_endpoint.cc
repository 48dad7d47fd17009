#include "health/http_endpoint.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/write.hpp>
#include <cctype>
#include <set>
#include <stdexcept>

#include "output/valid_text.h"

namespace dist::agent {
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

constexpr std::chrono::milliseconds kAcceptRetryDelay{100};
constexpr int kFreePortAttempts = 8;  // binding several addresses at one free port
constexpr std::size_t kReadChunkBytes = 2048;

const char* reason_phrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Error";
  }
}

HttpResponse plain(int status, std::string body) {
  return {status, "text/plain; charset=utf-8", std::move(body)};
}

std::string lowercase(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string trimmed(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

std::string shown(const std::string& address, std::uint16_t port) {
  return (address.find(':') != std::string::npos ? "[" + address + "]" : address) + ":" +
         std::to_string(port);
}

// An acceptor on `address` (unspecified "::": IPv4 mapped in too) at `port`, or the error.
tcp::acceptor open_acceptor(asio::io_context& io, const asio::ip::address& address,
                            std::uint16_t port, boost::system::error_code& ec) {
  tcp::acceptor acceptor(io);
  const tcp::endpoint endpoint(address, port);
  acceptor.open(endpoint.protocol(), ec);
  if (ec) return acceptor;
  if (address.is_v6() && address.is_unspecified()) acceptor.set_option(asio::ip::v6_only(false));
  acceptor.set_option(tcp::acceptor::reuse_address(true));
  acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  return acceptor;
}

// The addresses to bind: those given, once each; every address of the machine when none is, or
// when "::" is among them ("::", or 0.0.0.0 where IPv6 is off).
std::vector<asio::ip::address> addresses_to_bind(asio::io_context& io,
                                                 const std::vector<asio::ip::address>& given) {
  const bool every = given.empty() || std::any_of(given.begin(), given.end(), [](const auto& a) {
                       return a.is_v6() && a.is_unspecified();
                     });
  if (every) {
    boost::system::error_code ec;
    tcp::acceptor probe(io);
    probe.open(tcp::v6(), ec);
    return {ec ? asio::ip::address(asio::ip::address_v4::any())
               : asio::ip::address(asio::ip::address_v6::any())};
  }
  std::vector<asio::ip::address> unique;
  for (const auto& a : given) {
    if (std::find(unique.begin(), unique.end(), a) == unique.end()) unique.push_back(a);
  }
  return unique;
}

// "GET / HTTP/1.1": the request line's method, target and version, or none when it is not one.
struct RequestLine {
  std::string method, target, version;
};
std::optional<RequestLine> request_line(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const auto first = line.find(' ');
  if (first == std::string_view::npos) return std::nullopt;
  const auto second = line.find(' ', first + 1);
  if (second == std::string_view::npos || line.find(' ', second + 1) != std::string_view::npos) {
    return std::nullopt;
  }
  RequestLine r{std::string(line.substr(0, first)),
                std::string(line.substr(first + 1, second - first - 1)),
                std::string(line.substr(second + 1))};
  const auto token_char = [](unsigned char c) { return std::isalnum(c) || c == '-' || c == '_'; };
  const auto visible = [](unsigned char c) { return c > 0x20 && c < 0x7F; };
  if (r.method.empty() || !std::all_of(r.method.begin(), r.method.end(), token_char) ||
      r.target.empty() || !std::all_of(r.target.begin(), r.target.end(), visible) ||
      !r.version.starts_with("HTTP/") ||
      !std::all_of(r.version.begin(), r.version.end(), visible)) {
    return std::nullopt;
  }
  return r;
}

enum class HeadState { kIncomplete, kComplete, kBad };

// Whether the bytes received so far hold a whole request head; kBad as soon as they cannot be
// the start of one (binary junk, HTTP/0.9's "GET /\r\n", a line without a version).
HeadState head_state(const std::string& received) {
  const auto line_end = received.find('\n');
  if (line_end == std::string::npos) {
    const bool junk = std::any_of(received.begin(), received.end(), [](char c) {
      const auto u = static_cast<unsigned char>(c);
      return (u < 0x20 && c != '\r') || u >= 0x7F;
    });
    return junk ? HeadState::kBad : HeadState::kIncomplete;
  }
  if (!request_line(std::string_view(received).substr(0, line_end))) return HeadState::kBad;
  if (received.find("\r\n\r\n") != std::string::npos ||
      received.find("\n\n") != std::string::npos) {
    return HeadState::kComplete;
  }
  return HeadState::kIncomplete;
}

// The request in a whole head: none when a line is not what HTTP/1.1 allows (RFC 9112: no line
// folding, no space before the colon, one Host).
std::optional<HttpRequest> parse_http_request(const std::string& head) {
  std::vector<std::string> lines;
  for (std::size_t at = 0; at < head.size();) {
    auto end = head.find('\n', at);
    if (end == std::string::npos) end = head.size();
    std::string line = head.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    at = end + 1;
    if (line.empty()) break;  // the end of the head
    lines.push_back(std::move(line));
  }
  if (lines.empty()) return std::nullopt;
  const auto line = request_line(lines.front());
  if (!line) return std::nullopt;
  HttpRequest r;
  r.method = line->method;
  const auto question = line->target.find('?');
  r.path = line->target.substr(0, question);
  if (question != std::string::npos) r.query = line->target.substr(question + 1);
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const std::string& header = lines[i];
    const auto colon = header.find(':');
    if (colon == 0 || colon == std::string::npos || header.front() == ' ' ||
        header.front() == '\t' || header.find_first_of(" \t") < colon) {
      return std::nullopt;
    }
    const std::string name = lowercase(header.substr(0, colon));
    if (name == "host" && r.headers.contains(name)) return std::nullopt;
    r.headers[name] = trimmed(header.substr(colon + 1));
  }
  return r;
}

bool version_supported(const std::string& head) {
  const auto line = request_line(std::string_view(head).substr(0, head.find('\n')));
  return line && (line->version == "HTTP/1.1" || line->version == "HTTP/1.0");
}

// Host's name, without its port: "[::1]:80" -> "::1", "localhost:80" -> "localhost".
std::string host_name(const std::string& host) {
  if (host.starts_with('[')) {
    const auto close = host.find(']');
    return close == std::string::npos ? host : host.substr(1, close - 1);
  }
  const auto colon = host.find(':');
  return colon == std::string::npos || host.find(':', colon + 1) != std::string::npos
             ? host
             : host.substr(0, colon);
}

// A Host a page of another site cannot have made the browser send: none (HTTP/1.0), localhost,
// or an IP address.
bool loopback_name(const std::string& host) {
  if (host.empty()) return true;
  const std::string name = lowercase(host_name(host));
  if (name == "localhost" || name.ends_with(".localhost")) return true;
  boost::system::error_code ec;
  asio::ip::make_address(name, ec);
  return !ec;
}

std::string percent_decoded(const std::string& text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() &&
        std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
      out.push_back(static_cast<char>(std::stoi(text.substr(i + 1, 2), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

std::optional<std::string> base64_decoded(std::string_view text) {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  std::string out;
  std::uint32_t bits = 0;
  int held = 0;
  for (const char c : text) {
    const auto value = kAlphabet.find(c);
    if (value == std::string_view::npos) return std::nullopt;
    bits = (bits << 6) | static_cast<std::uint32_t>(value);
    held += 6;
    if (held >= 8) {
      held -= 8;
      out.push_back(static_cast<char>((bits >> held) & 0xFF));
    }
  }
  return out;
}

// Equal, in a time that does not depend on where they differ.
bool same_secret(std::string_view a, std::string_view b) {
  unsigned char differ = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    differ |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return differ == 0;
}

}  // namespace

std::vector<asio::ip::address> listen_addresses(const std::string& text) {
  std::string name = text;
  if (name.size() >= 2 && name.front() == '[' && name.back() == ']') {
    name = name.substr(1, name.size() - 2);
  }
  if (name.empty()) throw std::runtime_error("an empty address");
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(name, ec);
  if (!ec) return {address};
  asio::io_context io;
  tcp::resolver resolver(io);
  const auto results = resolver.resolve(name, "", ec);
  if (ec) throw std::runtime_error("cannot resolve '" + name + "': " + ec.message());
  std::vector<asio::ip::address> addresses;
  for (const auto& entry : results) {
    const auto a = entry.endpoint().address();
    if (std::find(addresses.begin(), addresses.end(), a) == addresses.end()) {
      addresses.push_back(a);
    }
  }
  if (addresses.empty()) throw std::runtime_error("'" + name + "' has no address");
  return addresses;
}

HttpResponse misdirected(const HttpRequest& request) {
  return plain(403,
               "this page listens on loopback only and answers requests for localhost or an "
               "IP address, not for '" +
                   valid_utf8(host_name(request.header("host"))) +
                   "' (a guard against DNS rebinding): ask for http://127.0.0.1:" +
                   std::to_string(request.local_port) + valid_utf8(request.path) + "\n");
}

HttpResponse unauthorized(const std::string& how) {
  HttpResponse r = plain(401, "this page needs the token: " + how + "\n");
  r.headers.emplace_back("WWW-Authenticate", "Basic realm=\"dist-launch\", charset=\"UTF-8\"");
  return r;
}

// An acceptor and what retries its accepts.
struct HttpEndpoint::Listener {
  Listener(tcp::acceptor a, asio::io_context& io) : acceptor(std::move(a)), retry(io) {}
  tcp::acceptor acceptor;
  asio::steady_timer retry;
};

// One client: its request head read (bounded in size and time), one response written (bounded
// in time), the rest of what it sends read and dropped until it closes (a close with unread bytes
// would reset the connection, the response with it), then closed.
class HttpEndpoint::Connection : public std::enable_shared_from_this<Connection> {
 public:
  enum class Phase { kReading, kWriting, kDraining, kClosed };

  Connection(HttpEndpoint& endpoint, tcp::socket socket, asio::ip::address peer)
      : endpoint_(endpoint),
        alive_(endpoint.alive_),
        socket_(std::move(socket)),
        deadline_(socket_.get_executor()),
        peer_(std::move(peer)) {}
  ~Connection() { unregister(); }

  void start() {
    place_ = endpoint_.connections_.insert(endpoint_.connections_.end(), this);
    registered_ = true;
    arm(endpoint_.limits_.head_timeout);
    read_head();
  }

  void close() {
    if (phase_ == Phase::kClosed) return;
    phase_ = Phase::kClosed;
    unregister();
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    deadline_.cancel();
  }

  Phase phase() const { return phase_; }
  const asio::ip::address& peer() const { return peer_; }

 private:
  void unregister() {
    if (!registered_) return;
    registered_ = false;
    if (!alive_.expired()) endpoint_.forget(this);
  }

  // The connection closes at `after` from now, whatever it is doing then.
  void arm(std::chrono::milliseconds after) {
    const std::uint64_t armed = ++armed_;
    deadline_.expires_after(after);
    deadline_.async_wait([self = shared_from_this(), armed](const boost::system::error_code& ec) {
      if (!ec && armed == self->armed_) self->close();
    });
  }

  void read_head() {
    socket_.async_read_some(asio::buffer(chunk_),
                            [self = shared_from_this()](const boost::system::error_code& ec,
                                                        std::size_t n) { self->on_read(ec, n); });
  }

  void on_read(const boost::system::error_code& ec, std::size_t n) {
    if (ec || phase_ != Phase::kReading || alive_.expired()) return close();
    request_.append(chunk_.data(), n);
    const HeadState state = head_state(request_);
    if (state == HeadState::kIncomplete && request_.size() < kMaxHttpRequestBytes) {
      return read_head();
    }
    try {
      if (state == HeadState::kBad) {
        write(plain(400, "not an HTTP/1.1 request\n"), false);
      } else if (state == HeadState::kIncomplete) {
        write(plain(431, "the request head is larger than " + std::to_string(kMaxHttpRequestBytes) +
                             " bytes\n"),
              false);
      } else {
        write(endpoint_.respond(request_), request_.starts_with("HEAD "));
      }
    } catch (const std::exception&) {  // out of memory, say: this client goes, the agent stays
      close();
    }
  }

  void write(const HttpResponse& r, bool head) {
    response_ = "HTTP/1.1 " + std::to_string(r.status) + " " + reason_phrase(r.status) +
                "\r\nContent-Type: " + r.content_type +
                "\r\nContent-Length: " + std::to_string(r.body.size()) +
                "\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff"
                "\r\nReferrer-Policy: no-referrer\r\nConnection: close\r\n";
    for (const auto& [name, value] : r.headers) response_ += name + ": " + value + "\r\n";
    response_ += "\r\n";
    if (!head) response_ += r.body;
    phase_ = Phase::kWriting;
    arm(endpoint_.limits_.write_timeout);
    asio::async_write(socket_, asio::buffer(response_),
                      [self = shared_from_this()](const boost::system::error_code& ec,
                                                  std::size_t) { self->on_written(ec); });
  }

  void on_written(const boost::system::error_code& ec) {
    if (ec || phase_ != Phase::kWriting) return close();
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    phase_ = Phase::kDraining;
    response_.clear();
    arm(endpoint_.limits_.head_timeout);
    drain();
  }

  void drain() {
    socket_.async_read_some(
        asio::buffer(chunk_),
        [self = shared_from_this()](const boost::system::error_code& ec, std::size_t) {
          if (ec || self->phase_ != Phase::kDraining) return self->close();
          self->drain();
        });
  }

  HttpEndpoint& endpoint_;
  std::weak_ptr<char> alive_;
  tcp::socket socket_;
  asio::steady_timer deadline_;
  std::uint64_t armed_ = 0;
  asio::ip::address peer_;
  Phase phase_ = Phase::kReading;
  bool registered_ = false;
  std::list<Connection*>::iterator place_;
  std::array<char, kReadChunkBytes> chunk_{};
  std::string request_;
  std::string response_;

  friend class HttpEndpoint;
};

HttpEndpoint::HttpEndpoint(asio::io_context& io, const HttpListen& listen,
                           std::map<std::string, Handler> routes, HttpLimits limits)
    : routes_(std::move(routes)), limits_(limits) {
  const auto addresses = addresses_to_bind(io, listen.addresses);
  // Every address at one port: the first one's, when it was free (0) and a later one has it
  // taken, tried again.
  const int attempts = listen.port == 0 && addresses.size() > 1 ? kFreePortAttempts : 1;
  for (int attempt = 1;; ++attempt) {
    listeners_.clear();
    std::uint16_t port = listen.port;
    boost::system::error_code ec;
    std::string failed;
    for (const auto& address : addresses) {
      auto acceptor = open_acceptor(io, address, port, ec);
      if (ec) {
        failed = shown(address.to_string(), port);
        break;
      }
      port = acceptor.local_endpoint().port();
      listeners_.push_back(std::make_unique<Listener>(std::move(acceptor), io));
    }
    if (!ec) {
      port_ = port;
      break;
    }
    if (attempt >= attempts || listeners_.empty()) {
      listeners_.clear();
      throw std::runtime_error("cannot listen on " + failed + ": " + ec.message());
    }
  }
  for (auto& listener : listeners_) accept(*listener);
}

HttpEndpoint::~HttpEndpoint() {
  boost::system::error_code ignored;
  for (auto& listener : listeners_) {
    listener->acceptor.close(ignored);
    listener->retry.cancel();
  }
  const std::vector<Connection*> open(connections_.begin(), connections_.end());
  for (Connection* c : open) c->close();
}

void HttpEndpoint::accept(Listener& listener) {
  listener.acceptor.async_accept([this, &listener, alive = std::weak_ptr<char>(alive_)](
                                     const boost::system::error_code& ec, tcp::socket socket) {
    if (alive.expired() || ec == asio::error::operation_aborted) return;
    if (ec) {  // out of descriptors, say: retried later rather than in a busy loop
      listener.retry.expires_after(kAcceptRetryDelay);
      listener.retry.async_wait([this, &listener, alive](const boost::system::error_code& e) {
        if (!e && !alive.expired()) accept(listener);
      });
      return;
    }
    try {
      admit(std::move(socket));
    } catch (const std::exception& e) {  // the socket closes as it goes
      spdlog::debug("http: a connection could not be taken: {}", e.what());
    }
    accept(listener);
  });
}

// A new connection, in place of the oldest one still sending its head (else the oldest) of the
// client address with the most connections when there are as many as allowed already.
void HttpEndpoint::admit(tcp::socket socket) {
  boost::system::error_code ec;
  const auto peer = socket.remote_endpoint(ec);
  if (ec) return;  // gone already
  if (connections_.size() >= limits_.max_connections && !connections_.empty()) {
    std::map<asio::ip::address, std::size_t> held;
    for (const Connection* c : connections_) ++held[c->peer()];
    const auto most = std::max_element(held.begin(), held.end(), [](const auto& a, const auto& b) {
                        return a.second < b.second;
                      })->first;
    Connection* victim = nullptr;
    for (Connection* c : connections_) {
      if (c->peer() != most) continue;
      if (!victim) victim = c;
      if (c->phase() != Connection::Phase::kWriting) {
        victim = c;
        break;
      }
    }
    victim->close();
  }
  std::make_shared<Connection>(*this, std::move(socket), peer.address())->start();
}

void HttpEndpoint::forget(Connection* connection) {
  connections_.erase(connection->place_);
}

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
    if (percent_decoded(pair.substr(0, eq)) == name) {
      return eq == std::string::npos ? "" : percent_decoded(pair.substr(eq + 1));
    }
    at = end + 1;
  }
  return std::nullopt;
}

bool HttpRequest::accepts_html() const {
  return lowercase(header("accept")).find("text/html") != std::string::npos;
}

bool HttpRequest::names_loopback_or_address() const {
  return loopback_name(header("host"));
}

bool HttpRequest::presents(std::string_view token) const {
  bool presented = false;
  const std::string authorization = header("authorization");
  const auto space = authorization.find(' ');
  const std::string scheme = lowercase(authorization.substr(0, space));
  const std::string credentials =
      space == std::string::npos ? "" : trimmed(authorization.substr(space + 1));
  if (scheme == "bearer") presented |= same_secret(credentials, token);
  if (scheme == "basic") {
    const auto decoded = base64_decoded(credentials);
    const auto colon = decoded ? decoded->find(':') : std::string::npos;
    if (colon != std::string::npos) presented |= same_secret(decoded->substr(colon + 1), token);
  }
  if (const auto value = parameter("token")) presented |= same_secret(*value, token);
  return presented;
}

HttpResponse HttpEndpoint::respond(const std::string& head) const {
  if (!version_supported(head)) return plain(505, "HTTP/1.0 and HTTP/1.1 only\n");
  auto request = parse_http_request(head);
  if (!request) return plain(400, "not an HTTP/1.1 request\n");
  request->local_port = port_;
  if (request->method != "GET" && request->method != "HEAD") {
    HttpResponse r = plain(405, "only GET and HEAD\n");
    r.headers.emplace_back("Allow", "GET, HEAD");
    return r;
  }
  try {
    return handle(*request);
  } catch (const std::exception& e) {
    if (++handler_failures_ <= 3 || handler_failures_ % 100 == 0) {
      spdlog::warn("http: answering GET {} failed ({} so far): {}; answered 500", request->path,
                   handler_failures_, e.what());
    }
  } catch (...) {
    ++handler_failures_;
  }
  return plain(500, "internal error (the agent's log says what)\n");
}

HttpResponse HttpEndpoint::handle(const HttpRequest& request) const {
  const auto route = routes_.find(request.path);
  if (route == routes_.end()) {
    std::string known;
    for (const auto& [p, handler] : routes_) known += " " + p;
    return plain(404, "not found; served:" + known + "\n");
  }
  return route->second(request);
}

}  // namespace dist::agent
