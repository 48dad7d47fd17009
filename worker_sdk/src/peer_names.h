// How a failed Gloo collective names the peer its error is about.
#pragma once

#include <string>

namespace dist::sdk::detail {

// ", peer rank 1 at [127.0.0.1]:8092" for a Gloo error `message` that names an address, from
// `published`: one "<rank> <listening address>" line per rank of the group (Gloo's address text,
// which may end in "$<sequence>"). The rank listening at that address when one is; else, since on
// the side that accepted a connection Gloo names its far end (the peer's ephemeral port), the one
// rank other than `own_rank` listening on that host, or the ranks it may be. "" when the message
// names no address.
std::string name_peer(const std::string& message, const std::string& published, int own_rank);

}  // namespace dist::sdk::detail
