// The agents' rendezvous through the store, one round per attempt of the job (round n is restart n,
// the same on every node). Blocking calls: the agent runs them on helper threads so that its own
// io thread, which may host the store, never blocks.
//
// Keys, all under rdzv/<run id>/:
//   alive/<node>            ephemeral: vanishes when that node's agent dies
//   r<n>/node/<node>        a node's join record (local world size, host, pid, nonce)
//   r<n>/joined             count of nodes that joined; the one that completes it publishes:
//   r<n>/offset/<node>      that node's first global rank, r<n>/world_size, then r<n>/closed
//   r<n>/healthy            deleted by the first node whose workers fail in round n
//   r<n>/failures/<node>    that node's failures (JSON), written before healthy is deleted
//   r<n>/done               count of nodes whose workers all succeeded
//   r<n>/stop/<node>        deleted by a node to end its own watch
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "dist/rendezvous/client.h"
#include "failure_report.h"

namespace dist::agent {

class RendezvousError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Assignment {
  int round = 0;
  int num_nodes = 1;
  int world_size = 0;
  int rank_offset = 0;  // global rank of this node's local rank 0
};

// What ended a watch: a failure somewhere, a node's agent gone, or our own stop.
struct WatchResult {
  enum Kind { kFailed, kNodeLost, kStopped } kind;
  int node = -1;  // for kNodeLost
};

class NodeRendezvous {
 public:
  NodeRendezvous(rendezvous::ClientOptions store, std::string run_id, int num_nodes, int node_rank);

  // Joins round n and waits for every node (until `timeout`); throws RendezvousError naming the
  // nodes seen and missing, or a node rank claimed twice.
  Assignment join(int round, int local_world_size, const std::string& host,
                  std::chrono::milliseconds timeout);

  // Publishes this node's failures for round n and tells every node the round failed.
  void announce_failure(int round, const std::vector<WorkerFailure>& failures);
  // Every node's published failures for round n.
  std::vector<WorkerFailure> failures(int round);

  // Blocks until round n fails anywhere, another node's agent dies, or stop_watch() is called.
  // Uses its own connection: call from one helper thread.
  WatchResult watch(int round);
  void stop_watch(int round);

  // This node's workers all succeeded: waits until every node's did (true), or the round failed
  // or a node was lost (false), at most `timeout` (RendezvousError).
  bool exit_barrier(int round, std::chrono::milliseconds timeout);

  // Node 0 hosts the store: before it exits it waits (bounded) for the other agents to leave.
  void wait_for_others_to_leave(std::chrono::milliseconds timeout);

 private:
  std::string key(const std::string& suffix) const { return prefix_ + suffix; }
  std::string round_key(int round, const std::string& suffix) const {
    return prefix_ + "r" + std::to_string(round) + "/" + suffix;
  }
  std::vector<std::string> alive_keys_of_others() const;

  rendezvous::ClientOptions options_;
  rendezvous::StoreClient client_;  // joins, announcements; holds this node's alive key
  std::string prefix_;
  std::uint32_t nonce_;  // tells this agent's join records from any other's
  int num_nodes_;
  int node_rank_;
};

}  // namespace dist::agent
