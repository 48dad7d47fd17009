// The agent's vocabulary: the worker, the round and the failure, each one type that every room
// (lifecycle, workers, health, rendezvous, recovery, output) shares. What a room needs beside
// them it holds next to one of these (the worker group's process state, a rank's published
// progress, a worker's environment), never a second copy of their fields.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "dist/store/endpoint.h"

namespace dist::agent {

// One worker of the job: the one type that holds a worker's ranks. Its process and round where
// they are known (a worker read back from the store has no pid here).
struct Worker {
  int round = 0;
  int rank = 0;        // in the job (RANK)
  int local_rank = 0;  // on its node (LOCAL_RANK)
  pid_t pid = -1;
  // Workers that are generations of their group (in place): the one it joined at start; none
  // for the workers of every other policy.
  std::optional<int> generation = std::nullopt;
};

// One round as this node sees it: a run of the worker group, with this node's place in it.
struct Round {
  int round = 0;
  int node_rank = 0;
  int num_nodes = 1;
  int world_size = 0;
  int rank_offset = 0;  // global rank of this node's local rank 0
  int restarts = 0;     // job-wide restarts before this round (TORCHELASTIC_RESTART_COUNT)
  bool elastic = false;
  // Elastic: the members that were in the previous round, and whether this round continues that
  // round's running workers (--restart-policy in-place: node 0 kept them, and its store).
  int returning = 0;
  bool continues = false;
  // Static: this node's workers of the round had succeeded before its agent was relaunched (the
  // agent before it was lost at its exit barrier, while other nodes still ran): the node joins
  // the round at its exit barrier, in that agent's place, and runs no worker.
  bool workers_succeeded = false;
  // Each node's liveness key exists exactly while that node's agent lives: alive_prefix followed
  // by the node's id (static: its node rank; elastic: its ticket, listed by node rank in the
  // members key, which only the nodes that need every id read).
  std::string alive_prefix;
  int successor_id = -1;    // the next node's id in the ring (-1: alone)
  std::string members_key;  // elastic: "<id>,<id>,..." by node rank
  // etcd: the workers' store of this round, hosted by node rank 0; none: the rendezvous store
  // itself serves the workers.
  std::optional<store::Endpoint> worker_store;
};

// One worker's failure, as the agent records it, the other nodes read it from the store and the
// failure report prints it.
struct WorkerFailure {
  // The store carries its ranks and pid to the other nodes, not its round or generation.
  Worker worker;
  std::chrono::system_clock::time_point time;  // from the error file when it has one
  std::string host;
  int exit_code = 0;  // the worker's status, or -signal when killed by a signal
  std::string error_file;
  std::string message;    // from the error file: "<Type>: <text>"
  std::string traceback;  // from the error file, else "Signal N (SIGX) received by PID p"
  // The worker failed because another did (a peer's connection reset, an aborted collective):
  // listed in the report, never chosen as its root cause over a failure of its own.
  bool collateral = false;
  // It had failed on its own (its error file predates the stop) when the stop's signal ended it:
  // the job's exit code is then 1, not 128 + that signal.
  bool ended_by_the_stop = false;
};

// A worker replaced alone (--restart-policy in-place): its failure, the generation its
// replacement joined, the replacement's pid, and the ranks that kept running. The store carries
// every node's to the others, for the failure report.
struct InPlaceReplacement {
  WorkerFailure failure;
  int generation = 0;
  pid_t new_pid = -1;
  std::vector<int> survivors;
};

}  // namespace dist::agent
