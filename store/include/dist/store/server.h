// The rendezvous store server: an event-driven TCP key-value store that speaks PyTorch's c10d
// TCPStore protocol (the current dialect of torch 2.x and the legacy dialect of torch 1.x, detected
// per connection) plus dist-launch's extensions (authentication, ephemeral keys, deletion waits).
//
// It runs on the caller's io_context (one thread drives it) and can take an acceptor the caller
// already bound, so the process that decides the port is the one that holds it.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "dist/store/limits.h"

namespace dist::store {

namespace detail {
class ServerCore;  // the accept loop, the connections and the store's state (server.cc)
}

// Who may use the store without authenticating when a shared secret is configured. PyTorch's own
// clients cannot authenticate, so a launcher that lets torch workers use its store picks one of
// the permissive policies.
enum class UnauthenticatedPolicy {
  kDeny,        // nobody: every connection must authenticate first
  kLoopback,    // connections from 127.0.0.0/8 and ::1
  kKnownHosts,  // loopback, plus any address from which a client has authenticated (default)
  kAllow,       // anybody (the secret then only guards dist-launch's own agents' identity)
};

// TCP keepalive on each connection, so a peer that vanished without closing (a partition, a
// powered-off host) is dropped after about idle + interval * probes; 0: off (the default).
struct Keepalive {
  int idle_seconds = 0;
  int interval_seconds = 1;
  int probes = 3;
};

// How long a connection may take over what it owes the server. A connection past one is closed
// with a warning. The defaults never cut a healthy PyTorch client: those send each request whole
// at once, keep idle connections open for the whole job (torch 1.13's second socket never sends
// a byte), and wait on keys for as long as their own timeout says.
struct Deadlines {
  // A connection that must authenticate (a secret is set and the unauthenticated policy does not
  // admit its address) and has not, this long after connecting. 0: never.
  std::chrono::milliseconds auth_timeout{10'000};
  // A request whose first bytes arrived this long ago and that is still incomplete (slow-loris).
  // Time during which the server holds back reading (the client does not read its replies) does
  // not count. 0: never.
  std::chrono::milliseconds request_timeout{30'000};
  // A connection that sent nothing this long and has nothing pending: no wait or watch, no
  // partial request, no unsent reply. 0: never (the default).
  std::chrono::milliseconds idle_timeout{0};
};

// Where dist-launch's agents keep their rendezvous keys: "rdzv/<run id>/..." in the job's store.
inline constexpr std::string_view kAgentKeyPrefix = "rdzv/";

struct ServerOptions {
  StoreLimits limits;
  Keepalive keepalive;
  Deadlines deadlines;
  std::string secret;  // empty: no authentication
  UnauthenticatedPolicy unauthenticated = UnauthenticatedPolicy::kKnownHosts;
  // With a secret, keys under this prefix (dist-launch's agents' rendezvous) and the extension
  // operations are for authenticated clients only: PyTorch workers admitted by the policy get the
  // rest of the store.
  std::string agent_key_prefix{kAgentKeyPrefix};
  // Repeated warnings of one kind are logged once per interval, then summed up with a count.
  std::chrono::milliseconds warning_interval{10'000};
};

struct ServerStats {
  std::uint64_t connections_open = 0;
  std::uint64_t connections_total = 0;
  std::uint64_t connections_rejected = 0;   // over max_connections or refused by the auth policy
  std::uint64_t connections_evicted = 0;    // closed to make room (a connection slot or memory)
  std::uint64_t connections_timed_out = 0;  // closed by a deadline
  // Closed for the job's token (a wrong one, or none where one is required), and the last such
  // ("ADDRESS: why"): a node started with another token is missing from the rounds for it.
  std::uint64_t connections_unauthenticated = 0;
  std::string last_unauthenticated;
  std::uint64_t protocol_errors = 0;
  std::uint64_t requests = 0;
  // The same, by operation (its name on the wire: "GET", "MULTI_SET", ...), where any was served.
  std::vector<std::pair<std::string, std::uint64_t>> requests_by_op;
  std::uint64_t keys = 0;
  std::uint64_t stored_bytes = 0;  // keys and values
  std::uint64_t held_bytes = 0;    // everything counted against max_total_bytes
};

class StoreServer {
 public:
  // Serves on an acceptor that is already open, bound and listening (port 0 works).
  StoreServer(boost::asio::io_context& io, boost::asio::ip::tcp::acceptor acceptor,
              ServerOptions options = {});
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // Binds host:port (port 0 picks one) and listens. Throws StoreError(kUnavailable) naming the
  // address when it is taken or cannot be bound.
  static boost::asio::ip::tcp::acceptor bind(boost::asio::io_context& io, const std::string& host,
                                             std::uint16_t port);

  void start();
  // Stops accepting and closes every connection. Call on the io_context's thread.
  void stop();

  boost::asio::ip::tcp::endpoint local_endpoint() const;
  ServerStats stats() const;  // call on the io_context's thread

  // Deletes every key (and queue) for which `predicate` is true, as DELETE_KEY would, and returns
  // how many were deleted. The hosting agent gives each restart attempt a clean namespace with it.
  // Call on the io_context's thread.
  std::size_t erase_keys(const std::function<bool(std::string_view key)>& predicate);

  // Stores every item, all or none, as a client's MULTI_SET would (the sessions waiting on them
  // wake), without a connection: the hosting process's own keys. Throws StoreError when the
  // store's limits refuse them. Call on the io_context's thread.
  void multi_set(const std::vector<std::pair<std::string, std::string>>& items);

 private:
  std::shared_ptr<detail::ServerCore> impl_;
};

// A store server on its own thread: what tests, benchmarks and a hosting agent use.
class StoreServerThread {
 public:
  // Binds host:port before returning (errors surface here), then serves on a new thread.
  explicit StoreServerThread(const std::string& host = "127.0.0.1", std::uint16_t port = 0,
                             ServerOptions options = {});
  ~StoreServerThread();  // stops the server and joins the thread
  StoreServerThread(const StoreServerThread&) = delete;
  StoreServerThread& operator=(const StoreServerThread&) = delete;

  std::uint16_t port() const { return port_; }
  std::string host() const { return host_; }
  ServerStats stats();  // runs on the server's thread and waits for the answer

 private:
  boost::asio::io_context io_;
  std::optional<StoreServer> server_;
  std::string host_;
  std::uint16_t port_ = 0;
  std::thread thread_;
};

}  // namespace dist::store
