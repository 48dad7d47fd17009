// The rendezvous store over etcd v3 (--rdzv-backend etcd-v3): RendezvousStore on the etcd client
// of rendezvous/etcd. docs/ETCD.md describes how each call maps onto etcd and the keys it writes.
//
// Per session: one lease, granted with the session's first ephemeral key or counter update and
// kept alive by a coroutine (a renewal every TTL/3, not waiting for the last one's answer). When
// etcd says it expired (no renewal reached etcd within its TTL) the session is lost: its calls
// throw kConnectionLost, the call in flight included. close() revokes it.
#pragma once

#include <utility>  // first: Asio 1.18's awaitable.hpp uses std::exchange without including it

#include <array>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "dist/agent/etcd_options.h"
#include "dist/agent/rendezvous_store.h"
#include "dist/rendezvous/etcd/client.h"

namespace dist::agent {

struct EtcdOptions {
  rendezvous::etcd::ClientOptions client;
  std::string prefix = "/dist-launch";  // the job's keys are <prefix>/<run id>/<key>
  // An ephemeral key outlives a vanished session by about this (etcd raises it to its minimum,
  // about 1.5 election timeouts); the agent's: keep_alive_interval * (keep_alive_max_attempt - 1),
  // at least 2 s.
  std::chrono::seconds lease_ttl{3};
};

// EtcdOptions from --rdzv-endpoint (members, comma-separated) and --rdzv-conf: cacert, cert, key
// (files, as etcdctl's --cacert/--cert/--key), user and password_file (read here: its first
// line), protocol (http or https, for endpoints without a scheme), etcd_prefix, and
// unavailable_timeout (seconds before a call fails when no member with a leader answers).
// Other keys are left to the agent. Throws StoreError(kInvalidArgument) with a one-line reason.
EtcdOptions etcd_options(const std::string& endpoints,
                         const std::map<std::string, std::string>& conf,
                         std::chrono::seconds lease_ttl);

// A session to the job `run_id`, not yet used: its first call reaches etcd, and close() ends it
// at any time (for an agent that may be told to stop while etcd is unreachable).
std::unique_ptr<RendezvousStore> make_etcd_store(boost::asio::io_context& io, EtcdOptions options,
                                                 std::string run_id);

// Opens a session to the job `run_id`, after checking that a member answers and accepts the
// credentials (kUnavailable, kUnauthenticated, kInvalidArgument otherwise). Its sessions run on
// `io` (one thread) and must be destroyed before it: closing one revokes its lease from `io`.
Task<std::unique_ptr<RendezvousStore>> open_etcd_store(boost::asio::io_context& io,
                                                       EtcdOptions options, std::string run_id);

// Deletes every key of the job `run_id` (they outlive the job in etcd, unlike a TCPStore's);
// returns how many. For the end of a job, once no node reads them any more.
Task<std::int64_t> remove_etcd_job(boost::asio::io_context& io, EtcdOptions options,
                                   std::string run_id);

}  // namespace dist::agent
