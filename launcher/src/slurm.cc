#include "dist/launcher/slurm.h"

#include <cstdlib>
#include <stdexcept>

namespace dist::launcher {
namespace {

// Below Linux's default ephemeral range (32768-60999): a port the kernel gave an outgoing
// connection on node 0 never takes the store's.
constexpr int kPortBase = 20000;
constexpr int kPortSpan = 12768;
// Step ids above this are Slurm's own steps (batch script, extern, interactive), not srun's.
constexpr unsigned long long kMaxTaskStepId = 0xfffffff0ULL;

unsigned long long count(const char* name, const std::string& value) {
  try {
    std::size_t used = 0;
    const unsigned long long v = std::stoull(value, &used);
    if (used == value.size() && !value.empty() && value.front() != '-') return v;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument(std::string(name) + "='" + value + "' is not a count");
}

// The first of `names` that is set and not empty, or "".
std::string first_of(std::initializer_list<const char*> names, const char** which = nullptr) {
  for (const char* name : names) {
    const char* v = std::getenv(name);
    if (v && *v) {
      if (which) *which = name;
      return v;
    }
  }
  return "";
}

}  // namespace

std::string SlurmJob::run_id() const {
  return "slurm-" + job_id + (in_step() ? "." + step_id : "");
}

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

std::uint16_t slurm_port(const std::string& job_id, const std::string& step_id) {
  // FNV-1a spreads the jobs; the step id is added after it, so the steps of one job (which may
  // run at once on the same nodes) never share a port.
  std::uint64_t hash = 14695981039346656037ULL;
  for (char c : job_id) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 1099511628211ULL;
  }
  const std::uint64_t step = step_id.empty() ? 0 : count("SLURM_STEP_ID", step_id) + 1;
  return static_cast<std::uint16_t>(kPortBase + static_cast<int>((hash + step) % kPortSpan));
}

std::optional<SlurmJob> slurm_job_from_environment() {
  SlurmJob job;
  job.job_id = first_of({"SLURM_JOB_ID", "SLURM_JOBID"});
  if (job.job_id.empty()) return std::nullopt;
  count("SLURM_JOB_ID", job.job_id);

  const std::string step = first_of({"SLURM_STEP_ID", "SLURM_STEPID"});
  if (!step.empty() && count("SLURM_STEP_ID", step) < kMaxTaskStepId) job.step_id = step;

  const char* nodes_from = "SLURM_JOB_NUM_NODES";
  const char* list_from = "SLURM_JOB_NODELIST";
  const std::string nnodes = job.in_step()
                                 ? first_of({"SLURM_STEP_NUM_NODES", "SLURM_NNODES"}, &nodes_from)
                                 : first_of({"SLURM_JOB_NUM_NODES", "SLURM_NNODES"}, &nodes_from);
  const std::string nodelist =
      job.in_step() ? first_of({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"}, &list_from)
                    : first_of({"SLURM_JOB_NODELIST", "SLURM_NODELIST"}, &list_from);
  if (nodelist.empty()) return std::nullopt;  // a job id alone (a container passing it on)
  const std::string node_id = first_of({"SLURM_NODEID"});
  const std::string local_id = first_of({"SLURM_LOCALID"});
  job.nnodes = nnodes.empty() ? 1 : static_cast<int>(count(nodes_from, nnodes));
  job.node_rank = node_id.empty() ? 0 : static_cast<int>(count("SLURM_NODEID", node_id));
  job.local_task = local_id.empty() ? 0 : static_cast<int>(count("SLURM_LOCALID", local_id));
  job.master = {first_host(nodelist), slurm_port(job.job_id, job.step_id)};
  job.node_name = first_of({"SLURMD_NODENAME"});
  if (job.nnodes < 1 || job.node_rank >= job.nnodes) {
    throw std::invalid_argument("SLURM_NODEID='" + node_id + "', " + nodes_from + "='" + nnodes +
                                "', " + list_from + "='" + nodelist +
                                "' do not describe a node of Slurm job " + job.job_id);
  }
  return job;
}

}  // namespace dist::launcher
