// Snapshots the agent holds (dist-launch --snapshot-memory SIZE, --snapshot-dir DIR): a worker's
// state in the agent's shared memory, which outlives the worker, so that a restarted worker resumes
// from its last step without reading a checkpoint from disk. The same files as Python's
// dist_launch.snapshot (python/dist_launch/snapshot.py, which describes the format): each tensor's
// raw bytes under a JSON header, written under a temporary name and renamed when complete (a save
// torn by a crash is never loaded); each local rank keeps its two newest, the older one's memory
// reused by the next save; all of them within --snapshot-memory.
//
//   if (auto s = dist::sdk::load_snapshot()) model.restore(*s);       // resume
//   dist::sdk::save_snapshot({step, model.tensors()});                 // every N steps
//
// Outside dist-launch (or without those options) save_snapshot() saves nothing and returns false,
// load_snapshot() returns nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <vector>

#include "dist/sdk/checkpoint.h"

namespace dist::sdk {

class SnapshotError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A save would take the job's snapshots past --snapshot-memory.
class SnapshotMemoryError : public SnapshotError {
 public:
  using SnapshotError::SnapshotError;
};

// Whether an agent holds snapshots for this worker (DIST_LAUNCH_SNAPSHOT_DIR).
bool snapshots_enabled();

// This local rank's snapshot at `snapshot.step`, atomically. False when no agent holds snapshots.
// Throws SnapshotMemoryError past --snapshot-memory, SnapshotError when it cannot be written.
bool save_snapshot(const Checkpoint& snapshot);

// The newest complete snapshot that every local rank with snapshots has (so that replicas resume
// together), else this rank's newest; or `step`'s. Looks in shared memory, then in --snapshot-dir.
// nullopt when there is none. Throws SnapshotError for a snapshot whose tensors are not float32
// (one Python saved with other types).
std::optional<Checkpoint> load_snapshot(std::optional<std::uint64_t> step = std::nullopt);

// This local rank's complete snapshots' steps, oldest first.
std::vector<std::uint64_t> snapshot_steps();

}  // namespace dist::sdk
