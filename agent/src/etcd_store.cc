#include "etcd_store.h"

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <charconv>
#include <fstream>
#include <random>
#include <set>
#include <unordered_map>

#include "dist/rendezvous/errors.h"

namespace dist::agent {
namespace {

namespace asio = boost::asio;
namespace etcd = rendezvous::etcd;
using etcd::Cancellation;
using etcd::Clock;
using etcd::Compare;
using etcd::KeyValue;
using etcd::Op;
using etcd::TxnRequest;
using rendezvous::StoreErrc;
using rendezvous::StoreError;
using Target = Compare::Target;

// etcd's default --max-txn-ops: longer batches go as several transactions.
constexpr std::size_t kMaxOpsPerTxn = 128;
// How long close() gives revoking the lease before leaving it to expire.
constexpr std::chrono::milliseconds kRevokeTimeout{2'000};
// Marks a counter that add() keeps (docs/ETCD.md, "Counters"): "<tag><base>:<base version>".
constexpr std::string_view kCounterTag{"\0dist-counter:", 14};

// A counter is `base` at the key's version `base_version`; each later put that keeps the value
// (ignore_value) adds one to the key's version and so to the counter: concurrent add(key, 1)s
// all compare the same value and none of them conflicts.
struct Counter {
  std::int64_t base = 0;
  std::int64_t base_version = 0;
  std::int64_t at(std::int64_t version) const { return base + (version - base_version); }
};

std::optional<std::int64_t> parse_decimal(std::string_view text) {
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return value;
}

std::string encode_counter(std::int64_t base, std::int64_t base_version) {
  return std::string(kCounterTag) + std::to_string(base) + ":" + std::to_string(base_version);
}

std::optional<Counter> decode_counter(std::string_view value) {
  if (value.substr(0, kCounterTag.size()) != kCounterTag) return std::nullopt;
  value.remove_prefix(kCounterTag.size());
  const auto colon = value.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  const auto base = parse_decimal(value.substr(0, colon));
  const auto version = parse_decimal(value.substr(colon + 1));
  if (!base || !version) return std::nullopt;
  return Counter{*base, *version};
}

// The value as the store's callers see it: a counter as its decimal value.
std::string visible_value(const KeyValue& kv) {
  const auto counter = decode_counter(kv.value);
  return counter ? std::to_string(counter->at(kv.version)) : kv.value;
}

std::optional<KeyValue> first(const etcd::OpResult& result) {
  if (result.kvs.empty()) return std::nullopt;
  return result.kvs.front();
}

template <typename T>
std::vector<std::vector<T>> chunks(std::vector<T> items) {
  std::vector<std::vector<T>> out;
  for (std::size_t i = 0; i < items.size(); i += kMaxOpsPerTxn) {
    const auto end = std::min(items.size(), i + kMaxOpsPerTxn);
    out.emplace_back(std::make_move_iterator(items.begin() + static_cast<std::ptrdiff_t>(i)),
                     std::make_move_iterator(items.begin() + static_cast<std::ptrdiff_t>(end)));
  }
  return out;
}

std::string hex(std::int64_t id) {
  char buffer[17];
  const auto [end, error] =
      std::to_chars(buffer, buffer + sizeof buffer, static_cast<std::uint64_t>(id), 16);
  (void)error;
  return std::string(buffer, end);
}

// What a session's calls, its keepalive and its close() share; each coroutine holds it.
struct Session {
  std::shared_ptr<etcd::Client> client;
  std::string prefix;  // "<root>/<run id>/"
  std::chrono::seconds lease_ttl{0};
  Cancellation calls;      // the call in flight
  Cancellation keepalive;  // the lease's keepalive
  std::int64_t lease = 0;
  std::chrono::seconds granted_ttl{0};
  std::size_t renewals_unanswered = 0;  // renewals sent since the last answer
  // The mod revision of this session's marker key as its last counter update left it (0: none
  // yet). Every counter update writes the marker in the same transaction and compares this
  // first, so a retried update that had applied already is recognised, not applied again.
  std::int64_t marker_revision = 0;
  std::optional<StoreError> lost;  // the lease could not be renewed: every call throws this
  bool closed = false;

  std::string key(const std::string& k) const { return prefix + k; }
  std::string marker_key() const { return prefix + ".sessions/" + hex(lease); }

  StoreError closed_error() const {
    return StoreError(StoreErrc::kCancelled, client->describe() + ": the session was closed");
  }
  void check() const {
    if (closed) throw closed_error();
    if (lost) throw *lost;
  }
  void lose(const std::string& reason) {
    lost.emplace(StoreErrc::kConnectionLost,
                 client->describe() + ": lease " + hex(lease) + " of this session (TTL " +
                     std::to_string(granted_ttl.count()) + " s) is gone (" + reason +
                     "), and its ephemeral keys with it; open a new session");
    keepalive.cancel();
    calls.cancel();
  }
  // A failed call's error as the store's contract has it.
  StoreError translate(const StoreError& e) {
    if (closed) return closed_error();
    if (lost) return *lost;
    const std::string_view what = e.what();
    switch (e.code()) {
      case StoreErrc::kNotFound:
        if (what.find("lease not found") != std::string_view::npos) {
          lose("etcd no longer has it: no renewal reached it within its TTL");
          return *lost;
        }
        return StoreError(StoreErrc::kConnectionLost, e.what());
      case StoreErrc::kTimeout:
        return StoreError(StoreErrc::kUnavailable, e.what());
      default:
        return e;
    }
  }
};
using SessionPtr = std::shared_ptr<Session>;

// Runs one call of the store: refused after close() or the lease's loss, errors translated.
template <typename T>
Task<T> guarded(SessionPtr s, Task<T> call) {
  s->check();
  std::optional<StoreError> failure;
  try {
    co_return co_await std::move(call);
  } catch (const StoreError& e) {
    failure = s->translate(e);
  }
  throw *failure;
}

// One renewal, given up when the lease's TTL has passed since it was sent: by then its answer no
// longer matters (a later renewal, or etcd's expiry, has decided). `skip`: the renewals sent
// since the last answer, so that while they wait (on a member that stopped answering) this one
// starts at the next member.
Task<void> renew(SessionPtr s, Clock::time_point sent) {
  const std::size_t skip = s->renewals_unanswered++;
  try {
    const auto left =
        co_await s->client->lease_keep_alive(s->lease, s->keepalive, sent + s->granted_ttl, skip);
    s->renewals_unanswered = 0;
    if (left.count() == 0) s->lose("etcd expired it: no renewal reached it within its TTL");
  } catch (const StoreError&) {
    // The session ended (cancelled), or no member answered in time: the next renewal is due.
  }
}

// Renews the lease every TTL/3 until the session ends, counted from when the grant or the last
// renewal was sent, without waiting for the last renewal's answer: a slow answer (a loaded
// cluster) does not make the next renewal late, and a renewal stuck on a member that stopped
// answering (frozen, or cut off: its connection stays open and silent) does not hold up the next,
// which goes to the next member. A new leader extends every lease by an election timeout, but a
// frozen follower extends nothing: a renewal must reach another member within the TTL, as the
// next one does. The session is lost only when etcd says the lease expired: while no member with
// a leader answers, etcd expires no lease either, and the session's calls fail on their own.
Task<void> keep_alive(SessionPtr s, Clock::time_point granted) {
  asio::steady_timer timer(s->client->executor());
  const auto period = std::chrono::duration_cast<std::chrono::milliseconds>(s->granted_ttl) / 3;
  // The first renewal comes between half a period and a period after the grant: sessions that
  // took their leases together (a round's joiners) do not all renew in the same instant.
  static std::minstd_rand jitter{std::random_device{}()};
  auto next = granted + period / 2 +
              std::chrono::milliseconds(std::uniform_int_distribution<long>(
                  0, std::max<long>(1, period.count() / 2))(jitter));
  while (!s->keepalive.cancelled()) {
    timer.expires_at(next);
    {
      const auto stop = s->keepalive.on_cancel([&timer] { timer.cancel(); });
      boost::system::error_code ignored;
      co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
    }
    if (s->keepalive.cancelled()) co_return;
    const auto sent = Clock::now();
    asio::co_spawn(s->client->executor(), renew(s, sent), asio::detached);
    next = sent + period;
  }
}

Task<void> revoke(std::shared_ptr<etcd::Client> client, std::int64_t lease) {
  Cancellation none;  // bounded by its deadline only
  try {
    co_await client->lease_revoke(lease, none, Clock::now() + kRevokeTimeout);
  } catch (const StoreError&) {
    // The lease expires by itself.
  }
}

Task<void> ensure_lease(SessionPtr s) {
  if (s->lease != 0) co_return;
  const auto granted = Clock::now();
  const auto lease = co_await s->client->lease_grant(s->lease_ttl, s->calls);
  s->lease = lease.id;
  s->granted_ttl = lease.ttl;
  asio::co_spawn(s->client->executor(), keep_alive(s, granted), asio::detached);
}

// Which keys exist, and the revision of the read (the first, when it took several transactions):
// a watch from the revision after it misses nothing that changed since.
struct Presence {
  std::vector<bool> exists;
  std::int64_t revision = 0;
};

Task<Presence> presence(SessionPtr s, std::vector<std::string> keys) {
  Presence p;
  for (auto& chunk : chunks(std::move(keys))) {
    TxnRequest t;
    for (auto& k : chunk) {
      auto op = Op::range(std::move(k));
      op.count_only = true;
      t.success.push_back(std::move(op));
    }
    const auto r = co_await s->client->txn(std::move(t), s->calls);
    if (p.revision == 0) p.revision = r.revision;
    for (const auto& result : r.results) p.exists.push_back(result.count > 0);
  }
  co_return p;
}

// One watch over the range from the least to the greatest of `keys`.
etcd::WatchRequest watch_over(const std::set<std::string>& keys, std::int64_t start_revision) {
  etcd::WatchRequest w;
  w.key = *keys.begin();
  if (keys.size() > 1) w.range_end = *keys.rbegin() + std::string(1, '\0');
  w.start_revision = start_revision;
  return w;
}

Task<void> do_set(SessionPtr s, std::string key, std::string value, bool ephemeral) {
  if (ephemeral) co_await ensure_lease(s);
  co_await s->client->put(s->key(key), std::move(value), ephemeral ? s->lease : 0, s->calls);
}

Task<void> do_multi_set(SessionPtr s, std::vector<std::pair<std::string, std::string>> items) {
  // One transaction may not put a key twice; as sets in order, the last value wins.
  std::unordered_map<std::string, std::size_t> last;
  for (std::size_t i = 0; i < items.size(); ++i) last[items[i].first] = i;
  std::vector<Op> puts;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (last[items[i].first] == i) {
      puts.push_back(Op::put(s->key(items[i].first), std::move(items[i].second)));
    }
  }
  for (auto& chunk : chunks(std::move(puts))) {
    TxnRequest t;
    t.success = std::move(chunk);
    co_await s->client->txn(std::move(t), s->calls);
  }
}

Task<std::vector<std::optional<std::string>>> do_multi_get(SessionPtr s,
                                                           std::vector<std::string> keys) {
  std::vector<std::optional<std::string>> values;
  std::vector<Op> ranges;
  for (const auto& k : keys) ranges.push_back(Op::range(s->key(k)));
  for (auto& chunk : chunks(std::move(ranges))) {
    TxnRequest t;
    t.success = std::move(chunk);
    const auto r = co_await s->client->txn(std::move(t), s->calls);
    for (const auto& result : r.results) {
      const auto kv = first(result);
      values.push_back(kv ? std::optional<std::string>(visible_value(*kv)) : std::nullopt);
    }
  }
  co_return values;
}

Task<std::optional<std::string>> do_try_get(SessionPtr s, std::string key) {
  std::vector<std::string> keys{std::move(key)};
  auto values = co_await do_multi_get(s, std::move(keys));
  co_return std::move(values.front());
}

// The counter's value as callers see it (decimal), or nullopt when it holds something else.
std::optional<std::int64_t> counter_value(const KeyValue& kv) {
  const auto counter = decode_counter(kv.value);
  return counter ? std::optional(counter->at(kv.version)) : parse_decimal(kv.value);
}

// Whether a nested update ran its success branch; its failure branches hold only further tries.
bool applied(const etcd::OpResult& update) {
  return update.succeeded || std::any_of(update.results.begin(), update.results.end(), applied);
}

Op bump(const std::string& key) {
  auto op = Op::put(key, {});
  op.ignore_value = true;
  op.ignore_lease = true;
  return op;
}

// Runs `update`, a transaction on the counter `key`, behind the session's marker: the marker is
// written with it, and compared first, so that a try whose answer was lost (and that the client
// sent again) is recognised as applied instead of applied twice. The counter after the update, or
// nullopt when the update's own comparisons failed; `kv` is then what `key` holds.
Task<std::optional<std::int64_t>> update_counter(SessionPtr s, std::string key, TxnRequest update,
                                                 std::optional<KeyValue>& kv) {
  co_await ensure_lease(s);
  const auto marker = s->marker_key();
  TxnRequest t;
  t.compare.push_back(Compare::revision_equals(Target::kModRevision, marker, s->marker_revision));
  t.success.push_back(Op::nested(std::move(update)));
  t.success.push_back(Op::put(marker, {}, s->lease));
  t.success.push_back(Op::range(key));
  t.failure.push_back(Op::range(key));
  t.failure.push_back(Op::range(marker));
  const auto r = co_await s->client->txn(std::move(t), s->calls);
  if (r.succeeded) {
    s->marker_revision = r.revision;
    kv = first(r.results.at(2));
    if (applied(r.results.at(0)) && kv) co_return counter_value(*kv);
    co_return std::nullopt;
  }
  const auto marker_kv = first(r.results.at(1));
  const auto marker_revision = marker_kv ? marker_kv->mod_revision : 0;
  if (marker_revision == s->marker_revision) {
    kv = first(r.results.at(0));
    co_return std::nullopt;
  }
  if (!marker_kv) {
    s->lose("its marker key is gone");
    throw *s->lost;
  }
  // This very update applied on an earlier try whose answer was lost (a member failed): the
  // counter as that try left it.
  s->marker_revision = marker_revision;
  auto then = Op::range(key);
  then.revision = marker_revision;
  TxnRequest read_then;
  read_then.success.push_back(std::move(then));
  const auto past = co_await s->client->txn(std::move(read_then), s->calls);
  co_return counter_value(past.results.at(0).kvs.at(0));
}

Task<std::int64_t> do_add(SessionPtr s, std::string key, std::int64_t delta) {
  const auto k = s->key(key);
  std::optional<KeyValue> kv;
  if (delta == 1) {
    // The common counter (a round's tickets): made by add(key, 1) and bumped by one ever since,
    // so its value is still encode_counter(1, 1). One transaction creates or bumps it, unread.
    const auto fresh = encode_counter(1, 1);
    TxnRequest bump_fresh;
    bump_fresh.compare.push_back(Compare::value_equals(k, fresh));
    bump_fresh.success.push_back(bump(k));
    TxnRequest create_or_bump;
    create_or_bump.compare.push_back(Compare::revision_equals(Target::kCreateRevision, k, 0));
    create_or_bump.success.push_back(Op::put(k, fresh));
    create_or_bump.failure.push_back(Op::nested(std::move(bump_fresh)));
    const auto value = co_await update_counter(s, k, std::move(create_or_bump), kv);
    if (value) co_return *value;
  } else {
    // A guess, checked by the update's comparison (whose failure reads the truth), so no need to
    // ask the leader; only an add of 0 answers from what is read here, so it reads the truth.
    const auto read = co_await s->client->range(
        k, s->calls, {},
        delta == 0 ? etcd::Client::Read::kLinearizable : etcd::Client::Read::kSerializable);
    if (!read.kvs.empty()) kv = read.kvs.front();
  }
  for (;;) {
    const auto current = kv ? counter_value(*kv) : std::optional<std::int64_t>(0);
    if (!current) {
      throw StoreError(StoreErrc::kInvalidArgument, s->client->describe() + ": add to '" + key +
                                                        "': its value is not a decimal counter");
    }
    if (delta == 0 && kv) co_return *current;
    std::int64_t next = 0;
    if (__builtin_add_overflow(*current, delta, &next)) {
      throw StoreError(StoreErrc::kInvalidArgument, s->client->describe() + ": add " +
                                                        std::to_string(delta) + " to '" + key +
                                                        "' overflows 64 bits");
    }
    TxnRequest update;
    if (!kv) {
      update.compare.push_back(Compare::revision_equals(Target::kCreateRevision, k, 0));
      update.success.push_back(Op::put(k, encode_counter(next, 1)));
    } else if (delta == 1 && decode_counter(kv->value)) {
      update.compare.push_back(Compare::value_equals(k, kv->value));
      update.success.push_back(bump(k));
    } else {
      update.compare.push_back(Compare::revision_equals(Target::kModRevision, k, kv->mod_revision));
      auto put = Op::put(k, encode_counter(next, kv->version + 1));
      put.ignore_lease = true;
      update.success.push_back(std::move(put));
    }
    const auto value = co_await update_counter(s, k, std::move(update), kv);
    if (value) co_return *value;
  }
}

Task<std::string> do_compare_set(SessionPtr s, std::string key, std::string expected,
                                 std::string desired) {
  const auto k = s->key(key);
  TxnRequest t;
  t.compare.push_back(expected.empty() ? Compare::revision_equals(Target::kCreateRevision, k, 0)
                                       : Compare::value_equals(k, expected));
  t.success.push_back(Op::put(k, desired));
  t.failure.push_back(Op::range(k));
  for (;;) {
    const auto r = co_await s->client->txn(t, s->calls);
    if (r.succeeded) co_return desired;
    const auto kv = first(r.results.at(0));
    if (!kv) co_return expected;
    auto current = visible_value(*kv);
    if (current != expected) co_return current;
    // Equal as callers see it but not as etcd stores it (an empty value, a counter): compare
    // the revision instead.
    t.compare = {Compare::revision_equals(Target::kModRevision, k, kv->mod_revision)};
  }
}

Task<bool> do_delete(SessionPtr s, std::string key) {
  co_return co_await s->client->delete_key(s->key(key), s->calls) > 0;
}

Task<bool> do_check(SessionPtr s, std::vector<std::string> keys) {
  for (auto& k : keys) k = s->key(k);
  const auto p = co_await presence(s, std::move(keys));
  co_return std::all_of(p.exists.begin(), p.exists.end(), [](bool e) { return e; });
}

Task<bool> do_wait(SessionPtr s, std::vector<std::string> keys, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (auto& k : keys) k = s->key(k);
  for (;;) {
    const auto p = co_await presence(s, keys);
    std::set<std::string> missing;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (!p.exists[i]) missing.insert(keys[i]);
    }
    if (missing.empty()) co_return true;
    if (Clock::now() >= deadline) co_return false;
    auto request = watch_over(missing, p.revision + 1);
    request.no_delete = true;
    const auto watch = s->client->watch(std::move(request));
    for (;;) {
      const auto batch = co_await watch->next(deadline, s->calls);
      if (!batch) co_return false;
      if (batch->compact_revision != 0) break;  // read again
      for (const auto& e : batch->events) missing.erase(e.kv.key);
      if (missing.empty()) co_return true;
    }
  }
}

Task<std::optional<std::size_t>> do_wait_deleted(SessionPtr s, std::vector<std::string> keys,
                                                 std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (auto& k : keys) k = s->key(k);
  for (;;) {
    const auto p = co_await presence(s, keys);
    const auto gone = std::find(p.exists.begin(), p.exists.end(), false);
    if (gone != p.exists.end()) co_return static_cast<std::size_t>(gone - p.exists.begin());
    if (Clock::now() >= deadline) co_return std::nullopt;
    auto request = watch_over(std::set<std::string>(keys.begin(), keys.end()), p.revision + 1);
    request.no_put = true;
    const auto watch = s->client->watch(std::move(request));
    for (;;) {
      const auto batch = co_await watch->next(deadline, s->calls);
      if (!batch) co_return std::nullopt;
      if (batch->compact_revision != 0) break;  // read again
      for (const auto& e : batch->events) {
        const auto it = std::find(keys.begin(), keys.end(), e.kv.key);
        if (it != keys.end()) co_return static_cast<std::size_t>(it - keys.begin());
      }
    }
  }
}

std::shared_ptr<Session> new_session(std::shared_ptr<etcd::Client> client, std::string prefix,
                                     std::chrono::seconds lease_ttl) {
  auto s = std::make_shared<Session>();
  s->client = std::move(client);
  s->prefix = std::move(prefix);
  s->lease_ttl = lease_ttl;
  return s;
}

}  // namespace

class EtcdRendezvousStore final : public RendezvousStore {
 public:
  explicit EtcdRendezvousStore(SessionPtr session) : s_(std::move(session)) {}
  ~EtcdRendezvousStore() override { close(); }

  Task<void> set(std::string key, std::string value) override {
    return guarded(s_, do_set(s_, std::move(key), std::move(value), false));
  }
  Task<void> set_ephemeral(std::string key, std::string value) override {
    return guarded(s_, do_set(s_, std::move(key), std::move(value), true));
  }
  Task<void> multi_set(std::vector<std::pair<std::string, std::string>> items) override {
    return guarded(s_, do_multi_set(s_, std::move(items)));
  }
  Task<std::optional<std::string>> try_get(std::string key) override {
    return guarded(s_, do_try_get(s_, std::move(key)));
  }
  Task<std::vector<std::optional<std::string>>> multi_get(std::vector<std::string> keys) override {
    return guarded(s_, do_multi_get(s_, std::move(keys)));
  }
  Task<std::int64_t> add(std::string key, std::int64_t delta) override {
    return guarded(s_, do_add(s_, std::move(key), delta));
  }
  Task<std::string> compare_set(std::string key, std::string expected,
                                std::string desired) override {
    return guarded(s_, do_compare_set(s_, std::move(key), std::move(expected), std::move(desired)));
  }
  Task<bool> check(std::vector<std::string> keys) override {
    return guarded(s_, do_check(s_, std::move(keys)));
  }
  Task<bool> delete_key(std::string key) override {
    return guarded(s_, do_delete(s_, std::move(key)));
  }
  Task<bool> wait(std::vector<std::string> keys, std::chrono::milliseconds timeout) override {
    return guarded(s_, do_wait(s_, std::move(keys), timeout));
  }
  Task<std::optional<std::size_t>> wait_deleted(std::vector<std::string> keys,
                                                std::chrono::milliseconds timeout) override {
    return guarded(s_, do_wait_deleted(s_, std::move(keys), timeout));
  }

  Task<std::unique_ptr<RendezvousStore>> open_another() override {
    s_->check();
    co_return std::make_unique<EtcdRendezvousStore>(
        new_session(s_->client, s_->prefix, s_->lease_ttl));
  }

  void close() override {
    if (s_->closed) return;
    s_->closed = true;
    s_->calls.cancel();
    s_->keepalive.cancel();
    if (s_->lease != 0)
      asio::co_spawn(s_->client->executor(), revoke(s_->client, s_->lease), asio::detached);
  }

  std::string describe() const override { return s_->client->describe(); }

 private:
  SessionPtr s_;
};

EtcdOptions etcd_options(const std::string& endpoints,
                         const std::map<std::string, std::string>& conf,
                         std::chrono::seconds lease_ttl) {
  const auto invalid = [](const std::string& message) {
    return StoreError(StoreErrc::kInvalidArgument, message);
  };
  EtcdOptions o;
  o.lease_ttl = lease_ttl;
  std::string protocol;
  for (const auto& [key, value] : conf) {
    const std::string flag = "--rdzv-conf " + key + "=" + value;
    if (key == "cacert") {
      o.client.ca_file = value;
    } else if (key == "cert") {
      o.client.cert_file = value;
    } else if (key == "key") {
      o.client.key_file = value;
    } else if (key == "user") {
      o.client.user = value;
    } else if (key == "password_file") {
      std::ifstream in(value);
      if (!in || !std::getline(in, o.client.password)) {
        throw invalid(flag + ": cannot read the password from it");
      }
      if (!o.client.password.empty() && o.client.password.back() == '\r') {
        o.client.password.pop_back();
      }
    } else if (key == "protocol") {
      if (value != "http" && value != "https") throw invalid(flag + ": http or https");
      protocol = value;
    } else if (key == "etcd_prefix") {
      if (value.empty() || value == "/") throw invalid(flag + ": give a non-empty prefix");
      o.prefix = value;
    } else if (key == "unavailable_timeout") {
      double seconds = 0;
      const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), seconds);
      if (error != std::errc() || end != value.data() + value.size() || !(seconds > 0)) {
        throw invalid(flag + ": a positive number of seconds");
      }
      o.client.unavailable_timeout = std::chrono::milliseconds(static_cast<long>(seconds * 1000));
    } else if (key == "member_order") {
      // spread: each call starts at a random member (many agents spread over them); given: at
      // the first listed (a host's own member), then the next.
      if (value != "spread" && value != "given") throw invalid(flag + ": spread or given");
      o.client.spread_over_members = value == "spread";
    }
  }
  if (!o.client.user.empty() && !conf.contains("password_file")) {
    throw invalid("--rdzv-conf user=" + o.client.user + " needs password_file=<file>");
  }
  if (o.client.user.empty() && conf.contains("password_file")) {
    throw invalid("--rdzv-conf password_file needs user=<name>");
  }
  std::size_t start = 0;
  while (start <= endpoints.size()) {
    auto end = endpoints.find(',', start);
    if (end == std::string::npos) end = endpoints.size();
    auto endpoint = endpoints.substr(start, end - start);
    endpoint.erase(0, endpoint.find_first_not_of(' '));
    endpoint.erase(endpoint.find_last_not_of(' ') + 1);
    if (!endpoint.empty()) {
      const bool has_scheme = endpoint.find("://") != std::string::npos;
      o.client.endpoints.push_back(has_scheme || protocol.empty() ? endpoint
                                                                  : protocol + "://" + endpoint);
    }
    start = end + 1;
  }
  if (o.client.endpoints.empty()) {
    throw invalid("--rdzv-endpoint: give the etcd members, e.g. h1:2379,h2:2379,h3:2379");
  }
  return o;
}

// "<prefix>/<run id>/", after checking both.
std::string job_prefix(const EtcdOptions& options, const std::string& run_id) {
  if (run_id.empty()) throw StoreError(StoreErrc::kInvalidArgument, "etcd: an empty run id");
  auto root = options.prefix;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  return root + "/" + run_id + "/";
}

void check_etcd_options(const std::string& endpoints,
                        const std::map<std::string, std::string>& conf) {
  etcd_options(endpoints, conf, std::chrono::seconds(1));
}

namespace {

SessionPtr open_session(asio::io_context& io, EtcdOptions options, const std::string& run_id) {
  const auto prefix = job_prefix(options, run_id);
  if (options.lease_ttl.count() < 1) {
    throw StoreError(StoreErrc::kInvalidArgument, "etcd: the lease TTL must be at least 1 s");
  }
  auto client = etcd::Client::create(io, std::move(options.client));
  return new_session(client, prefix, options.lease_ttl);
}

}  // namespace

std::unique_ptr<RendezvousStore> make_etcd_store(asio::io_context& io, EtcdOptions options,
                                                 std::string run_id) {
  return std::make_unique<EtcdRendezvousStore>(open_session(io, std::move(options), run_id));
}

Task<std::unique_ptr<RendezvousStore>> open_etcd_store(asio::io_context& io, EtcdOptions options,
                                                       std::string run_id) {
  auto session = open_session(io, std::move(options), run_id);
  // A member that answers and takes the credentials, now rather than at the first call.
  co_await session->client->range(session->prefix, session->calls);
  co_return std::make_unique<EtcdRendezvousStore>(std::move(session));
}

Task<std::unique_ptr<RendezvousStore>> open_etcd_store(asio::io_context& io, std::string endpoints,
                                                       std::map<std::string, std::string> conf,
                                                       std::string run_id,
                                                       std::chrono::seconds lease_ttl) {
  co_return co_await open_etcd_store(io, etcd_options(endpoints, conf, lease_ttl),
                                     std::move(run_id));
}

Task<std::int64_t> remove_etcd_job(asio::io_context& io, EtcdOptions options, std::string run_id) {
  const auto prefix = job_prefix(options, run_id);
  const auto client = etcd::Client::create(io, std::move(options.client));
  auto erase = Op::erase(prefix);
  erase.range_end = etcd::prefix_end(prefix);
  TxnRequest t;
  t.success.push_back(std::move(erase));
  Cancellation none;  // bounded by the client's unavailable_timeout
  const auto r = co_await client->txn(std::move(t), none);
  co_return r.results.at(0).deleted;
}

}  // namespace dist::agent
