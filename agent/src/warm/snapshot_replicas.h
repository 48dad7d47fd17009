// Peer replicas of the snapshots (--snapshot-replicas K): each agent sends its ranks' newest saves
// to K other nodes' agents, which keep them in their shared memory; an agent about to start
// workers for a rank whose snapshot it does not hold (the replacement of a lost node, a node on a
// new host, ranks that moved in an elastic round) first fetches the newest replica a peer holds,
// so that the workers' load() finds it without disk. The agents send, never the workers: a save
// costs the training loop what it did before.
//
// How agents find each other: through the job's worker store, under
// dist-launch/replicas/<job folder>/ (job_folder(): the --rdzv-id):
//   servers    every agent's replica endpoint, one per line: appended when it starts serving, and
//              again in each new store (an etcd job's worker store moves with its node 0)
//   rank_<R>   the endpoints that hold rank R's snapshot, one per line: appended by the sender
//              the first time a holder takes rank R, and for itself (an agent serves its own
//              node's snapshots too: a rank that moves to another node in the next round, as an
//              elastic round renumbers its nodes, is found there)
// A sender's holders are the K agents after its own in `servers`, taken as a ring; one that does
// not answer is passed over for kPeerRestPeriod. A restore asks rank_<R>'s holders (every server,
// which save each holds, and fetches the newest.
//
// The wire (one request per connection, integers little-endian; docs/SNAPSHOTS.md):
//   server: "DLREPL01", its nonce (32)
//   client: its nonce (32), its proof (32), op (u8: 1 PUT, 2 GET, 3 STAT), job (u32 length,
//           bytes), rank (i32); PUT adds save_id (u64), saved_at (i64), size (u64)
//   server: its proof (32), status (u8: kReplyOk, kReplyNone (GET, STAT: nothing held; PUT: this
//           save or a newer one is held), kReplyRefused, kReplyNoRoom, kReplyBadRequest)
//   STAT:   saved_at (i64), size (u64), save_id (u64)
//   GET:    size (u64), the file's bytes, whether it was not rewritten meanwhile (u8 1)
//   PUT:    the client sends size bytes and whether the file was not rewritten meanwhile (u8 1);
//           the server answers (u8) kReplyOk once the copy is whole and in place
// The proofs are the job's token's (store/include/dist/store/auth.h), under labels of this
// channel: the client's covers its request's bytes, the server's the request and its status, so
// that no one on the path can pass a proof on with another request or answer (the file's bytes
// are checked as a reader checks them, not signed). Without a token (a job whose store has none)
// they are zeros and prove nothing, as the store's own connections do not. A request's bytes must
// arrive within 5 s; past 16 connections at once, a server closes new ones. The server listens
// where the store an agent hosts does: every interface, or --local-addr.
//
// A holder keeps each rank's newest replica only (scratch/replicas/rank_<R>/step_<S>.snap), checked
// whole (the format's save ids agree) and this job's and rank's before it is put in place; a
// restore checks what it fetched the same way before its workers can see it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dist/store/endpoint.h"
#include "warm/snapshot_store.h"  // Saved

namespace dist::store {
class StoreClient;
}

namespace dist::agent::warm {

inline constexpr std::chrono::milliseconds kReplicaScanInterval{200};
inline constexpr std::chrono::seconds kPeerRestPeriod{10};
inline constexpr std::chrono::milliseconds kReplicaConnectTimeout{1000};
inline constexpr std::chrono::seconds kReplicaIoTimeout{10};
inline constexpr std::chrono::seconds kRestoreBudget{30};  // past it, the workers start without
inline constexpr std::chrono::seconds kRegistrationWait{5};
inline constexpr std::chrono::seconds kStoreTrouble{30};  // the sender's store failing: said
inline constexpr int kMaxSnapshotReplicas = 8;

struct ReplicaOptions {
  int replicas = 0;     // K: how many other agents hold each rank's newest snapshot
  std::string job;      // the job's --rdzv-id
  std::string secret;   // the job's token ("": none)
  std::string address;  // this node, as the others reach it (the agent's host name or address)
  std::string bind;     // where to listen ("": every interface, as the agent's store does)
};

class SnapshotReplicas {
 public:
  // `snapshots`: this node's snapshot folders (what it sends, where restores go); `held`: where it
  // keeps the replicas it holds for others. Nothing is sent or served before use_store().
  SnapshotReplicas(ReplicaOptions options, std::filesystem::path snapshots,
                   std::filesystem::path held);
  ~SnapshotReplicas();
  SnapshotReplicas(const SnapshotReplicas&) = delete;
  SnapshotReplicas& operator=(const SnapshotReplicas&) = delete;

  // The round's worker store (where the agents find each other); the first starts the server.
  void use_store(const store::Endpoint& endpoint);
  // The ranks of `ranks` this node holds no snapshot of.
  std::vector<int> missing(const std::vector<int>& ranks) const;
  // Fetches the newest replica of each of `ranks` that a peer holds into the snapshot folders, on
  // a thread of its own, then calls `done` there (within about kRestoreBudget; a rank no peer
  // holds is left to the workers). `other_nodes`: the round's other nodes, whose agents say what
  // they hold as they join the round's store (waited for, within kRegistrationWait).
  void restore(std::vector<int> ranks, int other_nodes, std::function<void()> done);
  // A new attempt begins: restores asked for before it put nothing more in place.
  void cancel_restores();
  nlohmann::ordered_json status() const;

 private:
  class Server;
  class InFlight;
  enum class Sent { kDelivered, kHeld, kRewritten, kRejected, kFailed };
  struct Restore {
    std::vector<int> ranks;
    int other_nodes = 0;
    std::uint64_t epoch = 0;  // restore_epoch_ when asked
    std::function<void()> done;
  };
  struct Delivery {  // a rank folder's newest save, and the holders that have it
    std::uint64_t save_id = 0;
    std::set<std::string> holders;
    bool rejected = false;  // a holder found it not whole, or not this job's rank's
    std::string signature;  // the folder's files when it was read (folder_signature())
  };

  std::unique_ptr<store::StoreClient> open_store(const store::Endpoint& endpoint);
  void run_sender();
  void connect_store(const store::Endpoint& endpoint);
  std::vector<std::string> peers();
  void send_new_saves();
  Sent send(const std::string& peer, int rank, const Saved& save);
  void run_restorer();
  void restore_now(const store::Endpoint& endpoint, const std::vector<int>& ranks, int other_nodes,
                   std::uint64_t epoch);
  bool restore_rank(int rank, const std::vector<std::string>& holders,
                    std::chrono::steady_clock::time_point deadline, std::uint64_t epoch);
  std::string key(const std::string& name) const;

  const ReplicaOptions options_;
  const std::filesystem::path snapshots_;
  const std::filesystem::path held_;

  mutable std::mutex mutex_;  // what the threads share: below, and server_ being set
  std::condition_variable wake_;
  bool stopping_ = false;
  std::optional<store::Endpoint> store_;  // the newest use_store()
  std::uint64_t rounds_ = 0;              // use_store() calls: one a round
  std::deque<Restore> restores_;
  std::unique_ptr<Server> server_;  // from the first store on
  std::set<int> in_flight_;         // the sender's and the restorer's connections

  // The sender thread's own.
  std::unique_ptr<store::StoreClient> session_;
  std::optional<store::Endpoint> connected_store_;
  std::map<std::string, Delivery> delivered_;              // by rank folder
  std::map<std::string, std::set<std::string>> recorded_;  // rank folder -> holders in rank_<R>
  std::map<std::string, std::chrono::steady_clock::time_point> resting_;  // peer -> until when
  std::vector<std::string> servers_;
  std::chrono::steady_clock::time_point servers_read_{};
  std::set<std::string> said_failed_;
  bool said_store_error_ = false;
  std::uint64_t rounds_seen_ = 0;
  std::optional<std::chrono::steady_clock::time_point> failing_since_;

  std::atomic<std::uint64_t> bytes_sent_{0};
  std::atomic<std::uint64_t> saves_sent_{0};
  std::atomic<std::uint64_t> bytes_restored_{0};
  std::atomic<std::uint64_t> restore_epoch_{0};
  std::thread sender_;  // last: they start once the rest is made
  std::thread restorer_;
};

}  // namespace dist::agent::warm
