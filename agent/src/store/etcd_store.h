// The rendezvous store over etcd v3 (--rdzv-backend etcd-v3): RendezvousStore on the etcd client
// of rendezvous/etcd. docs/ETCD.md describes how each call maps onto etcd and the keys it writes.
//
// Per session: one lease, granted with the session's first ephemeral key or counter update and
// kept alive by a coroutine (a renewal every TTL/3, not waiting for the last one's answer). When
// etcd says it expired (no renewal reached etcd within its TTL) the session is lost: its calls
// throw kConnectionLost, the call in flight included. close() revokes it.
#pragma once

#include <boost/asio/io_context.hpp>
#include <memory>
#include <string>

#include "store/store.h"

namespace dist::agent {

// A session of job `run_id`, not connected yet: open() checks that a member answers and accepts
// the credentials (kUnavailable, kUnauthenticated otherwise), or the first call reaches etcd.
// Throws StoreError(kInvalidArgument) for an empty run id or a TTL under 1 s.
std::unique_ptr<RendezvousStore> make_etcd_store(boost::asio::io_context& io, EtcdOptions options,
                                                 std::string run_id);

}  // namespace dist::agent
