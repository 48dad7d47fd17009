// Elastic rounds (--nnodes MIN:MAX, c10d): NodeRendezvous::join_elastic() and the verdict that
// follows a round's end.
//
// A round, as one node lives it:
//
//   JOIN      take a ticket (ADD r<n>/join) and write the ephemeral record node/<ticket>; a node
//             back from round n-1 also counts itself in `returning`; once the tickets reach MIN,
//             `quorum` is set; a newcomer to round n > 0 wakes round n-1's nodes (deletes its
//             no_newcomers) unless that round was already full.
//   CLOSE?    close at once if the round is complete: MAX nodes in round 0; later, every survivor
//             of round n-1 back (its verdict's `expect`) with at least MIN nodes in.
//   WAIT      for `quorum` (until join_timeout), then for `assignment`; each last_call_timeout that
//             passes without one, close the round with whoever is in (at least MIN).
//   ASSIGNED  the ticket is in the assignment: done.
//   EXCLUDED  it came after the close, or beyond MAX: JOIN round n+1 as a newcomer.
//
// Whoever claims `closed` first (COMPARE_SET) reads the records, orders them (round n-1's nodes
// in their old order, then newcomers by host and pid), keeps at most MAX, gives the workers a clean
// store, publishes healthy / no_newcomers / size / the round pointer / place/<ticket> / members,
// then `assignment`. Per round that is O(N) store traffic: a ticket, a record, a place and a few
// counters per node, and one read of every record by the closer.
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>

#include "node_rendezvous.h"
#include "rendezvous_detail.h"

namespace dist::agent {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

// How long a closer waits for records whose tickets were taken but not yet written.
constexpr milliseconds kRecordGrace{2000};
// How long a node waits for another node's verdict before deciding itself.
constexpr milliseconds kDecisionGrace{10'000};

struct Candidate {
  int ticket = 0;
  std::string host;
  int local_world_size = 0;
  int pid = 0;
  std::uint32_t nonce = 0;
  int previous_rank = -1;  // its node rank in the previous round, -1 for a newcomer

  // The previous round's nodes keep their order; newcomers follow, by host and pid.
  bool operator<(const Candidate& o) const {
    const bool returning = previous_rank >= 0, other_returning = o.previous_rank >= 0;
    if (returning != other_returning) return returning;
    if (returning) return previous_rank < o.previous_rank;
    return std::tie(host, pid, nonce) < std::tie(o.host, o.pid, o.nonce);
  }
};

const char* action_name(Verdict::Action a) {
  switch (a) {
    case Verdict::kRestart:
      return "restart";
    case Verdict::kReshape:
      return "reshape";
    case Verdict::kFail:
      return "fail";
    case Verdict::kDone:
      return "done";
  }
  return "?";
}

std::string to_json(const Verdict& v) {
  return json{{"action", action_name(v.action)},
              {"expect", v.expect},
              {"restarts", v.restarts},
              {"reason", v.reason}}
      .dump();
}

Verdict verdict_from_json(const std::string& text) {
  const json j = json::parse(text);
  Verdict v;
  const std::string action = j.at("action");
  v.action = action == "restart" ? Verdict::kRestart
             : action == "fail"  ? Verdict::kFail
             : action == "done"  ? Verdict::kDone
                                 : Verdict::kReshape;
  v.expect = j.value("expect", 0);
  v.restarts = j.value("restarts", 0);
  v.reason = j.value("reason", "");
  return v;
}

milliseconds until(steady_clock::time_point deadline, milliseconds at_most) {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - steady_clock::now());
  return std::clamp(left, milliseconds(1), at_most);
}

bool is_timeout(const rendezvous::StoreError& e) {
  return e.code() == rendezvous::StoreErrc::kTimeout;
}

}  // namespace

int NodeRendezvous::current_round() {
  const auto pointer = client_.try_get(key("round"));
  return pointer ? std::stoi(*pointer) : 0;
}

Assignment NodeRendezvous::join_elastic(int round, const Assignment* previous,
                                        milliseconds join_timeout, milliseconds last_call_timeout) {
  const auto deadline = steady_clock::now() + join_timeout;
  for (int n = round;; ++n) {
    throw_if_job_over(n);
    const int ticket = take_ticket(n, n == round ? previous : nullptr);                // JOIN
    close_if_complete(n);                                                              // CLOSE?
    if (auto a = await_assignment(n, ticket, deadline, last_call_timeout)) return *a;  // WAIT
    // EXCLUDED: on to the next round, as a newcomer.
  }
}

int NodeRendezvous::take_ticket(int round, const Assignment* previous) {
  const bool returning = previous && previous->round == round - 1;
  const int ticket = static_cast<int>(client_.add(round_key(round, "join"), 1));
  const std::string record = json{{"host", shape_.host},
                                  {"local_world_size", shape_.local_world_size},
                                  {"pid", ::getpid()},
                                  {"nonce", nonce_},
                                  {"previous_rank", returning ? previous->node_rank : -1}}
                                 .dump();
  client_.set(round_key(round, "node/" + std::to_string(ticket)), record, /*ephemeral=*/true);
  if (returning) client_.add(round_key(round, "returning"), 1);
  if (ticket >= shape_.min_nodes) client_.set(round_key(round, "quorum"), "1");
  if (!returning && round > 0) {
    // A newcomer: the running round makes room, unless it is full or already finishing (a node's
    // workers all succeeded): then the newcomer waits for the next round, if there is one.
    const auto size = client_.try_get(round_key(round - 1, "size"));
    const auto finishing = client_.try_get(round_key(round - 1, "done"));
    if (size && std::stoi(*size) < shape_.max_nodes && !finishing) {
      client_.delete_key(round_key(round - 1, "no_newcomers"));
    }
  }
  return ticket;
}

void NodeRendezvous::close_if_complete(int round) {
  // Read after this node's own ADDs: of two nodes completing the round together, the later one
  // sees both counts.
  const auto count = client_.add(round_key(round, "join"), 0);
  if (round == 0) {
    if (count >= shape_.max_nodes) try_close(round);
    return;
  }
  const auto previous = verdict_of(round - 1);
  if (!previous || count < shape_.min_nodes) return;
  if (client_.add(round_key(round, "returning"), 0) >= previous->expect) try_close(round);
}

bool NodeRendezvous::try_close(int round) {
  if (client_.add(round_key(round, "join"), 0) < shape_.min_nodes) return false;
  int restarts = 0;
  if (round > 0) {  // the previous round must have ended: its nodes are on their way here
    const auto previous = verdict_of(round - 1);
    if (!previous || previous->action == Verdict::kFail || previous->action == Verdict::kDone) {
      return false;
    }
    restarts = previous->restarts;
  }
  // `closed` is the closer's claim: one node reads the records, the others give up after one
  // request. A ticket taken after the count below belongs to the next round.
  const std::string closed = round_key(round, "closed");
  const std::string closer = std::to_string(nonce_) + "/" + std::to_string(::getpid());
  if (client_.check({closed}) || client_.compare_set(closed, "", closer) != closer) return false;
  const int count = static_cast<int>(client_.add(round_key(round, "join"), 0));

  std::vector<std::string> keys;
  for (int t = 1; t <= count; ++t) keys.push_back(round_key(round, "node/" + std::to_string(t)));
  std::vector<std::optional<std::string>> records(keys.size());
  try {
    client_.wait(keys, kRecordGrace);  // tickets taken a moment ago, records on their way
    const auto values = client_.multi_get(keys);
    std::copy(values.begin(), values.end(), records.begin());
  } catch (const rendezvous::StoreError& e) {  // a joiner died between ticket and record
    if (!is_timeout(e) && e.code() != rendezvous::StoreErrc::kNotFound) throw;
    for (std::size_t i = 0; i < keys.size(); ++i) records[i] = client_.try_get(keys[i]);
  }
  std::vector<Candidate> members;
  for (int t = 1; t <= count; ++t) {
    const auto& record = records[static_cast<std::size_t>(t - 1)];
    if (!record) continue;
    const json j = json::parse(*record);
    members.push_back({t, j.value("host", "?"), j.value("local_world_size", 0), j.value("pid", 0),
                       j.value("nonce", 0u), j.value("previous_rank", -1)});
  }
  std::sort(members.begin(), members.end());
  if (static_cast<int>(members.size()) > shape_.max_nodes) members.resize(shape_.max_nodes);
  if (static_cast<int>(members.size()) < shape_.min_nodes) {  // some left after their ticket
    client_.delete_key(closed);
    return false;
  }
  // Torch workers key the store by restart count, which a reshaped round does not advance: every
  // round after the first starts its workers on a clean store (the agents' keys stay).
  if (round > 0) client_.delete_all_except("rdzv/");
  client_.multi_set({{round_key(round, "healthy"), "1"},
                     {round_key(round, "intact"), "1"},
                     {round_key(round, "no_newcomers"), "1"},
                     {round_key(round, "size"), std::to_string(members.size())},
                     {key("round"), std::to_string(round + 1)}});
  // Each member reads only its own place (node rank, first global rank, the next node's ticket
  // for its watch) and the round's totals: O(1) per node. The member list is for the few that
  // need every node (a verdict's decider, the store's host, status).
  std::vector<std::pair<std::string, std::string>> places;
  std::string list;
  int offset = 0;
  const std::size_t n = members.size();
  for (std::size_t rank = 0; rank < n; ++rank) {
    const int successor = n > 1 ? members[(rank + 1) % n].ticket : -1;
    places.emplace_back(
        round_key(round, "place/" + std::to_string(members[rank].ticket)),
        std::to_string(rank) + " " + std::to_string(offset) + " " + std::to_string(successor));
    offset += members[rank].local_world_size;
    list += (rank ? "," : "") + std::to_string(members[rank].ticket);
  }
  places.emplace_back(round_key(round, "members"), list);
  client_.multi_set(places);
  client_.set(round_key(round, "assignment"),
              std::to_string(restarts) + " " + std::to_string(offset) + " " + std::to_string(n));
  return true;
}

std::optional<Assignment> NodeRendezvous::await_assignment(int round, int ticket,
                                                           steady_clock::time_point deadline,
                                                           milliseconds last_call_timeout) {
  const std::string quorum = round_key(round, "quorum");
  const std::string published = round_key(round, "assignment");
  auto too_late = [&](const std::string& what) {
    if (steady_clock::now() < deadline) return;
    const auto count = client_.add(round_key(round, "join"), 0);
    throw RendezvousError("elastic round " + std::to_string(round) + " " + what + ": " +
                          std::to_string(count) + " node(s) joined, at least " +
                          std::to_string(shape_.min_nodes) +
                          " needed; start more agents with the same --rdzv-endpoint and "
                          "--rdzv-id, or raise --rdzv-conf join_timeout");
  };
  while (true) {  // until MIN nodes are in
    try {
      client_.wait({quorum}, until(deadline, last_call_timeout));
      break;
    } catch (const rendezvous::StoreError& e) {
      if (!is_timeout(e)) throw;
    }
    throw_if_job_over(round);
    too_late("did not reach its minimum within join_timeout");
  }
  while (true) {  // until the round closes: after each last call, close it with whoever is in
    try {
      client_.wait({published}, until(deadline, last_call_timeout));
      break;
    } catch (const rendezvous::StoreError& e) {
      if (!is_timeout(e)) throw;
    }
    if (try_close(round)) break;
    throw_if_job_over(round);
    too_late("did not close within join_timeout");
  }

  // "<restarts> <world size> <nodes>" and this node's "<node rank> <offset> <next ticket>".
  const auto place = client_.try_get(round_key(round, "place/" + std::to_string(ticket)));
  if (!place) return std::nullopt;
  Assignment a;
  a.round = round;
  a.elastic = true;
  a.alive_prefix = round_key(round, "node/");
  a.members_key = round_key(round, "members");
  std::istringstream(*place) >> a.node_rank >> a.rank_offset >> a.successor_id;
  std::istringstream(client_.get(published)) >> a.restarts >> a.world_size >> a.num_nodes;
  client_.set(round_key(round, "stop/" + std::to_string(a.node_rank)), "1");  // for watch()
  return a;
}

std::optional<Verdict> NodeRendezvous::verdict_of(int round) {
  const auto text = client_.try_get(round_key(round, "verdict"));
  if (!text) return std::nullopt;
  return verdict_from_json(*text);
}

void NodeRendezvous::throw_if_job_over(int round) {
  if (round == 0) return;
  const auto previous = verdict_of(round - 1);
  if (previous && previous->action == Verdict::kFail) {
    throw JobOverError(
        "the job failed in round " + std::to_string(round - 1) + ": " + previous->reason, false);
  }
  if (previous && previous->action == Verdict::kDone) {
    throw JobOverError("the job already finished (round " + std::to_string(round - 1) + ")", true);
  }
}

Verdict NodeRendezvous::decide(const Assignment& a, int max_restarts) {
  if (auto v = verdict_of(a.round)) return *v;
  // One node decides (and counts the lost nodes, O(N)); the others wait for its verdict, and
  // decide themselves only if it vanished meanwhile.
  const std::string mine_claim = std::to_string(nonce_) + "/" + std::to_string(::getpid());
  if (client_.compare_set(round_key(a.round, "deciding"), "", mine_claim) != mine_claim) {
    try {
      client_.wait({round_key(a.round, "verdict")}, kDecisionGrace);
      return *verdict_of(a.round);
    } catch (const rendezvous::StoreError& e) {
      if (!is_timeout(e)) throw;
    }
  }
  const bool failed = !client_.check({round_key(a.round, "healthy")});
  // A worker failing while its round was being reshaped (a peer's workers stopped under it) is
  // collateral, not a restart: a real fault shows up again in the next round.
  const bool newcomer = !client_.check({round_key(a.round, "no_newcomers")});
  const std::vector<int> lost = lost_nodes(a);
  const int alive = a.num_nodes - static_cast<int>(lost.size());
  // Newcomers already waiting in the next round count towards its minimum (no node of this round
  // has joined it yet: they all wait for this verdict).
  const auto waiting = client_.add(round_key(a.round + 1, "join"), 0);

  Verdict v;
  v.expect = alive;
  v.restarts = a.restarts;
  const std::string lost_text = "node(s) " + detail::node_list(lost) + " lost";
  if (failed && lost.empty() && !newcomer) {
    if (a.restarts < max_restarts) {
      v.action = Verdict::kRestart;
      v.restarts = a.restarts + 1;
      v.reason = "a worker failed";
    } else {
      v.action = Verdict::kFail;
      v.reason = "a worker failed after " + std::to_string(a.restarts) + " restart(s), " +
                 "the most --max-restarts allows";
    }
  } else if (alive + waiting < shape_.min_nodes) {
    v.action = Verdict::kFail;
    v.reason = lost_text + ", " + std::to_string(alive + waiting) +
               " node(s) left, fewer than the minimum " + std::to_string(shape_.min_nodes);
  } else {
    v.action = Verdict::kReshape;  // a membership change: not a restart
    v.reason = !lost.empty() ? lost_text
               : newcomer    ? "a node is waiting to join"
                             : "the round ended elsewhere";
  }
  const std::string mine = to_json(v);
  return verdict_from_json(client_.compare_set(round_key(a.round, "verdict"), "", mine));
}

void NodeRendezvous::mark_done(const Assignment& a) {
  Verdict v;
  v.action = Verdict::kDone;
  v.restarts = a.restarts;
  v.reason = "every node succeeded";
  client_.compare_set(round_key(a.round, "verdict"), "", to_json(v));
}

}  // namespace dist::agent
