// The checks the launcher runs before anything starts (dist/agent/config.h): the agent's own
// planners, run once more, so that what this node cannot give is a usage error now rather than a
// failed start later.
#include <algorithm>
#include <string>
#include <thread>

#include "dist/agent/config.h"
#include "output/log_line_prefix.h"
#include "resources/devices.h"
#include "resources/placement.h"
#include "resources/worker_resources.h"
#include "store/store.h"

namespace dist::agent {

void check(const LaunchConfig& config) {
  plan_worker_resources(config.nproc_per_node, config.devices, config.placement,
                        config.omp_threads_defaulted);
  render_log_line_prefix(config.log_line_prefix_template, {config.role, Worker{}, "host"});
  if (config.rdzv_backend == RendezvousBackend::kEtcdV3) etcd_options(config.etcd, {});
}

const char* backend_name(RendezvousBackend backend) {
  switch (backend) {
    case RendezvousBackend::kStatic:
      return "static";
    case RendezvousBackend::kC10d:
      return "c10d";
    case RendezvousBackend::kEtcdV3:
      return "etcd-v3";
  }
  return "static";
}

int resolve_nproc_per_node(const std::string& text, const DeviceOptions& devices) {
  const int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (text == "cpu") return cpus;
  if ((text == "gpu" || text == "auto") && !devices.devices.empty()) {
    return static_cast<int>(devices.devices.size());
  }
  if (text == "gpu") {
    const Accelerators found = discover_accelerators();
    if (found.count() == 0) throw ConfigError("--nproc-per-node gpu: " + found.source);
    return found.count();
  }
  if (text == "xpu") {
    const Accelerators found = discover_intel_gpus();
    if (found.count() == 0) throw ConfigError("--nproc-per-node xpu: " + found.source);
    return found.count();
  }
  if (text == "auto") {
    if (const int gpus = discover_accelerators().count(); gpus > 0) return gpus;
    if (const int xpus = discover_intel_gpus().count(); xpus > 0) return xpus;
    return cpus;
  }
  std::size_t used = 0;
  try {
    const int n = std::stoi(text, &used);
    if (used == text.size() && n > kMaxWorkersPerNode) {
      throw ConfigError("--nproc-per-node " + text + ": at most " +
                        std::to_string(kMaxWorkersPerNode) + " workers per node");
    }
    if (used == text.size() && n > 0) return n;
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception&) {
  }
  throw ConfigError("--nproc-per-node must be a positive integer, cpu, gpu, xpu or auto, got '" +
                    text + "'");
}

}  // namespace dist::agent
