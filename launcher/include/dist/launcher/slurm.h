// Inside a Slurm allocation, the job's shape comes from Slurm's environment when the command line
// (and PET_*) leave it out. Inside a job step (srun) that is the step's nodes, not the job's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "dist/store/endpoint.h"

namespace dist::launcher {

struct SlurmJob {
  int nnodes = 1;      // the step's nodes (the job's outside a step)
  int node_rank = 0;   // SLURM_NODEID: this node's index in the step
  int local_task = 0;  // SLURM_LOCALID: this task's index among the step's tasks on this node
  // The store: the first host of the step's node list, at a port derived from the job and step
  // ids (steps sharing nodes do not collide).
  store::Endpoint master;
  std::string job_id;
  std::string step_id;    // empty outside a task step (the batch script, an salloc shell)
  std::string node_name;  // SLURMD_NODENAME (empty outside a step or the batch script)

  bool in_step() const { return !step_id.empty(); }
  // "slurm-<job>.<step>" in a step, "slurm-<job>" outside one.
  std::string run_id() const;
};

// Reads SLURM_JOB_ID, SLURM_STEP_ID, SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST),
// SLURM_STEP_NUM_NODES (else SLURM_NNODES), SLURM_NODEID, SLURM_LOCALID and SLURMD_NODENAME;
// nullopt outside Slurm (no SLURM_JOB_ID or no node list). Throws std::invalid_argument naming the
// variable when one is malformed.
std::optional<SlurmJob> slurm_job_from_environment();

// The first host of a Slurm node list: "gpu[07-09,12],cpu1" -> "gpu07".
std::string first_host(const std::string& nodelist);

// The store port of a Slurm job step: in 20000..32767 (below Linux's ephemeral ports), the same on
// every node of the step, and different for each step of one job (step ids below 12768).
std::uint16_t slurm_port(const std::string& job_id, const std::string& step_id);

}  // namespace dist::launcher
