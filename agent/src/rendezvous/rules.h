// The rendezvous's decisions as pure functions of what the store said: who is in a closing round
// and in what order, where each node's ranks start, and how the job goes on after a round ended.
// Table-driven tests: agent/tests/rules_test.cc.
#pragma once

#include <cstdint>
#include <vector>

#include "rendezvous/rendezvous.h"
#include "rendezvous/schema.h"

namespace dist::agent::rules {

// A node that took a ticket in an elastic round.
struct Candidate {
  int ticket = 0;
  schema::NodeRecord record;
};

// Who is in a closing elastic round, by node rank: the previous round's nodes keep their order,
// newcomers follow, the store's host first, then by host, pid and nonce; at most max_nodes.
std::vector<Candidate> choose_members(std::vector<Candidate> joined, int max_nodes);

// Each member's place (node rank = position, first global rank, ring successor: the next member's
// id, -1 when alone) and the world size.
struct Placement {
  std::vector<schema::Place> places;
  int world_size = 0;
};
// ids[i] is member i's id (elastic: ticket, static: node rank); local_world_sizes[i] its workers.
Placement place(const std::vector<int>& ids, const std::vector<int>& local_world_sizes);

// What is known when an elastic round has ended.
struct RoundEnd {
  bool worker_failed = false;  // `healthy` was deleted
  bool newcomer = false;       // `no_newcomers` was deleted: a node waits to join
  std::vector<int> lost;       // node ranks whose liveness key is gone
  int num_nodes = 0;           // in the round
  int restarts = 0;            // job-wide restarts before the round
  std::int64_t waiting = 0;    // newcomers already waiting in the next round
  int replacements = 0;        // job-wide in-place replacements: they count as restarts do
  bool in_place = false;       // the survivors keep their workers (JobShape::in_place_wait)
};
// A worker failure alone is a restart (or the end, when none is left); a lost node or a newcomer
// is a reshape (not a restart), unless fewer than min_nodes would be left: then a restart whose
// round waits for min_nodes (or the end, when none is left); in place, with a restart left, a
// reshape instead (node 0, the workers' store's host, among the survivors), whose round the
// survivors wait in with their workers running, for nodes to join (then the round waits as the
// restart's would); it counts against --max-restarts as an in-place replacement (decide()). A
// worker failing while its round was reshaped (a peer's workers stopped under it) is collateral,
// not a restart: a real fault shows up again in the next round. --max-restarts bounds the restarts
// and the in-place replacements together.
Verdict decide(const RoundEnd& end, int max_restarts, int min_nodes);

}  // namespace dist::agent::rules
