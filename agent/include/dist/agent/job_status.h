// A running job as its agents wrote it in the rendezvous store: what `dist-launch status` shows.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dist/agent/vocabulary.h"
#include "dist/store/client.h"

namespace dist::agent {

// One running worker's progress, as its node's agent published it beside its heartbeat (ages as of
// the moment the status was read). What the worker does not report is absent: steps before its
// first one (or a worker that reports none), rates and timeouts the agent has not measured yet.
struct RankStatus {
  Worker worker;  // its ranks (no pid: the store does not carry it)
  std::optional<std::uint64_t> steps;
  std::optional<double> steps_per_second;
  std::optional<double> step_seconds;        // the median of its recent steps
  std::optional<double> since_step_seconds;  // since its last step
  std::optional<double> since_beat_seconds;  // since its last heartbeat (dist::sdk::heartbeat())
  std::uint64_t beats = 0;
  std::optional<double> hang_timeout_seconds;  // progress stopped this long: taken for hung
  bool straggler = false;                      // slower than its group by more than noise
  std::string pending_collective;              // the one it is blocked in ("all_reduce #12")
  bool suspect = false;  // a hang investigation found the others wait for it, and it does nothing
  bool paused = false;   // in a pause it declared (dist_launch.progress.pause())
  std::optional<double> work_seconds;  // its own work per step (the straggler measure)
  // The share of the time its main thread could run that it waited for a CPU: where the job's
  // median rank waits 60% of it, ranks are not compared (no straggler is told).
  std::optional<double> cpu_wait;
  std::string doing;  // what the last investigation (or its pause) says it is doing

  // Since its last sign of progress: its last step, else its last heartbeat; none before either.
  std::optional<double> progress_age_seconds() const;
  // Suspected of a hang: the others wait for it and it does nothing (its agent looked).
  bool hung() const;
};

struct NodeStatus {
  int node_rank = 0;
  int first_rank = -1;  // -1: not placed yet
  int workers = 0;
  bool alive = false;  // the agent's liveness key exists
  std::optional<long long> heartbeat_age_seconds;
  std::string host;
  int pid = 0;
  std::string agent_state;        // its agent's lifecycle state as last published; "" when none
  std::vector<RankStatus> ranks;  // its running workers as last published, by rank
};

struct JobStatus {
  std::string run_id;
  std::string endpoint;
  bool elastic = false;
  int round = 0;
  int restarts = 0;
  std::string state;          // running, done, FAILED, ended (<reason>), forming
  int next_round_joined = 0;  // elastic: nodes already in the round forming after this one
  std::vector<NodeStatus> nodes;
};

// Reads job `run_id` from the TCPStore `store` names (connecting and waiting as its options say);
// nullopt when the store holds no job by that id. Throws store::StoreError when the store
// cannot be read, std::runtime_error naming the key of a corrupted value.
std::optional<JobStatus> read_job_status(const store::ClientOptions& store,
                                         const std::string& run_id);

std::string format_table(const JobStatus& status);  // the nodes, then their ranks
std::string to_json(const JobStatus& status);       // one JSON object
// Text cells as the table shows them: "-" for what is absent.
std::string format_seconds(std::optional<double> seconds);  // "0.25 s", "12 s", "3m05s"
// "HUNG? (idle) STRAGGLER waits in all_reduce #3", "PAUSED (checkpoint)".
std::string rank_marks(const RankStatus& rank);

}  // namespace dist::agent
