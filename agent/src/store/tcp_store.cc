#include "store/tcp_store.h"

#include <algorithm>

#include <boost/asio/this_coro.hpp>

namespace dist::agent {

TcpRendezvousStore::TcpRendezvousStore(boost::asio::any_io_executor executor,
                                       store::ClientOptions options, std::string run_id)
    : client_(std::move(executor), std::move(options)),
      run_id_(std::move(run_id)),
      prefix_(tcp_job_prefix(run_id_)) {}

TcpRendezvousStore::TcpRendezvousStore(store::AsyncStoreClient lane, std::string run_id)
    : client_(std::move(lane)), run_id_(std::move(run_id)), prefix_(tcp_job_prefix(run_id_)) {}

Task<void> TcpRendezvousStore::open() {
  co_await client_.open();
}

std::vector<std::string> TcpRendezvousStore::full(std::vector<std::string> keys) const {
  for (auto& key : keys) key.insert(0, prefix_);
  return keys;
}

Task<void> TcpRendezvousStore::set(std::string key, std::string value) {
  co_await client_.set(full(key), std::move(value));
}

Task<void> TcpRendezvousStore::set_ephemeral(std::string key, std::string value) {
  co_await client_.set(full(key), std::move(value), /*ephemeral=*/true);
}

Task<void> TcpRendezvousStore::multi_set(std::vector<std::pair<std::string, std::string>> items) {
  for (auto& item : items) item.first.insert(0, prefix_);
  co_await client_.multi_set(std::move(items));
}

Task<std::optional<std::string>> TcpRendezvousStore::try_get(std::string key) {
  co_return co_await client_.try_get(full(key));
}

Task<std::vector<std::optional<std::string>>> TcpRendezvousStore::multi_get(
    std::vector<std::string> keys) {
  std::vector<std::string> names = full(std::move(keys));
  std::vector<std::optional<std::string>> values;
  values.reserve(names.size());
  try {  // one request when every key exists, the usual case
    for (auto& v : co_await client_.multi_get(names)) values.emplace_back(std::move(v));
    co_return values;
  } catch (const store::StoreError& e) {
    if (e.code() != store::StoreErrc::kNotFound) throw;
  }
  for (auto& name : names) values.push_back(co_await client_.try_get(std::move(name)));
  co_return values;
}

Task<std::int64_t> TcpRendezvousStore::add(std::string key, std::int64_t delta) {
  co_return co_await client_.add(full(key), delta);
}

Task<std::string> TcpRendezvousStore::compare_set(std::string key, std::string expected,
                                                  std::string desired) {
  co_return co_await client_.compare_set(full(key), std::move(expected), std::move(desired));
}

Task<bool> TcpRendezvousStore::check(std::vector<std::string> keys) {
  co_return co_await client_.check(full(std::move(keys)));
}

Task<bool> TcpRendezvousStore::delete_key(std::string key) {
  co_return co_await client_.delete_key(full(key));
}

Task<bool> TcpRendezvousStore::wait(std::vector<std::string> keys,
                                    std::chrono::milliseconds timeout) {
  co_return co_await client_.wait(full(std::move(keys)), timeout);
}

Task<std::optional<std::size_t>> TcpRendezvousStore::wait_deleted(
    std::vector<std::string> keys, std::chrono::milliseconds timeout) {
  co_return co_await client_.wait_deleted(full(std::move(keys)), timeout);
}

// A second session to a store this one reached: a refusal now means the store is gone, not that
// it is not up yet, so the connect gives up after the liveness period rather than the rendezvous
// timeout. (An agent told to stop while its round's watch session connects waits for this.)
Task<std::unique_ptr<RendezvousStore>> TcpRendezvousStore::open_another() {
  store::ClientOptions options = client_.options();
  if (options.keepalive_idle_seconds > 0) {
    const std::chrono::milliseconds liveness =
        std::chrono::seconds(options.keepalive_idle_seconds +
                             options.keepalive_interval_seconds * options.keepalive_probes);
    options.connect_timeout = std::min(options.connect_timeout, liveness);
  }
  auto store = std::make_unique<TcpRendezvousStore>(co_await boost::asio::this_coro::executor,
                                                    std::move(options), run_id_);
  co_await store->open();
  co_return store;
}

// A lane of this session's connection: nothing to open, and no second connection in the store.
Task<std::unique_ptr<RendezvousStore>> TcpRendezvousStore::open_watcher() {
  co_return std::unique_ptr<RendezvousStore>(new TcpRendezvousStore(client_.lane(), run_id_));
}

void TcpRendezvousStore::close() {
  client_.close();
}

std::string TcpRendezvousStore::describe() const {
  return client_.endpoint();
}

}  // namespace dist::agent
