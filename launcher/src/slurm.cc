#include "dist/launcher/slurm.h"

#include <cstdlib>
#include <stdexcept>

namespace dist::launcher {
namespace {

constexpr int kPortBase = 20000;
constexpr int kPortSpan = 40000;

int integer(const char* name, const char* value) {
  try {
    std::size_t used = 0;
    const int v = std::stoi(value, &used);
    if (used == std::string(value).size() && v >= 0) return v;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument(std::string(name) + "='" + value + "' is not a count");
}

}  // namespace

std::string first_host(const std::string& nodelist) {
  // The first entry ends at a comma outside brackets; its range, if any, starts at '['.
  std::size_t end = 0;
  for (int depth = 0; end < nodelist.size(); ++end) {
    if (nodelist[end] == '[') ++depth;
    if (nodelist[end] == ']') --depth;
    if (nodelist[end] == ',' && depth == 0) break;
  }
  const std::string entry = nodelist.substr(0, end);
  const auto open = entry.find('[');
  if (open == std::string::npos) return entry;
  const std::string prefix = entry.substr(0, open);
  const std::string ranges = entry.substr(open + 1, entry.find(']') - open - 1);
  const std::string first = ranges.substr(0, ranges.find_first_of("-,"));  // keeps zero padding
  const auto close = entry.find(']');
  return prefix + first + (close + 1 < entry.size() ? entry.substr(close + 1) : "");
}

std::uint16_t slurm_port(const std::string& job_id) {
  unsigned long long id = 0;
  for (char c : job_id) id = id * 31 + static_cast<unsigned char>(c);
  return static_cast<std::uint16_t>(kPortBase + static_cast<int>(id % kPortSpan));
}

std::optional<SlurmJob> slurm_job_from_environment() {
  const char* nodelist = std::getenv("SLURM_JOB_NODELIST");
  const char* nnodes = std::getenv("SLURM_NNODES");
  const char* node_id = std::getenv("SLURM_NODEID");
  const char* job_id = std::getenv("SLURM_JOB_ID");
  if (!nodelist || !nnodes || !node_id || !job_id) return std::nullopt;
  SlurmJob job;
  job.nnodes = integer("SLURM_NNODES", nnodes);
  job.node_rank = integer("SLURM_NODEID", node_id);
  job.master_addr = first_host(nodelist);
  job.job_id = job_id;
  job.master_port = slurm_port(job.job_id);
  if (job.nnodes < 1 || job.node_rank >= job.nnodes || job.master_addr.empty()) {
    throw std::invalid_argument("SLURM_NODEID=" + std::string(node_id) +
                                ", SLURM_NNODES=" + nnodes + ", SLURM_JOB_NODELIST=" + nodelist +
                                " do not describe a node of this job");
  }
  return job;
}

}  // namespace dist::launcher
