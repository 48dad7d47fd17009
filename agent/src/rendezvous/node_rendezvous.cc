// Static rounds, and what static and elastic rounds share: failures, the watch, the exit barrier.
//
// A static round n (restart n), as one node lives it:
//   LIVE      publish alive/<k> (once per agent); if another live agent holds node rank k, that
//             is an error: two nodes were given the same --node-rank.
//   CLAIM     COMPARE_SET node/<k> in round n. Held by another agent, it is a dead one (its
//             liveness is gone): this agent was relaunched. The round is aborted, so that the
//             survivors restart, and this node claims its rank in round n+1; unless that agent
//             was lost at its exit barrier (its workers succeeded) while the round runs on
//             elsewhere: then this one takes its place there (Round::workers_succeeded), or,
//             when every other node succeeded too, learns that the job finished.
//   JOIN      count itself in `joined` (the round's first node raises the job's round pointer);
//             the node whose count completes max_nodes publishes every offset and closes the
//             round, writing `settled` last.
//   WAIT      until `settled` is there, saying every timeouts.waiting_notice which node ranks it
//             waits for; then `aborted` (RoundAbortedError) or the node's offset.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <random>

#include "dist/store/errors.h"
#include "rendezvous/rendezvous_detail.h"
#include "rendezvous/rendezvous_impl.h"
#include "rendezvous/rules.h"

namespace dist::agent {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
namespace name = schema::name;

namespace {

// How often an in-place claim reads the state again after losing its COMPARE_SET to a write that
// claimed nothing for this round (a recovery's end, an earlier round's count).
constexpr int kClaimAttempts = 4;
// How long a rejoining node waits for the store to drop its earlier agent's session (a
// keepalive's length: 30 s by default for a static job, which --rdzv-conf may lengthen).
constexpr std::chrono::milliseconds kPredecessorsSessionWait{120'000};

// An exit barrier passed by every node still there, without the `lost`.
BarrierEnd passed_without(std::vector<int> lost) {
  return BarrierEnd{true, std::move(lost), false};
}

// Every node's list under `name` in round `a` (round/<r>/<name>/<k>), decoded and joined in node
// order; a node that wrote none adds nothing.
template <typename Decode>
auto every_nodes(RendezvousStore& store, const Round& a, std::string_view name, Decode decode)
    -> Task<decltype(decode(std::string_view(), std::string_view()))> {
  std::vector<std::string> names;
  for (int n = 0; n < a.num_nodes; ++n) names.push_back(schema::in_round(a.round, name, n));
  const auto values = co_await store.multi_get(names);
  decltype(decode(std::string_view(), std::string_view())) all;
  for (std::size_t n = 0; n < values.size(); ++n) {
    if (!values[n]) continue;
    for (auto& item : decode(names[n], *values[n])) all.push_back(std::move(item));
  }
  co_return all;
}

}  // namespace

std::string seconds_text(milliseconds timeout) {
  const auto ms = timeout.count();
  std::string text = std::to_string(ms / 1000);
  if (ms % 1000 != 0) {
    std::string fraction = std::to_string(1000 + ms % 1000).substr(1);  // "050"
    while (fraction.back() == '0') fraction.pop_back();
    text += "." + fraction;
  }
  return text + " s";
}

NodeRendezvous::Impl::Impl(std::unique_ptr<RendezvousStore> session, JobShape shape,
                           RendezvousTimeouts timeouts, std::function<void(const std::string&)> log)
    : store_(std::move(session)),
      shape_(std::move(shape)),
      timeouts_(timeouts),
      log_(std::move(log)),
      nonce_(std::random_device{}()),
      self_{shape_.host,
            shape_.local_world_size,
            static_cast<int>(::getpid()),
            nonce_,
            -1,
            std::nullopt,
            false,
            shape_.hosts_store} {}

// ---------------------------------------------------------------------------------------------
// Static rounds

Task<Round> NodeRendezvous::Impl::join_static(int round, int node_rank) {
  const int num_nodes = shape_.max_nodes;
  const std::string record = schema::encode(self_);
  // Each store request here is paid by every node of the job at every round: the count per node
  // is guarded by the tests rendezvous.requests.* (bench/CMakeLists.txt) and measured by
  // bench/rendezvous_bench.cc.
  co_await publish_liveness(node_rank, record);  // LIVE: GET, SET alive/<rank>
  const std::string pointer =                    // GET round
      (co_await store_->try_get(std::string(schema::kRoundPointer))).value_or("");
  if (!pointer.empty()) {
    round =
        std::max<int>(round, static_cast<int>(schema::decode_int(schema::kRoundPointer, pointer)));
  }
  while (true) {  // CLAIM: COMPARE_SET round/R/node/<rank>
    const auto stored =
        co_await store_->compare_set(schema::in_round(round, name::kNode, node_rank), "", record);
    if (stored == record) break;
    // Every node rank has a record in a round that ran: a node relaunched into a job that already
    // failed learns it here (GET over), or from the next round, which the failure aborted.
    co_await throw_if_over();
    if (co_await still_at_barrier(round, node_rank)) {
      Round a = co_await placed(round, node_rank);
      a.workers_succeeded = true;
      co_return a;
    }
    if (co_await finished_without(round, node_rank)) {
      throw JobOverError("the job finished in round " + std::to_string(round) +
                             " while node rank " + std::to_string(node_rank) +
                             " was away: every other node succeeded",
                         true);
    }
    const auto holder =
        schema::decode_node_record(schema::in_round(round, name::kNode, node_rank), stored);
    const std::string reason = "node rank " + std::to_string(node_rank) + " was relaunched on " +
                               shape_.host + " (its agent on " + holder.host + ", pid " +
                               std::to_string(holder.pid) + ", is gone)";
    notice(reason + ": aborting round " + std::to_string(round) + " so that the job restarts " +
           "with this node");
    co_await abort_round(round, node_rank, reason);
    ++round;
  }
  const std::string settled = schema::in_round(round, name::kSettled);
  const auto joined = co_await store_->add(schema::in_round(round, name::kJoined), 1);  // ADD
  if (joined == 1) {
    // The round's first node alone: in round 0 the job's shape for `dist-launch status`, and the
    // job's round pointer (COMPARE_SET round, raised to this round). A relaunched node that
    // reads the pointer a moment before it is raised claims its rank in the round before, finds
    // it taken, and comes on to this one.
    if (round == 0) {  // (first: a status reader that finds the pointer knows the job static)
      co_await store_->set(std::string(schema::kStaticNodes), std::to_string(num_nodes));
    }
    co_await raise_round_pointer(round, pointer);
  }
  if (joined == num_nodes) co_await close_static(round);

  const auto deadline = steady_clock::now() + timeouts_.rdzv;
  while (true) {                              // WAIT
    if (co_await store_->wait(keys(settled),  // WAIT settled: closed, or aborted
                              detail::until(deadline, timeouts_.waiting_notice))) {
      break;
    }
    const auto missing = co_await missing_static(round);
    if (steady_clock::now() >= deadline) {
      std::vector<int> seen;
      for (int n = 0; n < num_nodes; ++n) {
        if (!std::binary_search(missing.begin(), missing.end(), n)) seen.push_back(n);
      }
      throw RoundTimeoutError("rendezvous round " + std::to_string(round) + " did not fill in " +
                              seconds_text(timeouts_.rdzv) + ": nodes seen " +
                              detail::node_list(seen) + ", missing " + detail::node_list(missing) +
                              "; start their agents with the same --master-addr/--master-port, or "
                              "raise --rdzv-conf timeout");
    }
    notice("waiting for node rank(s) " + detail::node_list(missing) + " to join round " +
           std::to_string(round) + " (" + std::to_string(num_nodes - missing.size()) + " of " +
           std::to_string(num_nodes) + " in; giving up in " +
           seconds_text(
               std::chrono::duration_cast<std::chrono::seconds>(deadline - steady_clock::now())) +
           ")");
  }
  co_return co_await placed(round, node_rank);
}

// This node's place in static round `round`, once `settled` is there: RoundAbortedError when the
// round was aborted.
Task<Round> NodeRendezvous::Impl::placed(int round, int node_rank) {
  const int num_nodes = shape_.max_nodes;
  const auto offset_key = schema::in_round(round, name::kOffset, node_rank);
  const auto size_key = schema::in_round(round, name::kWorldSize);
  // MULTI_GET: how the round settled, and this node's place (missing when it was aborted).
  const auto placement = co_await store_->multi_get(
      keys(schema::in_round(round, name::kSettled), offset_key, size_key));
  if (placement[0] != schema::kSettledClosed) {
    const auto why = co_await store_->try_get(schema::in_round(round, name::kAborted));
    co_await throw_if_over();
    throw RoundAbortedError("round " + std::to_string(round) +
                            " was aborted: " + why.value_or("(no reason recorded)"));
  }
  const std::optional<std::string> offset = placement[1], size = placement[2];
  if (!offset || !size) {
    throw RendezvousError("round " + std::to_string(round) + " closed without node rank " +
                          std::to_string(node_rank) + "'s offset; was the store cleared?");
  }
  Round a;
  a.round = round;
  a.restarts = round;
  a.node_rank = node_rank;
  a.num_nodes = num_nodes;
  a.alive_prefix = std::string(schema::kStaticAlivePrefix);
  if (num_nodes > 1) a.successor_id = (node_rank + 1) % num_nodes;
  a.rank_offset = static_cast<int>(schema::decode_int(offset_key, *offset));
  a.world_size = static_cast<int>(schema::decode_int(size_key, *size));
  co_return a;
}

// The liveness key carries the holder's record, so that a second agent given the same node rank
// can be told which agent holds it. A stale value of this agent's own (a restart) is fine.
Task<void> NodeRendezvous::Impl::publish_liveness(int node_rank, std::string record) {
  if (alive_published_) co_return;
  const std::string alive = schema::static_alive(node_rank);
  if (const auto holder = co_await store_->try_get(alive); holder && *holder != record) {
    const auto other = schema::decode_node_record(alive, *holder);
    // This process's earlier agent, cut off from the store, whose session the store has not
    // dropped yet (it does on its keepalive, the one that agent asked for): this node rejoins.
    // (No co_await inside && or a braced list: GCC 12 gets both wrong.)
    bool predecessor_gone = false;
    if (other.host == self_.host && other.pid == self_.pid) {
      std::vector<std::string> keys;
      keys.push_back(alive);
      const auto gone = co_await store_->wait_deleted(std::move(keys), kPredecessorsSessionWait);
      predecessor_gone = gone.has_value();
    }
    if (predecessor_gone) {
      co_await store_->set_ephemeral(alive, record);
      alive_published_ = true;
      co_return;
    }
    throw RendezvousError("node rank " + std::to_string(node_rank) + " joined twice (an agent on " +
                          other.host + ", pid " + std::to_string(other.pid) +
                          ", holds it, and this agent on " + shape_.host +
                          "): give every node its own --node-rank");
  }
  co_await store_->set_ephemeral(alive, record);
  alive_published_ = true;
}

// The pointer only grows: a COMPARE_SET loop against concurrent joiners of other rounds, from
// `current`, the value last read (a stale one costs one more COMPARE_SET, never a wrong pointer).
Task<void> NodeRendezvous::Impl::raise_round_pointer(int round, std::string current) {
  const std::string pointer(schema::kRoundPointer);
  const std::string mine = std::to_string(round);
  while (current.empty() || schema::decode_int(pointer, current) < round) {
    const std::string stored = co_await store_->compare_set(pointer, current, mine);
    if (stored == mine) break;
    current = stored;
  }
}

// Ends a round for everyone in it: those running restart (`healthy` gone), those waiting (and
// any that joins it later) wake up (`settled` aborted) and read why.
Task<void> NodeRendezvous::Impl::abort_round(int round, int node_rank, std::string reason) {
  std::vector<std::pair<std::string, std::string>> why{
      {schema::in_round(round, name::kAborted), reason},
      {schema::in_round(round, name::kLost), std::to_string(node_rank)},
      {schema::in_round(round, name::kSettled), std::string(schema::kSettledAborted)}};
  co_await store_->multi_set(std::move(why));
  // (`healthy` first: a node at its exit barrier that saw `intact` go first would take the
  // relaunch for a loss with no failure said.)
  for (auto& key :
       keys(schema::in_round(round, name::kHealthy), schema::in_round(round, name::kIntact))) {
    co_await store_->delete_key(std::move(key));
  }
}

// The node that completed the count: every node's offset, then the round is closed.
Task<void> NodeRendezvous::Impl::close_static(int round) {
  const int num_nodes = shape_.max_nodes;
  std::vector<std::string> record_keys;
  std::vector<int> ids;
  for (int n = 0; n < num_nodes; ++n) {
    record_keys.push_back(schema::in_round(round, name::kNode, n));
    ids.push_back(n);
  }
  const auto records = co_await store_->multi_get(record_keys);
  std::vector<int> sizes;
  for (std::size_t n = 0; n < records.size(); ++n) {
    if (!records[n]) {
      throw RendezvousError("round " + std::to_string(round) + " counted " +
                            std::to_string(num_nodes) + " nodes but node rank " +
                            std::to_string(n) + " has no record; was the store cleared?");
    }
    sizes.push_back(schema::decode_node_record(record_keys[n], *records[n]).local_world_size);
  }
  const auto placement = rules::place(ids, sizes);
  std::vector<std::pair<std::string, std::string>> items;
  for (int n = 0; n < num_nodes; ++n) {
    items.emplace_back(schema::in_round(round, name::kOffset, n),
                       std::to_string(placement.places[static_cast<std::size_t>(n)].rank_offset));
  }
  items.emplace_back(schema::in_round(round, name::kWorldSize),
                     std::to_string(placement.world_size));
  items.emplace_back(schema::in_round(round, name::kHealthy), "1");
  items.emplace_back(schema::in_round(round, name::kIntact), "1");
  items.emplace_back(schema::in_round(round, name::kRunning), "1");
  items.emplace_back(schema::in_round(round, name::kClosed), "1");
  items.emplace_back(schema::in_round(round, name::kSettled), std::string(schema::kSettledClosed));
  co_await store_->multi_set(std::move(items));  // last: the waiters wake on `settled`
}

Task<std::vector<int>> NodeRendezvous::Impl::missing_static(int round) {
  std::vector<std::string> record_keys;
  for (int n = 0; n < shape_.max_nodes; ++n) {
    record_keys.push_back(schema::in_round(round, name::kNode, n));
  }
  const auto records = co_await store_->multi_get(record_keys);
  std::vector<int> missing;
  for (std::size_t n = 0; n < records.size(); ++n) {
    if (!records[n]) missing.push_back(static_cast<int>(n));
  }
  co_return missing;
}

Task<void> NodeRendezvous::Impl::throw_if_over() {
  const auto over = co_await store_->multi_get(
      keys(std::string(schema::kJobOver), std::string(schema::kJobFinished)));
  if (over[0]) throw JobOverError("the job already failed: " + *over[0], false);
  if (over[1]) throw JobOverError("the job already finished: " + *over[1], true);
}

// Static: node_rank's agent before this one was lost at its exit barrier (its workers succeeded,
// counted in `done`: kAtBarrierCounted), and round `round` still runs on other nodes, untouched: no
// failure, no outcome settled, not every node done. This agent waits at the barrier in its place,
// as it would have: the round is not aborted (that restarted the healthy job on every node).
Task<bool> NodeRendezvous::Impl::still_at_barrier(int round, int node_rank) {
  const std::string done_key = schema::in_round(round, name::kDone);
  const auto state = co_await store_->multi_get(keys(
      schema::in_round(round, name::kAtBarrier, node_rank), schema::in_round(round, name::kSettled),
      schema::in_round(round, name::kHealthy), schema::in_round(round, name::kRunning),
      schema::in_round(round, name::kOutcome), done_key));
  const std::int64_t done = state[5] ? schema::decode_int(done_key, *state[5]) : 0;
  // (An agent lost between its `at_barrier` and its count may or may not be counted: then the
  // round restarts, as for any relaunch.)
  const bool counted = state[0] == schema::kAtBarrierCounted;
  const bool runs_on = state[1] == schema::kSettledClosed && state[2] && state[3] && !state[4];
  const bool takes_its_place = counted && runs_on && done < shape_.max_nodes;
  co_return takes_its_place;
}

// Static: the job's other nodes all succeeded in `round` and none failed, while node_rank (lost
// at their exit barrier, and relaunched) was away: the job is done, and its barrier passes. Else
// the round is to restart with this node. Settled once for the round (settle_static), with the
// nodes at their barrier.
Task<bool> NodeRendezvous::Impl::finished_without(int round, int node_rank) {
  const std::string done_key = schema::in_round(round, name::kDone);
  const auto state =
      co_await store_->multi_get(keys(done_key, schema::in_round(round, name::kHealthy),
                                      schema::in_round(round, name::kAtBarrier, node_rank)));
  // (Its predecessor at the barrier before it was lost is counted in `done` already.)
  const std::int64_t others =
      (state[0] ? schema::decode_int(done_key, *state[0]) : 0) - (state[2] ? 1 : 0);
  const bool finished = state[1] && others >= shape_.max_nodes - 1;
  if (!co_await settle_static(round, finished)) co_return false;
  Round a;
  a.round = round;
  a.node_rank = node_rank;
  co_await store_->set(schema::in_round(round, name::kLost), std::to_string(node_rank));
  co_await mark_finished(a, "every node but node rank " + std::to_string(node_rank) +
                                " succeeded in round " + std::to_string(round) +
                                " (it was lost at the exit barrier)");
  co_await store_->delete_key(schema::in_round(round, name::kRunning));  // the others pass too
  co_return true;
}

// Static: whether round `round` ended with the job finished (true) or is to restart, settled
// once by COMPARE_SET: the first node to know says which (`finished` its wish), and every other
// node follows it, so that no node restarts while another leaves the job done.
Task<bool> NodeRendezvous::Impl::settle_static(int round, bool finished) {
  const std::string wish = finished ? "finished" : "restart";
  const std::string settled =
      co_await store_->compare_set(schema::in_round(round, name::kOutcome), "", wish);
  co_return settled == "finished";
}

Task<bool> NodeRendezvous::Impl::mark_finished(Round a, std::string reason) {
  co_await store_->set(std::string(schema::kJobFinished),
                       "round " + std::to_string(a.round) + ": " + reason);
  co_return true;
}

Task<void> NodeRendezvous::Impl::mark_failed(Round a, std::string reason) {
  co_await store_->set(std::string(schema::kJobOver), reason);
  // A relaunched node may be waiting in the next round already.
  co_await abort_round(a.round + 1, a.node_rank, "the job failed: " + reason);
}

// ---------------------------------------------------------------------------------------------
// In-place recovery: one at a time, job-wide, counted with the restarts

Task<RecoveryClaim> NodeRendezvous::Impl::claim_recovery(Round a, Recovery kind, int workers,
                                                         int budget) {
  const std::string key(schema::kInPlace);
  const std::optional<std::string> read = co_await store_->try_get(key);
  std::string seen = read.value_or("");
  // The COMPARE_SET loses when the state changed since it was read: another node's claim (then
  // this one is refused), or a recovery's end, or a count of an earlier round's (then it is read
  // again and claimed afresh). Each lost try means another node's write went in.
  const int counted = kind == Recovery::kReplacement ? workers : 0;
  for (int attempt = 0;; ++attempt) {
    schema::InPlaceState state;
    if (!seen.empty()) state = schema::decode_in_place(key, seen);
    // A recovery of an earlier round ended with that round, whatever it became.
    const bool under_way = state.recovery != Recovery::kNone && state.round == a.round;
    if (under_way) co_return RecoveryClaim{std::nullopt, state.recovery, seen, std::nullopt};
    if (attempt == kClaimAttempts) {  // other nodes' claims kept going in: recoveries elsewhere
      co_return RecoveryClaim{std::nullopt, Recovery::kReplacement, {}, std::nullopt};
    }
    // (Refused uncounted: a group restart may be left.)
    if (kind == Recovery::kReplacement && state.replacements + counted > budget) {
      co_return RecoveryClaim{std::nullopt, Recovery::kNone, seen, state.replacements};
    }
    const schema::InPlaceState claimed{state.replacements + counted, a.round, kind, a.node_rank};
    const std::string desired = schema::encode(claimed);
    const std::string stored = co_await store_->compare_set(key, seen, desired);
    if (stored == desired) {
      co_return RecoveryClaim{claimed.replacements, Recovery::kNone, {}, std::nullopt};
    }
    seen = stored;
  }
}

// One COMPARE_SET against exactly what the refused claim saw: a recovery that ended, or another
// node's claim or takeover since, is not the one whose generation the caller folds into.
Task<RecoveryClaim> NodeRendezvous::Impl::take_over_recovery(Round a, std::string seen, int workers,
                                                             int budget) {
  const std::string key(schema::kInPlace);
  if (seen.empty()) co_return RecoveryClaim{};
  const schema::InPlaceState state = schema::decode_in_place(key, seen);
  if (state.recovery != Recovery::kReplacement || state.round != a.round) co_return RecoveryClaim{};
  if (state.replacements + workers > budget) {
    co_return RecoveryClaim{std::nullopt, Recovery::kReplacement, seen, state.replacements};
  }
  const schema::InPlaceState taken{state.replacements + workers, a.round, Recovery::kReplacement,
                                   a.node_rank};
  const std::string desired = schema::encode(taken);
  const std::string stored = co_await store_->compare_set(key, seen, desired);
  if (stored != desired) co_return RecoveryClaim{};
  co_return RecoveryClaim{taken.replacements, Recovery::kNone, {}, std::nullopt};
}

Task<void> NodeRendezvous::Impl::recovery_over(Round a) {
  const std::string key(schema::kInPlace);
  const std::optional<std::string> now = co_await store_->try_get(key);
  if (!now) co_return;
  schema::InPlaceState state = schema::decode_in_place(key, *now);
  if (state.recovery == Recovery::kNone || state.round != a.round ||
      state.node_rank != a.node_rank) {
    co_return;
  }
  state.recovery = Recovery::kNone;
  co_await store_->compare_set(key, *now, schema::encode(state));
}

// The exit barrier's count: a node adds itself once its workers all succeeded (this one has not).
// Read, not ADDed to: the key's existence says the round is finishing (a newcomer then waits for
// the next round), so a check must not create it.
Task<bool> NodeRendezvous::Impl::others_finished(Round a) {
  const std::string key = schema::in_round(a.round, name::kDone);
  const auto done = co_await store_->try_get(key);
  co_return (done ? schema::decode_int(key, *done) : 0) >= a.num_nodes - 1;
}

Task<void> NodeRendezvous::Impl::count_replacement() {
  const std::string key(schema::kInPlace);
  std::string seen = (co_await store_->try_get(key)).value_or("");
  while (true) {  // COMPARE_SET against the other nodes' claims and counts
    schema::InPlaceState state;
    if (!seen.empty()) state = schema::decode_in_place(key, seen);
    ++state.replacements;
    const std::string desired = schema::encode(state);
    const std::string stored = co_await store_->compare_set(key, seen, desired);
    if (stored == desired) co_return;
    seen = stored;
  }
}

Task<int> NodeRendezvous::Impl::replacements() {
  const std::string key(schema::kInPlace);
  const std::optional<std::string> now = co_await store_->try_get(key);
  co_return now ? schema::decode_in_place(key, *now).replacements : 0;
}

// ---------------------------------------------------------------------------------------------
// Both: failures, liveness, the watch, the exit barrier

Task<void> NodeRendezvous::Impl::announce_failure(Round a, std::vector<WorkerFailure> failures) {
  co_await store_->set(schema::in_round(a.round, name::kFailures, a.node_rank),
                       schema::encode(failures));
  co_await store_->delete_key(schema::in_round(a.round, name::kHealthy));
}

Task<std::vector<WorkerFailure>> NodeRendezvous::Impl::failures(Round a) {
  co_return co_await every_nodes(*store_, a, name::kFailures, schema::decode_failures);
}

Task<void> NodeRendezvous::Impl::publish_replacements(Round a,
                                                      std::vector<InPlaceReplacement> replaced) {
  co_await store_->set(schema::in_round(a.round, name::kReplaced, a.node_rank),
                       schema::encode(replaced));
}

Task<std::vector<InPlaceReplacement>> NodeRendezvous::Impl::replaced(Round a) {
  co_return co_await every_nodes(*store_, a, name::kReplaced, schema::decode_replacements);
}

// Every node's liveness key by node rank (elastic: from the member list).
std::vector<std::string> NodeRendezvous::Impl::liveness_keys(const Round& a,
                                                             const std::vector<int>& members) {
  std::vector<std::string> names;
  for (const int id : members) names.push_back(a.alive_prefix + std::to_string(id));
  return names;
}

Task<std::vector<int>> NodeRendezvous::Impl::members(const Round& a) {
  co_return co_await members(a, *store_);
}

Task<std::vector<int>> NodeRendezvous::Impl::members(const Round& a, RendezvousStore& via) {
  std::vector<int> ids;
  if (a.members_key.empty()) {
    for (int n = 0; n < a.num_nodes; ++n) ids.push_back(n);
    co_return ids;
  }
  const auto list = co_await via.try_get(a.members_key);
  if (!list) throw RendezvousError("round " + std::to_string(a.round) + " has no member list");
  co_return schema::decode_members(a.members_key, *list);
}

Task<std::vector<int>> NodeRendezvous::Impl::lost_nodes(Round a) {
  const auto names = liveness_keys(a, co_await members(a));
  std::vector<int> lost;
  if (co_await store_->check(names)) co_return lost;  // one request in the usual case
  // One more (not one per node: on etcd, 1,000 round trips took seconds) to name the lost.
  const auto records = co_await store_->multi_get(names);
  for (std::size_t n = 0; n < records.size(); ++n) {
    if (!records[n]) lost.push_back(static_cast<int>(n));
  }
  co_return lost;
}

// Liveness in a ring: each node watches only the next node's liveness key and, when that one
// vanishes, tells everyone by deleting `intact` (after naming the node in `lost`). Every watch is
// O(1) keys, so N nodes cost the store O(N), and a loss still reaches everyone in one more hop.
std::optional<std::string> NodeRendezvous::Impl::successor_key(const Round& a) const {
  if (a.successor_id < 0) return std::nullopt;
  return a.alive_prefix + std::to_string(a.successor_id);
}

Task<void> NodeRendezvous::Impl::report_lost_successor(const Round& a, RendezvousStore& via,
                                                       int successor) {
  co_await via.set(schema::in_round(a.round, name::kLost), std::to_string(successor));
  co_await via.delete_key(schema::in_round(a.round, name::kIntact));
}

// The watched successor's liveness is gone. A node that did so after its workers succeeded (at its
// exit barrier, or past its timeout: `at_barrier`, `left`) is no loss: the watch moves on to the
// node after it (`successor`, a node rank, moves with it), and returns that one's liveness key, or
// an empty one when the ring is back at this node. Nothing (nullopt) when the successor is lost.
Task<std::optional<std::string>> NodeRendezvous::Impl::skip_departed(const Round& a,
                                                                     RendezvousStore& via,
                                                                     int& successor) {
  const auto marks =
      co_await via.multi_get(keys(schema::in_round(a.round, name::kLeft, successor),
                                  schema::in_round(a.round, name::kAtBarrier, successor)));
  if (!marks[0] && !marks[1]) co_return std::nullopt;
  successor = (successor + 1) % a.num_nodes;
  if (successor == a.node_rank) co_return std::string();
  const auto ids = co_await members(a, via);
  co_return liveness_keys(a, ids)[static_cast<std::size_t>(successor)];
}

Task<void> NodeRendezvous::Impl::exchange_view(
    const Round& a, RendezvousStore& via, const std::function<void(schema::JobView)>& on_view) {
  const std::string key = schema::in_round(a.round, name::kView);
  try {
    if (a.node_rank != 0) {
      if (const auto value = co_await via.try_get(key))
        on_view(schema::decode_job_view(key, *value));
      co_return;
    }
    std::vector<std::string> names;
    for (int k = 0; k < a.num_nodes; ++k) {
      names.push_back(schema::in_round(a.round, name::kProgress, k));
    }
    const auto values = co_await via.multi_get(names);  // one request, every node's progress
    std::vector<schema::NodeProgress> nodes;
    for (std::size_t k = 0; k < values.size(); ++k) {
      if (!values[k]) continue;
      try {
        nodes.push_back(schema::decode_node_progress(names[k], *values[k]));
      } catch (const schema::CorruptValueError& e) {
        spdlog::debug("job view: {}", e.what());
      }
    }
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    schema::JobView view = schema::make_job_view(nodes, now);
    co_await via.set(key, schema::encode(view));
    on_view(std::move(view));
  } catch (const schema::CorruptValueError& e) {
    spdlog::debug("job view: {}", e.what());
  }
}

Task<WatchResult> NodeRendezvous::Impl::watch(Round a, std::chrono::seconds heartbeat,
                                              std::function<std::string()> progress,
                                              std::function<void(schema::JobView)> on_view) {
  struct Reset {  // the next watch starts afresh, however this one ends
    std::weak_ptr<char> alive;
    bool& flag;
    std::unique_ptr<RendezvousStore>& session;
    ~Reset() {
      if (alive.expired()) return;  // the frame outlived this object: nothing left to reset
      flag = false;
      session.reset();
    }
  } reset{alive_, watch_stop_requested_, watch_session_};
  try {
    if (watch_stop_requested_) co_return WatchResult{WatchResult::kStopped, -1};
    watch_session_ = co_await store_->open_watcher();
    if (watch_stop_requested_) co_return WatchResult{WatchResult::kStopped, -1};
    RendezvousStore& watcher = *watch_session_;
    // Each key, and what its deletion means.
    enum Event { kFailed, kLossNoticed, kNewcomer, kSuccessorGone };
    std::vector<std::string> names{schema::in_round(a.round, name::kHealthy),
                                   schema::in_round(a.round, name::kIntact)};
    std::vector<Event> events{kFailed, kLossNoticed};
    if (a.elastic) {
      names.push_back(schema::in_round(a.round, name::kNoNewcomers));
      events.push_back(kNewcomer);
    }
    if (const auto next = successor_key(a)) {
      names.push_back(*next);
      events.push_back(kSuccessorGone);
    }
    // Between events, a heartbeat for `dist-launch status`: the wall-clock time, and this node's
    // progress beside it (one request).
    // Every kJobViewInterval, the job view (node 0 makes it from every node's progress).
    const auto view_every = std::max<std::int64_t>(
        1, kJobViewInterval.count() / std::max<std::int64_t>(1, heartbeat.count()));
    int successor = (a.node_rank + 1) % a.num_nodes;
    std::optional<std::size_t> gone;
    for (std::int64_t beat = 1; !gone; ++beat) {
      co_await watcher.multi_set(schema::heartbeat_items(a.round, a.node_rank, progress));
      if (on_view && progress && beat % view_every == 0)
        co_await exchange_view(a, watcher, on_view);
      gone = co_await watcher.wait_deleted(names, heartbeat);
      if (!gone || events[*gone] != kSuccessorGone) continue;
      const auto next = co_await skip_departed(a, watcher, successor);
      if (!next) continue;  // lost
      if (next->empty()) {  // (the successor's key is the last one)
        names.pop_back();
        events.pop_back();
      } else {
        names[*gone] = *next;
      }
      gone.reset();
    }
    if (events[*gone] == kLossNoticed || events[*gone] == kSuccessorGone) {
      const std::string stop_key(schema::kLauncherStop);
      if (const auto stop = co_await watcher.try_get(stop_key)) {
        std::int64_t signal = 0;
        try {
          signal = schema::decode_int(stop_key, *stop);
        } catch (const schema::CorruptValueError& e) {
          spdlog::debug("{}", e.what());  // not the launcher's: the node is lost
        }
        if (signal > 0 && signal < NSIG) {
          co_return WatchResult{WatchResult::kLauncherStop, -1, static_cast<int>(signal)};
        }
      }
    }
    switch (events[*gone]) {
      case kFailed:
        co_return WatchResult{WatchResult::kFailed, -1};
      case kLossNoticed: {
        const std::string lost_key = schema::in_round(a.round, name::kLost);
        const auto lost = co_await watcher.try_get(lost_key);
        const int node = lost ? static_cast<int>(schema::decode_int(lost_key, *lost)) : -1;
        co_return WatchResult{WatchResult::kNodeLost, node};
      }
      case kNewcomer:
        co_return WatchResult{WatchResult::kNewcomer, -1};
      case kSuccessorGone:
        break;
    }
    co_await report_lost_successor(a, watcher, successor);
    co_return WatchResult{WatchResult::kNodeLost, successor};
  } catch (const store::StoreError& e) {
    if (e.code() != store::StoreErrc::kCancelled) throw;
  }
  co_return WatchResult{WatchResult::kStopped, -1};
}

void NodeRendezvous::Impl::stop_watch() {
  watch_stop_requested_ = true;
  if (watch_session_) watch_session_->close();
}

Task<BarrierEnd> NodeRendezvous::Impl::exit_barrier(Round a, milliseconds timeout, bool may_leave) {
  const std::string running = schema::in_round(a.round, name::kRunning);
  const std::string done = schema::in_round(a.round, name::kDone);
  const std::string healthy = schema::in_round(a.round, name::kHealthy);
  // Which nodes are counted: a node lost after it came here succeeded (its loss is no node's
  // business then). Said before it is counted, so that it is never counted twice.
  // (A relaunched node in its predecessor's place was counted by it: kAtBarrierCounted.)
  const std::string at_barrier = schema::in_round(a.round, name::kAtBarrier, a.node_rank);
  std::int64_t counted = 0;
  if (a.workers_succeeded) {
    // Its predecessor may have left already, past its barrier timeout (`left`): the node's part
    // is over, and the others do not wait for it; this agent leaves as it did.
    // (Not `may_leave && co_await ...`: GCC 12 runs a co_await whatever the && says.)
    if (may_leave) {
      const bool left =
          co_await store_->check(keys(schema::in_round(a.round, name::kLeft, a.node_rank)));
      if (left) co_return BarrierEnd{true, {}, true, true};
    }
    counted = co_await store_->add(done, 0);
  } else {
    co_await store_->set(at_barrier, std::string(schema::kAtBarrierSaid));
    counted = co_await store_->add(done, 1);
    co_await store_->set(at_barrier, std::string(schema::kAtBarrierCounted));
  }
  if (counted >= a.num_nodes) {
    co_await store_->delete_key(running);  // wakes the others
    co_return passed_without({});
  }
  // Each key, and what its deletion means.
  enum Event { kEveryone, kFailed, kLossNoticed, kSuccessorGone, kNewcomer, kDecided };
  std::vector<std::string> names{running, healthy, schema::in_round(a.round, name::kIntact)};
  std::vector<Event> events{kEveryone, kFailed, kLossNoticed};
  int successor = (a.node_rank + 1) % a.num_nodes;
  if (const auto next = successor_key(a)) {
    names.push_back(*next);
    events.push_back(kSuccessorGone);
  }
  // Elastic: a newcomer that got in before this node was done. Alone it ends nothing: every
  // node's workers may have finished too (the job is done then, and the newcomer told so). What
  // ends the round is a node acting on it (its workers still ran): its verdict, `undecided` gone.
  if (a.elastic) {
    names.push_back(schema::in_round(a.round, name::kNoNewcomers));
    events.push_back(kNewcomer);
  }
  auto deadline = steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - steady_clock::now());
    std::optional<std::size_t> gone;
    if (left > milliseconds(0)) gone = co_await store_->wait_deleted(names, left);
    if (!gone) {
      if (auto end = co_await past_barrier_timeout(a, deadline, timeout, may_leave)) co_return *end;
      continue;
    }
    // A node that passed the barrier may leave at once: only a count short of everyone, seen
    // after the trouble, means a failure, a lost node or a newcomer acted on.
    if (co_await store_->add(done, 0) >= a.num_nodes) co_return passed_without({});
    const std::size_t at = *gone;
    switch (events[at]) {
      case kEveryone: {  // short of everyone: the last node still there passed it without the lost
        // (A co_await's result in a local first: GCC 12 mishandles one in a braced initialiser
        // or an argument.)
        auto absent = co_await absent_nodes(a);
        co_return passed_without(std::move(absent));
      }
      case kNewcomer:
        names[at] = schema::in_round(a.round, name::kUndecided);
        events[at] = kDecided;
        continue;
      case kSuccessorGone:
        if (const auto next = co_await skip_departed(a, *store_, successor)) {
          if (next->empty()) {
            names.erase(names.begin() + static_cast<std::ptrdiff_t>(at));
            events.erase(events.begin() + static_cast<std::ptrdiff_t>(at));
          } else {
            names[at] = *next;
          }
          continue;
        }
        co_await report_lost_successor(a, *store_, successor);
        break;
      case kLossNoticed:
        break;
      case kFailed:
      case kDecided:
        co_return BarrierEnd{};  // the round ended
    }
    const bool healthy_still = co_await store_->check(keys(healthy));
    if (!healthy_still) co_return BarrierEnd{};  // a failure too
    co_return co_await pass_without_lost(a, deadline, timeout, may_leave);
  }
}

// Not every node finished within --exit-barrier-timeout, and this node's workers did: like
// torchrun's agent it leaves with 0 (the others run on: it says so, `left`, so that they do not
// take it for lost), unless it serves a store that they use (the rendezvous's, or the workers':
// node 0), whose loss would end their job; then it says why, and waits on (another timeout).
Task<std::optional<BarrierEnd>> NodeRendezvous::Impl::past_barrier_timeout(
    const Round& a, steady_clock::time_point& deadline, milliseconds timeout, bool may_leave) {
  const std::string waited = seconds_text(timeout);
  if (may_leave) {
    co_await store_->set(schema::in_round(a.round, name::kLeft, a.node_rank), "1");
    co_return BarrierEnd{true, {}, true};
  }
  notice("exit barrier of round " + std::to_string(a.round) + ": not every node finished within " +
         waited +
         " (--exit-barrier-timeout); this node serves a store the others still use (the "
         "rendezvous's, or node 0's, the workers'), so it waits on for them");
  deadline = steady_clock::now() + timeout;
  co_return std::nullopt;
}

// A node was lost while this one waited at its exit barrier, and no worker failed: the job is
// done once every node still there has succeeded, and the last of them to see it says so
// (`running` gone). Until then, elastic, the nodes whose workers still run finish too, or end the
// round (a failure, their verdict on the loss), or are lost as well; static, they restart it.
Task<BarrierEnd> NodeRendezvous::Impl::pass_without_lost(Round a, steady_clock::time_point deadline,
                                                         milliseconds timeout, bool may_leave) {
  const std::string running = schema::in_round(a.round, name::kRunning);
  const std::string done = schema::in_round(a.round, name::kDone);
  for (;;) {
    auto absent = co_await absent_nodes(a);
    const std::int64_t finished = co_await store_->add(done, 0);  // (those that left count)
    const bool complete = finished + static_cast<std::int64_t>(absent.size()) >= a.num_nodes;
    // Static: the round's one outcome, finished or restart, whichever node settles it first.
    // (Not `a.elastic ? ... : co_await ...`: GCC 12 runs a co_await whatever the condition says.)
    bool passes = complete;
    if (!a.elastic) passes = co_await settle_static(a.round, complete);
    if (passes) {
      if (complete) co_await store_->delete_key(running);  // (static: else the settler does)
      co_return passed_without(std::move(absent));
    }
    if (!a.elastic) co_return BarrierEnd{};
    std::vector<std::string> trouble{running, schema::in_round(a.round, name::kHealthy),
                                     schema::in_round(a.round, name::kUndecided)};
    const std::size_t first_node = trouble.size();
    const auto alive = liveness_keys(a, co_await members(a));
    const auto records = co_await store_->multi_get(alive);
    for (std::size_t n = 0; n < alive.size(); ++n) {
      if (static_cast<int>(n) != a.node_rank && records[n]) trouble.push_back(alive[n]);
    }
    std::optional<std::size_t> gone;
    while (!gone) {
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - steady_clock::now());
      if (left > milliseconds(0)) gone = co_await store_->wait_deleted(trouble, left);
      if (gone) break;
      if (auto end = co_await past_barrier_timeout(a, deadline, timeout, may_leave)) co_return *end;
    }
    const bool running_still = co_await store_->check(keys(running));
    if (!running_still) {
      auto gone_for_good = co_await absent_nodes(a);
      co_return passed_without(std::move(gone_for_good));
    }
    if (*gone < first_node) co_return BarrierEnd{};  // a failure, or a verdict: the round ended
  }
}

// The nodes of round a that are gone, but for those that came to their exit barrier first (their
// workers succeeded, and `done` counts them; some left it past its timeout): their liveness lost,
// or the one named lost (a relaunched static node takes its predecessor's liveness key again).
Task<std::vector<int>> NodeRendezvous::Impl::absent_nodes(Round a) {
  auto absent = co_await lost_nodes(a);
  const std::string lost_key = schema::in_round(a.round, name::kLost);
  if (const auto named = co_await store_->try_get(lost_key)) {
    const int node = static_cast<int>(schema::decode_int(lost_key, *named));
    if (std::find(absent.begin(), absent.end(), node) == absent.end()) absent.push_back(node);
  }
  if (absent.empty()) co_return absent;
  std::vector<std::string> marks;  // per node: left, at_barrier
  for (const int node : absent) {
    marks.push_back(schema::in_round(a.round, name::kLeft, node));
    marks.push_back(schema::in_round(a.round, name::kAtBarrier, node));
  }
  const auto counted = co_await store_->multi_get(marks);
  std::vector<int> lost;
  for (std::size_t i = 0; i < absent.size(); ++i) {
    if (!counted[2 * i] && !counted[2 * i + 1]) lost.push_back(absent[i]);
  }
  std::sort(lost.begin(), lost.end());
  co_return lost;
}

Task<void> NodeRendezvous::Impl::wait_for_others_to_leave(Round a, milliseconds timeout) {
  const auto deadline = steady_clock::now() + timeout;
  std::vector<std::string> others = liveness_keys(a, co_await members(a));
  others.erase(others.begin() + a.node_rank);
  for (auto& other : others) {  // one wait per node still there, each until it leaves
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - steady_clock::now());
    if (left <= milliseconds(0)) co_return;
    if (!co_await store_->wait_deleted(keys(std::move(other)), left)) co_return;
  }
  if (!a.elastic) co_return;
  // Then the nodes waiting for a place in the next round (the job was full, or finishing), so
  // that they learn its outcome (they look every kJobOverPoll) rather than lose the store. A
  // node that takes its ticket while these leave is waited for too.
  const std::string next_round_join = schema::in_round(a.round + 1, name::kJoin);
  for (std::int64_t seen = 0;;) {
    const std::int64_t waiting = co_await store_->add(next_round_join, 0);
    if (waiting <= seen) co_return;
    for (; seen < waiting; ++seen) {
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - steady_clock::now());
      if (left <= milliseconds(0)) co_return;
      const std::string record =
          schema::in_round(a.round + 1, name::kNode, static_cast<int>(seen + 1));
      if (!co_await store_->wait_deleted(keys(record), left)) co_return;
    }
  }
}

void NodeRendezvous::Impl::close() {
  stop_watch();
  store_->close();
}

// ---------------------------------------------------------------------------------------------
// NodeRendezvous

NodeRendezvous::NodeRendezvous(std::unique_ptr<RendezvousStore> session, JobShape shape,
                               RendezvousTimeouts timeouts,
                               std::function<void(const std::string&)> log)
    : impl_(
          std::make_unique<Impl>(std::move(session), std::move(shape), timeouts, std::move(log))) {}

NodeRendezvous::~NodeRendezvous() = default;

Task<Round> NodeRendezvous::join_static(int round, int node_rank) {
  return impl_->join_static(round, node_rank);
}
Task<Round> NodeRendezvous::join_elastic(int round, std::optional<Round> previous,
                                         std::optional<store::Endpoint> worker_store,
                                         bool keeps_workers) {
  return impl_->elastic.join_elastic(round, std::move(previous), std::move(worker_store),
                                     keeps_workers);
}
Task<int> NodeRendezvous::current_round() {
  return impl_->elastic.current_round();
}
Task<Verdict> NodeRendezvous::decide(Round a, int max_restarts) {
  return impl_->elastic.decide(std::move(a), max_restarts);
}
Task<bool> NodeRendezvous::mark_done(Round a, const std::vector<int>& lost) {
  std::string reason = lost.empty() ? "every node succeeded"
                                    : "every node still there succeeded (node(s) " +
                                          detail::node_list(lost) + " lost at the exit barrier)";
  if (a.elastic) return impl_->elastic.mark_done(std::move(a), std::move(reason));
  return impl_->mark_finished(std::move(a), std::move(reason));
}
Task<void> NodeRendezvous::mark_failed(Round a, std::string reason) {
  return impl_->mark_failed(std::move(a), std::move(reason));
}
Task<RecoveryClaim> NodeRendezvous::claim_recovery(Round a, Recovery kind, int workers,
                                                   int budget) {
  return impl_->claim_recovery(std::move(a), kind, workers, budget);
}
Task<RecoveryClaim> NodeRendezvous::take_over_recovery(Round a, std::string seen, int workers,
                                                       int budget) {
  return impl_->take_over_recovery(std::move(a), std::move(seen), workers, budget);
}
Task<void> NodeRendezvous::recovery_over(Round a) {
  return impl_->recovery_over(std::move(a));
}
Task<bool> NodeRendezvous::others_finished(Round a) {
  return impl_->others_finished(std::move(a));
}
Task<int> NodeRendezvous::replacements() {
  return impl_->replacements();
}
Task<void> NodeRendezvous::announce_failure(Round a, std::vector<WorkerFailure> failures) {
  return impl_->announce_failure(std::move(a), std::move(failures));
}
Task<std::vector<WorkerFailure>> NodeRendezvous::failures(Round a) {
  return impl_->failures(std::move(a));
}
Task<void> NodeRendezvous::publish_replacements(Round a, std::vector<InPlaceReplacement> replaced) {
  return impl_->publish_replacements(std::move(a), std::move(replaced));
}
Task<std::vector<InPlaceReplacement>> NodeRendezvous::replaced(Round a) {
  return impl_->replaced(std::move(a));
}
Task<WatchResult> NodeRendezvous::watch(Round a, std::chrono::seconds heartbeat,
                                        std::function<std::string()> progress,
                                        std::function<void(schema::JobView)> on_view) {
  return impl_->watch(std::move(a), heartbeat, std::move(progress), std::move(on_view));
}
void NodeRendezvous::stop_watch() {
  impl_->stop_watch();
}
Task<BarrierEnd> NodeRendezvous::exit_barrier(Round a, milliseconds timeout, bool may_leave) {
  return impl_->exit_barrier(std::move(a), timeout, may_leave);
}
Task<void> NodeRendezvous::wait_for_others_to_leave(Round a, milliseconds timeout) {
  return impl_->wait_for_others_to_leave(std::move(a), timeout);
}
void NodeRendezvous::close() {
  impl_->close();
}
std::string NodeRendezvous::describe() const {
  return impl_->store().describe();
}

}  // namespace dist::agent
