// Elastic rounds (--nnodes MIN:MAX, c10d): joining one, and the verdict that follows its end.
//
// A round, as one node lives it:
//
//   JOIN      take a ticket (ADD r<n>/join) and write the ephemeral record node/<ticket>; a node
//             back from round n-1 also counts itself in `returning`; the MIN-th ticket sets
//             `quorum`; a newcomer to round n > 0 wakes round n-1's nodes (deletes its
//             no_newcomers) unless that round was already full or finishing.
//   CLOSE?    close at once if the round is complete: MAX nodes in round 0; later, every survivor
//             of round n-1 back (its verdict's `expect`) with at least MIN nodes in. Only a node
//             whose own counts may have completed it looks (the MAX-th ticket; the last survivor
//             back, or a newcomer at or past MIN), so most nodes pay nothing here.
//   WAIT      for `quorum` (until the join timeout; not when its own ticket set it), then for
//             `assignment`; each last call that passes without one, close the round with
//             whoever is in (at least MIN).
//   ASSIGNED  the ticket is in the assignment: done.
//   EXCLUDED  it came after the close, or beyond MAX: JOIN round n+1 as a newcomer (a node whose
//             workers run on, regrouping: an error instead).
//
// Whoever claims `closed` first (COMPARE_SET) reads the records, orders them (rules.h), keeps at
// most MAX, gives the workers a clean store, publishes healthy / intact / running /
// no_newcomers / size / the round pointer / place/<ticket> / members, then `assignment`. Per round
// that is O(N) store traffic: a ticket, a record, a place and a few counters per node, and one
// read of every record by the closer.
//
// Each store request below is paid by every node at every round (a survivor's also by the
// verdict before it): the counts per node and per survivor are guarded by the tests
// rendezvous.requests.* (bench/CMakeLists.txt) and measured by bench/rendezvous_bench.cc --by-op.
// A verdict, once settled, never changes (COMPARE_SET from nothing): each node keeps those it
// read, and reads each at most once.
#include <algorithm>

#include "dist/store/errors.h"
#include "rendezvous/rendezvous_detail.h"
#include "rendezvous/rendezvous_impl.h"
#include "rendezvous/rules.h"

namespace dist::agent {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
namespace name = schema::name;

// How long a closer waits for records whose tickets were taken but not yet written.
constexpr milliseconds kRecordGrace{2000};
// How long a node waits for another node's verdict before deciding itself.
constexpr milliseconds kDecisionGrace{10'000};
// How often a node waiting to join looks whether the job ended meanwhile.
constexpr milliseconds kJobOverPoll{1000};

// What every node of a closed round shares: its keys and totals (a node adds its own place).
Round closed_round(int round, const schema::RoundTotals& totals) {
  Round a;
  a.round = round;
  a.elastic = true;
  a.alive_prefix = schema::in_round(round, name::kNode) + "/";
  a.members_key = schema::in_round(round, name::kMembers);
  a.restarts = totals.restarts;
  a.world_size = totals.world_size;
  a.num_nodes = totals.num_nodes;
  a.returning = totals.returning;
  a.continues = totals.continues;
  return a;
}

}  // namespace

RendezvousStore& ElasticRendezvous::store() {
  return *node_.store_;
}
const JobShape& ElasticRendezvous::shape() const {
  return node_.shape_;
}
const RendezvousTimeouts& ElasticRendezvous::timeouts() const {
  return node_.timeouts_;
}

std::string ElasticRendezvous::claim() const {
  return std::to_string(node_.nonce_) + "/" + std::to_string(::getpid());
}

Task<int> ElasticRendezvous::current_round() {
  const std::string pointer(schema::kRoundPointer);
  const auto value = co_await store().try_get(pointer);
  if (!value) co_return 0;
  co_return static_cast<int>(schema::decode_int(pointer, *value));
}

Task<Round> ElasticRendezvous::join_elastic(int round, std::optional<Round> previous,
                                            std::optional<store::Endpoint> worker_store,
                                            bool keeps_workers) {
  // A node whose workers run on waits at most --in-place-timeout (JobShape::in_place_wait): past
  // it they stop, and the node joins afresh.
  const bool in_place = keeps_workers && shape().in_place_wait.count() > 0;
  auto deadline = steady_clock::now() +
                  (in_place ? std::min(timeouts().join, shape().in_place_wait) : timeouts().join);
  for (int n = round;; ++n) {
    co_await throw_if_job_over(n);
    // (A plain local: GCC 12 mishandles a conditional's temporary inside a co_await.)
    std::optional<Round> back_from;
    if (n == round) back_from = previous;
    std::optional<store::Endpoint> offer = worker_store;  // (each round's record offers it)
    Ticket ticket;
    if (withdrawn_ && withdrawn_->first == n) {  // its own, again: its record anew
      ticket = withdrawn_->second;
      withdrawn_.reset();
      co_await write_record(n, ticket.number, std::move(back_from), std::move(offer), false);
    } else {
      ticket =
          co_await take_ticket(n, std::move(back_from), std::move(offer), keeps_workers);  // JOIN
    }
    co_await throw_if_job_over(n);  // (again: the store's host waits only for tickets it saw)
    co_await close_if_complete(n, ticket);  // CLOSE?
    std::optional<Round> a;
    std::exception_ptr failed;
    try {
      a = co_await await_assignment(n, ticket, deadline, in_place);  // WAIT
    } catch (const RendezvousError&) {
      failed = std::current_exception();
    }
    if (failed && keeps_workers) {
      // Past the deadline its workers stop; the round closing meanwhile with this node in it is
      // joined all the same (a closer read its record already).
      a = co_await withdraw(n, ticket);
      if (a) co_return *a;
    }
    if (failed) std::rethrow_exception(failed);
    if (a) co_return *a;
    // EXCLUDED: on to the next round, as a newcomer; unless the node's workers run on (a
    // regroup): a later round cannot continue them, and its others must not wait on them.
    if (keeps_workers) {
      throw RendezvousError("round " + std::to_string(n) +
                            " closed without this node: its running workers cannot go on in it");
    }
    // A hot spare's timeout counts from the end of the round it waited on, however long that
    // ran: afresh now, as round n closed (and runs) without it.
    if (ticket.spare) deadline = steady_clock::now() + timeouts().join;
  }
}

Task<ElasticRendezvous::Ticket> ElasticRendezvous::take_ticket(
    int round, std::optional<Round> previous, std::optional<store::Endpoint> worker_store,
    bool keeps_workers) {
  const bool returning = previous && previous->round == round - 1;
  const int ticket =  // ADD join
      static_cast<int>(co_await store().add(schema::in_round(round, name::kJoin), 1));
  co_await write_record(round, ticket, std::move(previous),
                        std::move(worker_store),  // SET node/<t>
                        keeps_workers);
  Ticket taken{ticket, false, 0};
  if (returning) {  // ADD returning: read after this node's ticket (close_if_complete)
    taken.returning =
        static_cast<int>(co_await store().add(schema::in_round(round, name::kReturning), 1));
  }
  // SET quorum: one node, the MIN-th (nodes waiting for it also count the tickets at each last
  // call, should that node vanish before setting it).
  if (ticket == shape().min_nodes)
    co_await store().set(schema::in_round(round, name::kQuorum), "1");
  // A newcomer: the running round makes room, unless it is full or already finishing (a node's
  // workers all succeeded): then the newcomer waits for the next round, if there is one. A round
  // already decided runs no more: its nodes are on their way here (a lost node's survivors
  // waiting in place for one, say).
  // (Not `... && !co_await verdict_of(...)`: GCC 12 runs a co_await whatever the left side says.)
  bool decided = false;
  if (!returning && round > 0) {
    const auto before = co_await verdict_of(round - 1);
    decided = before.has_value();
  }
  if (!returning && round > 0 && !decided) {
    const std::string size_key = schema::in_round(round - 1, name::kSize);
    const auto size = co_await store().try_get(size_key);
    const bool finishing = co_await store().check(keys(schema::in_round(round - 1, name::kDone)));
    if (size && schema::decode_int(size_key, *size) < shape().max_nodes && !finishing) {
      co_await store().delete_key(schema::in_round(round - 1, name::kNoNewcomers));
    } else if (size) {
      node_.notice("round " + std::to_string(round - 1) +
                   (finishing ? " is finishing" : " is full") + ": waiting for a place in round " +
                   std::to_string(round));
      taken.spare = true;
    }
  }
  co_return taken;
}

Task<void> ElasticRendezvous::write_record(int round, int ticket, std::optional<Round> previous,
                                           std::optional<store::Endpoint> worker_store,
                                           bool keeps_workers) {
  const bool returning = previous && previous->round == round - 1;
  schema::NodeRecord record = node_.self_;
  record.previous_rank = returning ? previous->node_rank : -1;
  record.worker_store = std::move(worker_store);
  record.keeps_workers = returning && keeps_workers;
  co_await store().set_ephemeral(schema::in_round(round, name::kNode, ticket),
                                 schema::encode(record));
}

// The round is complete once both of its counts are: tickets (at least MIN; round 0, MAX) and,
// after round 0, survivors back (`returning`, the previous verdict's `expect`). Each node knows
// the counts its own ADDs returned, and reads the other only where those say it may be the one
// completing the round: the MAX-th ticket in round 0; later, the survivor whose ADD reached
// `expect`, or a newcomer at or past MIN. Of two nodes completing the two counts together, the
// later one reads the other's count after it was made, so one of them closes. A node that
// vanished between its ADD and its look leaves the round to the others' last call.
Task<void> ElasticRendezvous::close_if_complete(int round, Ticket ticket) {
  if (round == 0) {
    if (ticket.number >= shape().max_nodes) co_await try_close(round, ticket.number);
    co_return;
  }
  const bool returning = ticket.returning > 0;
  if (!returning && ticket.number < shape().min_nodes) co_return;  // not MIN yet: a later one's
  const auto previous = co_await verdict_of(round - 1);  // a survivor's: decided, so known
  if (!previous) co_return;                              // round n-1 runs on: not complete
  std::int64_t count = ticket.number;
  if (returning) {
    if (ticket.returning < previous->expect) co_return;  // survivors still on their way
    if (count < shape().min_nodes) {                     // ADD join 0: newcomers since?
      count = co_await store().add(schema::in_round(round, name::kJoin), 0);
      if (count < shape().min_nodes) co_return;
    }
  } else if (co_await store().add(schema::in_round(round, name::kReturning), 0) <
             previous->expect) {  // ADD returning 0: a newcomer's look at the survivors
    co_return;
  }
  co_await try_close(round, count);
}

Task<bool> ElasticRendezvous::try_close(int round, std::optional<std::int64_t> taken) {
  const std::string join = schema::in_round(round, name::kJoin);
  if (!taken) taken = co_await store().add(join, 0);
  if (*taken < shape().min_nodes) co_return false;
  int restarts = 0;
  if (round > 0) {  // the previous round must have ended: its nodes are on their way here
    const auto previous = co_await verdict_of(round - 1);
    if (!previous || previous->action == Verdict::kFail || previous->action == Verdict::kDone) {
      co_return false;
    }
    restarts = previous->restarts;
  }
  // `closed` is the closer's claim: one node reads the records, the others give up after one
  // request. A ticket taken after the count below belongs to the next round.
  const std::string closed = schema::in_round(round, name::kClosed);
  if (co_await store().check(keys(closed))) co_return false;
  if (co_await store().compare_set(closed, "", claim()) != claim()) co_return false;
  const int count = static_cast<int>(co_await store().add(join, 0));

  std::vector<std::string> record_keys;
  for (int t = 1; t <= count; ++t) record_keys.push_back(schema::in_round(round, name::kNode, t));
  // Tickets taken a moment ago: their records are on their way, or their nodes died since. Too
  // few to close with after kRecordGrace, the closer waits for the rest until the last call (it
  // is the only node that looked: a slow writer's record must not leave the round to the others'
  // last calls).
  std::vector<std::optional<std::string>> records;
  for (const auto grace : {kRecordGrace, timeouts().last_call}) {
    co_await store().wait(record_keys, grace);
    records = co_await store().multi_get(record_keys);
    const auto present =
        std::count_if(records.begin(), records.end(), [](const auto& r) { return r.has_value(); });
    if (present >= shape().min_nodes || present == count) break;
  }
  std::vector<rules::Candidate> joined;
  for (int t = 1; t <= count; ++t) {
    const auto& record = records[static_cast<std::size_t>(t - 1)];
    if (!record) continue;
    joined.push_back(
        {t, schema::decode_node_record(record_keys[static_cast<std::size_t>(t - 1)], *record)});
  }
  const auto members = rules::choose_members(std::move(joined), shape().max_nodes);
  if (static_cast<int>(members.size()) < shape().min_nodes) {  // some left after their ticket
    co_await store().delete_key(closed);
    co_return false;
  }
  std::vector<std::pair<std::string, std::string>> items{
      {schema::in_round(round, name::kQuorum), "1"},  // wakes any node still waiting for MIN
      {schema::in_round(round, name::kHealthy), "1"},
      {schema::in_round(round, name::kIntact), "1"},
      {schema::in_round(round, name::kRunning), "1"},
      {schema::in_round(round, name::kNoNewcomers), "1"},
      {schema::in_round(round, name::kUndecided), "1"},
      {schema::in_round(round, name::kSize), std::to_string(members.size())},
      {schema::in_round(round, name::kWorkerStore),
       schema::encode_endpoint(members.front().record.worker_store)},
      {std::string(schema::kRoundPointer), std::to_string(round + 1)}};
  co_await store().multi_set(std::move(items));
  // Each member reads only its own place and the round's totals: O(1) per node. The member list
  // is for the few that need every node (a verdict's decider, the store's host, status).
  std::vector<int> tickets, sizes;
  for (const auto& m : members) {
    tickets.push_back(m.ticket);
    sizes.push_back(m.record.local_world_size);
  }
  const auto placement = rules::place(tickets, sizes);
  std::vector<std::pair<std::string, std::string>> places;
  for (std::size_t i = 0; i < members.size(); ++i) {
    places.emplace_back(schema::in_round(round, name::kPlace, tickets[i]),
                        schema::encode(placement.places[i]));
  }
  places.emplace_back(schema::in_round(round, name::kMembers), schema::encode_members(tickets));
  co_await store().multi_set(std::move(places));
  // In place, the round continues the previous one's running workers when its node 0 was that
  // round's node 0 and kept them: the workers' store is theirs (regroup, in the agent).
  const auto& first = members.front().record;
  const int returning = static_cast<int>(std::count_if(
      members.begin(), members.end(), [](const auto& m) { return m.record.previous_rank >= 0; }));
  co_await store().set(schema::in_round(round, name::kAssignment),
                       schema::encode(schema::RoundTotals{
                           restarts, placement.world_size, static_cast<int>(members.size()),
                           returning, first.keeps_workers && first.previous_rank == 0}));
  co_return true;
}

Task<std::optional<Round>> ElasticRendezvous::await_assignment(int round, Ticket ticket,
                                                               steady_clock::time_point deadline,
                                                               bool in_place) {
  const std::string quorum = schema::in_round(round, name::kQuorum);
  const std::string published = schema::in_round(round, name::kAssignment);
  const std::string join = schema::in_round(round, name::kJoin);
  auto too_late = [&](const std::string& what, std::int64_t count) {
    if (steady_clock::now() < deadline) return;
    if (in_place) {
      throw RendezvousError("elastic round " + std::to_string(round) + " " + what +
                            " while this node's workers waited in place (--in-place-timeout): " +
                            std::to_string(count) + " node(s) joined, at least " +
                            std::to_string(shape().min_nodes) + " needed");
    }
    throw RoundTimeoutError("elastic round " + std::to_string(round) + " " + what + " within " +
                            "join_timeout: " + std::to_string(count) +
                            " node(s) joined, at least " + std::to_string(shape().min_nodes) +
                            " needed; start more agents with the same --rdzv-endpoint and "
                            "--rdzv-id, or raise --rdzv-conf join_timeout");
  };
  // Each wait is at most kJobOverPoll long: a node waiting for a place (the job full, or
  // finishing) learns within it that the job ended, and leaves with the job's outcome.
  const auto poll = std::min(timeouts().last_call, kJobOverPoll);
  auto last_call = steady_clock::now() + timeouts().last_call;
  bool running = ticket.spare;  // a spare found the round before running (full, or finishing)
  auto at_last_call = [&] {
    const auto now = steady_clock::now();
    if (now < last_call && now < deadline) return false;
    last_call = now + timeouts().last_call;
    return true;
  };
  // Until MIN nodes are in (a node whose ticket reached MIN set `quorum` itself).
  if (ticket.number < shape().min_nodes) {
    while (!co_await store().wait(keys(quorum), detail::until(deadline, poll))) {
      co_await throw_if_job_over(round);
      if (!at_last_call()) continue;
      const auto count = co_await store().add(join, 0);
      if (count >= shape().min_nodes) break;  // the MIN-th node vanished before setting quorum
      node_.notice("waiting for more nodes to join elastic round " + std::to_string(round) + ": " +
                   std::to_string(count) + " of at least " + std::to_string(shape().min_nodes) +
                   " in");
      if (ticket.spare) co_await extend_while_running(round, deadline, running);
      too_late("did not reach its minimum", count);
    }
  }
  // Until the round closes: after each last call, close it with whoever is in.
  last_call = steady_clock::now() + timeouts().last_call;
  while (!co_await store().wait(keys(published), detail::until(deadline, poll))) {
    co_await throw_if_job_over(round);
    if (!at_last_call()) continue;
    if (co_await try_close(round)) break;
    if (ticket.spare) {
      co_await extend_while_running(round, deadline, running);  // (deciding it if abandoned)
    } else if (round > 0) {
      co_await decide_if_abandoned(round - 1);
    }
    too_late("did not close", co_await store().add(join, 0));
  }

  co_return co_await read_assignment(round, ticket);
}

Task<std::optional<Round>> ElasticRendezvous::read_assignment(int round, Ticket ticket) {
  const std::string published = schema::in_round(round, name::kAssignment);
  // One request: this node's place, the round's totals and its workers' store.
  const std::string place_key = schema::in_round(round, name::kPlace, ticket.number);
  const auto values = co_await store().multi_get(
      keys(place_key, published, schema::in_round(round, name::kWorkerStore)));
  if (!values[0]) co_return std::nullopt;
  if (!values[1]) throw RendezvousError("round " + std::to_string(round) + " lost its assignment");
  const auto p = schema::decode_place(place_key, *values[0]);
  Round a = closed_round(round, schema::decode_round_totals(published, *values[1]));
  a.node_rank = p.node_rank;
  a.rank_offset = p.rank_offset;
  a.successor_id = p.successor;
  a.worker_store =
      schema::decode_endpoint(schema::in_round(round, name::kWorkerStore), values[2].value_or(""));
  co_return a;
}

// The round's `closed` claimed by this node, no closer reads the records meanwhile: the record goes
// (a ticket without a record is no member), the claim is given back, and the ticket is the node's
// again once its workers stopped (withdrawn_): the round counts it once, and closes with it and
// whoever joined since, as a restart's round would. Claimed by another node: that closer's outcome
// (the assignment, or its claim given back, within its wait for records), then again.
Task<std::optional<Round>> ElasticRendezvous::withdraw(int round, Ticket ticket) {
  const std::string closed = schema::in_round(round, name::kClosed);
  const std::string published = schema::in_round(round, name::kAssignment);
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (co_await store().compare_set(closed, "", claim()) == claim()) {
      co_await store().delete_key(schema::in_round(round, name::kNode, ticket.number));
      co_await store().delete_key(closed);
      withdrawn_.emplace(round, ticket);
      co_return std::nullopt;
    }
    if (co_await store().wait(keys(published), kRecordGrace + timeouts().last_call)) {
      co_return co_await read_assignment(round, ticket);
    }
  }
  co_return std::nullopt;  // a closer that never ends: the record stays, counted twice at worst
}

Task<std::optional<Verdict>> ElasticRendezvous::verdict_of(int round) {
  if (const auto known = verdicts_.find(round); known != verdicts_.end()) co_return known->second;
  const std::string key = schema::in_round(round, name::kVerdict);
  const auto text = co_await store().try_get(key);  // GET verdict, until there is one
  if (!text) co_return std::nullopt;
  co_return remember(round, schema::decode_verdict(key, *text));
}

Verdict ElasticRendezvous::remember(int round, Verdict verdict) {
  if (verdicts_.size() >= kVerdictsKept) verdicts_.erase(verdicts_.begin());  // the oldest round
  verdicts_.insert_or_assign(round, verdict);
  return verdict;
}

Task<bool> ElasticRendezvous::runs_on(int round) {
  if (round < 0) co_return false;
  // (Plain locals: GCC 12 miscompiled these co_awaits written inside the `if` and the
  // `co_return`: SIGILL at the first call.)
  const auto verdict = co_await verdict_of(round);
  if (verdict) co_return false;
  const bool closed = co_await store().check(keys(schema::in_round(round, name::kAssignment)));
  co_return closed;
}

Task<void> ElasticRendezvous::extend_while_running(int round, steady_clock::time_point& deadline,
                                                   bool& running) {
  // (Without this, a round whose nodes were all killed before any wrote its verdict would run
  // on for ever in a spare's eyes, over a store that outlives them: etcd, an external one.)
  co_await decide_if_abandoned(round - 1);
  const bool runs = co_await runs_on(round - 1);
  const auto now = steady_clock::now();
  if (!runs) {
    if (running) deadline = std::max(deadline, now + timeouts().join);  // it has just ended
    running = false;
    co_return;
  }
  running = true;
  if (now < deadline) co_return;
  deadline = now + timeouts().join;
  node_.notice("round " + std::to_string(round - 1) + " runs on: waiting for a place in round " +
               std::to_string(round) + " as a hot spare (join_timeout counts from its end)");
}

Task<void> ElasticRendezvous::decide_if_abandoned(int round) {
  if (co_await verdict_of(round)) co_return;
  const std::string published = schema::in_round(round, name::kAssignment);
  const auto totals_text = co_await store().try_get(published);
  if (!totals_text) co_return;  // it never closed: its nodes are joining the same round as we
  const Round a = closed_round(round, schema::decode_round_totals(published, *totals_text));
  const auto lost = co_await node_.lost_nodes(a);
  if (static_cast<int>(lost.size()) < a.num_nodes) co_return;  // a node of it lives: its call
  node_.notice("every node of round " + std::to_string(round) +
               " is gone without a verdict: deciding it");
  co_await decide(a, shape().max_restarts);
}

Task<void> ElasticRendezvous::throw_if_job_over(int round) {
  if (round == 0) co_return;
  const auto previous = co_await verdict_of(round - 1);
  if (previous && previous->action == Verdict::kFail) {
    throw JobOverError(
        "the job failed in round " + std::to_string(round - 1) + ": " + previous->reason, false);
  }
  if (previous && previous->action == Verdict::kDone) {
    throw JobOverError("the job already finished (round " + std::to_string(round - 1) + ")", true);
  }
}

Task<Verdict> ElasticRendezvous::decide(Round a, int max_restarts) {
  if (auto v = co_await verdict_of(a.round)) co_return *v;
  // One node decides (and counts the lost nodes, O(N)); the others wait for its verdict, and
  // decide themselves only if it vanished meanwhile.
  const std::string verdict_key = schema::in_round(a.round, name::kVerdict);
  if (co_await store().compare_set(schema::in_round(a.round, name::kDeciding), "", claim()) !=
      claim()) {
    if (co_await store().wait(keys(verdict_key), kDecisionGrace)) {
      if (auto v = co_await verdict_of(a.round)) co_return *v;
    }
  }
  rules::RoundEnd end;
  end.worker_failed = !co_await store().check(keys(schema::in_round(a.round, name::kHealthy)));
  end.newcomer = !co_await store().check(keys(schema::in_round(a.round, name::kNoNewcomers)));
  end.lost = co_await node_.lost_nodes(a);
  end.num_nodes = a.num_nodes;
  end.restarts = a.restarts;
  end.replacements = co_await node_.replacements();  // --restart-policy in-place: the job's so far
  end.in_place = shape().in_place_wait.count() > 0;
  // Newcomers already waiting in the next round count towards its minimum (no node of this round
  // has joined it yet: they all wait for this verdict).
  end.waiting = co_await store().add(schema::in_round(a.round + 1, name::kJoin), 0);
  const Verdict v = rules::decide(end, max_restarts, shape().min_nodes);
  const std::string ours = schema::encode(v);
  const Verdict settled = co_await settle(a.round, ours);
  // The survivors waiting in place for a node (too few without one) spend a restart, as the
  // restart they replace would: counted once, by the node whose verdict it is.
  const int alive = a.num_nodes - static_cast<int>(end.lost.size());
  if (v.action == Verdict::kReshape && alive + end.waiting < shape().min_nodes &&
      schema::encode(settled) == ours) {
    co_await node_.count_replacement();
  }
  co_return settled;
}

// The round's one verdict: this one, unless another node's came first; and `undecided` goes,
// waking the nodes that wait at the exit barrier for someone to act on a newcomer.
Task<Verdict> ElasticRendezvous::settle(int round, std::string verdict) {
  const std::string verdict_key = schema::in_round(round, name::kVerdict);
  const std::string settled = co_await store().compare_set(verdict_key, "", std::move(verdict));
  co_await store().delete_key(schema::in_round(round, name::kUndecided));
  co_return remember(round, schema::decode_verdict(verdict_key, settled));
}

Task<bool> ElasticRendezvous::mark_done(Round a, std::string reason) {
  Verdict v;
  v.action = Verdict::kDone;
  v.restarts = a.restarts;
  v.reason = std::move(reason);
  co_return (co_await settle(a.round, schema::encode(v))).action == Verdict::kDone;
}

}  // namespace dist::agent
