#include "recovery/generations.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/this_coro.hpp>
#include <charconv>
#include <cstring>
#include <string_view>

#include <spdlog/spdlog.h>

#include "dist/contract/worker_contract.h"
#include "dist/store/errors.h"
#include "rendezvous/rendezvous.h"  // seconds_text

namespace dist::agent {
namespace {

namespace contract = worker_contract;

store::Task<int> add_generation(std::shared_ptr<store::AsyncStoreClient> client,
                                std::string prefix) {
  co_await client->open();
  co_return static_cast<int>(co_await client->add(contract::generation_counter_key(prefix), 1));
}

// Free coroutines: they hold what they use, so that the Generations object may go while they wait
// (closed: the wait then ends in kCancelled).
store::Task<void> publish_generation(std::shared_ptr<store::AsyncStoreClient> client,
                                     std::string prefix, int generation, std::string record) {
  co_await client->open();  // (the counter was added to first: next())
  spdlog::debug("in-place: generation {} published in the workers' store at {}: {}", generation,
                client->endpoint(), contract::generation_key(prefix, generation));
  co_await client->set(contract::generation_key(prefix, generation), std::move(record));
}

// Generation `generation` recovered: every rank is in it. The keys of the generations before it
// are read by nobody now; the SDK's workers delete their own, torch's process groups (dist_launch.
// elastic) leave theirs, O(world) keys a recovery. One LIST_KEYS, then a DELETE_KEY each, in the
// background: never a failure of the recovery (a courtesy to the store; a key left is found by
// the next recovery's sweep).
store::Task<void> forget_before(std::shared_ptr<store::AsyncStoreClient> client, std::string prefix,
                                std::string group_prefix, int generation) {
  try {
    const auto keys = co_await client->list_keys();
    const auto stale = keys_before(keys, prefix, group_prefix, generation);
    for (const auto& key : stale) co_await client->delete_key(key);
    if (!stale.empty()) {
      spdlog::debug("in-place: {} keys of generations before {} deleted from the workers' store",
                    stale.size(), generation);
    }
  } catch (const store::StoreError& e) {
    spdlog::debug("in-place: the keys of generations before {} stay: {}", generation, e.what());
  }
}

// The generation a recovered key's value says superseded it (a failure folded into the recovery),
// if it does.
std::optional<int> superseded_by(const std::string& value) {
  if (!value.starts_with(contract::kSuperseded)) return std::nullopt;
  const std::string_view g = std::string_view(value).substr(std::strlen(contract::kSuperseded));
  int generation = 0;
  const auto [end, ec] = std::from_chars(g.data(), g.data() + g.size(), generation);
  if (ec != std::errc() || end != g.data() + g.size()) return std::nullopt;
  return generation;
}

store::Task<RecoveryOutcome> recovery_of(std::shared_ptr<store::AsyncStoreClient> client,
                                         std::string prefix, std::string group_prefix,
                                         int generation, std::chrono::milliseconds timeout) {
  RecoveryOutcome outcome;
  outcome.generation = generation;
  try {
    co_await client->open();
    while (true) {  // each generation that supersedes the one waited for gets the whole timeout
      const std::string recovered = contract::recovered_key(prefix, outcome.generation);
      std::vector<std::string> keys{recovered};
      const bool arrived = co_await client->wait(std::move(keys), timeout);
      if (!arrived) {
        outcome.why = "the group did not say it recovered within " + seconds_text(timeout) +
                      " (--in-place-timeout) of generation " + std::to_string(outcome.generation) +
                      " (a survivor stuck in its recovery, or workers that do not recover in "
                      "place: dist_launch.elastic, the SDK's InPlaceRecovery or their own)";
        co_return outcome;
      }
      outcome.record = (co_await client->try_get(recovered)).value_or("");
      const std::optional<int> later = superseded_by(outcome.record);
      if (!later) break;
      spdlog::info(
          "in-place: generation {} was superseded by generation {} (a failure folded "
          "into the recovery)",
          outcome.generation, *later);
      outcome.generation = *later;
    }
    outcome.recovered = true;
    generation = outcome.generation;
    boost::asio::co_spawn(co_await boost::asio::this_coro::executor,
                          forget_before(client, prefix, std::move(group_prefix), generation),
                          boost::asio::detached);
  } catch (const store::StoreError& e) {
    if (e.code() == store::StoreErrc::kCancelled) throw;
    outcome.why = "the workers' store at " + client->endpoint() + " cannot be used: " + e.what();
  }
  co_return outcome;
}

store::Task<RecoveryOutcome> publish_then_wait(std::shared_ptr<store::AsyncStoreClient> client,
                                               std::string prefix, std::string group_prefix,
                                               int generation, std::string record,
                                               std::chrono::milliseconds timeout) {
  try {
    co_await publish_generation(client, prefix, generation, std::move(record));
  } catch (const store::StoreError& e) {
    if (e.code() == store::StoreErrc::kCancelled) throw;
    co_return RecoveryOutcome{
        false, generation, "",
        "the workers' store at " + client->endpoint() + " cannot be used: " + e.what()};
  }
  co_return co_await recovery_of(client, prefix, std::move(group_prefix), generation, timeout);
}

store::Task<std::optional<GenerationUnderWay>> generation_under_way(
    std::shared_ptr<store::AsyncStoreClient> client, std::string prefix,
    std::chrono::milliseconds timeout) {
  co_await client->open();
  const int counted =
      static_cast<int>(co_await client->add(contract::generation_counter_key(prefix), 0));
  // Counted and not recovered: under way, once published. Else the claimant has yet to count it.
  bool recovered = counted == 0;
  if (!recovered) {  // (no co_await inside ||: GCC 12)
    std::vector<std::string> over{contract::recovered_key(prefix, counted)};
    recovered = co_await client->check(std::move(over));
  }
  const int generation = recovered ? counted + 1 : counted;
  const std::string key = contract::generation_key(prefix, generation);
  std::vector<std::string> keys{key};
  if (!co_await client->wait(std::move(keys), timeout)) co_return std::nullopt;
  const auto record = co_await client->try_get(key);
  if (!record) co_return std::nullopt;
  co_return GenerationUnderWay{generation, *record};
}

store::Task<bool> all_set(std::shared_ptr<store::AsyncStoreClient> client,
                          std::vector<std::string> keys) {
  co_await client->open();
  co_return co_await client->check(std::move(keys));
}

store::Task<bool> any_at_work_of(std::shared_ptr<store::AsyncStoreClient> client,
                                 std::string prefix, std::vector<int> ranks) {
  co_await client->open();
  for (const int rank : ranks) {
    const auto work = co_await client->try_get(contract::work_key(prefix, rank));
    if (work == contract::kWorkRunning) co_return true;
  }
  co_return false;
}

store::Task<bool> mark_superseded(std::shared_ptr<store::AsyncStoreClient> client, std::string key,
                                  std::string value) {
  co_await client->open();
  const std::string now = co_await client->compare_set(key, "", value);
  co_return now == value;
}

store::Task<bool> wait_for_keys(std::shared_ptr<store::AsyncStoreClient> client,
                                std::vector<std::string> keys, std::chrono::milliseconds timeout) {
  co_await client->open();
  co_return co_await client->wait(std::move(keys), timeout);
}

store::Task<Arrivals> arrivals_of(std::shared_ptr<store::AsyncStoreClient> client,
                                  std::vector<std::string> keys,
                                  std::chrono::milliseconds timeout) {
  Arrivals a;
  co_await client->open();
  std::vector<std::string> waited = keys;  // (no temporary inside co_await: GCC 12)
  a.all = co_await client->wait(std::move(waited), timeout);
  if (!a.all) co_return a;
  const auto values = co_await client->multi_get(std::move(keys));
  for (std::size_t rank = 0; rank < values.size(); ++rank) {
    if (values[rank] == contract::kArrivalFailed) {
      a.failed_rank = static_cast<int>(rank);
      break;
    }
  }
  co_return a;
}

store::Task<void> set_all(std::shared_ptr<store::AsyncStoreClient> client,
                          store::AsyncStoreClient::Items items) {
  co_await client->open();
  co_await client->multi_set(std::move(items));
}

store::Task<void> set_place(std::shared_ptr<store::AsyncStoreClient> client, std::string key,
                            std::string value) {
  co_await client->open();
  co_await client->set(std::move(key), std::move(value));
}

RegroupName regroup_name(const std::string& key, const std::string& value) {
  if (value == contract::kRegroupFinished) return {0, true};
  try {
    const int generation = std::stoi(value);
    if (generation > 0) return {generation, false};
  } catch (const std::exception&) {
  }
  throw store::StoreError(store::StoreErrc::kProtocol,
                          "the workers' store holds '" + value + "' at " + key +
                              ", not a generation (or '" + contract::kRegroupFinished + "')");
}

store::Task<std::optional<RegroupName>> wait_for_generation(
    std::shared_ptr<store::AsyncStoreClient> client, std::string key,
    std::chrono::milliseconds timeout) {
  co_await client->open();
  std::vector<std::string> keys{key};
  if (!co_await client->wait(std::move(keys), timeout)) co_return std::nullopt;
  const auto value = co_await client->try_get(key);
  co_return regroup_name(key, value.value_or(""));
}

// The key's first value stays: a generation named, or the word that the job finished.
store::Task<RegroupName> claim_regroup_generation(std::shared_ptr<store::AsyncStoreClient> client,
                                                  std::string key, std::string value) {
  co_await client->open();
  const std::string now = co_await client->compare_set(key, "", std::move(value));
  co_return regroup_name(key, now);
}

store::Task<std::optional<int>> say_regroup_finished(
    std::shared_ptr<store::AsyncStoreClient> client, std::string prefix, int round) {
  std::string key = contract::regroup_generation_key(prefix, round);
  std::string finished = contract::kRegroupFinished;
  const auto name = co_await claim_regroup_generation(client, std::move(key), std::move(finished));
  if (name.finished) co_return std::nullopt;
  // The group recovered with the newcomers first: they trained, and end with the others.
  std::vector<std::string> recovered{contract::recovered_key(prefix, name.generation)};
  if (co_await client->check(std::move(recovered))) co_return name.generation;
  std::string finished_key = contract::regroup_finished_key(prefix, round);
  std::string generation = std::to_string(name.generation);
  co_await client->set(std::move(finished_key), std::move(generation));
  co_return name.generation;
}

}  // namespace

Generations::Generations(boost::asio::io_context& io, const std::string& run_id,
                         const std::string& secret, store::Endpoint store, int restart_count)
    : prefix_(contract::generation_prefix(run_id, restart_count)),
      group_prefix_(contract::group_prefix(run_id, restart_count)) {
  store::ClientOptions options;
  options.host = store.host;
  options.port = store.port;
  options.secret = secret;
  client_ = std::make_shared<store::AsyncStoreClient>(io.get_executor(), options);
}

Generations::~Generations() {
  close();
}

store::Task<int> Generations::next() {
  return add_generation(client_, prefix_);
}

store::Task<std::optional<GenerationUnderWay>> Generations::under_way(
    std::chrono::milliseconds timeout) {
  return generation_under_way(client_, prefix_, timeout);
}

store::Task<bool> Generations::all_follow_folds(int world_size) {
  std::vector<std::string> keys;
  for (int rank = 0; rank < world_size; ++rank) keys.push_back(contract::fold_key(prefix_, rank));
  return all_set(client_, std::move(keys));
}

store::Task<bool> Generations::any_at_work(std::vector<int> ranks) {
  return any_at_work_of(client_, prefix_, std::move(ranks));
}

store::Task<bool> Generations::supersede(int generation, int by) {
  return mark_superseded(client_, contract::recovered_key(prefix_, generation),
                         contract::kSuperseded + std::to_string(by));
}

store::Task<void> Generations::place_regrouped(int round, int old_rank_offset, int new_rank_offset,
                                               int new_node_rank) {
  return set_place(client_, contract::regroup_key(prefix_, round, old_rank_offset),
                   std::to_string(new_rank_offset) + " " + std::to_string(new_node_rank));
}

store::Task<RegroupName> Generations::name_regroup_generation(int round, int generation) {
  return claim_regroup_generation(client_, contract::regroup_generation_key(prefix_, round),
                                  std::to_string(generation));
}

store::Task<std::optional<RegroupName>> Generations::regroup_generation(
    int round, std::chrono::milliseconds timeout) {
  return wait_for_generation(client_, contract::regroup_generation_key(prefix_, round), timeout);
}

store::Task<std::optional<int>> Generations::mark_regroup_finished(int round) {
  return say_regroup_finished(client_, prefix_, round);
}

store::Task<void> Generations::mark_arrived(int generation, int first_rank, int count) {
  store::AsyncStoreClient::Items items;
  for (int rank = first_rank; rank < first_rank + count; ++rank) {
    items.emplace_back(contract::arrived_key(prefix_, generation, rank), "1");
  }
  return set_all(client_, std::move(items));
}

store::Task<void> Generations::mark_arrival_failed(int generation, int first_rank, int count) {
  store::AsyncStoreClient::Items items;
  for (int rank = first_rank; rank < first_rank + count; ++rank) {
    items.emplace_back(contract::arrived_key(prefix_, generation, rank), contract::kArrivalFailed);
  }
  return set_all(client_, std::move(items));
}

store::Task<Arrivals> Generations::wait_arrived(int generation, int world_size,
                                                std::chrono::milliseconds timeout) {
  std::vector<std::string> keys;
  for (int rank = 0; rank < world_size; ++rank) {
    keys.push_back(contract::arrived_key(prefix_, generation, rank));
  }
  return arrivals_of(client_, std::move(keys), timeout);
}

store::Task<bool> Generations::wait_regroup_finished(int round, std::chrono::milliseconds timeout) {
  return wait_for_keys(client_, {contract::regroup_finished_key(prefix_, round)}, timeout);
}

store::Task<void> Generations::publish(int generation, std::string record) {
  return publish_generation(client_, prefix_, generation, std::move(record));
}

store::Task<RecoveryOutcome> Generations::wait_recovered(int generation,
                                                         std::chrono::milliseconds timeout) {
  return recovery_of(client_, prefix_, group_prefix_, generation, timeout);
}

store::Task<bool> Generations::wait_published(int generation, std::chrono::milliseconds timeout) {
  return wait_for_keys(client_, {contract::generation_key(prefix_, generation)}, timeout);
}

store::Task<RecoveryOutcome> Generations::publish_and_wait(int generation, std::string record,
                                                           std::chrono::milliseconds timeout) {
  return publish_then_wait(client_, prefix_, group_prefix_, generation, std::move(record), timeout);
}

namespace {

// The generation a key names right after `prefix`: "<h>", then the key's end (where `whole` may
// be the key) or "/".
std::optional<int> generation_after(std::string_view key, std::string_view prefix, bool whole) {
  if (!key.starts_with(prefix)) return std::nullopt;
  key.remove_prefix(prefix.size());
  int h = 0;
  const auto [rest, ec] = std::from_chars(key.data(), key.data() + key.size(), h);
  if (ec != std::errc() || rest == key.data()) return std::nullopt;
  const std::string_view after(rest, static_cast<std::size_t>(key.data() + key.size() - rest));
  if (after.empty() ? !whole : after.front() != '/') return std::nullopt;
  return h;
}

}  // namespace

std::vector<std::string> keys_before(const std::vector<std::string>& keys,
                                     const std::string& prefix, const std::string& group_prefix,
                                     int generation) {
  const std::string records = prefix + "gen/";
  const std::string groups = group_prefix + "gen_";
  std::vector<std::string> stale;
  for (const auto& key : keys) {
    std::string_view name = key;
    auto h = generation_after(name, records, /*whole=*/true);  // gen/<h>, gen/<h>/recovered
    if (!h) {
      if (name.starts_with('/')) name.remove_prefix(1);     // torch's client puts "/" before a key
      h = generation_after(name, groups, /*whole=*/false);  // gen_<h>/<the group's key>
    }
    if (h && *h < generation) stale.push_back(key);
  }
  return stale;
}

void Generations::close() {
  client_->close();
}

}  // namespace dist::agent
