// The key-value store the agents' rendezvous runs over, as one asynchronous interface with two
// implementations: the job's TCPStore (hosted by an agent, or by dist-rendezvous) and etcd v3.
//
// Calls are Asio coroutines on the agent's one io_context: nothing here blocks a thread.
//
// Contract, for every implementation:
// - Keys are relative to the job: the store puts them under the job's own prefix
//   (TCPStore: "rdzv/<run id>/", etcd: "<root>/<run id>/"). Callers never see the prefix.
// - Calls on one object are served one at a time, in order (a call made while another is in
//   flight waits for it). A user that must not wait behind another's long wait (the round's
//   watch) opens its own session with open_another().
// - Failures throw rendezvous::StoreError: kUnavailable or kConnectionLost when the store is gone
//   (the job cannot go on through this session), kCancelled after close(), kLimitExceeded or
//   kInvalidArgument for a request the store refuses. A wait that times out is not an error: it
//   returns false / nullopt.
// - An ephemeral key lives exactly as long as the session that set it: its TCP connection, or its
//   etcd lease (kept alive by the session, expiring about keep_alive_interval * max_attempt after
//   the process vanished). Sessions opened with open_another() have their own.
#pragma once

#include <utility>  // first: Asio 1.18's awaitable.hpp uses std::exchange without it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dist/rendezvous/client.h"

namespace dist::agent {

template <typename T = void>
using Task = boost::asio::awaitable<T>;

class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;

  virtual Task<void> set(std::string key, std::string value) = 0;
  // A key deleted by the store when this session ends (connection closed, lease expired).
  virtual Task<void> set_ephemeral(std::string key, std::string value) = 0;
  virtual Task<void> multi_set(std::vector<std::pair<std::string, std::string>> items) = 0;
  virtual Task<std::optional<std::string>> try_get(std::string key) = 0;
  // One value per key, nullopt where the key does not exist.
  virtual Task<std::vector<std::optional<std::string>>> multi_get(
      std::vector<std::string> keys) = 0;
  // Adds delta to the decimal counter at key (a missing key counts as 0); returns the new value.
  virtual Task<std::int64_t> add(std::string key, std::int64_t delta) = 0;
  // PyTorch's semantics: stores `desired` if the value equals `expected`, or if the key is missing
  // and `expected` is empty; returns the value stored afterwards (missing and not created:
  // `expected`).
  virtual Task<std::string> compare_set(std::string key, std::string expected,
                                        std::string desired) = 0;
  // True when every key exists.
  virtual Task<bool> check(std::vector<std::string> keys) = 0;
  // True when the key existed.
  virtual Task<bool> delete_key(std::string key) = 0;
  // True once every key exists; false when `timeout` passed first.
  virtual Task<bool> wait(std::vector<std::string> keys, std::chrono::milliseconds timeout) = 0;
  // The index in `keys` of a key that does not exist, now or once it is deleted; nullopt when
  // `timeout` passed first.
  virtual Task<std::optional<std::size_t>> wait_deleted(std::vector<std::string> keys,
                                                        std::chrono::milliseconds timeout) = 0;

  // A new session to the same store and job, for concurrent use.
  virtual Task<std::unique_ptr<RendezvousStore>> open_another() = 0;
  // Ends the session: pending and later calls throw kCancelled; its ephemeral keys go (at once
  // where the store can tell, else when they expire). Safe to call more than once.
  virtual void close() = 0;
  // Where the store is, for messages: "127.0.0.1:29400", "etcd 10.0.0.1:2379,10.0.0.2:2379".
  virtual std::string describe() const = 0;
};

// The job's TCPStore (an agent's, or dist-rendezvous) as a RendezvousStore: keys under
// "rdzv/<run id>/", ephemeral keys tied to the connection. Connects like
// rendezvous::AsyncStoreClient (retrying until options.connect_timeout).
Task<std::unique_ptr<RendezvousStore>> open_tcp_store(rendezvous::ClientOptions options,
                                                      std::string run_id);

// A session of the job `run_id` on the etcd members `endpoints` (as --rdzv-endpoint), with the
// etcd keys of `conf` (as --rdzv-conf: etcd_options.h) and leases of `lease_ttl`, once a member
// has answered and taken the credentials: keys under "<etcd_prefix>/<run id>/", ephemeral keys
// tied to the lease. Throws StoreError: kInvalidArgument for the options, kUnavailable or
// kUnauthenticated for the cluster. Its sessions run on `io` (one thread) and must be destroyed
// before it.
Task<std::unique_ptr<RendezvousStore>> open_etcd_store(boost::asio::io_context& io,
                                                       std::string endpoints,
                                                       std::map<std::string, std::string> conf,
                                                       std::string run_id,
                                                       std::chrono::seconds lease_ttl);

}  // namespace dist::agent
