// Small helpers shared by the static (node_rendezvous.cc) and elastic (elastic_round.cc) rounds.
#pragma once

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

namespace dist::agent::detail {

// The time left until `deadline`, at least 1 ms and at most `at_most`: one wait's timeout.
inline std::chrono::milliseconds until(std::chrono::steady_clock::time_point deadline,
                                       std::chrono::milliseconds at_most) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return std::clamp(left, std::chrono::milliseconds(1), at_most);
}

// "[0, 2, 5]", for messages.
inline std::string node_list(const std::vector<int>& nodes) {
  std::string s = "[";
  for (std::size_t i = 0; i < nodes.size(); ++i) s += (i ? ", " : "") + std::to_string(nodes[i]);
  return s + "]";
}

}  // namespace dist::agent::detail
