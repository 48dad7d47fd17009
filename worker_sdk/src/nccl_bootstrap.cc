#include "nccl_bootstrap.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

#include "local_address.h"

namespace dist::sdk::detail {

std::string nccl_communicator_key(const std::string& prefix, int rank) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, int>, int> built;
  std::lock_guard lock(mutex);
  return prefix + "/" + std::to_string(built[{prefix, rank}]++);
}

void meet_on_store(store::StoreClient& store, const std::string& key, int rank, int size,
                   std::chrono::milliseconds timeout) {
  if (store.add(key + "/arrived", 1) == size) store.set(key + "/all_arrived", "1");
  try {
    store.wait({key + "/all_arrived"}, timeout);
  } catch (const store::StoreError& e) {
    if (e.code() != store::StoreErrc::kTimeout) throw;
    const auto arrived = store.add(key + "/arrived", 0);
    throw CollectiveError("NCCL group '" + key + "': rank " + std::to_string(rank) + " waited " +
                          std::to_string(timeout.count()) + " ms (init_timeout) and only " +
                          std::to_string(arrived) + " of " + std::to_string(size) +
                          " ranks reached it: see the missing ranks' errors (a crash before the "
                          "group, another world size, another key_prefix)");
  }
}

namespace {
std::mutex environment_mutex;  // ranks run as threads of one process read and set it together
}

std::string nccl_socket_interface(const NcclOptions& options) {
  {
    std::lock_guard lock(environment_mutex);
    if (std::getenv("NCCL_SOCKET_IFNAME") || std::getenv("NCCL_COMM_ID")) return "";
  }
  try {
    return interface_with_address(choose_local_address(options.local_address, options.route_to));
  } catch (const CollectiveError&) {  // NCCL's own choice, then
    return "";
  }
}

std::string set_nccl_socket_interface(const NcclOptions& options) {
  const std::string interface = nccl_socket_interface(options);
  if (interface.empty()) return "";
  std::lock_guard lock(environment_mutex);
  if (std::getenv("NCCL_SOCKET_IFNAME")) return "";  // another rank of this process set it
  ::setenv("NCCL_SOCKET_IFNAME", ("=" + interface).c_str(), 0);
  return interface;
}

}  // namespace dist::sdk::detail
