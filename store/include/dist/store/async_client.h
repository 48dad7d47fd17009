// An asynchronous client of the rendezvous store, for programs that drive an Asio io_context (the
// agent): every call is a C++20 coroutine and nothing blocks the thread, which may be serving the
// very store the calls go to.
//
// Same options, limits, errors and reconnect policy as the blocking StoreClient (client.h), and:
// - Calls are served one at a time, in the order they were made: a call made while another is in
//   flight waits for it. A wait in flight gives way to a call made meanwhile: it is cancelled on
//   the store (CANCEL_WAIT), the other call served, then the wait made again for the time it has
//   left (waits are for a state, not an event: nothing is missed). So a coroutine that waits
//   beside others' calls needs no connection of its own: lane() gives it a handle of its own on
//   this one.
// - close() ends every pending and later call with StoreErrc::kCancelled and closes the
//   connection (the store then deletes this client's ephemeral keys).
// - A wait that times out returns false / nullopt instead of throwing; the connection stays usable.
// - Name resolution runs on Asio's resolver. While the store cannot be reached, options.on_retry
//   (if set) hears why, at most every options.retry_notice_interval.
#pragma once

#include <utility>  // first: Asio 1.18's awaitable.hpp uses std::exchange without it

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dist/store/client.h"
#include "dist/store/task.h"

namespace dist::store {

class AsyncStoreClient {
 public:
  template <typename T = void>
  using Task = store::Task<T>;
  using Items = std::vector<std::pair<std::string, std::string>>;

  // A client not yet connected: open() connects; close() may be called at any time, during
  // open() too (it then throws kCancelled).
  AsyncStoreClient(boost::asio::any_io_executor executor, ClientOptions options);
  // Connects (retrying until options.connect_timeout), negotiates the extension protocol and
  // authenticates when the store asks for it. Once: an open() made while one is under way waits
  // for it (and returns, or tries again if it failed); one made after it returns at once.
  Task<void> open();
  // Both steps at once.
  static Task<AsyncStoreClient> connect(ClientOptions options);

  AsyncStoreClient(AsyncStoreClient&&) noexcept = default;
  AsyncStoreClient& operator=(AsyncStoreClient&&) noexcept = default;
  ~AsyncStoreClient();

  Task<void> set(std::string key, std::string value, bool ephemeral = false);
  Task<std::optional<std::string>> try_get(std::string key);
  // MULTI_GET: throws kNotFound when any key is missing.
  Task<std::vector<std::string>> multi_get(std::vector<std::string> keys);
  Task<void> multi_set(Items items);
  Task<std::int64_t> add(std::string key, std::int64_t delta);
  Task<std::string> compare_set(std::string key, std::string expected, std::string desired);
  Task<bool> check(std::vector<std::string> keys);
  Task<bool> delete_key(std::string key);
  // Deletes every key and queue whose name does not start with `prefix`; returns how many.
  Task<std::int64_t> delete_all_except(std::string prefix);
  Task<std::vector<std::string>> list_keys();
  // True once every key exists; false when `timeout` passed first.
  Task<bool> wait(std::vector<std::string> keys, std::chrono::milliseconds timeout);
  // The index of a key that does not exist (now, or once deleted); nullopt on timeout.
  Task<std::optional<std::size_t>> wait_deleted(std::vector<std::string> keys,
                                                std::chrono::milliseconds timeout);

  // Another handle on this client's connection, for a coroutine that waits beside this client's
  // calls (the round's watch). Its calls queue with this client's; its close() ends only its own
  // calls (pending, a wait in flight, later ones: kCancelled) and leaves the connection open;
  // the client's close() ends them too. Its ephemeral keys are the connection's. open() on a
  // lane does nothing.
  AsyncStoreClient lane() const;

  // Ends every call and closes the connection; on a lane, ends the lane's calls only.
  void close();
  const ClientOptions& options() const;
  std::string endpoint() const;  // "host:port", for messages

 private:
  class Impl;
  struct Lane;
  AsyncStoreClient(std::shared_ptr<Impl> impl, std::shared_ptr<Lane> lane);

  std::shared_ptr<Impl> impl_;  // shared with the coroutines and timers in flight, and lanes
  std::shared_ptr<Lane> lane_;  // null for the connection's own handle
};

}  // namespace dist::store
