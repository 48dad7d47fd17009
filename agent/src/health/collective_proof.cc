#include "health/collective_proof.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <set>
#include <unordered_map>

#include "dist/contract/worker_contract.h"

namespace dist::agent {
namespace {

using Collective = worker_contract::heartbeat_slot::Collective;

bool known(std::uint32_t op) {
  return op != static_cast<std::uint32_t>(Collective::kNone) &&
         op != static_cast<std::uint32_t>(Collective::kOther) && collective_name(op) != "none";
}

std::string waits_text(const CollectiveState& r) {
  return collective_text(r.wait->op, r.wait->seq, r.wait->group, r.order);
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string text;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    text += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
  }
  return text;
}

// The ranks that stand still (collective_proof.h): blocked in the SDK's one sequence, or in a
// torch group whose every member (as many as its size says) stands still. The largest such set:
// every blocked rank to begin with, then those waiting in a group with a member outside it left
// out, until none is.
std::vector<bool> standing_still(const std::vector<CollectiveState>& ranks) {
  std::vector<bool> still(ranks.size());
  for (std::size_t i = 0; i < ranks.size(); ++i) still[i] = ranks[i].wait.has_value();
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      if (!still[i] || ranks[i].wait->group == 0) continue;
      const std::uint64_t group = ranks[i].wait->group;
      const auto size = ranks[i].sizes.find(group);
      std::set<int> members;  // (a rank seen twice, in a stale view, counts once)
      bool all_still = size != ranks[i].sizes.end() && size->second > 0;
      for (std::size_t j = 0; j < ranks.size() && all_still; ++j) {
        if (!ranks[j].seqs.contains(group)) continue;
        members.insert(ranks[j].rank);
        all_still = still[j];
      }
      if (!all_still || members.size() < size->second) {
        still[i] = false;
        changed = true;
      }
    }
  }
  return still;
}

// Ranks blocked in the same collective of a group with operations that differ. Not a send or a
// receive: torch counts a point-to-point operation in its group's sequence on its two ranks only,
// so that the number it has on them is another collective's on the group's other ranks (a
// pipeline's stage receiving while the others all-reduce is no mismatch).
std::optional<Mismatch> different_operations(const std::vector<CollectiveState>& ranks,
                                             const std::vector<bool>& still) {
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::map<std::uint32_t, std::vector<int>>>
      at;  // (group, seq) -> op -> ranks
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const auto& r = ranks[i];
    if (still[i] && known(r.wait->op))
      at[{r.wait->group, r.wait->seq}][r.wait->op].push_back(r.rank);
  }
  constexpr auto kSendRecv = static_cast<std::uint32_t>(Collective::kSendRecv);
  for (const auto& [place, ops] : at) {
    if (ops.size() < 2 || ops.contains(kSendRecv)) continue;
    std::size_t most = 0, with_most = 0;
    for (const auto& [op, who] : ops) {
      if (who.size() > most) {
        most = who.size();
        with_most = 1;
      } else if (who.size() == most) {
        ++with_most;
      }
    }
    Mismatch m;
    std::string parts;
    for (const auto& [op, who] : ops) {
      m.involved.insert(m.involved.end(), who.begin(), who.end());
      if (with_most > 1 || who.size() < most)
        m.causes.insert(m.causes.end(), who.begin(), who.end());
      parts += fmt::format("{}rank{} {} in {}", parts.empty() ? "" : ", ",
                           who.size() > 1 ? "s" : "", ranks_text(who), collective_name(op));
    }
    std::sort(m.involved.begin(), m.involved.end());
    std::sort(m.causes.begin(), m.causes.end());
    const auto& any = *std::find_if(ranks.begin(), ranks.end(), [&](const CollectiveState& r) {
      return r.wait && r.wait->group == place.first && r.wait->seq == place.second;
    });
    m.why = fmt::format("collective #{}{} can never complete: {}", place.second,
                        group_text(place.first, any.order), parts);
    return m;
  }
  return std::nullopt;
}

// The ranks of a cycle whose count differs from the majority's in a group the cycle waits in: the
// ones that went past a collective (or issued one too many); none when no count has a majority
// (two ranks: either may be the one).
std::vector<int> odd_ones(const std::vector<CollectiveState>& ranks,
                          const std::vector<std::size_t>& cycle) {
  std::vector<int> odd;
  for (const std::size_t i : cycle) {
    const std::uint64_t group = ranks[i].wait->group;
    std::map<std::uint64_t, std::vector<int>> by_count;
    for (const auto& r : ranks) {
      const auto it = r.seqs.find(group);
      if (it != r.seqs.end()) by_count[it->second].push_back(r.rank);
    }
    std::size_t most = 0, with_most = 0;
    std::uint64_t majority = 0;
    for (const auto& [count, who] : by_count) {
      if (who.size() > most) {
        most = who.size();
        majority = count;
        with_most = 1;
      } else if (who.size() == most) {
        ++with_most;
      }
    }
    if (with_most > 1) return {};
    for (const std::size_t j : cycle) {
      const auto it = ranks[j].seqs.find(group);
      if (it != ranks[j].seqs.end() && it->second != majority) odd.push_back(ranks[j].rank);
    }
  }
  std::sort(odd.begin(), odd.end());
  odd.erase(std::unique(odd.begin(), odd.end()), odd.end());
  return odd;
}

// A cycle of ranks each blocked in a collective the next one has not issued.
std::optional<Mismatch> cycle_of_waits(const std::vector<CollectiveState>& ranks,
                                       const std::vector<bool>& still) {
  const std::size_t n = ranks.size();
  std::vector<std::vector<std::size_t>> waits_for(n);
  for (std::size_t a = 0; a < n; ++a) {
    // (A send or a receive is numbered on its two ranks only: the others' counts say nothing of
    // whether they issued it.)
    if (!still[a] || ranks[a].wait->op == static_cast<std::uint32_t>(Collective::kSendRecv))
      continue;
    for (std::size_t b = 0; b < n; ++b) {
      if (b == a || !still[b]) continue;  // only ranks that stand still can close a cycle
      const auto it = ranks[b].seqs.find(ranks[a].wait->group);
      if (it != ranks[b].seqs.end() && it->second < ranks[a].wait->seq) waits_for[a].push_back(b);
    }
  }
  // Depth-first search for a cycle: 0 unseen, 1 on the path, 2 done.
  std::vector<int> mark(n, 0);
  std::vector<std::size_t> path;
  std::vector<std::size_t> cycle;
  const std::function<bool(std::size_t)> visit = [&](std::size_t a) {
    mark[a] = 1;
    path.push_back(a);
    for (const std::size_t b : waits_for[a]) {
      if (mark[b] == 1) {
        cycle.assign(std::find(path.begin(), path.end(), b), path.end());
        return true;
      }
      if (mark[b] == 0 && visit(b)) return true;
    }
    path.pop_back();
    mark[a] = 2;
    return false;
  };
  for (std::size_t a = 0; a < n && cycle.empty(); ++a) {
    if (mark[a] == 0) visit(a);
  }
  if (cycle.empty()) return std::nullopt;
  Mismatch m;
  std::string chain;
  for (std::size_t i = 0; i < cycle.size(); ++i) {
    const auto& a = ranks[cycle[i]];
    const auto& b = ranks[cycle[(i + 1) % cycle.size()]];
    m.involved.push_back(a.rank);
    chain +=
        fmt::format("{}rank {} waits in {}, which rank {} has not issued (it issued {})",
                    i == 0 ? "" : "; ", a.rank, waits_text(a), b.rank, b.seqs.at(a.wait->group));
  }
  std::sort(m.involved.begin(), m.involved.end());
  m.causes = odd_ones(ranks, cycle);
  if (m.causes.empty()) {
    m.causes = m.involved;
    m.why = fmt::format("collectives that can never match: {}; ranks {} wait for each other", chain,
                        ranks_text(m.involved));
  } else {
    m.why = fmt::format(
        "collectives that can never match: {}; rank{} {} went past a collective the others wait "
        "in",
        chain, m.causes.size() > 1 ? "s" : "", ranks_text(m.causes));
  }
  return m;
}

}  // namespace

std::string collective_name(std::uint32_t op) {
  switch (static_cast<Collective>(op)) {
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kBarrier:
      return "barrier";
    case Collective::kOther:
      return "a collective";
    case Collective::kReduce:
      return "reduce";
    case Collective::kAllToAll:
      return "all_to_all";
    case Collective::kGather:
      return "gather";
    case Collective::kScatter:
      return "scatter";
    case Collective::kSendRecv:
      return "send/recv";
    case Collective::kSetup:
      return "its group's set-up";
    case Collective::kNone:
      break;
  }
  return "none";
}

namespace {

// progress.py's name_id: FNV-1a (64 bits) of a group's name.
std::uint64_t name_id(const std::string& name) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const unsigned char byte : name) h = (h ^ byte) * 0x100000001b3ULL;
  return h != 0 ? h : 1;
}

// torch's number of the group whose id is `group`: torch names its groups by a count ("0" the
// world's, then "1", "2", ... in the order the ranks make them), the same on every rank; none for
// a name of the script's own.
std::optional<int> torch_group_number(std::uint64_t group) {
  constexpr int kNumbered = 4096;
  static const std::unordered_map<std::uint64_t, int> numbers = [] {
    std::unordered_map<std::uint64_t, int> m;
    for (int n = 0; n < kNumbered; ++n) m.emplace(name_id(std::to_string(n)), n);
    return m;
  }();
  const auto at = numbers.find(group);
  if (at == numbers.end()) return std::nullopt;
  return at->second;
}

}  // namespace

std::string group_label(std::uint64_t group, const std::vector<std::uint64_t>& order) {
  if (const auto number = torch_group_number(group)) {
    return "process group " + std::to_string(*number);
  }
  const auto at = std::find(order.begin(), order.end(), group);
  if (at == order.end()) return "a process group";
  return "process group " + std::to_string(at - order.begin());
}

std::string group_text(std::uint64_t group, const std::vector<std::uint64_t>& order) {
  if (group == 0) return "";
  return " of " + group_label(group, order);
}

std::string collective_text(std::uint32_t op, std::uint64_t seq, std::uint64_t group,
                            const std::vector<std::uint64_t>& order) {
  return collective_name(op) + " #" + std::to_string(seq) + group_text(group, order);
}

std::optional<Mismatch> prove_mismatch(const std::vector<CollectiveState>& ranks) {
  const auto still = standing_still(ranks);
  if (auto m = different_operations(ranks, still)) return m;
  return cycle_of_waits(ranks, still);
}

}  // namespace dist::agent
