// Snapshots the agent holds (--snapshot-memory, --snapshot-dir): a directory in the agent's scratch
// space in shared memory (scratch.h), named in the workers' DIST_LAUNCH_SNAPSHOT_DIR, where
// dist_launch.snapshot (python/dist_launch/snapshot.py) and dist::sdk::save_snapshot
// (worker_sdk/include/dist/sdk/snapshot.h) keep each global rank's newest snapshots, so that they
// outlive the worker that saved them. Every file names its job, rank and world size, and a load
// returns only its own (docs/SNAPSHOTS.md: the format and its rules). The writers enforce the
// memory limit among themselves (a lock file and an allocation per save:
// DIST_LAUNCH_SNAPSHOT_MEMORY), evicting first the snapshots of ranks this node no longer runs (the
// agent lists those it runs before each attempt: begin_attempt()); the agent removes what a worker
// that died mid-save left (begin_attempt()) and the whole directory at its end.
//
// With --snapshot-dir the agent also copies each rank's newest save to DIR/JOB/rank_R (JOB: the
// job's --rdzv-id), on a thread of its own: every kPersistInterval, at once when a worker fails
// (persist_now()), and a last time when the agent ends. A copy is checked whole (its header's and
// footer's save ids agree: it did not overlap a rewrite) and put in place atomically (temporary
// file, fsync, rename, fsync of the directory); a step saved again is copied again. The workers'
// load() reads them (DIST_LAUNCH_SNAPSHOT_PERSIST_DIR) beside shared memory: after a restart of the
// node, or in the job's next run under the same --rdzv-id.
//
// Python workers import dist_launch.snapshot from the stand-in package every Python worker gets
// (health/python_hook.h) where dist_launch is not installed.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dist/agent/config.h"
#include "dist/contract/worker_contract.h"
#include "dist/store/endpoint.h"
#include "processes/process.h"
#include "warm/scratch.h"

namespace dist::agent::warm {

using worker_contract::kSnapshotDirVariable;  // the workers' variables: the contract's
using worker_contract::kSnapshotMemoryVariable;
using worker_contract::kSnapshotPersistVariable;
using worker_contract::kSnapshotRunVariable;
inline constexpr std::chrono::seconds kPersistInterval{5};
inline constexpr int kPersistedPerRank = 2;  // on disk, as in memory

// The folder of a job's snapshots under --snapshot-dir: its --rdzv-id, every byte outside
// [A-Za-z0-9._-] (and a leading '.') written %XX, so that two ids never share a folder
// (docs/SNAPSHOTS.md).
std::string job_folder(const std::string& job);

// What identifies one save (docs/SNAPSHOTS.md): read from a file's header and checked against its
// footer; nullopt for a file that is not a whole snapshot (torn, rewritten under the reader, or
// not one).
struct SaveStamp {
  std::uint64_t save_id = 0;
  std::int64_t saved_at = 0;  // Unix nanoseconds
  std::uint64_t step = 0;
  std::string job;  // whose it is: the header's job, global rank and world size
  std::int64_t rank = -1;
  std::int64_t world_size = 0;
};
std::optional<SaveStamp> read_stamp(const std::filesystem::path& file);

// The whole snapshots in a rank's folder, oldest saved first (not by step: a later run's step 110
// is newer than an earlier run's step 5000).
struct Saved {
  std::filesystem::path path;
  SaveStamp stamp;
};
std::vector<Saved> snapshots_in(const std::filesystem::path& rank_dir);
// A snapshot's file name: step_<STEP, 20 digits>.snap.
std::string snapshot_name(std::uint64_t step);
// A snapshot's prefix and header as bytes (empty when unreadable): the same bytes before and after
// a copy show that its writer did not rewrite it meanwhile.
std::string header_of(int fd);

class SnapshotReplicas;

class SnapshotStore {
 public:
  // `job`: the job's --rdzv-id; `run`: this agent's run, as the headers name it; for the
  // replicas (--snapshot-replicas): the job's token, this node as the others reach it, and where
  // to listen (--local-addr; "": every interface). Throws std::runtime_error (the snapshot
  // directory or --snapshot-dir cannot be made).
  SnapshotStore(const WarmOptions& options, const Scratch& scratch, const std::string& job,
                const std::string& run, const std::string& secret = {},
                const std::string& host = {}, const std::string& bind = {});
  ~SnapshotStore();  // persists what is new a last time (--snapshot-dir)
  SnapshotStore(const SnapshotStore&) = delete;
  SnapshotStore& operator=(const SnapshotStore&) = delete;

  // The variables every worker gets.
  const Variables& environment() const { return environment_; }
  std::uint64_t memory_limit() const { return memory_limit_; }
  const std::filesystem::path& directory() const { return directory_; }

  // Before an attempt (no worker runs): removes the partial saves the last one left, and lists the
  // global ranks this node runs now (the writers evict other ranks' snapshots first).
  void begin_attempt(int first_rank, int count);
  // The ranks this node runs changed under running workers (an in-place regroup).
  void list_ranks(int first_rank, int count);
  // A worker failed: the newest snapshots go to --snapshot-dir now.
  void persist_now();
  // --snapshot-replicas: the round's worker store, where the agents find each other's replicas.
  void use_store(const store::Endpoint& endpoint);
  // --snapshot-replicas, a round after the job's first: the ranks of first_rank..+count this node
  // holds no snapshot of are fetched from the peers that hold their replicas (among the round's
  // `other_nodes`), on a thread of the replicas'; `done` is called there when it is over (false:
  // nothing to fetch, and `done` is not called).
  bool restore(int first_rank, int count, int other_nodes, std::function<void()> done);
  // For status.json: the memory the snapshots hold and may hold, each rank's newest save, and
  // where they are persisted.
  nlohmann::ordered_json status() const;

 private:
  void run_persister();
  void announce_earlier_snapshots() const;
  void persist_all();
  bool persist(const std::filesystem::path& rank_dir, const std::filesystem::path& source,
               std::uint64_t save_id);

  std::filesystem::path directory_;
  std::filesystem::path persist_dir_;  // empty: none
  std::uint64_t memory_limit_ = 0;
  Variables environment_;

  std::mutex mutex_;
  std::condition_variable wake_;
  bool urgent_ = false;
  bool stopping_ = false;
  std::map<std::string, std::uint64_t> persisted_;  // rank folder -> save id last persisted
  std::thread persister_;
  std::unique_ptr<SnapshotReplicas> replicas_;
};

}  // namespace dist::agent::warm
