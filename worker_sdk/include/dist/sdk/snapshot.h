// Snapshots the agent holds (dist-launch --snapshot-memory SIZE, --snapshot-dir DIR): a worker's
// state in the agent's shared memory, which outlives the worker, so that a restarted worker resumes
// from its last step without reading a checkpoint from disk. The same files as Python's
// dist_launch.snapshot (python/dist_launch/snapshot.py): format 2, specified in docs/SNAPSHOTS.md.
//
//   if (auto s = dist::sdk::load_snapshot()) model.restore(*s);       // resume
//   dist::sdk::save_snapshot({step, model.tensors()});                 // every N steps
//
// Identity: a save belongs to its global rank and job. Each global rank (RANK) has a folder,
// rank_<RANK>, and each file's header names the job (TORCHELASTIC_RUN_ID, "none" when unset), the
// agent's run (DIST_LAUNCH_SNAPSHOT_RUN), the rank, the world size (WORLD_SIZE), the local rank,
// the generation (TORCHELASTIC_RESTART_COUNT), the step, when it was saved (saved_at) and a random
// save_id that the file's footer repeats. A load returns a file only when its job, rank and world
// size are this worker's (SnapshotScope::kReplicated: its job only), and only when it is whole (its
// footer is there and names the header's save_id): another job's or rank's file, a torn save and a
// file being rewritten are skipped, wherever they are found.
//
// Freshness is when a snapshot was saved, not its step: a run that started afresh under the same
// job id is never beaten by a higher step an earlier run left in --snapshot-dir.
//
// Each rank keeps its two newest saves, the oldest one's memory reused by the next save; all of
// them within --snapshot-memory (a save past it first evicts the snapshots of ranks this node no
// longer runs).
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

// Whose snapshots a load may return.
enum class SnapshotScope {
  // This rank's own: saved by this global rank of this job with this world size (state that
  // differs between ranks: shards, per-rank optimizer state, residuals).
  kThisRank,
  // State that is the same on every rank (DDP's replicas): any rank's save of this job, whatever
  // rank and world size it was saved with, so that a worker whose rank changed (an elastic job that
  // reshaped) resumes from whichever rank's state is here.
  kReplicated,
};

// Whether an agent holds snapshots for this worker (DIST_LAUNCH_SNAPSHOT_DIR).
bool snapshots_enabled();

// This rank's snapshot at `snapshot.step`, atomically (never seen torn by a reader): its float
// tensors and its typed ones (Checkpoint::typed, any type and shape; blobs are not kept). False
// when no agent holds snapshots. Throws SnapshotMemoryError past --snapshot-memory, SnapshotError
// when it cannot be written or a typed tensor's bytes are not its shape's.
bool save_snapshot(const Checkpoint& snapshot);

// The newest saved complete snapshot of this job in `scope` (shared memory and --snapshot-dir
// together), or `step`'s newest save; nullopt when there is none. kThisRank: this rank's, the
// steps that every rank folder here has (of this job and world size) first, so that replicas and
// shards resume at one step, then the rest. kReplicated: any rank's newest save. Float32 tensors
// of one dimension come back in `tensors`, every other tensor (any type Checkpoint::typed names,
// any shape: what torch and numpy workers save) in `typed`. Throws SnapshotError for a tensor of
// a type it does not know.
std::optional<Checkpoint> load_snapshot(std::optional<std::uint64_t> step = std::nullopt,
                                        SnapshotScope scope = SnapshotScope::kThisRank);

// This rank's complete snapshots' steps of this job (as kThisRank loads them), oldest saved first:
// back() is the newest save.
std::vector<std::uint64_t> snapshot_steps();

}  // namespace dist::sdk
