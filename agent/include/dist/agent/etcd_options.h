// The etcd-v3 rendezvous backend's options, as the command line gives them.
#pragma once

#include <array>
#include <map>
#include <string>
#include <string_view>

namespace dist::agent {

// The --rdzv-conf keys of the etcd backend, besides the agent's own.
inline constexpr std::array<std::string_view, 9> kEtcdConfKeys{
    "cacert",        "cert",     "key",         "user",
    "password_file", "protocol", "etcd_prefix", "unavailable_timeout",
    "member_order"};

// Checks --rdzv-endpoint (the members, comma-separated) and the etcd keys of --rdzv-conf; throws
// rendezvous::StoreError (kInvalidArgument) with a one-line reason.
void check_etcd_options(const std::string& endpoints,
                        const std::map<std::string, std::string>& conf);

}  // namespace dist::agent
