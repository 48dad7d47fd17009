#include "store/etcd_store.h"

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <charconv>
#include <fstream>
#include <set>
#include <unordered_map>

#include "dist/store/errors.h"
#include "dist/store/etcd/lease_session.h"

namespace dist::agent {
namespace {

namespace asio = boost::asio;
namespace etcd = store::etcd;
using etcd::Cancellation;
using etcd::Clock;
using etcd::Compare;
using etcd::KeyValue;
using etcd::Op;
using etcd::TxnRequest;
using store::StoreErrc;
using store::StoreError;
using Target = Compare::Target;

// etcd's default --max-txn-ops: longer batches go as several transactions.
constexpr std::size_t kMaxOpsPerTxn = 128;
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

// What a session's calls and its close() share; each coroutine holds it. Its lease (etcd's
// LeaseSession) keeps the session's ephemeral keys alive.
struct Session {
  std::shared_ptr<etcd::Client> client;
  std::string prefix;  // "<root>/<run id>/"
  std::chrono::seconds lease_ttl{0};
  Cancellation calls;  // the call in flight
  std::unique_ptr<etcd::LeaseSession> lease;
  // The mod revision of this session's marker key as its last counter update left it (0: none
  // yet). Every counter update writes the marker in the same transaction and compares this
  // first, so a retried update that had applied already is recognised, not applied again.
  std::int64_t marker_revision = 0;
  bool closed = false;

  std::string key(const std::string& k) const { return prefix + k; }
  std::string marker_key() const { return prefix + ".sessions/" + hex(lease->id()); }

  StoreError closed_error() const {
    return StoreError(StoreErrc::kCancelled, client->describe() + ": the session was closed");
  }
  void check() const {
    if (closed) throw closed_error();
    if (lease->lost()) throw *lease->lost();
  }
  // The lease is gone, and the session's ephemeral keys with it: every call fails from now on,
  // the call in flight included (the lease's on_lost cancels it).
  void lose(const std::string& reason) { lease->lose(reason); }
  // A failed call's error as the store's contract has it.
  StoreError translate(const StoreError& e) {
    if (closed) return closed_error();
    if (lease->lost()) return *lease->lost();
    const std::string_view what = e.what();
    switch (e.code()) {
      case StoreErrc::kNotFound:
        if (what.find("lease not found") != std::string_view::npos) {
          lose("etcd no longer has it: no renewal reached it within its TTL");
          return *lease->lost();
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

Task<void> ensure_lease(SessionPtr s) {
  co_await s->lease->ensure(s->calls);
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
  co_await s->client->put(s->key(key), std::move(value), ephemeral ? s->lease->id() : 0, s->calls);
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
  t.success.push_back(Op::put(marker, {}, s->lease->id()));
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
    throw *s->lease->lost();
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
  // The session lives as long as its lease's owner: a raw pointer does (close() clears it).
  Session* session = s.get();
  s->lease = std::make_unique<etcd::LeaseSession>(s->client, lease_ttl,
                                                  [session] { session->calls.cancel(); });
  return s;
}

}  // namespace

class EtcdRendezvousStore final : public RendezvousStore {
 public:
  explicit EtcdRendezvousStore(SessionPtr session) : s_(std::move(session)) {}
  ~EtcdRendezvousStore() override { close(); }

  // A member that answers and takes the credentials, now rather than at the first call.
  Task<void> open() override {
    s_->check();
    co_await s_->client->range(s_->prefix, s_->calls);
  }

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
    s_->lease->close();
  }

  std::string describe() const override { return s_->client->describe(); }

 private:
  SessionPtr s_;
};

EtcdOptions etcd_options(const EtcdConfig& config, std::chrono::seconds lease_ttl) {
  EtcdOptions o;
  o.lease_ttl = lease_ttl;
  o.prefix = config.prefix;
  o.client.ca_file = config.ca_file;
  o.client.cert_file = config.cert_file;
  o.client.key_file = config.key_file;
  o.client.user = config.user;
  o.client.spread_over_members = config.spread_over_members;
  if (config.unavailable_timeout) o.client.unavailable_timeout = *config.unavailable_timeout;
  if (!config.user.empty() && config.password_file.empty()) {
    throw ConfigError("--rdzv-conf user=" + config.user + " needs password_file=<file>");
  }
  if (config.user.empty() && !config.password_file.empty()) {
    throw ConfigError("--rdzv-conf password_file needs user=<name>");
  }
  if (!config.password_file.empty()) {
    std::ifstream in(config.password_file);
    if (!in || !std::getline(in, o.client.password)) {
      throw ConfigError("--rdzv-conf password_file=" + config.password_file +
                        ": cannot read the password from it");
    }
    if (!o.client.password.empty() && o.client.password.back() == '\r') {
      o.client.password.pop_back();
    }
  }
  for (const std::string& endpoint : config.endpoints) {
    const bool has_scheme = endpoint.find("://") != std::string::npos;
    o.client.endpoints.push_back(
        has_scheme || config.protocol.empty() ? endpoint : config.protocol + "://" + endpoint);
  }
  if (o.client.endpoints.empty()) {
    throw ConfigError("--rdzv-endpoint: give the etcd members, e.g. h1:2379,h2:2379,h3:2379");
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

}  // namespace dist::agent
