// Which local address a rank's Gloo device binds, and so advertises to the other ranks.
#pragma once

#include "dist/contract/worker_contract.h"

#include <string>

namespace dist::sdk::detail {

// This node's address as the other nodes reach it: dist-launch exports its --local-addr here.
inline constexpr const char* kLocalAddrVariable = worker_contract::kLocalAddr;
// The interface to use, as PyTorch reads it (the first of a comma-separated list).
inline constexpr const char* kSocketIfnameVariable = "GLOO_SOCKET_IFNAME";

// A numeric address, in this order: `explicit_address` (GlooOptions::local_address); the
// interface GLOO_SOCKET_IFNAME names (its address of the family `destination` resolves to);
// DIST_LOCAL_ADDR, unless it is a loopback address while `destination` is not reached over
// loopback (a node whose /etc/hosts maps its own name to 127.0.1.1, as Debian does); else the
// local address of the route to `destination` (MASTER_ADDR: a name, IPv4 or IPv6). Never a silent
// fallback: throws CollectiveError naming what failed and what to set.
std::string choose_local_address(const std::string& explicit_address,
                                 const std::string& destination);

// The local address a UDP socket connected to `destination` gets (no packet is sent): the first of
// its resolved addresses that has a route. Throws CollectiveError when it does not resolve or no
// address routes.
std::string address_towards(const std::string& destination);

// The name of the interface that has `address` (a name or a numeric address: any of its
// addresses), or else whose network holds it (127.0.0.2: lo); "" when none; NCCL_SOCKET_IFNAME
// is set from it. Throws CollectiveError when
// `address` does not resolve.
std::string interface_with_address(const std::string& address);

// True for 127.0.0.0/8, ::1 and IPv4-mapped loopback; false for names and other addresses.
bool is_loopback(const std::string& numeric_address);

}  // namespace dist::sdk::detail
