#include "rendezvous/rules.h"

#include <algorithm>
#include <tuple>

#include "rendezvous/rendezvous_detail.h"

namespace dist::agent::rules {

std::vector<Candidate> choose_members(std::vector<Candidate> joined, int max_nodes) {
  std::sort(joined.begin(), joined.end(), [](const Candidate& a, const Candidate& b) {
    const auto& x = a.record;
    const auto& y = b.record;
    const bool x_back = x.previous_rank >= 0, y_back = y.previous_rank >= 0;
    if (x_back != y_back) return x_back;
    if (x_back) return x.previous_rank < y.previous_rank;
    if (x.hosts_store != y.hosts_store) return x.hosts_store;
    return std::tie(x.host, x.pid, x.nonce) < std::tie(y.host, y.pid, y.nonce);
  });
  if (static_cast<int>(joined.size()) > max_nodes) joined.resize(max_nodes);
  return joined;
}

Placement place(const std::vector<int>& ids, const std::vector<int>& local_world_sizes) {
  Placement p;
  const std::size_t n = ids.size();
  for (std::size_t rank = 0; rank < n; ++rank) {
    const int successor = n > 1 ? ids[(rank + 1) % n] : -1;
    p.places.push_back({static_cast<int>(rank), p.world_size, successor});
    p.world_size += local_world_sizes[rank];
  }
  return p;
}

Verdict decide(const RoundEnd& end, int max_restarts, int min_nodes) {
  Verdict v;
  const int alive = end.num_nodes - static_cast<int>(end.lost.size());
  v.expect = alive;
  v.restarts = end.restarts;
  const std::string lost_text = "node(s) " + detail::node_list(end.lost) + " lost";
  const bool restart_left = end.restarts + end.replacements < max_restarts;
  if (end.worker_failed && end.lost.empty() && !end.newcomer) {
    if (restart_left) {
      v.action = Verdict::kRestart;
      v.restarts = end.restarts + 1;
      v.reason = "a worker failed";
    } else {
      v.action = Verdict::kFail;
      v.reason = "a worker failed after " + std::to_string(end.restarts) + " restart(s)" +
                 (end.replacements > 0
                      ? " and " + std::to_string(end.replacements) + " in-place replacement(s)"
                      : "") +
                 ", the most --max-restarts allows";
    }
  } else if (alive + end.waiting < min_nodes) {
    // Too few to go on now. With a restart left, the next round waits for MIN nodes until the
    // join timeout, as torchrun's survivors do: a cluster manager brings the lost node back.
    const std::string too_few = lost_text + ", " + std::to_string(alive + end.waiting) +
                                " node(s) left, fewer than the minimum " +
                                std::to_string(min_nodes);
    // (Not when node 0 was lost: it hosted the workers' store, which the survivors' workers lost.)
    const bool node_0_lost = std::find(end.lost.begin(), end.lost.end(), 0) != end.lost.end();
    if (restart_left && end.in_place && alive > 0 && !node_0_lost) {
      v.action = Verdict::kReshape;
      v.reason = too_few +
                 ": the survivors' workers wait in place for nodes to join (until "
                 "--in-place-timeout, then a new round of the whole group)";
    } else if (restart_left) {
      v.action = Verdict::kRestart;
      v.restarts = end.restarts + 1;
      v.reason = too_few + ": waiting for nodes to join (until the join timeout)";
    } else {
      v.action = Verdict::kFail;
      v.reason = too_few;
    }
  } else {
    v.action = Verdict::kReshape;
    v.reason = !end.lost.empty() ? lost_text
               : end.newcomer    ? "a node is waiting to join"
                                 : "the round ended elsewhere";
  }
  return v;
}

}  // namespace dist::agent::rules
