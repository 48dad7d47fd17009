// What dist-launch's agent tells each worker, as one contract both sides include: the agent
// writes it (agent/src/workers/worker_env.cc, worker_group.cc, health/, warm/), the worker SDK
// reads it (worker_sdk/src/env.cc, progress_slot.cc, snapshot.cc). torchrun's variables keep
// torchrun's names; dist-launch's own start with DIST_. A header-only library of its own
// (contract/, Dist::contract) that depends on nothing: the store library names the token file's
// variable from it too. python/dist_launch/ (progress.py, elastic.py, snapshot.py) holds the same
// names and offsets in blocks that contract/python_constants.py writes from this header (the
// suite's contract.python_constants fails when they differ).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace dist::worker_contract {

// torchrun's worker environment.
inline constexpr char kRank[] = "RANK";
inline constexpr char kLocalRank[] = "LOCAL_RANK";
inline constexpr char kGroupRank[] = "GROUP_RANK";
inline constexpr char kRoleRank[] = "ROLE_RANK";
inline constexpr char kRoleName[] = "ROLE_NAME";
inline constexpr char kLocalWorldSize[] = "LOCAL_WORLD_SIZE";
inline constexpr char kWorldSize[] = "WORLD_SIZE";
inline constexpr char kGroupWorldSize[] = "GROUP_WORLD_SIZE";
inline constexpr char kRoleWorldSize[] = "ROLE_WORLD_SIZE";
inline constexpr char kMasterAddr[] = "MASTER_ADDR";
inline constexpr char kMasterPort[] = "MASTER_PORT";
inline constexpr char kRestartCount[] = "TORCHELASTIC_RESTART_COUNT";
inline constexpr char kMaxRestarts[] = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr char kRunId[] = "TORCHELASTIC_RUN_ID";
inline constexpr char kUseAgentStore[] = "TORCHELASTIC_USE_AGENT_STORE";
inline constexpr char kErrorFile[] = "TORCHELASTIC_ERROR_FILE";
inline constexpr char kSignalsToHandle[] = "TORCHELASTIC_SIGNALS_TO_HANDLE";
inline constexpr char kNcclAsyncErrorHandling[] = "TORCH_NCCL_ASYNC_ERROR_HANDLING";

// dist-launch's own.
inline constexpr char kTokenFile[] = "DIST_LAUNCH_TOKEN_FILE";  // a path, never the secret
inline constexpr char kLocalAddr[] = "DIST_LOCAL_ADDR";         // --local-addr: where Gloo listens

// In-place recovery (--restart-policy in-place): the agent replaces a failed worker alone and the
// survivors rebuild their group with it, one generation of the group after another. Every worker
// of such a job gets kRestartPolicyVariable=in-place and kGenerationVariable: 0 for the workers
// the group started with, g for the worker started as generation g's replacement (with the same
// RANK, LOCAL_RANK, TORCHELASTIC_RESTART_COUNT and store as the worker it replaces).
//
// The keys, in the workers' store (MASTER_ADDR:MASTER_PORT), under
// generation_prefix(run id, restart count) = "/dist_launch/inplace/<run id>/attempt_<restart>/"
// (the leading "/" is the one PyTorch's TCPStore client puts before every key it sends, so that a
// torch worker reads and writes them as "dist_launch/inplace/..."; python/dist_launch/elastic.py):
//   generation        a counter: the agent adds 1 to publish the next generation, g
//   gen/<g>           then writes this record: "replaced=<ranks> survivors=<ranks>"
//   (comma-separated
//                     global ranks). The survivors, whose collective failed, wait for it: it is
//                     the agent's word that the peer is being replaced, not lost for good
//   gen/<g>/recovered written by the group's new root (the lowest rank that kept its state) once
//                     generation g's group is built and every rank holds the root's state:
//                     "step=<n> root=<rank> wall_ns=<ns>". The agent waits for it: until then a
//                     failure is a failure during recovery, and the whole group restarts
//   A lost node (elastic rendezvous): the survivors keep their processes and go on in a smaller
//   world. Its agents join the next round R while their workers wait, each writes, for its
//   workers,
//   regroup/<R>/from/<o>  "<new rank offset> <new node rank>": the workers whose global ranks
//                     started at o (RANK - LOCAL_RANK) are now those from the new offset on
//                     (LOCAL_RANK and LOCAL_WORLD_SIZE stay)
//   and node 0 of round R publishes the generation: gen/<g> = "regrouped round=<R> world=<N>
//   nodes=<K>".
//   Every survivor takes its new rank from its own node's key, and the group is rebuilt as for
//   a replacement (gen/<g>/recovered included), only without one.
//   A newcomer (elastic rendezvous): a node that waits to join a running in-place job makes the
//   running nodes regroup the same way, in a larger world. Node 0 of round R also writes
//   regroup/<R>/generation  "<g>": the newcomer's agent starts its workers as generation g
//                     (kGenerationVariable), which receive the running workers' state as a
//                     replacement does.
//   gen/<g>/arrived/<rank>  "1": rank `rank` of generation g's world is ready to join it: a
//                     newcomer's worker writes its own once started (its imports done, as it
//                     waits for the group); every running node's agent writes its workers'.
//                     Node 0 publishes gen/<g> once every rank arrived (or after
//                     kArrivalTimeout, agent side): the running workers train on meanwhile.
//                     "failed" (kArrivalFailed): the newcomer's agent says that worker died
//                     before the running workers took it in; node 0 then publishes nothing,
//                     and the job starts again with every node (a group restart).
//   The running workers' collectives do not fail: once gen/<g> is out, their agents ask them to
//   recover at their next unit of work (the progress slot's regroup_round, below; a torch
//   worker's watcher sees gen/<g> itself), and they wait in the new group for the newcomers.
//   The running workers may finish the job meanwhile. A node whose workers all finished during
//   the regroup writes "finished" at regroup/<R>/generation when nothing was named there yet
//   (node 0 then names nothing: the key is set by compare-and-set), and otherwise
//   regroup/<R>/finished  "<g>": the newcomer's agent stops its workers, which would wait for
//                     running workers that are gone; every node of round R passes its exit
//                     barrier and the job ends done, not restarted.
//   A failure while a replacement is under way (a worker of another node dies as the group
//   rebuilds itself) is folded into that recovery when every rank can follow it: the failed
//   worker's agent takes the recovery over, counts generation g+1 and writes
//   gen/<g>/recovered  "superseded=<g+1>" (kSuperseded; by compare-and-set: not when g's group
//                     said it recovered first, a plain replacement then), and publishes gen/<g+1>
//                     with the replaced ranks of both. (A root that formed g after all may write
//                     its word over it: g's ranks then fail into g+1 as after any failure.) Ranks
//                     whose set-up of g fails or sees the counter pass g give it up and join the
//                     latest generation; the agent that waited for g waits for g+1.
//   work/<rank>       "running" while rank `rank`'s worker is inside its training function,
//                     "returned" once that returned (dist_launch.elastic.run writes it at each
//                     entry and at its return; the SDK does not): a worker that fails once every
//                     other worker finished ends the job done only when it had returned (a crash
//                     in its teardown), not while its own work was under way (its part of the
//                     result, a final checkpoint: lost, not done).
//   fold/<rank>       "1": rank `rank`'s worker follows such a generation (the SDK's recovery
//                     and dist_launch.elastic write it over Gloo as they start, and again under
//                     a rank a regroup gave them; NCCL groups do not): without every rank's, the
//                     failure restarts the whole group as before.
// Generation g's process group keeps its keys under "sdk/<run id>/attempt_<restart>/gen_<g>/"
// (generation 0: "sdk/<run id>/attempt_<restart>/"), so no key of a previous generation is read.
// Once generation g recovered, the agent deletes the keys of the generations before it (gen/<h>
// and everything under it, gen_<h>/...): no rank reads them again.
// A group restart starts over at generation 0 with a new restart count, hence new keys.
inline constexpr char kRestartPolicyVariable[] = "DIST_LAUNCH_RESTART_POLICY";
// --in-place-timeout, in milliseconds: how long a recovery may take, from a failure to the group's
// word (gen/<g>/recovered). The agent restarts the group past it; the workers bound their wait for
// a generation's group and state by it (the SDK's RecoveryOptions::group_timeout,
// dist_launch.elastic's group timeout).
inline constexpr char kInPlaceTimeoutVariable[] = "DIST_LAUNCH_IN_PLACE_TIMEOUT_MS";
inline constexpr std::chrono::milliseconds kDefaultInPlaceTimeout{300'000};  // without the flag
inline constexpr char kInPlacePolicy[] = "in-place";
inline constexpr char kGenerationVariable[] = "DIST_LAUNCH_GENERATION";

// Where a restart's process groups keep their keys: generation 0's here, generation g's under
// <this>gen_<g>/ (above). Stored as it is by the SDK's client, with a "/" before it by torch's.
inline std::string group_prefix(const std::string& run_id, int restart_count) {
  return "sdk/" + run_id + "/attempt_" + std::to_string(restart_count) + "/";
}
inline std::string generation_prefix(const std::string& run_id, int restart_count) {
  return "/dist_launch/inplace/" + run_id + "/attempt_" + std::to_string(restart_count) + "/";
}
inline std::string generation_counter_key(const std::string& prefix) {
  return prefix + "generation";
}
inline std::string generation_key(const std::string& prefix, int generation) {
  return prefix + "gen/" + std::to_string(generation);
}
inline std::string recovered_key(const std::string& prefix, int generation) {
  return generation_key(prefix, generation) + "/recovered";
}
inline std::string regroup_key(const std::string& prefix, int round, int old_rank_offset) {
  return prefix + "regroup/" + std::to_string(round) + "/from/" + std::to_string(old_rank_offset);
}
inline std::string regroup_generation_key(const std::string& prefix, int round) {
  return prefix + "regroup/" + std::to_string(round) + "/generation";
}
inline std::string arrived_key(const std::string& prefix, int generation, int rank) {
  return generation_key(prefix, generation) + "/arrived/" + std::to_string(rank);
}
inline std::string fold_key(const std::string& prefix, int rank) {
  return prefix + "fold/" + std::to_string(rank);
}
inline std::string work_key(const std::string& prefix, int rank) {
  return prefix + "work/" + std::to_string(rank);
}
inline constexpr char kWorkRunning[] = "running";       // at work_key (and "returned")
inline constexpr char kSuperseded[] = "superseded=";    // at recovered_key, then the generation
inline constexpr char kArrivalFailed[] = "failed";      // at arrived_key
inline constexpr char kRegroupFinished[] = "finished";  // at regroup_generation_key
inline std::string regroup_finished_key(const std::string& prefix, int round) {
  return prefix + "regroup/" + std::to_string(round) + "/finished";
}

// A worker's progress slot: the agent gives each worker one page of shared memory (a memfd) open
// at the descriptor that kFdVariable names; the worker maps it shared and stores into it, with no
// system call: at each beat (dist::sdk::heartbeat()) the CLOCK_MONOTONIC time in nanoseconds into
// last_beat_ns, and beats counts them; at each training step (dist::sdk::step(),
// dist_launch.progress.step(), the optimizer-step hook dist-launch installs in torch workers) the
// same into last_step_ns, and steps counts them. The worker's collectives:
//   - the SDK's groups count theirs (one sequence for all of them: collectives_issued, _done) and
//     stamp the oldest one still pending (pending_since_ns, pending_op; pending_group 0);
//   - a torch worker's progress hook samples its main thread ten times a second (nothing of
//     torch's is replaced): each process group's own sequence number (groups: id = a hash of the
//     group's name, the same on every rank; seq = the collectives issued on it), and whether the
//     main thread is blocked in a collective: pending_since_ns (when it was first seen there),
//     pending_op, pending_group and pending_seq (the group's sequence number of the one it waits
//     in). sampled_ns stamps each pass: a pass that stops coming means the interpreter cannot run
//     (a thread holds the GIL). wait_ns adds up the time it was seen blocked.
// work_ns adds up the time each step computed rather than waited for its peers (the straggler
// measure: the SDK's DDP from after_step() to synchronize(); torch: the sampler's time not
// blocked). activity says what the main thread was last seen doing (kActivity*). A worker can say
// "a long pause of my own" (dist_launch.progress.pause(reason), dist::sdk::Pause): paused_since_ns
// and pause_reason while it lasts, resumed_ns when it ends (counted as progress).
// setup_since_ns says since when the worker waits for its peers in a group's set-up (building a
// process group, whose rendezvous waits for every rank; an in-place generation's record, group and
// state): the SDK's group building and InPlaceRecovery write it, and a torch worker's sampler
// while it sees the main thread in torch's init_process_group or new_group, or in the recovery of
// dist_launch.elastic, and in no collective inside it; 0: none. Such a rank waits on every rank of
// its group.
// collective_timeout_ms is the longest timeout of its process groups (0: unknown): the agent's
// bound for a hang it cannot prove. A worker that can dump its stacks says so in features and names
// the process to signal in dump_pid. The agent asks for them in stacks_asked first (a torch
// worker's sampler writes every thread's stacks, holding the GIL) and signals only a worker that
// cannot answer so (a thread keeps the GIL, no sampler, a C++ worker): a Python worker's at its
// main thread (tgkill), whose stack alone its handler dumps. A signal handler that walks the other
// threads crashes the process when one of them comes or goes meanwhile (torch's autograd and DDP
// threads do, every step: measured, SIGSEGV in faulthandler's all-threads dump). The agent writes
// kMagic first: a descriptor without it is not a slot. Every field sits at a fixed offset, aligned
// to its size (Python workers write them through a memoryview): magic 0, last_beat_ns 8, beats 16,
// steps 24, last_step_ns 32, collectives_issued 40, collectives_done 48, pending_since_ns 56,
// pending_op 64, features 68, work_ns 72, dump_pid 80, regroup_round 84, sampled_ns 88, wait_ns 96,
// pending_group 104, pending_seq 112, paused_since_ns 120, resumed_ns 128, collective_timeout_ms
// 136, activity 144, group_count 148, pause_reason 152 (64 bytes, NUL-padded UTF-8), groups 216
// (kMaxGroups of {id, seq}), stacks_asked 728, setup_since_ns 736, group_sizes 744 (kMaxGroups:
// each group's number of ranks, the groups' order; 0: unknown). Two fields go the other way: the
// agent bumps stacks_asked to ask for the stacks (above), and it writes regroup_round when the job
// regroups in place in round R (a node joins or was lost), and the SDK's InPlaceRecovery, seeing a
// round it has not regrouped in, recovers at its next unit; its watcher aborts the group when the
// rank has not let go of it 500 ms after the request (a collective waiting for a lost node's silent
// peer).
namespace heartbeat_slot {

inline constexpr char kFdVariable[] = "DIST_HEARTBEAT_FD";
inline constexpr std::uint64_t kMagic = 0x3130'4248'5453'4944;  // "DISTHB01", little-endian
inline constexpr std::size_t kBytes = 4096;

// What a pending collective is (pending_op).
enum class Collective : std::uint32_t {
  kNone,
  kAllReduce,
  kBroadcast,
  kAllGather,
  kReduceScatter,
  kBarrier,
  kOther,
  kReduce,
  kAllToAll,
  kGather,
  kScatter,
  kSendRecv,
  kSetup,  // not a collective: a group's set-up (setup_since_ns), as the agents publish it
};
// features: what the worker can do for the agent.
inline constexpr std::uint32_t kStacksOnSignal = 1;  // dumps its stacks on kStackSignalVariable
inline constexpr std::uint32_t kSampler = 2;         // samples its main thread (torch's hook)
inline constexpr std::uint32_t kProgressHook = 4;    // dist-launch's Python hook loaded
inline constexpr std::uint32_t kStacksOnAsk = 8;     // writes every thread's on stacks_asked
// activity: what the main thread was last seen in (bits; torch workers' sampler).
inline constexpr std::uint32_t kActivitySave = 1;        // torch.save / torch.load
inline constexpr std::uint32_t kActivityCheckpoint = 2;  // torch.distributed.checkpoint
inline constexpr std::uint32_t kActivityData = 4;        // torch.utils.data (a DataLoader)
inline constexpr std::uint32_t kActivityForward = 8;     // a module's forward
inline constexpr std::uint32_t kActivityBackward = 16;   // autograd's backward
inline constexpr std::uint32_t kActivityCompile = 32;    // torch.compile (dynamo, inductor)
// Not the main thread's: another thread of the script's own (its code or a library's on that
// thread's stack, a collective of torch's, or the standard library's alone: a Timer, sched, an
// event loop, which run what they were handed; progress.py's others_may_issue) lives beside it,
// and may issue what the main thread's peers wait for: the main thread's wait proves nothing
// (collective_proof.h).
inline constexpr std::uint32_t kActivityThreads = 64;
// Not the main thread's either: another thread is inside torch.distributed.checkpoint (an
// async_save's writer): the main thread waiting for it (its future's result()) waits for a
// checkpoint of its own, as a main thread inside dcp.save does.
inline constexpr std::uint32_t kActivityCheckpointThread = 128;
inline constexpr std::size_t kMaxGroups = 32;
inline constexpr std::size_t kPauseReasonBytes = 64;

struct GroupSequence {
  std::atomic<std::uint64_t> id;   // a hash of the group's name; 0: an empty entry
  std::atomic<std::uint64_t> seq;  // collectives issued on it
};

struct Slot {
  std::uint64_t magic;
  std::atomic<std::uint64_t> last_beat_ns;  // 0: not beaten yet
  std::atomic<std::uint64_t> beats;
  std::atomic<std::uint64_t> steps;
  std::atomic<std::uint64_t> last_step_ns;  // 0: no step yet
  std::atomic<std::uint64_t> collectives_issued;
  std::atomic<std::uint64_t> collectives_done;
  std::atomic<std::uint64_t> pending_since_ns;  // the oldest pending collective's issue; 0: none
  std::atomic<std::uint32_t> pending_op;        // its Collective
  std::atomic<std::uint32_t> features;
  std::atomic<std::uint64_t> work_ns;
  std::atomic<std::uint32_t> dump_pid;         // 0: none
  std::atomic<std::uint32_t> regroup_round;    // by the agent; 0: none (round 0 is no regroup)
  std::atomic<std::uint64_t> sampled_ns;       // the sampler's last pass; 0: no sampler
  std::atomic<std::uint64_t> wait_ns;          // time seen blocked in collectives
  std::atomic<std::uint64_t> pending_group;    // the pending collective's group (torch); 0: none
  std::atomic<std::uint64_t> pending_seq;      // and its number in that group
  std::atomic<std::uint64_t> paused_since_ns;  // a declared pause; 0: none
  std::atomic<std::uint64_t> resumed_ns;       // the last pause's end
  std::atomic<std::uint64_t> collective_timeout_ms;  // 0: unknown
  std::atomic<std::uint32_t> activity;               // kActivity* bits
  std::atomic<std::uint32_t> group_count;            // entries of groups in use
  char pause_reason[kPauseReasonBytes];
  GroupSequence groups[kMaxGroups];
  std::atomic<std::uint32_t> stacks_asked;             // by the agent: bumped for each request
  std::atomic<std::uint64_t> setup_since_ns;           // waiting in a group's set-up since; 0: not
  std::atomic<std::uint32_t> group_sizes[kMaxGroups];  // ranks in groups[i]; 0: unknown
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "the slot is shared by processes");
static_assert(sizeof(Slot) <= kBytes);
static_assert(offsetof(Slot, features) == 68 && offsetof(Slot, work_ns) == 72 &&
                  offsetof(Slot, dump_pid) == 80 && offsetof(Slot, regroup_round) == 84 &&
                  offsetof(Slot, sampled_ns) == 88 && offsetof(Slot, pending_seq) == 112 &&
                  offsetof(Slot, collective_timeout_ms) == 136 && offsetof(Slot, activity) == 144 &&
                  offsetof(Slot, group_count) == 148 && offsetof(Slot, pause_reason) == 152 &&
                  offsetof(Slot, groups) == 216 && sizeof(GroupSequence) == 16 &&
                  offsetof(Slot, stacks_asked) == 728 && offsetof(Slot, setup_since_ns) == 736 &&
                  offsetof(Slot, group_sizes) == 744,
              "the offsets Python workers write at");

}  // namespace heartbeat_slot

// Where a worker dumps its stacks when the agent asks (a hang): the signal the agent sends (a
// realtime signal, sent only to a worker whose slot has kStacksOnSignal, to its main thread, when
// it does not answer stacks_asked), and the file it appends them to (faulthandler's format).
inline constexpr char kStackSignalVariable[] = "DIST_STACK_SIGNAL";
inline constexpr char kStackFileVariable[] = "DIST_STACK_FILE";

// Snapshots (--snapshot-memory, --snapshot-dir; agent/src/warm/snapshot_store.h): the shared-memory
// directory the workers save into, the bound on what they keep there (bytes), and where the agent
// persists them to disk (--snapshot-dir/JOB). python/dist_launch/snapshot.py and
// worker_sdk/src/snapshot.cc write them in one format: docs/SNAPSHOTS.md.
inline constexpr char kSnapshotDirVariable[] = "DIST_LAUNCH_SNAPSHOT_DIR";
inline constexpr char kSnapshotMemoryVariable[] = "DIST_LAUNCH_SNAPSHOT_MEMORY";
inline constexpr char kSnapshotPersistVariable[] = "DIST_LAUNCH_SNAPSHOT_PERSIST_DIR";
// The agent's run (host, pid, start), which every snapshot's header names (docs/SNAPSHOTS.md).
inline constexpr char kSnapshotRunVariable[] = "DIST_LAUNCH_SNAPSHOT_RUN";
}  // namespace dist::worker_contract
