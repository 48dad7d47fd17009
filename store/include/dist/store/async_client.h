// An asynchronous client of the rendezvous store, for programs that drive an Asio io_context (the
// agent): every call is a C++20 coroutine and nothing blocks the thread, which may be serving the
// very store the calls go to.
//
// Same options, limits, errors and reconnect policy as the blocking StoreClient (client.h), and:
// - Calls are served one at a time, in the order they were made: a call made while another is in
//   flight waits for it. A WAIT holds the connection until it is answered, so a waiting
//   coroutine that must not be held up by one uses a client of its own.
// - close() ends every pending and later call with StoreErrc::kCancelled and closes the
//   connection (the store then deletes this client's ephemeral keys).
// - A wait that times out returns false / nullopt instead of throwing; the connection stays usable.
// - Name resolution runs on Asio's resolver. While the store cannot be reached, options.on_retry
//   (if set) hears why, at most every options.retry_notice_interval.
#pragma once

#include <utility>  // first: Asio 1.18's awaitable.hpp uses std::exchange without it

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
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
  // authenticates when the store asks for it.
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

  void close();
  const ClientOptions& options() const;
  std::string endpoint() const;  // "host:port", for messages

 private:
  class Impl;
  std::shared_ptr<Impl> impl_;  // shared with the coroutines and timers in flight
};

}  // namespace dist::store
