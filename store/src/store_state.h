// The store's data and everything that waits on it: keys and values, queues, ephemeral ownership,
// byte accounting against the limits, and the indexes of sessions waiting for a key to appear,
// to disappear, or for a counter to reach a target. Single-threaded: the server's io thread owns
// it.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "dist/store/errors.h"
#include "dist/store/server.h"
#include "protocol.h"

namespace dist::store {

class Session;

// A failed request. `fatal` ones close the connection; others are answered with an error frame
// when the connection speaks the framed extension protocol (and close it otherwise).
struct RequestError {
  StoreErrc code;
  std::string message;
  bool fatal = false;
};

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};
// A counter's stored text as PyTorch's servers read it (std::stoll): " 12", "+5" and "12abc" are
// numbers, "abc", "" and values outside the 64-bit range are not (nullopt).
std::optional<std::int64_t> parse_counter(std::string_view text);

template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// Sessions waiting on keys. An entry names the session and the session's own ticket number.
// Per key the waiters are indexed by session, so a session that stops waiting leaves each of its
// keys in constant time (a watch over N keys by N agents stays O(N^2) in all, not O(N^3)).
class WaiterIndex {
 public:
  struct Waiter {
    Session* session;
    std::uint64_t ticket;
    std::int64_t target;  // barrier waits only
  };
  using Waiters = std::unordered_multimap<const Session*, Waiter>;

  void add(std::string_view key, Waiter waiter);
  // Removes and returns every waiter of key, in ticket order.
  std::vector<Waiter> take(std::string_view key);
  std::optional<Waiter> take_one(std::string_view key);
  void remove(std::string_view key, const Session* session, std::uint64_t ticket);
  Waiters* find(std::string_view key);
  void erase_if_empty(std::string_view key);

 private:
  StringMap<Waiters> by_key_;
};

class StoreState {
 public:
  explicit StoreState(ServerOptions options);

  const ServerOptions& options() const { return options_; }
  const StoreLimits& limits() const { return options_.limits; }

  // Data operations. Each throws RequestError when a limit would be exceeded, and wakes the
  // sessions that wait on what it changed.
  const std::string* find(std::string_view key) const;
  bool exists(std::string_view key) const;
  void set(std::string_view key, std::string_view value, Session* ephemeral_owner = nullptr);
  std::string compare_set(std::string_view key, std::string_view expected,
                          std::string_view desired);
  // PyTorch's clients get a wrapped sum on overflow (as from PyTorch's servers); ours an error.
  std::int64_t add(std::string_view key, std::int64_t delta, bool wrap_on_overflow);
  void append(std::string_view key, std::string_view value);
  // All or nothing: either every item is stored or (over the byte limit) none is.
  void multi_set(const std::vector<std::pair<std::string_view, std::string_view>>& items);
  bool erase(std::string_view key);
  std::size_t erase_if(const std::function<bool(std::string_view)>& predicate);
  std::size_t num_keys() const { return data_.size(); }
  std::vector<std::string_view> list_keys() const;
  std::uint64_t stored_bytes() const { return stored_bytes_; }

  // Keys under options().agent_key_prefix: what authenticated clients alone may touch.
  bool is_agent_key(std::string_view key) const;
  std::size_t num_agent_keys() const { return agent_keys_; }

  void queue_push(std::string_view key, std::string_view value);  // wakes one waiter
  bool queue_pop(std::string_view key, std::string* value_out);
  std::size_t queue_len(std::string_view key) const;

  // Wait indexes; the sessions keep their own bookkeeping of tickets.
  WaiterIndex& creation_waiters() { return creation_waiters_; }
  WaiterIndex& deletion_waiters() { return deletion_waiters_; }
  WaiterIndex& barrier_waiters() { return barrier_waiters_; }
  WaiterIndex& watchers() { return watchers_; }

  // Authentication policy memory: hosts from which a client has authenticated.
  void remember_authenticated_host(const std::string& address) { known_hosts_.insert(address); }
  bool is_known_host(const std::string& address) const { return known_hosts_.contains(address); }

  // Called by a closing session for every ephemeral key it owns.
  void release_ephemeral(std::string_view key, const Session* owner);

  // Memory accounting against limits().max_total_bytes: stored data with its bookkeeping, plus
  // what each session holds (its buffers, waits and watches), which sessions report here.
  std::uint64_t held_bytes() const;
  void recharge(Session* session, std::uint64_t before, std::uint64_t after);
  // Makes room for `more` bytes by closing the sessions that hold the most, largest first, as
  // long as each holds more than `requester_bytes` (a session is never closed for a bigger one);
  // false when that is not enough. The requester itself is never closed here.
  bool make_room(std::uint64_t more, const Session* requester, std::uint64_t requester_bytes);
  // The session whose request is executing (never closed to make room for itself).
  Session* current() const { return current_; }
  bool is_current(const Session* session) const { return current_ == session; }
  void set_current(Session* session) { current_ = session; }

  std::array<std::uint64_t, std::size(wire::kOps)> requests_by_op{};  // served, for stats
  std::uint64_t evictions = 0;  // sessions closed by make_room, for stats

 private:
  struct Entry {
    std::string value;
    Session* owner = nullptr;  // set for an ephemeral key
  };
  // Accounts for stored data growing by `more` bytes (bookkeeping of new entries included), or
  // throws the store-full error naming `key`.
  void reserve_bytes(std::uint64_t more, std::string_view key);
  bool make_room_below(std::uint64_t limit, std::uint64_t more, const Session* requester,
                       std::uint64_t requester_bytes);
  void count_key(std::string_view key, int delta);
  void on_created(std::string_view key);
  void on_created_one(std::string_view key);
  void on_deleted(std::string_view key, const std::string& old_value);
  void on_counter(std::string_view key, std::int64_t value);
  void notify_watchers(std::uint8_t event, std::string_view key, std::string_view old_value,
                       std::string_view new_value);

  ServerOptions options_;
  StringMap<Entry> data_;
  StringMap<std::deque<std::string>> queues_;
  std::uint64_t stored_bytes_ = 0;
  std::uint64_t queue_items_ = 0;
  std::size_t agent_keys_ = 0;
  std::uint64_t session_bytes_ = 0;             // the sum of what sessions hold
  std::unordered_set<Session*> large_holders_;  // sessions holding enough to be worth closing
  Session* current_ = nullptr;
  WaiterIndex creation_waiters_, deletion_waiters_, barrier_waiters_, watchers_;
  std::unordered_set<std::string> known_hosts_;
};

// Marks a session's request as the one executing, for its scope.
class CurrentSession {
 public:
  CurrentSession(StoreState& state, Session* session) : state_(state), previous_(state.current()) {
    state_.set_current(session);
  }
  ~CurrentSession() { state_.set_current(previous_); }
  CurrentSession(const CurrentSession&) = delete;
  CurrentSession& operator=(const CurrentSession&) = delete;

 private:
  StoreState& state_;
  Session* previous_;
};

}  // namespace dist::store
