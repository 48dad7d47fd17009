#include "store_state.h"

#include <algorithm>
#include <charconv>
#include <cstring>

#include "protocol.h"
#include "session.h"
#include "text.h"

namespace dist::store {

namespace {
// Memory of the store's own structures, counted against max_total_bytes with the data: a hash
// node, two string headers and a bucket per key (or queue item), a deque's first block per queue.
constexpr std::uint64_t kEntryBookkeepingBytes = 128;
constexpr std::uint64_t kQueueBookkeepingBytes = 640;
// Writes stop at all but this share of max_total_bytes (1/8), kept for connections' buffers.
constexpr std::uint64_t kConnectionsShareDivisor = 8;
// Sessions holding less than this are not worth closing to make room.
constexpr std::uint64_t kLargeHolderBytes = 64 * 1024;
}  // namespace

std::optional<std::int64_t> parse_counter(std::string_view text) {
  // std::stoll of the value as a C string, as PyTorch's servers do: leading white space skipped,
  // an optional sign, at least one digit, anything after the digits ignored.
  std::size_t i = 0;
  while (i < text.size() && text[i] != '\0' && std::strchr(" \t\n\v\f\r", text[i])) ++i;
  bool negative = false;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) negative = text[i++] == '-';
  std::uint64_t magnitude = 0;
  const auto [end, ec] = std::from_chars(text.data() + i, text.data() + text.size(), magnitude);
  if (ec != std::errc() || end == text.data() + i) return std::nullopt;  // no digits, or too big
  constexpr std::uint64_t kMaxMagnitude = std::uint64_t{1} << 63;        // of INT64_MIN
  if (magnitude > (negative ? kMaxMagnitude : kMaxMagnitude - 1)) return std::nullopt;
  return negative ? static_cast<std::int64_t>(0 - magnitude) : static_cast<std::int64_t>(magnitude);
}

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
  // A session's replies go out in the order of its requests.
  std::sort(waiters.begin(), waiters.end(),
            [](const Waiter& a, const Waiter& b) { return a.ticket < b.ticket; });
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

void WaiterIndex::remove(std::string_view key, const Session* session, std::uint64_t ticket) {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return;
  // Only this wait's entry: the same session may have other waits on the key (pipelined).
  auto [first, last] = it->second.equal_range(session);
  for (auto w = first; w != last; ++w) {
    if (w->second.ticket == ticket) {
      it->second.erase(w);
      break;
    }
  }
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

std::uint64_t StoreState::held_bytes() const {
  return stored_bytes_ + (data_.size() + queue_items_) * kEntryBookkeepingBytes +
         queues_.size() * kQueueBookkeepingBytes + session_bytes_;
}

void StoreState::recharge(Session* session, std::uint64_t before, std::uint64_t after) {
  session_bytes_ = session_bytes_ - before + after;
  if (after >= kLargeHolderBytes) {
    large_holders_.insert(session);
  } else if (before >= kLargeHolderBytes) {
    large_holders_.erase(session);
  }
}

bool StoreState::make_room(std::uint64_t more, const Session* requester,
                           std::uint64_t requester_bytes) {
  return make_room_below(options_.limits.max_total_bytes, more, requester, requester_bytes);
}

bool StoreState::make_room_below(std::uint64_t limit, std::uint64_t more, const Session* requester,
                                 std::uint64_t requester_bytes) {
  while (held_bytes() + more > limit) {
    Session* victim = nullptr;
    for (Session* s : large_holders_) {
      if (s != requester && !s->closing() && s->charged() > requester_bytes &&
          (!victim || s->charged() > victim->charged())) {
        victim = s;
      }
    }
    if (!victim) return false;
    ++evictions;
    victim->evict(StoreErrc::kLimitExceeded,
                  "closed to make room: it held " + std::to_string(victim->charged()) +
                      " bytes of requests, replies and waits, the most of any connection, and "
                      "the server reached its memory limit of " +
                      std::to_string(options_.limits.max_total_bytes) +
                      " bytes (--max-total-bytes)");
  }
  return true;
}

void StoreState::reserve_bytes(std::uint64_t more, std::string_view key) {
  // Writes leave part of the limit to the connections, so that a full store can still be read.
  const std::uint64_t total = options_.limits.max_total_bytes;
  const std::uint64_t limit = total - total / kConnectionsShareDivisor;
  if (held_bytes() + more > limit &&
      !make_room_below(limit, more, current_, current_ ? current_->charged() : 0)) {
    throw RequestError{StoreErrc::kLimitExceeded,
                       "store is full: writing key " + quote_key(key) + " needs " +
                           std::to_string(more) + " more bytes, " + std::to_string(held_bytes()) +
                           " of " + std::to_string(limit) +
                           " are held (keys, values and connections' buffers; 1/" +
                           std::to_string(kConnectionsShareDivisor) + " of --max-total-bytes " +
                           std::to_string(total) +
                           " is kept for connections); delete keys or raise --max-total-bytes"};
  }
}

bool StoreState::is_agent_key(std::string_view key) const {
  return !options_.agent_key_prefix.empty() && key.starts_with(options_.agent_key_prefix);
}

void StoreState::count_key(std::string_view key, int delta) {
  if (is_agent_key(key)) agent_keys_ += delta;
}

void StoreState::set(std::string_view key, std::string_view value, Session* ephemeral_owner) {
  auto it = data_.find(key);
  if (it == data_.end()) {
    reserve_bytes(key.size() + value.size() + kEntryBookkeepingBytes, key);
    stored_bytes_ += key.size() + value.size();
    it = data_.emplace(std::string(key), Entry{std::string(value), ephemeral_owner}).first;
    count_key(key, 1);
    on_created(key);
    notify_watchers(wire::kWatchKeyCreated, key, {}, value);
    return;
  }
  Entry& entry = it->second;
  if (value.size() > entry.value.size()) {
    reserve_bytes(value.size() - entry.value.size(), key);
    stored_bytes_ += value.size() - entry.value.size();
  } else {
    stored_bytes_ -= entry.value.size() - value.size();
  }
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

std::int64_t StoreState::add(std::string_view key, std::int64_t delta, bool wrap_on_overflow) {
  std::int64_t value = 0;
  auto it = data_.find(key);
  if (it != data_.end()) {
    const std::optional<std::int64_t> parsed = parse_counter(it->second.value);
    if (!parsed) {
      throw RequestError{StoreErrc::kInvalidArgument,
                         "ADD to key " + quote_key(key) +
                             " whose value is not a decimal integer in the 64-bit range; use a "
                             "separate counter key"};
    }
    value = *parsed;
  }
  std::int64_t sum = 0;
  if (__builtin_add_overflow(value, delta, &sum) && !wrap_on_overflow) {
    throw RequestError{StoreErrc::kInvalidArgument,
                       "ADD overflows the 64-bit counter at key " + quote_key(key)};
  }
  set(key, std::to_string(sum));
  on_counter(key, sum);
  return sum;
}

void StoreState::append(std::string_view key, std::string_view value) {
  auto it = data_.find(key);
  if (it == data_.end()) {
    set(key, value);
    return;
  }
  reserve_bytes(value.size(), key);
  stored_bytes_ += value.size();
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
    const std::uint64_t after = key.size() + value.size() + (old ? 0 : kEntryBookkeepingBytes);
    if (after > before) growth += after - before;
  }
  // Room for all of it first (set() below accounts for each item itself).
  if (!items.empty()) reserve_bytes(growth, items.front().first);
  for (const auto& [key, value] : items) set(key, value);
}

bool StoreState::erase(std::string_view key) {
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  stored_bytes_ -= it->first.size() + it->second.value.size();
  std::string old_value = std::move(it->second.value);
  count_key(it->first, -1);
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
    queue_items_ -= it->second.size();
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
  auto it = queues_.find(key);
  reserve_bytes(key.size() + value.size() + kEntryBookkeepingBytes +
                    (it == queues_.end() ? kQueueBookkeepingBytes : 0),
                key);
  stored_bytes_ += key.size() + value.size();
  if (it == queues_.end()) it = queues_.emplace(std::string(key), std::deque<std::string>{}).first;
  it->second.emplace_back(value);
  ++queue_items_;
  on_created_one(key);
}

bool StoreState::queue_pop(std::string_view key, std::string* value_out) {
  auto it = queues_.find(key);
  if (it == queues_.end() || it->second.empty()) return false;
  *value_out = std::move(it->second.front());
  it->second.pop_front();
  --queue_items_;
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

}  // namespace dist::store
