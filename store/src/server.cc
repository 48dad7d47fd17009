#include "dist/store/server.h"

#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstring>
#include <future>
#include <unordered_set>

#include "dist/store/client.h"
#include "dist/store/endpoint.h"
#include "dist/store/errors.h"
#include "session.h"
#include "text.h"
#include "warning_limiter.h"

namespace dist::store {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {
constexpr std::size_t kReadChunkBytes = 64 * 1024;
// Reads from one connection per turn of the event loop, so one busy client cannot starve others.
constexpr int kReadRoundsPerTurn = 1;
constexpr auto kAcceptRetryDelay = std::chrono::milliseconds(50);  // after EMFILE and the like
// Deadlines are checked by one sweep over the connections, this often (a quarter of the shortest
// deadline, within these bounds); the same sweep writes the warnings' summaries.
constexpr auto kMinSweepInterval = std::chrono::milliseconds(10);
constexpr auto kMaxSweepInterval = std::chrono::milliseconds(1000);
// Eviction candidates for a full connection table are gathered by one scan at most this often.
constexpr auto kEvictionScanInterval = std::chrono::milliseconds(100);

std::chrono::milliseconds sweep_interval(const ServerOptions& options) {
  auto interval = std::min(kMaxSweepInterval, options.warning_interval);
  for (const auto d : {options.deadlines.auth_timeout, options.deadlines.request_timeout,
                       options.deadlines.idle_timeout}) {
    if (d.count() > 0) interval = std::min(interval, d / 4);
  }
  return std::max(interval, kMinSweepInterval);
}
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
  void on_keepalive_asked(const Keepalive& k) override;
  const PeerInfo& peer() const { return session_.peer(); }
  Session& session() { return session_; }
  // Closes the connection with a warning of `kind` (rate-limited) saying why.
  void close_with_warning(const std::string& kind, const std::string& reason);

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
      : io_(io),
        acceptor_(std::move(acceptor)),
        state_(std::move(options)),
        retry_timer_(io),
        sweep_timer_(io),
        warnings_(state_.options().warning_interval),
        reserve_fd_(open_reserve()) {}
  ~ServerCore() {
    if (reserve_fd_ >= 0) ::close(reserve_fd_);
  }
  ServerCore(const ServerCore&) = delete;
  ServerCore& operator=(const ServerCore&) = delete;

  void start() {
    accept();
    sweep();
  }
  void stop() {
    stopped_ = true;
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    retry_timer_.cancel();
    sweep_timer_.cancel();
    warnings_.flush(WarningLimiter::Clock::time_point::max());
    for (const auto& c :
         std::vector<std::shared_ptr<Connection>>(connections_.begin(), connections_.end())) {
      c->close();
    }
  }
  void forget(const std::shared_ptr<Connection>& c) { connections_.erase(c); }

  ServerStats stats() const {
    ServerStats s = stats_;
    s.connections_open = connections_.size();
    for (std::size_t op = 0; op < state_.requests_by_op.size(); ++op) {
      if (state_.requests_by_op[op] == 0) continue;
      s.requests += state_.requests_by_op[op];
      s.requests_by_op.emplace_back(std::string(wire::kOps[op].name), state_.requests_by_op[op]);
    }
    s.keys = state_.num_keys();
    s.stored_bytes = state_.stored_bytes();
    s.held_bytes = state_.held_bytes();
    s.connections_evicted += state_.evictions;
    return s;
  }
  void warn(const std::string& kind, const std::string& message) {
    warnings_.warn(kind, message, WarningLimiter::Clock::now());
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

  static int open_reserve() { return ::open("/dev/null", O_RDONLY | O_CLOEXEC); }

  // At the open-file limit the connections waiting to be accepted would wait in the listen
  // backlog until their clients' connect timeouts (minutes of a stalled rendezvous). Instead the
  // descriptor kept in reserve is given up for a moment, each waiting connection is accepted and
  // closed at once (its client is told now: the store closed the connection), and the reserve is
  // taken back. False where there is no reserve to give up.
  bool refuse_waiting_connections() {
    if (reserve_fd_ < 0) return false;
    ::close(reserve_fd_);
    std::uint64_t refused = 0;
    std::string last;
    const int listener = acceptor_.native_handle();
    while (true) {
      pollfd ready{listener, POLLIN, 0};
      if (::poll(&ready, 1, 0) != 1) break;  // none waiting (the listener may block: ask first)
      sockaddr_storage address{};
      socklen_t length = sizeof address;
      const int fd = ::accept4(listener, reinterpret_cast<sockaddr*>(&address), &length,
                               SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) break;
      tcp::endpoint remote;
      if (length <= remote.capacity()) {
        std::memcpy(remote.data(), &address, length);
        remote.resize(length);
        last = Endpoint{remote.address().to_string(), remote.port()}.to_string();
      }
      ::close(fd);
      ++refused;
    }
    reserve_fd_ = open_reserve();
    stats_.connections_rejected += refused;
    rlimit limit{};
    const std::string files =
        ::getrlimit(RLIMIT_NOFILE, &limit) == 0 ? group_digits(limit.rlim_cur) + " " : "";
    if (refused > 0) {
      warn("refused connections",
           "refusing " +
               (refused == 1 ? last
                             : group_digits(refused) +
                                   " connections (the last "
                                   "from " +
                                   last + ")") +
               ": the store's process has every file it may open (" + files + "open files, " +
               group_digits(connections_.size()) +
               " connections): raise its limit (ulimit -n) on the store's host");
    }
    return true;
  }

  void on_accept(const boost::system::error_code& ec, tcp::socket socket) {
    if (stopped_ || ec == asio::error::operation_aborted) return;
    if ((ec == asio::error::no_descriptors ||
         ec == boost::system::errc::too_many_files_open_in_system) &&
        refuse_waiting_connections()) {
      accept();
      return;
    }
    if (ec) {
      warn("accept failures", "accept failed: " + ec.message() + " (retrying every " +
                                  std::to_string(kAcceptRetryDelay.count()) +
                                  " ms; at the open-file limit, raise it with ulimit -n)");
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
    peer.address = Endpoint{peer.host, remote.port()}.to_string();
    peer.loopback =
        remote.address().is_loopback() ||
        (remote.address().is_v6() && remote.address().to_v6().is_v4_mapped() &&
         asio::ip::make_address_v4(asio::ip::v4_mapped, remote.address().to_v6()).is_loopback());
    ++stats_.connections_total;
    if (connections_.size() >= state_.limits().max_connections && !evict_for_slot()) {
      ++stats_.connections_rejected;
      warn("refused connections", "refusing " + peer.address + ": " +
                                      group_digits(connections_.size()) +
                                      " connections open, the limit (--max-connections)");
      return;  // the socket closes as it goes out of scope
    }
    const std::uint64_t base = Session::kBaseBytes;
    if (state_.held_bytes() + base > state_.limits().max_total_bytes &&
        !state_.make_room(base, nullptr, base)) {
      ++stats_.connections_rejected;
      warn("refused connections", "refusing " + peer.address + ": the server holds " +
                                      group_digits(state_.held_bytes()) +
                                      " bytes, its limit (--max-total-bytes)");
      return;
    }
    auto connection =
        std::make_shared<Connection>(shared_from_this(), std::move(socket), std::move(peer));
    connections_.insert(connection);
    connection->start();
  }

  // Periodic: closes connections past a deadline, writes the warnings' summaries.
  void sweep() {
    if (stopped_) return;
    const auto now = Session::Clock::now();
    for (const auto& c :
         std::vector<std::shared_ptr<Connection>>(connections_.begin(), connections_.end())) {
      const std::string reason = c->session().overdue(now);
      if (reason.empty()) continue;
      ++stats_.connections_timed_out;
      c->close_with_warning("connections closed by a deadline", reason);
    }
    warnings_.flush(now);
    sweep_timer_.expires_after(sweep_interval(state_.options()));
    sweep_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (!ec) self->sweep();
    });
  }

  // Every slot is taken: closes the connection that is least likely a working client (one that
  // must authenticate and has not, then one stuck in the middle of a request; the longest
  // waiting first) to admit the new one. Candidates come from one scan, reused until spent.
  bool evict_for_slot() {
    const auto now = Session::Clock::now();
    while (true) {
      while (!eviction_candidates_.empty()) {
        auto victim = eviction_candidates_.back().lock();
        eviction_candidates_.pop_back();
        if (!victim || !connections_.contains(victim) || !victim->session().eviction_rank()) {
          continue;
        }
        ++stats_.connections_evicted;
        victim->close_with_warning("connections closed to admit new ones",
                                   std::string(victim->session().eviction_rank()->first == 0
                                                   ? "not authenticated"
                                                   : "in the middle of a request") +
                                       " while every connection slot is taken (--max-connections " +
                                       group_digits(state_.limits().max_connections) +
                                       "): closed to admit another");
        return true;
      }
      if (now - last_eviction_scan_ < kEvictionScanInterval) return false;
      last_eviction_scan_ = now;
      std::vector<std::pair<std::pair<int, Session::Clock::time_point>, std::weak_ptr<Connection>>>
          ranked;
      for (const auto& c : connections_) {
        if (auto rank = c->session().eviction_rank()) ranked.emplace_back(*rank, c);
      }
      if (ranked.empty()) return false;
      // Best victim last, so candidates pop from the back.
      std::sort(ranked.begin(), ranked.end(),
                [](const auto& a, const auto& b) { return a.first > b.first; });
      for (auto& [rank, c] : ranked) eviction_candidates_.push_back(std::move(c));
    }
  }

  asio::io_context& io_;
  tcp::acceptor acceptor_;
  StoreState state_;
  asio::steady_timer retry_timer_;
  asio::steady_timer sweep_timer_;
  WarningLimiter warnings_;
  std::vector<std::weak_ptr<Connection>> eviction_candidates_;
  Session::Clock::time_point last_eviction_scan_{};
  std::unordered_set<std::shared_ptr<Connection>> connections_;
  std::array<char, kReadChunkBytes> read_buffer_{};
  ServerStats stats_;
  // Kept open to be given up at the open-file limit (refuse_waiting_connections).
  int reserve_fd_ = -1;
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
  for (int round = 0; round < kReadRoundsPerTurn && session_.wants_input(); ++round) {
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
  ++server_->counters().protocol_errors;
  if (session_.close_code() == StoreErrc::kUnauthenticated) {
    ++server_->counters().connections_unauthenticated;
    server_->counters().last_unauthenticated =
        session_.peer().address + ": " + session_.close_reason();
  }
  close_with_warning("connections closed (" + std::string(to_string(session_.close_code())) + ")",
                     session_.close_reason());
  return true;
}

void Connection::close_with_warning(const std::string& kind, const std::string& reason) {
  if (closed_) return;
  server_->warn(kind, "closing connection from " + session_.peer().address + ": " + reason);
  flush();  // an error frame, if the session wrote one
  close();
}

// The client's schedule replaces the server's on its own connection (once it has proven the
// secret, where one is required; held to Linux's bounds): a dist-launch agent's liveness is its
// connection, and its job knows how long a silence it can ride out (a job of a fixed size 30 s,
// an elastic one 8 s), whichever server (an agent, dist-rendezvous) holds it.
void Connection::on_keepalive_asked(const Keepalive& k) {
  enable_keepalive(socket_.native_handle(), k.idle_seconds, k.interval_seconds, k.probes);
}

void Connection::on_async_output() {
  // Called while another connection's request runs: write now, but never close here (the
  // caller may still be iterating over waiters that include this session).
  if (closed_) return;
  if (session_.closing()) {  // closed to make room
    asio::post(socket_.get_executor(),
               [self = shared_from_this()] { self->close_if_session_ended(); });
    return;
  }
  if (write_pending_) return;
  std::string& out = session_.output();
  boost::system::error_code ec;
  const std::size_t n =
      socket_.write_some(asio::buffer(out.data() + sent_, out.size() - sent_), ec);
  if (!ec) sent_ += n;
  if (sent_ == out.size()) {
    out.clear();
    sent_ = 0;
    session_.account();
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
  session_.account();
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
  const std::string where = Endpoint{host, port}.to_string();
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

void StoreServer::multi_set(const std::vector<std::pair<std::string, std::string>>& items) {
  const std::vector<std::pair<std::string_view, std::string_view>> views(items.begin(),
                                                                         items.end());
  try {
    impl_->state().multi_set(views);
  } catch (const RequestError& e) {
    throw StoreError(e.code, e.message);
  }
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

}  // namespace dist::store
