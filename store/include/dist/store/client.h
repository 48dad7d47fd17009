// A blocking client of the rendezvous store, used by the worker SDK and the tests (the agent uses
// AsyncStoreClient, async_client.h, on its one thread).
//
// Every call has a deadline (ClientOptions::timeout unless the call takes its own) and throws
// StoreError on failure. Keys travel exactly as given: unlike PyTorch's client, no "/" is added.
//
// Reconnect policy: connect() retries with exponential backoff (100 ms, x1.5, +-20% jitter, capped
// at 2 s) until connect_timeout. Once connected, a broken connection is never silently
// re-established: ADD, APPEND and queue operations are not idempotent, so a call that may or may
// not have reached the server throws kConnectionLost and the caller decides (the agent makes a new
// client and re-reads what it needs).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dist/store/errors.h"
#include "dist/store/limits.h"

namespace dist::store {

struct ClientOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  std::chrono::milliseconds connect_timeout{30'000};
  std::chrono::milliseconds timeout{60'000};  // default deadline of each call
  std::string secret;                         // shared secret, when the store requires one
  // TCP keepalive: a store that vanished without closing is noticed after about
  // idle + interval * probes seconds (0: off).
  int keepalive_idle_seconds = 0;
  int keepalive_interval_seconds = 1;
  int keepalive_probes = 3;
  // While connect() keeps failing (a name that does not resolve yet, a store not up yet), this
  // hears why, at most once per retry_notice_interval; unset: silence until connect_timeout.
  std::function<void(const std::string& why)> on_retry;
  std::chrono::milliseconds retry_notice_interval{10'000};
  // A refused connection ends connect() at once (kUnavailable) instead of being retried: for a
  // client that reached this store before, whose host now answers without it (the store is gone),
  // as opposed to one that waits for a store still starting.
  bool refusal_is_final = false;
};

// Reads a shared secret from a file: its contents without trailing newlines. Throws
// StoreError(kInvalidArgument) naming the file when it cannot be read, is not a regular file, is
// empty, or is readable or writable by other users (a token every user of the machine can read
// proves nothing: chmod 600 it).
std::string read_secret_file(const std::string& path);

// Turns on TCP keepalive (and a matching TCP_USER_TIMEOUT for unacknowledged data) on a socket,
// each value held to Linux's bounds.
inline constexpr int kMaxKeepaliveSeconds = 32767, kMaxKeepaliveProbes = 127;
void enable_keepalive(int fd, int idle_seconds, int interval_seconds, int probes);

class StoreClient {
 public:
  using Timeout = std::optional<std::chrono::milliseconds>;  // nullopt: ClientOptions::timeout

  // Connects (retrying until connect_timeout), negotiates the extension protocol and
  // authenticates when the store asks for it.
  static StoreClient connect(ClientOptions options);

  StoreClient(StoreClient&& other) noexcept;
  StoreClient& operator=(StoreClient&& other) noexcept;
  ~StoreClient();

  // SET; an ephemeral key is deleted by the server when this connection closes.
  void set(const std::string& key, const std::string& value, bool ephemeral = false);
  // GET, waiting for the key to exist (kTimeout if it does not appear in time).
  std::string get(const std::string& key, Timeout timeout = {});
  // GET without waiting: nullopt when the key does not exist.
  std::optional<std::string> try_get(const std::string& key);
  std::int64_t add(const std::string& key, std::int64_t delta);
  // Stores `desired` if the value equals `expected` (or the key is missing and `expected` is
  // empty); returns the value stored afterwards (PyTorch's semantics).
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired);
  void append(const std::string& key, const std::string& value);
  bool check(const std::vector<std::string>& keys);
  // Returns once every key exists; kTimeout otherwise (the wait is cancelled on the server).
  void wait(const std::vector<std::string>& keys, Timeout timeout = {});
  // Returns the index of a key in `keys` that does not exist (now, or once it is deleted).
  std::size_t wait_deleted(const std::vector<std::string>& keys, Timeout timeout = {});
  std::vector<std::string> multi_get(const std::vector<std::string>& keys, Timeout timeout = {});
  void multi_set(const std::vector<std::pair<std::string, std::string>>& items);
  bool delete_key(const std::string& key);
  // Deletes every key and queue whose name does not start with `prefix`; returns how many.
  std::int64_t delete_all_except(const std::string& prefix);
  std::int64_t num_keys();
  std::vector<std::string> list_keys();
  // Adds 1 to the counter `key` and returns once it reaches world_size.
  void barrier(const std::string& key, std::int64_t world_size, Timeout timeout = {});
  void queue_push(const std::string& key, const std::string& value);
  std::optional<std::string> queue_pop(const std::string& key);  // nullopt when empty
  std::int64_t queue_len(const std::string& key);
  std::uint32_t ping(std::uint32_t nonce);

  const StoreLimits& server_limits() const;
  std::string endpoint() const;  // "host:port", for messages

 private:
  class Impl;
  explicit StoreClient(Impl* impl);
  Impl* impl_;
};

}  // namespace dist::store
