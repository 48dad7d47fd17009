// In-place recovery (recovery.h): the survivors' side (a failed collective, the agent's new
// generation, the group rebuilt, the root's state broadcast) and the replacement's (the same
// group and broadcast, from start()).
#include "dist/sdk/recovery.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <stdexcept>

#include "dist/contract/worker_contract.h"
#include "dist/store/errors.h"
#include "folds.h"
#include "progress_slot.h"

namespace dist::sdk {
namespace {

namespace contract = worker_contract;
using Clock = std::chrono::steady_clock;

std::int64_t wall_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// One write, so that the line is never cut by another thread's or process's output.
void say(const std::string& text) {
  const std::string line = "dist-sdk: " + text + "\n";
  [[maybe_unused]] const auto written = ::write(STDERR_FILENO, line.data(), line.size());
}

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

std::string fixed(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", value);
  return text;
}

// The ranks' states cannot be exchanged: no other generation would change that.
class StateRefused : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

void append_u64(std::string& out, std::uint64_t v) {
  char bytes[8];
  std::memcpy(bytes, &v, sizeof v);
  out.append(bytes, sizeof bytes);
}

}  // namespace

// ------------------------------------------------------------------------------------------
// RecoverableState

void RecoverableState::add(std::string name, std::span<float> values) {
  items_.push_back({std::move(name), values.data(), values.size_bytes(), false, {}, {}, {}});
}
void RecoverableState::add(std::string name, std::span<double> values) {
  items_.push_back({std::move(name), values.data(), values.size_bytes(), false, {}, {}, {}});
}
void RecoverableState::add(std::string name, std::uint64_t& counter) {
  items_.push_back({std::move(name), &counter, sizeof counter, true, {}, {}, {}});
}
void RecoverableState::add(std::string name, std::int64_t& counter) {
  items_.push_back({std::move(name), &counter, sizeof counter, true, {}, {}, {}});
}
void RecoverableState::add(std::string name, float& value) {
  items_.push_back({std::move(name), &value, sizeof value, false, {}, {}, {}});
}
void RecoverableState::add_blob(std::string name, std::function<std::string()> get,
                                std::function<void(const std::string&)> set) {
  items_.push_back({std::move(name), nullptr, 0, false, std::move(get), std::move(set), {}});
}

void RecoverableState::capture_blobs() {
  for (Item& item : items_) {
    if (item.get) item.blob = item.get();
  }
}

void RecoverableState::apply_blobs() {
  for (Item& item : items_) {
    if (item.set) item.set(item.blob);
  }
}

std::string RecoverableState::describe_counters() const {
  std::string out;
  for (const Item& item : items_) {
    if (!item.counter) continue;
    std::int64_t value = 0;  // both kinds of counter are 8 bytes; shown as signed
    std::memcpy(&value, item.data, sizeof value);
    out += (out.empty() ? "" : " ") + item.name + "=" + std::to_string(value);
  }
  return out;
}

std::string RecoverableState::serialize() const {
  std::string out;
  for (const Item& item : items_) {
    if (item.get) {
      append_u64(out, item.blob.size());
      out += item.blob;
    } else {
      out.append(static_cast<const char*>(item.data), item.bytes);
    }
  }
  return out;
}

void RecoverableState::deserialize(const std::string& bytes) {
  std::size_t at = 0;
  auto take = [&](std::size_t n, const std::string& name) {
    if (bytes.size() - at < n) {
      throw std::runtime_error("in-place recovery: the state received ends inside '" + name +
                               "' (" + std::to_string(bytes.size()) + " bytes)");
    }
    const std::size_t from = at;
    at += n;
    return from;
  };
  for (Item& item : items_) {
    if (item.set) {
      std::uint64_t length = 0;
      std::memcpy(&length, bytes.data() + take(sizeof length, item.name), sizeof length);
      const std::size_t from = take(static_cast<std::size_t>(length), item.name);
      item.blob = bytes.substr(from, static_cast<std::size_t>(length));
    } else {
      std::memcpy(item.data, bytes.data() + take(item.bytes, item.name), item.bytes);
    }
  }
  if (at != bytes.size()) {
    throw std::runtime_error("in-place recovery: the state received has " +
                             std::to_string(bytes.size() - at) + " bytes more than registered");
  }
}

// FNV-1a over each item's name, kind and size: ranks that registered different state must not
// exchange it.
std::uint64_t RecoverableState::layout_hash() const {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  for (const Item& item : items_) {
    mix(item.name.data(), item.name.size());
    const std::uint64_t shape[2] = {item.get ? 1u : 0u, item.bytes};
    mix(shape, sizeof shape);
  }
  return h;
}

// ------------------------------------------------------------------------------------------
// InPlaceRecovery

InPlaceRecovery::InPlaceRecovery(Distributed& dist, RecoveryOptions options)
    : dist_(dist),
      options_(options),
      generation_(dist.env.generation),
      has_state_(dist.env.generation == 0) {
  if (!enabled()) return;
  prefix_ = contract::generation_prefix(dist.env.run_id, dist.env.restart_count);
  store_ = std::make_unique<store::StoreClient>(connect_store(dist.env));
  say_follows_folds();
  // A regroup asked before this process started (it is a newcomer's, or a replacement) is not
  // this rank's to follow: it starts in the group that regroup made.
  if (const detail::Slot* slot = detail::progress_slot()) {
    regroup_seen_ = slot->regroup_round.load();
    watcher_ = std::thread([this] { watch(); });
  }
}

// The agent may fold a failure into a recovery when every rank's worker follows a later
// generation (worker_contract.h, fold/<rank>): this one says so, under its rank.
void InPlaceRecovery::say_follows_folds() {
  if (detail::follows_folds(dist_.env, options_.backend)) {
    store_->set(contract::fold_key(prefix_, dist_.env.rank), "1");
  }
}

InPlaceRecovery::~InPlaceRecovery() {
  stop_watching();
}

void InPlaceRecovery::stop_watching() {
  if (!watcher_.joinable()) return;
  {
    std::lock_guard lock(watch_mutex_);
    stopping_ = true;
  }
  watch_wake_.notify_all();
  watcher_.join();
}

// The agent's request to regroup (a node lost, or joining) that stands kAbortGrace while this
// rank is not recovering: the group is aborted, so that a collective waiting for a peer that may
// never answer (its host cut off) fails now, not at the group's timeout. The main thread then
// recovers as from any failed collective. Once per request; a shared-memory read every period.
void InPlaceRecovery::watch() {
  constexpr std::chrono::milliseconds kPeriod{50};
  const detail::Slot* slot = detail::progress_slot();
  std::uint32_t pending = 0, aborted = 0;
  Clock::time_point pending_since;
  std::unique_lock lock(watch_mutex_);
  while (!watch_wake_.wait_for(lock, kPeriod, [this] { return stopping_; })) {
    const std::uint32_t asked = slot->regroup_round.load();
    if (asked <= regroup_seen_.load() || asked == aborted || recovering_.load()) {
      pending = 0;
      continue;
    }
    if (asked != pending) {
      pending = asked;
      pending_since = Clock::now();
    }
    if (Clock::now() - pending_since < kAbortGrace) continue;
    std::lock_guard group(group_mutex_);
    if (recovering_.load() || asked <= regroup_seen_.load() || !dist_.group) continue;
    // (The group's rank, not the environment's: the main thread rewrites that while it
    // recovers, outside this mutex.)
    const int rank = dist_.group->rank();
    const std::string why = "the job regroups in round " + std::to_string(asked) +
                            " (a node was lost, or joins) and rank " + std::to_string(rank) +
                            " had not let go of its group " + std::to_string(kAbortGrace.count()) +
                            " ms later";
    aborted_round_ = asked;  // before the abort: the main thread's recovery reads it
    if (dist_.group->abort(why)) {
      say("rank " + std::to_string(rank) + ": " + why +
          ": its collectives are aborted, so that none waits for a peer that may never answer");
    }
    aborted = asked;
  }
}

void InPlaceRecovery::replace_group(std::unique_ptr<ProcessGroup> group) {
  std::unique_ptr<ProcessGroup> old;
  {
    std::lock_guard lock(group_mutex_);
    old = std::move(dist_.group);
    dist_.group = std::move(group);
  }
  old.reset();  // destroyed outside the lock: a Gloo group joins its thread
}

void InPlaceRecovery::on_group(std::function<void(ProcessGroup&)> build,
                               std::function<void()> release) {
  build_ = std::move(build);
  release_ = std::move(release);
}

void InPlaceRecovery::start() {
  const bool replacement = !has_state_;
  if (replacement) {  // the survivors are rebuilding the same generation's group
    const auto began = Clock::now();
    settle_in(generation_, true);
    // A replacement's generation replaced a worker; a regroup's took this node into the job.
    const auto record = store_->try_get(contract::generation_key(prefix_, generation_));
    const bool newcomer = record && record->starts_with("regrouped");
    say("rank " + std::to_string(dist_.env.rank) + " joined generation " +
        std::to_string(generation_) + (newcomer ? " as a newcomer" : " as a replacement") +
        ": state from rank " + std::to_string(last_root_) + " (" + state_.describe_counters() +
        ") in " + fixed(ms_since(began)) + " ms");
  }
  if (build_) build_(*dist_.group);
  if (replacement) {
    state_.apply_blobs();
    forget_generation_keys();
  }
}

bool InPlaceRecovery::run(const std::function<void()>& unit) {
  if (enabled() && regroup_asked()) {  // between two units: the unit runs in the new group
    regroup();
    return false;
  }
  try {
    unit();
    return true;
  } catch (const CollectiveError& e) {
    if (!enabled()) throw;
    recover(e);
    return false;
  }
}

// While the group is released and rebuilt, the watcher leaves it alone.
struct InPlaceRecovery::Recovering {
  explicit Recovering(std::atomic<bool>& flag) : flag_(flag) { flag_.store(true); }
  ~Recovering() { flag_.store(false); }
  std::atomic<bool>& flag_;
};

void InPlaceRecovery::recover(const CollectiveError& error) {
  const Recovering recovering(recovering_);
  const auto failed_at = Clock::now();
  std::string what = error.what();  // without the advice to exit, which does not apply here
  what = what.substr(0, what.find("; the group is unusable"));
  if (regroup_asked()) {  // a peer let go of the group first, as this one would have; or the
                          // watcher aborted it
    regroup_seen_ = detail::progress_slot()->regroup_round.load();
    what = "the job regroups in round " + std::to_string(regroup_seen_) +
           (aborted_round_.load() == regroup_seen_.load()
                ? " (this rank's group was aborted: see above)"
                : " (a peer let go of the group first)");
  }
  join_next_generation(failed_at, "its collective failed", error.what(),
                       "rank " + std::to_string(dist_.env.rank) + ": " + what);
}

bool InPlaceRecovery::regroup_asked() const {
  const detail::Slot* slot = detail::progress_slot();
  return slot != nullptr && slot->regroup_round.load() > regroup_seen_;
}

// The agent asks the running workers to regroup when a node joins the job (their collectives do
// not fail: nothing did). This rank lets its group go first, so that the collectives of peers
// that have not seen the request yet fail at once, and follows the next generation as a
// survivor of a failure does.
void InPlaceRecovery::regroup() {
  const Recovering recovering(recovering_);
  const auto asked_at = Clock::now();
  regroup_seen_ = detail::progress_slot()->regroup_round.load();
  const std::string where = "rank " + std::to_string(dist_.env.rank) +
                            ": the job regroups in round " + std::to_string(regroup_seen_);
  state_.capture_blobs();  // while what holds them still exists
  release_group();
  join_next_generation(asked_at, "its agent asked it to regroup", where, where);
}

std::chrono::milliseconds InPlaceRecovery::generation_timeout() const {
  // The agent's worst case: a round that waits its --in-place-timeout for a relaunched node, then
  // the newcomers' workers (4/5 of it), then its publication.
  return options_.generation_timeout.value_or(2 * dist_.env.in_place_timeout +
                                              std::chrono::minutes(1));
}

void InPlaceRecovery::join_next_generation(Clock::time_point began, const std::string& since,
                                           const std::string& cause, const std::string& what) {
  const int next = generation_ + 1;
  int latest = next;
  {
    // In the new generation's set-up from here to its group (the slot says so before the log).
    const detail::SetupWait waiting;
    say(what + "; waiting for generation " + std::to_string(next) + " of the group");
    try {
      store_->wait({contract::generation_key(prefix_, next)}, generation_timeout());
    } catch (const store::StoreError& e) {
      throw CollectiveError(cause + "; and no generation " + std::to_string(next) +
                            " of the group came from the agent (" + e.what() + ")");
    }
    latest =
        std::max(next, static_cast<int>(store_->add(contract::generation_counter_key(prefix_), 0)));
    for (int g = next; g <= latest; ++g) take_new_rank(g);
    if (dist_.group) state_.capture_blobs();  // (a regroup captured them before letting go)
  }
  settle_in(latest, false);
  if (build_) build_(*dist_.group);
  state_.apply_blobs();
  if (dist_.env.rank == last_root_) {  // the agent's word that the group is whole again
    store_->set(contract::recovered_key(prefix_, generation_),
                "root=" + std::to_string(last_root_) + " wall_ns=" + std::to_string(wall_ns()) +
                    " " + state_.describe_counters());
  }
  forget_generation_keys();
  say("rank " + std::to_string(dist_.env.rank) + " recovered in place: generation " +
      std::to_string(generation_) + ", state from rank " + std::to_string(last_root_) + " (" +
      state_.describe_counters() + "), " + fixed(ms_since(began)) + " ms after " + since);
}

// Every rank is in generation generation_ now (the state's broadcast reached each): the keys of
// the generations before it are read by nobody. Each rank deletes its own arrival (a replacement's
// or a regroup's), the root the previous generation's record and word; a long job keeps a few
// keys, not a few per recovery. Never fails the recovery: the keys are a courtesy to the store.
void InPlaceRecovery::forget_generation_keys() {
  try {
    store_->delete_key(contract::arrived_key(prefix_, generation_, dist_.env.rank));
    if (dist_.env.rank == last_root_ && generation_ > 1) {
      store_->delete_key(contract::generation_key(prefix_, generation_ - 1));
      store_->delete_key(contract::recovered_key(prefix_, generation_ - 1));
    }
  } catch (const store::StoreError&) {
  }
}

void InPlaceRecovery::release_group() {
  if (!dist_.group) return;
  if (release_) release_();
  replace_group(nullptr);  // its pairs with a failed peer are broken: a new mesh, new keys
}

// Generation g's record: a replacement's changes no rank; a regroup's (a node was lost, or joined)
// moves this rank to where its agent's key says, in a world of the record's size.
void InPlaceRecovery::take_new_rank(int generation) {
  const std::string record =
      store_->get(contract::generation_key(prefix_, generation), generation_timeout());
  int round = -1, world = -1;
  if (std::sscanf(record.c_str(), "regrouped round=%d world=%d", &round, &world) != 2) return;
  // The agent's request to regroup in this round (the slot) is followed, whatever brought this
  // rank here: its collective may have failed first (a node lost).
  regroup_seen_ = std::max(regroup_seen_.load(), static_cast<std::uint32_t>(std::max(round, 0)));
  const int old_offset = dist_.env.rank - dist_.env.local_rank;
  const std::string place = contract::regroup_key(prefix_, round, old_offset);
  std::string value;
  try {
    value = store_->get(place, generation_timeout());
  } catch (const store::StoreError& e) {
    throw CollectiveError("rank " + std::to_string(dist_.env.rank) + ": generation " +
                          std::to_string(generation) + " regrouped the job in round " +
                          std::to_string(round) + " without a place for this node's workers (" +
                          e.what() + ")");
  }
  int new_offset = -1, node_rank = -1;
  if (std::sscanf(value.c_str(), "%d %d", &new_offset, &node_rank) != 2 || new_offset < 0 ||
      world <= 0 || new_offset + dist_.env.local_world_size > world) {
    throw CollectiveError("rank " + std::to_string(dist_.env.rank) + ": the regrouped place " +
                          place + " cannot be read: '" + value + "' (world " +
                          std::to_string(world) + ")");
  }
  say("rank " + std::to_string(dist_.env.rank) + " is rank " +
      std::to_string(new_offset + dist_.env.local_rank) + " of " + std::to_string(world) +
      " from generation " + std::to_string(generation) + " (the job regrouped in round " +
      std::to_string(round) + ")");
  dist_.env.rank = new_offset + dist_.env.local_rank;
  dist_.env.world_size = world;
  say_follows_folds();  // under the new rank
}

// Generation `generation`'s group (`built`: init() or an earlier call built it) and the root's
// state. A set-up that a peer's failure ends, or that the agent superseded, is given up for the
// generation the agent folded that failure into (folds.h), as often as it does.
void InPlaceRecovery::settle_in(int generation, bool built) {
  while (true) {
    try {
      if (!built) {
        const detail::SetupWait waiting;
        rebuild_group(generation);
      }
      synchronize_state();
      return;
    } catch (const StateRefused&) {
      throw;
    } catch (const CollectiveError& e) {
      if (!detail::follows_folds(dist_.env, options_.backend)) throw;
      replace_group(nullptr);  // (never built on: no release) its peers' collectives fail now
      const detail::SetupWait waiting;
      const auto next = detail::generation_to_follow(dist_.env, *store_, generation_, e);
      if (!next) throw;
      detail::say_following(dist_.env, generation_, *next, e.what());
      generation = *next;
      built = false;
    }
  }
}

void InPlaceRecovery::rebuild_group(int generation) {
  release_group();
  generation_ = generation;
  dist_.env.generation = generation;
  replace_group(join_group(dist_.env, options_.backend,
                           options_.group_timeout.value_or(dist_.env.in_place_timeout)));
}

// The root is the lowest rank that kept its state; every other rank takes the root's, so that
// survivors that stopped in different units (the root finished the one that failed elsewhere)
// go on from one state. The layouts are compared first, on every rank, so that all agree on
// refusing a mismatch rather than some waiting on a broadcast.
void InPlaceRecovery::synchronize_state() {
  ProcessGroup& group = *dist_.group;
  const int size = group.size();
  const auto hash = static_cast<std::int64_t>(state_.layout_hash());
  std::vector<std::int64_t> facts{has_state_ ? group.rank() : size, hash, -hash};
  group.all_reduce(std::span<std::int64_t>(facts), ReduceOp::kMin);
  if (facts[0] >= size) {
    throw StateRefused("in-place recovery of generation " + std::to_string(generation_) +
                       ": no rank kept its state, so there is nothing to recover from");
  }
  if (facts[1] != -facts[2]) {
    throw StateRefused("in-place recovery of generation " + std::to_string(generation_) +
                       ": the ranks registered different state (names, sizes or order of "
                       "RecoverableState::add differ)");
  }
  const int root = static_cast<int>(facts[0]);
  std::string bytes = group.rank() == root ? state_.serialize() : std::string();
  std::vector<std::int64_t> length{static_cast<std::int64_t>(bytes.size())};
  group.broadcast(std::span<std::int64_t>(length), root);
  bytes.resize(static_cast<std::size_t>(length[0]));
  if (!bytes.empty()) group.broadcast(bytes.data(), bytes.size(), DataType::kUInt8, root);
  if (group.rank() != root) state_.deserialize(bytes);
  has_state_ = true;
  last_root_ = root;
}

}  // namespace dist::sdk
