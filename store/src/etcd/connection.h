// One HTTP/1.1 connection to one etcd member, plain or TLS, kept alive between requests.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <memory>
#include <optional>
#include <string>

#include "dist/store/etcd/client.h"

namespace dist::store::etcd::detail {

struct Endpoint {
  std::string host;  // a name or an address (without brackets)
  std::string port;
  std::string text;  // "host:port", for messages and the Host header
};

using Request = boost::beast::http::request<boost::beast::http::string_body>;
using Response = boost::beast::http::response<boost::beast::http::string_body>;

// The connection failed (refused, reset, closed, timed out): the member may be down, another
// may answer. Failures that no other member would fix (a refused certificate) are StoreErrors.
struct TransportError {
  std::string reason;
  bool timed_out = false;  // the member said nothing before the deadline (it may be hung)
};

class Connection {
 public:
  // `tls` null: plain HTTP. The context outlives the connection.
  Connection(boost::asio::io_context::executor_type executor, boost::asio::ssl::context* tls);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  Task<void> connect(const Endpoint& endpoint, Clock::time_point deadline, Cancellation& cancel);
  // Sends the request and reads the whole response.
  Task<Response> exchange(Request& request, Clock::time_point deadline, Cancellation& cancel);
  // Sends the request and reads the response's header: its status. The body, a stream of
  // newline-separated JSON objects, follows through next_line().
  Task<unsigned> open_stream(Request& request, Clock::time_point deadline, Cancellation& cancel);
  // The next line of the streamed body; nullopt at its end.
  Task<std::optional<std::string>> next_line(Clock::time_point deadline, Cancellation& cancel);
  // The rest of the streamed body (an error's text).
  Task<std::string> rest_of_stream(Clock::time_point deadline, Cancellation& cancel);

  // The member keeps the connection open for the next request.
  bool reusable() const { return reusable_; }
  void close();

 private:
  boost::beast::tcp_stream& tcp();
  Task<void> write(Request& request, Clock::time_point deadline, Cancellation& cancel);
  Task<std::size_t> read_some(Clock::time_point deadline, Cancellation& cancel);
  // Throws kCancelled, a StoreError for TLS refusals, else TransportError; `what` names the step.
  [[noreturn]] void fail(const boost::system::error_code& error, const char* what,
                         const Cancellation& cancel) const;

  boost::asio::io_context::executor_type executor_;
  boost::asio::ssl::context* tls_;
  std::unique_ptr<boost::beast::tcp_stream> plain_;
  std::unique_ptr<boost::beast::ssl_stream<boost::beast::tcp_stream>> secure_;
  std::string endpoint_;
  boost::beast::flat_buffer buffer_;
  bool reusable_ = false;
  // The streamed response being read, and its bytes not yet split into lines.
  std::optional<boost::beast::http::response_parser<boost::beast::http::buffer_body>> stream_;
  std::string pending_;
};

}  // namespace dist::store::etcd::detail
