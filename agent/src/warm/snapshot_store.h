// Snapshots the agent holds (--snapshot-memory, --snapshot-dir): a directory in the agent's scratch
// space in shared memory (scratch.h), named in the workers' DIST_LAUNCH_SNAPSHOT_DIR, where
// dist_launch.snapshot (python/dist_launch/snapshot.py) and dist::sdk::save_snapshot
// (worker_sdk/include/dist/sdk/snapshot.h) keep each local rank's newest snapshots, so that they
// outlive the worker that saved them. The writers enforce the memory limit among themselves (a lock
// file and an allocation per save: DIST_LAUNCH_SNAPSHOT_MEMORY); the agent removes what a worker
// that died mid-save left (sweep_torn(), before each attempt) and the whole directory at its end.
//
// With --snapshot-dir the agent also copies each local rank's newest snapshot to disk, on a thread
// of its own: every kPersistInterval, at once when a worker fails (persist_now()), and a last time
// when the agent ends. The copies are atomic (temporary file, fsync, rename, fsync of the
// directory), and the workers' load() reads them (DIST_LAUNCH_SNAPSHOT_PERSIST_DIR) when shared
// memory has none: after a restart of the node.
//
// Python workers import dist_launch.snapshot from the stand-in package every Python worker gets
// (health/python_hook.h) where dist_launch is not installed.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "dist/agent/config.h"
#include "dist/contract/worker_contract.h"
#include "processes/process.h"
#include "warm/scratch.h"

namespace dist::agent::warm {

using worker_contract::kSnapshotDirVariable;  // the workers' variables: the contract's
using worker_contract::kSnapshotMemoryVariable;
using worker_contract::kSnapshotPersistVariable;
inline constexpr std::chrono::seconds kPersistInterval{5};
inline constexpr int kPersistedPerRank = 2;  // on disk, as in memory

class SnapshotStore {
 public:
  // Throws std::runtime_error (the snapshot directory or --snapshot-dir cannot be made).
  SnapshotStore(const WarmOptions& options, const Scratch& scratch);
  ~SnapshotStore();  // persists what is new a last time (--snapshot-dir)
  SnapshotStore(const SnapshotStore&) = delete;
  SnapshotStore& operator=(const SnapshotStore&) = delete;

  // The variables every worker gets.
  const Variables& environment() const { return environment_; }
  std::uint64_t memory_limit() const { return memory_limit_; }
  const std::filesystem::path& directory() const { return directory_; }

  // Before an attempt (no worker runs): removes the partial saves the last one left.
  void sweep_torn();
  // A worker failed: the newest snapshots go to --snapshot-dir now.
  void persist_now();

 private:
  void run_persister();
  void persist_all();
  bool persist(const std::filesystem::path& rank_dir, const std::filesystem::path& source);

  std::filesystem::path directory_;
  std::filesystem::path persist_dir_;  // empty: none
  std::uint64_t memory_limit_ = 0;
  Variables environment_;

  std::mutex mutex_;
  std::condition_variable wake_;
  bool urgent_ = false;
  bool stopping_ = false;
  std::map<std::string, std::string> persisted_;  // rank folder -> newest file persisted
  std::thread persister_;
};

}  // namespace dist::agent::warm
