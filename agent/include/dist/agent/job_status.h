// A running job as its agents wrote it in the rendezvous store: what `dist-launch status` shows.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dist/rendezvous/client.h"

namespace dist::agent {

struct NodeStatus {
  int node_rank = 0;
  int first_rank = -1;  // -1: not placed yet
  int workers = 0;
  bool alive = false;  // the agent's liveness key exists
  std::optional<long long> heartbeat_age_seconds;
  std::string host;
  int pid = 0;
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
// nullopt when the store holds no job by that id. Throws rendezvous::StoreError when the store
// cannot be read, std::runtime_error naming the key of a corrupted value.
std::optional<JobStatus> read_job_status(const rendezvous::ClientOptions& store,
                                         const std::string& run_id);

std::string format_table(const JobStatus& status);
std::string to_json(const JobStatus& status);  // one JSON object

}  // namespace dist::agent
