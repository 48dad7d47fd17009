// Small helpers shared by the static (node_rendezvous.cc) and elastic (elastic_round.cc) rounds.
#pragma once

#include <string>
#include <vector>

namespace dist::agent::detail {

// "[0, 2, 5]", for messages.
inline std::string node_list(const std::vector<int>& nodes) {
  std::string s = "[";
  for (std::size_t i = 0; i < nodes.size(); ++i) s += (i ? ", " : "") + std::to_string(nodes[i]);
  return s + "]";
}

}  // namespace dist::agent::detail
