#include "store_state.h"

#include <algorithm>
#include <charconv>

#include "protocol.h"
#include "session.h"

namespace dist::rendezvous {

// ---------------------------------------------------------------------------------------------
// WaiterIndex

void WaiterIndex::add(std::string_view key, Waiter waiter) {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) it = by_key_.emplace(std::string(key), Waiters{}).first;
  it->second.emplace(waiter.session, waiter);
}

std::vector<WaiterIndex::Waiter> WaiterIndex::take(std::string_view key) {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return {};
  std::vector<Waiter> waiters;
  waiters.reserve(it->second.size());
  for (const auto& [session, w] : it->second) waiters.push_back(w);
  by_key_.erase(it);
  return waiters;
}

std::optional<WaiterIndex::Waiter> WaiterIndex::take_one(std::string_view key) {
  auto it = by_key_.find(key);
  if (it == by_key_.end() || it->second.empty()) return std::nullopt;
  const Waiter w = it->second.begin()->second;
  it->second.erase(it->second.begin());
  if (it->second.empty()) by_key_.erase(it);
  return w;
}

void WaiterIndex::remove(std::string_view key, const Session* session) {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return;
  it->second.erase(session);
  if (it->second.empty()) by_key_.erase(it);
}

WaiterIndex::Waiters* WaiterIndex::find(std::string_view key) {
  auto it = by_key_.find(key);
  return it == by_key_.end() ? nullptr : &it->second;
}

void WaiterIndex::erase_if_empty(std::string_view key) {
  auto it = by_key_.find(key);
  if (it != by_key_.end() && it->second.empty()) by_key_.erase(it);
}

// ---------------------------------------------------------------------------------------------
// StoreState

StoreState::StoreState(ServerOptions options) : options_(std::move(options)) {}

const std::string* StoreState::find(std::string_view key) const {
  auto it = data_.find(key);
  return it == data_.end() ? nullptr : &it->second.value;
}

bool StoreState::exists(std::string_view key) const {
  if (data_.contains(key)) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

void StoreState::reserve_bytes(std::uint64_t more, std::string_view key) {
  if (stored_bytes_ + more > options_.limits.max_total_bytes) {
    throw RequestError{StoreErrc::kLimitExceeded,
                       "store is full: writing key '" + std::string(key) + "' needs " +
                           std::to_string(more) + " more bytes, " + std::to_string(stored_bytes_) +
                           " of " + std::to_string(options_.limits.max_total_bytes) +
                           " are used; delete keys or raise --max-total-bytes"};
  }
  stored_bytes_ += more;
}

void StoreState::set(std::string_view key, std::string_view value, Session* ephemeral_owner) {
  auto it = data_.find(key);
  if (it == data_.end()) {
    reserve_bytes(key.size() + value.size(), key);
    it = data_.emplace(std::string(key), Entry{std::string(value), ephemeral_owner}).first;
    on_created(key);
    notify_watchers(wire::kWatchKeyCreated, key, {}, value);
    return;
  }
  Entry& entry = it->second;
  if (value.size() > entry.value.size())
    reserve_bytes(value.size() - entry.value.size(), key);
  else
    stored_bytes_ -= entry.value.size() - value.size();
  std::string old_value = watchers_.find(key) ? entry.value : std::string();
  entry.value.assign(value);
  entry.owner = ephemeral_owner;  // a plain SET makes the key permanent
  notify_watchers(wire::kWatchKeyUpdated, key, old_value, value);
}

std::string StoreState::compare_set(std::string_view key, std::string_view expected,
                                    std::string_view desired) {
  auto it = data_.find(key);
  if (it == data_.end()) {
    if (!expected.empty()) return std::string(expected);
    set(key, desired);
    return std::string(desired);
  }
  if (it->second.value == expected) {
    set(key, desired);
    return std::string(desired);
  }
  return it->second.value;
}

std::int64_t StoreState::add(std::string_view key, std::int64_t delta) {
  std::int64_t value = 0;
  auto it = data_.find(key);
  if (it != data_.end()) {
    const std::string& text = it->second.value;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size()) {
      throw RequestError{StoreErrc::kInvalidArgument,
                         "ADD to key '" + std::string(key) +
                             "' whose value is not a decimal integer; use a separate counter key"};
    }
  }
  if ((delta > 0 && value > INT64_MAX - delta) || (delta < 0 && value < INT64_MIN - delta)) {
    throw RequestError{StoreErrc::kInvalidArgument,
                       "ADD overflows the 64-bit counter at key '" + std::string(key) + "'"};
  }
  value += delta;
  set(key, std::to_string(value));
  on_counter(key, value);
  return value;
}

void StoreState::append(std::string_view key, std::string_view value) {
  auto it = data_.find(key);
  if (it == data_.end()) {
    set(key, value);
    return;
  }
  reserve_bytes(value.size(), key);
  std::string old_value = watchers_.find(key) ? it->second.value : std::string();
  it->second.value.append(value);
  notify_watchers(wire::kWatchKeyUpdated, key, old_value, it->second.value);
}

void StoreState::multi_set(
    const std::vector<std::pair<std::string_view, std::string_view>>& items) {
  std::uint64_t growth = 0;
  for (const auto& [key, value] : items) {
    const std::string* old = find(key);
    const std::uint64_t before = old ? key.size() + old->size() : 0;
    const std::uint64_t after = key.size() + value.size();
    if (after > before) growth += after - before;
  }
  if (!items.empty()) {
    reserve_bytes(growth, items.front().first);
    stored_bytes_ -= growth;  // set() below accounts for each item itself
  }
  for (const auto& [key, value] : items) set(key, value);
}

bool StoreState::erase(std::string_view key) {
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  stored_bytes_ -= it->first.size() + it->second.value.size();
  std::string old_value = std::move(it->second.value);
  data_.erase(it);
  on_deleted(key, old_value);
  return true;
}

std::size_t StoreState::erase_if(const std::function<bool(std::string_view)>& predicate) {
  std::vector<std::string> doomed;
  for (const auto& [key, entry] : data_) {
    if (predicate(key)) doomed.push_back(key);
  }
  for (const auto& key : doomed) erase(key);
  std::size_t queues = 0;
  for (auto it = queues_.begin(); it != queues_.end();) {
    if (!predicate(it->first)) {
      ++it;
      continue;
    }
    for (const auto& value : it->second) stored_bytes_ -= it->first.size() + value.size();
    it = queues_.erase(it);
    ++queues;
  }
  return doomed.size() + queues;
}

void StoreState::release_ephemeral(std::string_view key, const Session* owner) {
  auto it = data_.find(key);
  if (it != data_.end() && it->second.owner == owner) erase(key);
}

std::vector<std::string_view> StoreState::list_keys() const {
  std::vector<std::string_view> keys;
  keys.reserve(data_.size());
  for (const auto& [key, entry] : data_) keys.emplace_back(key);
  std::sort(keys.begin(), keys.end());
  return keys;
}

void StoreState::queue_push(std::string_view key, std::string_view value) {
  reserve_bytes(key.size() + value.size(), key);
  auto it = queues_.find(key);
  if (it == queues_.end()) it = queues_.emplace(std::string(key), std::deque<std::string>{}).first;
  it->second.emplace_back(value);
  on_created_one(key);
}

bool StoreState::queue_pop(std::string_view key, std::string* value_out) {
  auto it = queues_.find(key);
  if (it == queues_.end() || it->second.empty()) return false;
  *value_out = std::move(it->second.front());
  it->second.pop_front();
  stored_bytes_ -= key.size() + value_out->size();
  if (it->second.empty()) queues_.erase(it);
  return true;
}

std::size_t StoreState::queue_len(std::string_view key) const {
  auto it = queues_.find(key);
  return it == queues_.end() ? 0 : it->second.size();
}

void StoreState::on_created(std::string_view key) {
  for (const auto& w : creation_waiters_.take(key)) w.session->on_key_created(w.ticket);
}

void StoreState::on_created_one(std::string_view key) {
  if (auto w = creation_waiters_.take_one(key)) w->session->on_key_created(w->ticket);
}

void StoreState::on_deleted(std::string_view key, const std::string& old_value) {
  for (const auto& w : deletion_waiters_.take(key)) w.session->on_key_deleted(w.ticket, key);
  notify_watchers(wire::kWatchKeyDeleted, key, old_value, {});
}

void StoreState::on_counter(std::string_view key, std::int64_t value) {
  WaiterIndex::Waiters* waiters = barrier_waiters_.find(key);
  if (!waiters) return;
  std::vector<WaiterIndex::Waiter> reached;
  for (auto it = waiters->begin(); it != waiters->end();) {
    if (it->second.target > value) {
      ++it;
      continue;
    }
    reached.push_back(it->second);
    it = waiters->erase(it);
  }
  barrier_waiters_.erase_if_empty(key);
  for (const auto& w : reached) w.session->on_barrier_reached(w.ticket);
}

void StoreState::notify_watchers(std::uint8_t event, std::string_view key,
                                 std::string_view old_value, std::string_view new_value) {
  WaiterIndex::Waiters* watchers = watchers_.find(key);
  if (!watchers) return;
  std::vector<WaiterIndex::Waiter> copy;
  for (const auto& [session, w] : *watchers) copy.push_back(w);
  for (const auto& w : copy) w.session->on_watch_event(event, key, old_value, new_value);
}

}  // namespace dist::rendezvous
