#include "connection.h"

#include <openssl/ssl.h>

#include <array>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>
#include <vector>

#include "dist/store/client.h"
#include "dist/store/errors.h"

namespace dist::store::etcd::detail {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::redirect_error;
using asio::use_awaitable;

// Bounds what one answer may hold; etcd's own requests stop at 1.5 MiB by default.
constexpr std::uint64_t kMaxResponseBytes = 64ull << 20;
constexpr std::size_t kStreamChunkBytes = 16 * 1024;
// A member that vanished without closing (a dead host, a partition) is noticed on an idle
// connection, such as a watch's, after about idle + interval * probes seconds.
constexpr int kTcpKeepAliveIdleSeconds = 2;
constexpr int kTcpKeepAliveIntervalSeconds = 1;
constexpr int kTcpKeepAliveProbes = 3;

}  // namespace

Connection::Connection(asio::io_context::executor_type executor, asio::ssl::context* tls)
    : executor_(executor), tls_(tls) {}

Connection::~Connection() = default;

beast::tcp_stream& Connection::tcp() {
  return secure_ ? secure_->next_layer() : *plain_;
}

void Connection::close() {
  reusable_ = false;
  if (plain_ || secure_) tcp().close();
}

void Connection::fail(const boost::system::error_code& error, const char* what,
                      const Cancellation& cancel) const {
  if (cancel.cancelled())
    throw StoreError(StoreErrc::kCancelled, "etcd " + endpoint_ + ": cancelled");
  if (error.category() == asio::error::get_ssl_category()) {
    throw StoreError(StoreErrc::kUnauthenticated,
                     "etcd " + endpoint_ + ": TLS " + what + " failed: " + error.message() +
                         "; check cacert, cert and key, and that the member's certificate names "
                         "the address used for it");
  }
  if (error == beast::error::timeout) throw TransportError{std::string(what) + " timed out", true};
  throw TransportError{std::string(what) + ": " + error.message()};
}

Task<void> Connection::connect(const Endpoint& endpoint, Clock::time_point deadline,
                               Cancellation& cancel) {
  endpoint_ = endpoint.text;
  if (tls_) {
    secure_ = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(executor_, *tls_);
  } else {
    plain_ = std::make_unique<beast::tcp_stream>(executor_);
  }
  if (cancel.cancelled()) fail({}, "connect", cancel);
  const auto stop = cancel.on_cancel([this] { close(); });
  boost::system::error_code ec;
  std::vector<asio::ip::tcp::endpoint> targets;
  const auto address = asio::ip::make_address(endpoint.host, ec);
  const bool is_address = !ec;
  if (is_address) {
    targets.emplace_back(address, static_cast<unsigned short>(std::stoi(endpoint.port)));
  } else {
    asio::ip::tcp::resolver resolver(executor_);
    const auto stop_resolving = cancel.on_cancel([&resolver] { resolver.cancel(); });
    const auto results = co_await resolver.async_resolve(endpoint.host, endpoint.port,
                                                         asio::ip::resolver_base::numeric_service,
                                                         redirect_error(use_awaitable, ec));
    // A cancel that came after the lookup completed stopped nothing: connect would open anew.
    if (ec || cancel.cancelled()) fail(ec, "name lookup", cancel);
    for (const auto& r : results) targets.push_back(r.endpoint());
  }
  tcp().expires_at(deadline);
  co_await tcp().async_connect(targets, redirect_error(use_awaitable, ec));
  if (ec) fail(ec, "connect", cancel);
  tcp().socket().set_option(asio::ip::tcp::no_delay(true));
  enable_keepalive(tcp().socket().native_handle(), kTcpKeepAliveIdleSeconds,
                   kTcpKeepAliveIntervalSeconds, kTcpKeepAliveProbes);
  if (secure_) {
    // Server name indication is for names only; verification checks names and addresses.
    if (!is_address) SSL_set_tlsext_host_name(secure_->native_handle(), endpoint.host.c_str());
    secure_->set_verify_callback(asio::ssl::host_name_verification(endpoint.host));
    tcp().expires_at(deadline);
    co_await secure_->async_handshake(asio::ssl::stream_base::client,
                                      redirect_error(use_awaitable, ec));
    if (ec) fail(ec, "handshake", cancel);
  }
}

Task<void> Connection::write(Request& request, Clock::time_point deadline, Cancellation& cancel) {
  if (cancel.cancelled()) fail({}, "send", cancel);
  const auto stop = cancel.on_cancel([this] { close(); });
  boost::system::error_code ec;
  tcp().expires_at(deadline);
  if (secure_) {
    co_await http::async_write(*secure_, request, redirect_error(use_awaitable, ec));
  } else {
    co_await http::async_write(*plain_, request, redirect_error(use_awaitable, ec));
  }
  if (ec) fail(ec, "send", cancel);
}

Task<Response> Connection::exchange(Request& request, Clock::time_point deadline,
                                    Cancellation& cancel) {
  reusable_ = false;
  co_await write(request, deadline, cancel);
  const auto stop = cancel.on_cancel([this] { close(); });
  http::response_parser<http::string_body> parser;
  parser.body_limit(kMaxResponseBytes);
  boost::system::error_code ec;
  tcp().expires_at(deadline);
  if (secure_) {
    co_await http::async_read(*secure_, buffer_, parser, redirect_error(use_awaitable, ec));
  } else {
    co_await http::async_read(*plain_, buffer_, parser, redirect_error(use_awaitable, ec));
  }
  if (ec) fail(ec, "receive", cancel);
  tcp().expires_never();
  auto response = parser.release();
  reusable_ = response.keep_alive();
  co_return response;
}

Task<unsigned> Connection::open_stream(Request& request, Clock::time_point deadline,
                                       Cancellation& cancel) {
  reusable_ = false;
  co_await write(request, deadline, cancel);
  const auto stop = cancel.on_cancel([this] { close(); });
  stream_.emplace();
  stream_->body_limit(boost::none);  // a watch streams for as long as it is watched
  pending_.clear();
  boost::system::error_code ec;
  tcp().expires_at(deadline);
  if (secure_) {
    co_await http::async_read_header(*secure_, buffer_, *stream_,
                                     redirect_error(use_awaitable, ec));
  } else {
    co_await http::async_read_header(*plain_, buffer_, *stream_, redirect_error(use_awaitable, ec));
  }
  if (ec) fail(ec, "receive", cancel);
  co_return stream_->get().result_int();
}

Task<std::size_t> Connection::read_some(Clock::time_point deadline, Cancellation& cancel) {
  const auto stop = cancel.on_cancel([this] { close(); });
  std::array<char, kStreamChunkBytes> chunk;
  auto& body = stream_->get().body();
  body.data = chunk.data();
  body.size = chunk.size();
  boost::system::error_code ec;
  tcp().expires_at(deadline);
  if (secure_) {
    co_await http::async_read_some(*secure_, buffer_, *stream_, redirect_error(use_awaitable, ec));
  } else {
    co_await http::async_read_some(*plain_, buffer_, *stream_, redirect_error(use_awaitable, ec));
  }
  if (ec == http::error::need_buffer) ec = {};
  if (ec) fail(ec, "receive", cancel);
  const std::size_t got = chunk.size() - body.size;
  pending_.append(chunk.data(), got);
  co_return got;
}

Task<std::optional<std::string>> Connection::next_line(Clock::time_point deadline,
                                                       Cancellation& cancel) {
  for (;;) {
    const auto newline = pending_.find('\n');
    if (newline != std::string::npos) {
      std::string line = pending_.substr(0, newline);
      pending_.erase(0, newline + 1);
      if (line.find_first_not_of(" \r\t") != std::string::npos) co_return line;
      continue;
    }
    if (stream_->is_done()) {
      if (pending_.find_first_not_of(" \r\t\n") == std::string::npos) co_return std::nullopt;
      co_return std::exchange(pending_, {});
    }
    co_await read_some(deadline, cancel);
  }
}

Task<std::string> Connection::rest_of_stream(Clock::time_point deadline, Cancellation& cancel) {
  while (!stream_->is_done() && pending_.size() < kMaxResponseBytes) {
    co_await read_some(deadline, cancel);
  }
  co_return std::exchange(pending_, {});
}

}  // namespace dist::store::etcd::detail
