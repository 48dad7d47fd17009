// What an NCCL group does on the store and the network before NCCL runs: built in every build
// (no CUDA, no NCCL), so it is tested on machines without a GPU.
#pragma once

#include <chrono>
#include <string>

#include "dist/sdk/process_group.h"
#include "dist/store/client.h"

namespace dist::sdk::detail {

// The store keys of the next NCCL group this rank builds on `prefix`: "<prefix>/<n>", n counting
// the groups this rank built on `prefix` in this process (torch's ncclCommCounter_). Ranks build
// their groups in the same order, so they agree on n, and a second group, or one rebuilt after a
// failure, never reads an earlier group's unique id. Counted per rank: ranks run as threads of one
// process count as processes would.
std::string nccl_communicator_key(const std::string& prefix, int rank);

// Every rank of `size` meets under `key` ("<key>/arrived"); returns once all came. Throws
// CollectiveError after `timeout` naming how many ranks came.
void meet_on_store(store::StoreClient& store, const std::string& key, int rank, int size,
                   std::chrono::milliseconds timeout);

// The interface NCCL's bootstrap should use (NCCL_SOCKET_IFNAME), chosen as the Gloo group chooses
// its address (NcclOptions::local_address, GLOO_SOCKET_IFNAME, DIST_LOCAL_ADDR, the route to
// route_to); "" when NCCL_SOCKET_IFNAME or NCCL_COMM_ID is set already (the user's choice) or no
// interface has that address.
std::string nccl_socket_interface(const NcclOptions& options);

// nccl_socket_interface(), then NCCL_SOCKET_IFNAME="=<interface>" (exactly that interface) unless
// it is set; returns the interface, "" when none was set. Call before NCCL's first call in the
// process: NCCL reads it once.
std::string set_nccl_socket_interface(const NcclOptions& options);

}  // namespace dist::sdk::detail
