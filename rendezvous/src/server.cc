#include "dist/rendezvous/server.h"

#include <spdlog/spdlog.h>

#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <future>
#include <unordered_set>

#include "dist/rendezvous/client.h"
#include "dist/rendezvous/errors.h"
#include "session.h"

namespace dist::rendezvous {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {
constexpr std::size_t kReadChunkBytes = 64 * 1024;
constexpr auto kAcceptRetryDelay = std::chrono::milliseconds(50);  // after EMFILE and the like
}  // namespace

// One client connection. It waits for readability instead of keeping a read buffer of its own,
// so an idle connection costs the socket and the Session, nothing more; bytes are read into the
// server's shared buffer and only an incomplete request's tail is kept by the Session.
class Connection : public std::enable_shared_from_this<Connection>, public SessionOwner {
 public:
  Connection(std::shared_ptr<detail::ServerCore> server, tcp::socket socket, PeerInfo peer);
  void start();
  void close();
  void on_async_output() override;
  const PeerInfo& peer() const { return session_.peer(); }

 private:
  void wait_readable();
  void on_readable(const boost::system::error_code& ec);
  void flush();
  void pump();
  bool close_if_session_ended();  // logs why and closes when the session gave up
  void wait_writable();

  std::shared_ptr<detail::ServerCore> server_;  // outlives every connection's handlers
  tcp::socket socket_;
  Session session_;
  std::size_t sent_ = 0;  // bytes of session_.output() already written
  bool read_pending_ = false;
  bool write_pending_ = false;
  bool closed_ = false;
};

namespace detail {
class ServerCore : public std::enable_shared_from_this<ServerCore> {
 public:
  ServerCore(asio::io_context& io, tcp::acceptor acceptor, ServerOptions options)
      : io_(io), acceptor_(std::move(acceptor)), state_(std::move(options)), retry_timer_(io) {}

  void start() { accept(); }
  void stop() {
    stopped_ = true;
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    retry_timer_.cancel();
    for (const auto& c :
         std::vector<std::shared_ptr<Connection>>(connections_.begin(), connections_.end())) {
      c->close();
    }
  }
  void forget(const std::shared_ptr<Connection>& c) { connections_.erase(c); }

  ServerStats stats() const {
    ServerStats s = stats_;
    s.connections_open = connections_.size();
    s.requests = state_.requests;
    s.keys = state_.num_keys();
    s.stored_bytes = state_.stored_bytes();
    return s;
  }

  StoreState& state() { return state_; }
  char* read_buffer() { return read_buffer_.data(); }
  std::size_t read_buffer_size() const { return read_buffer_.size(); }
  ServerStats& counters() { return stats_; }
  tcp::endpoint local_endpoint() const { return acceptor_.local_endpoint(); }

 private:
  void accept() {
    if (stopped_) return;
    acceptor_.async_accept(
        [self = shared_from_this()](boost::system::error_code ec, tcp::socket socket) {
          self->on_accept(ec, std::move(socket));
        });
  }

  void on_accept(const boost::system::error_code& ec, tcp::socket socket) {
    if (stopped_ || ec == asio::error::operation_aborted) return;
    if (ec) {
      spdlog::warn("store: accept failed: {} (retrying in {} ms)", ec.message(),
                   kAcceptRetryDelay.count());
      retry_timer_.expires_after(kAcceptRetryDelay);
      retry_timer_.async_wait([self = shared_from_this()](boost::system::error_code e) {
        if (!e) self->accept();
      });
      return;
    }
    accept();
    boost::system::error_code peer_ec;
    const tcp::endpoint remote = socket.remote_endpoint(peer_ec);
    if (peer_ec) return;  // the client is already gone
    PeerInfo peer;
    peer.host = remote.address().to_string();
    peer.address = remote.address().is_v6() ? "[" + peer.host + "]:" + std::to_string(remote.port())
                                            : peer.host + ":" + std::to_string(remote.port());
    peer.loopback =
        remote.address().is_loopback() ||
        (remote.address().is_v6() && remote.address().to_v6().is_v4_mapped() &&
         asio::ip::make_address_v4(asio::ip::v4_mapped, remote.address().to_v6()).is_loopback());
    ++stats_.connections_total;
    if (connections_.size() >= state_.limits().max_connections) {
      ++stats_.connections_rejected;
      spdlog::warn("store: refusing {}: {} connections open, the limit (--max-connections)",
                   peer.address, connections_.size());
      return;  // the socket closes as it goes out of scope
    }
    auto connection =
        std::make_shared<Connection>(shared_from_this(), std::move(socket), std::move(peer));
    connections_.insert(connection);
    connection->start();
  }

  asio::io_context& io_;
  tcp::acceptor acceptor_;
  StoreState state_;
  asio::steady_timer retry_timer_;
  std::unordered_set<std::shared_ptr<Connection>> connections_;
  std::array<char, kReadChunkBytes> read_buffer_{};
  ServerStats stats_;
  bool stopped_ = false;
};
}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Connection

Connection::Connection(std::shared_ptr<detail::ServerCore> server, tcp::socket socket,
                       PeerInfo peer)
    : server_(std::move(server)),
      socket_(std::move(socket)),
      session_(server_->state(), std::move(peer), this) {}

void Connection::start() {
  boost::system::error_code ec;
  socket_.non_blocking(true, ec);
  socket_.set_option(tcp::no_delay(true), ec);
  const Keepalive& k = server_->state().options().keepalive;
  enable_keepalive(socket_.native_handle(), k.idle_seconds, k.interval_seconds, k.probes);
  wait_readable();
}

void Connection::wait_readable() {
  if (closed_ || read_pending_ || !session_.wants_input()) return;
  read_pending_ = true;
  socket_.async_wait(tcp::socket::wait_read,
                     [self = shared_from_this()](const boost::system::error_code& ec) {
                       self->read_pending_ = false;
                       self->on_readable(ec);
                     });
}

void Connection::on_readable(const boost::system::error_code& ec) {
  if (closed_) return;
  if (ec) {
    close();
    return;
  }
  // Drain what the kernel has (bounded, so one busy client cannot starve the others).
  for (int round = 0; round < 4 && session_.wants_input(); ++round) {
    boost::system::error_code read_ec;
    const std::size_t n = socket_.read_some(
        asio::buffer(server_->read_buffer(), server_->read_buffer_size()), read_ec);
    if (read_ec == asio::error::would_block || read_ec == asio::error::try_again) break;
    if (read_ec) {  // EOF or reset: the client is gone
      flush();
      close();
      return;
    }
    session_.feed(server_->read_buffer(), n);
    if (n < server_->read_buffer_size()) break;
  }
  pump();
  if (!close_if_session_ended()) wait_readable();
}

bool Connection::close_if_session_ended() {
  if (closed_) return true;
  if (!session_.closing()) return false;
  spdlog::warn("store: closing connection from {}: {}", session_.peer().address,
               session_.close_reason());
  ++server_->counters().protocol_errors;
  close();
  return true;
}

void Connection::on_async_output() {
  // Called while another connection's request runs: write now, but never close here (the
  // caller may still be iterating over waiters that include this session).
  if (closed_ || write_pending_) return;
  std::string& out = session_.output();
  boost::system::error_code ec;
  const std::size_t n =
      socket_.write_some(asio::buffer(out.data() + sent_, out.size() - sent_), ec);
  if (!ec) sent_ += n;
  if (sent_ == out.size()) {
    out.clear();
    sent_ = 0;
  } else if (!ec || ec == asio::error::would_block || ec == asio::error::try_again) {
    wait_writable();
  } else {
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->close(); });
  }
}

void Connection::flush() {
  if (closed_ || write_pending_) return;
  std::string& out = session_.output();
  while (sent_ < out.size()) {
    boost::system::error_code ec;
    const std::size_t n =
        socket_.write_some(asio::buffer(out.data() + sent_, out.size() - sent_), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) {
      wait_writable();
      return;
    }
    if (ec) {
      close();
      return;
    }
    sent_ += n;
  }
  out.clear();
  if (out.capacity() > 64 * 1024) out.shrink_to_fit();
  sent_ = 0;
}

void Connection::wait_writable() {
  write_pending_ = true;
  socket_.async_wait(tcp::socket::wait_write,
                     [self = shared_from_this()](const boost::system::error_code& ec) {
                       self->write_pending_ = false;
                       if (ec || self->closed_) {
                         self->close();
                         return;
                       }
                       self->pump();
                       if (!self->close_if_session_ended() && !self->write_pending_) {
                         self->wait_readable();
                       }
                     });
}

// Writes replies and, whenever they drain below the backlog limit, runs requests that were held
// back, until output blocks or no complete request is left.
void Connection::pump() {
  flush();
  while (!closed_ && !write_pending_ && session_.has_runnable_input()) {
    session_.resume();
    flush();
  }
}

void Connection::close() {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  server_->forget(shared_from_this());
}

// ---------------------------------------------------------------------------------------------
// StoreServer

StoreServer::StoreServer(asio::io_context& io, tcp::acceptor acceptor, ServerOptions options) {
  if (std::string problem = options.limits.validate(); !problem.empty()) {
    throw StoreError(StoreErrc::kInvalidArgument, problem);
  }
  impl_ = std::make_shared<detail::ServerCore>(io, std::move(acceptor), std::move(options));
}

StoreServer::~StoreServer() {
  if (impl_) impl_->stop();
}

tcp::acceptor StoreServer::bind(asio::io_context& io, const std::string& host, std::uint16_t port) {
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (ec) {
    throw StoreError(StoreErrc::kInvalidArgument,
                     "cannot listen on '" + host + "': not an IP address (" + ec.message() + ")");
  }
  const tcp::endpoint endpoint(address, port);
  tcp::acceptor acceptor(io);
  const std::string where =
      (address.is_v6() ? "[" + host + "]" : host) + ":" + std::to_string(port);
  acceptor.open(endpoint.protocol(), ec);
  // "::" is every address, IPv4 included, whatever net.ipv6.bindv6only says.
  if (!ec && address.is_v6() && address.is_unspecified()) {
    acceptor.set_option(asio::ip::v6_only(false), ec);
  }
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    throw StoreError(StoreErrc::kUnavailable,
                     "cannot listen on " + where + ": " + ec.message() +
                         (ec == asio::error::address_in_use
                              ? " (another process holds the port; choose another, or 0 for a "
                                "free one)"
                              : ""));
  }
  return acceptor;
}

void StoreServer::start() {
  impl_->start();
}
void StoreServer::stop() {
  impl_->stop();
}
tcp::endpoint StoreServer::local_endpoint() const {
  return impl_->local_endpoint();
}
ServerStats StoreServer::stats() const {
  return impl_->stats();
}
std::size_t StoreServer::erase_keys(const std::function<bool(std::string_view)>& predicate) {
  return impl_->state().erase_if(predicate);
}

// ---------------------------------------------------------------------------------------------
// StoreServerThread

StoreServerThread::StoreServerThread(const std::string& host, std::uint16_t port,
                                     ServerOptions options)
    : host_(host) {
  server_.emplace(io_, StoreServer::bind(io_, host, port), std::move(options));
  port_ = server_->local_endpoint().port();
  server_->start();
  thread_ = std::thread([this] { io_.run(); });
}

StoreServerThread::~StoreServerThread() {
  asio::post(io_, [this] { server_->stop(); });
  thread_.join();  // run() returns once the stopped server's handlers have drained
  server_.reset();
}

ServerStats StoreServerThread::stats() {
  std::promise<ServerStats> result;
  asio::post(io_, [&] { result.set_value(server_->stats()); });
  return result.get_future().get();
}

}  // namespace dist::rendezvous
