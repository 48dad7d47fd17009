// Inside a Slurm allocation, the job's shape comes from Slurm's environment when the command line
// (and PET_*) leave it out.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dist::launcher {

struct SlurmJob {
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;    // the first host of the job's node list
  std::uint16_t master_port;  // derived from the job id, so jobs sharing nodes do not collide
  std::string job_id;
};

// Reads SLURM_JOB_NODELIST, SLURM_NNODES, SLURM_NODEID and SLURM_JOB_ID; nullopt outside Slurm.
// Throws std::invalid_argument naming the variable when one is malformed.
std::optional<SlurmJob> slurm_job_from_environment();

// The first host of a Slurm node list: "gpu[07-09,12],cpu1" -> "gpu07".
std::string first_host(const std::string& nodelist);

// The store port of a Slurm job: in 20000..59999, the same on every node of the job.
std::uint16_t slurm_port(const std::string& job_id);

}  // namespace dist::launcher
