#include "peer_names.h"

#include <regex>
#include <sstream>
#include <vector>

namespace dist::sdk::detail {

std::string name_peer(const std::string& message, const std::string& published, int own_rank) {
  static const std::regex kAddress(R"(\[[^\]]+\]:[0-9]+)");
  std::smatch m;
  if (!std::regex_search(message, m, kAddress)) return "";
  const std::string address = m.str();
  const std::string host = address.substr(0, address.rfind(':') + 1);  // "[127.0.0.1]:"
  std::istringstream lines(published);
  std::vector<std::string> on_host;  // the other ranks listening on the address's host
  for (std::string rank, listening; lines >> rank >> listening;) {
    if (listening == address || listening.starts_with(address + "$")) {
      return ", peer rank " + rank + " at " + address;
    }
    if (rank != std::to_string(own_rank) && listening.starts_with(host)) on_host.push_back(rank);
  }
  const std::string where = host.substr(0, host.size() - 1);  // "[127.0.0.1]"
  if (on_host.size() == 1) {
    return ", peer rank " + on_host[0] + " at " + address +
           " (its end of the connection: the one other rank on " + where + ")";
  }
  if (on_host.empty()) return ", peer at " + address + " (no rank published that address)";
  std::string ranks;
  for (const auto& r : on_host) ranks += (ranks.empty() ? "" : ", ") + r;
  return ", peer at " + address + " (its end of the connection: one of ranks " + ranks + " on " +
         where + ")";
}

}  // namespace dist::sdk::detail
