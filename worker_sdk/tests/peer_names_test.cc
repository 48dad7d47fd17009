// How a failed collective names its peer, from Gloo's error text and the published addresses.
#include "peer_names.h"

#include <gtest/gtest.h>

#include <string>

namespace dist::sdk::detail {
namespace {

// Three ranks: 0 and 1 on one host, 2 on another; rank 1's address as Gloo writes a device's,
// with its sequence number.
const std::string kPublished =
    "0 [10.0.0.1]:8090\n"
    "1 [10.0.0.1]:8091$2\n"
    "2 [10.0.0.2]:8092\n";

struct Case {
  const char* message;
  int own_rank;
  const char* named;
};

TEST(PeerNames, NamesTheRankFromTheListeningAddressOrTheHostOfTheFarEnd) {
  const Case cases[] = {
      // The listening address Gloo's error names: its rank, whatever the sequence suffix.
      {"Connection closed by peer [10.0.0.2]:8092", 0, ", peer rank 2 at [10.0.0.2]:8092"},
      {"Read error [10.0.0.1]:8091: Connection reset by peer", 2,
       ", peer rank 1 at [10.0.0.1]:8091"},
      // A port that only starts like a published one is not it.
      {"Read error [10.0.0.2]:80921: reset", 0,
       ", peer rank 2 at [10.0.0.2]:80921 (its end of the connection: the one other rank on "
       "[10.0.0.2])"},
      // The far end of an accepted connection (an ephemeral port): the one other rank on its host.
      {"Read error [10.0.0.1]:45123: Connection reset by peer", 0,
       ", peer rank 1 at [10.0.0.1]:45123 (its end of the connection: the one other rank on "
       "[10.0.0.1])"},
      // ... or the ranks it may be, when more than one other rank listens there.
      {"Read error [10.0.0.1]:45123: Connection reset by peer", 2,
       ", peer at [10.0.0.1]:45123 (its end of the connection: one of ranks 0, 1 on [10.0.0.1])"},
      // A host no rank published.
      {"Connection closed by peer [10.0.0.9]:8092", 0,
       ", peer at [10.0.0.9]:8092 (no rank published that address)"},
      // IPv6, as Gloo brackets it.
      {"Connection closed by peer [::1]:8092", 0,
       ", peer at [::1]:8092 (no rank published that address)"},
      // No address in the message: nothing to add.
      {"Timed out waiting 30000ms for recv operation to complete", 0, ""},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(name_peer(c.message, kPublished, c.own_rank), c.named)
        << c.message << " (seen from rank " << c.own_rank << ")";
  }
  // Nothing published (the store was gone): the address alone.
  EXPECT_EQ(name_peer("Connection closed by peer [10.0.0.2]:8092", "", 0),
            ", peer at [10.0.0.2]:8092 (no rank published that address)");
}

}  // namespace
}  // namespace dist::sdk::detail
