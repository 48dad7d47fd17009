#include "resources/worker_resources.h"

namespace dist::agent {

std::vector<WorkerResources> plan_worker_resources(const LaunchConfig& config) {
  const int workers = config.nproc_per_node;
  std::vector<WorkerResources> resources(static_cast<std::size_t>(workers));
  const bool selects = !config.devices.devices.empty() || config.devices.virtual_local_rank;
  if (!selects && !config.placement.binds()) return resources;

  // Binding follows each worker's GPU when there are GPUs, so it needs the devices too.
  const std::vector<WorkerDevice> devices =
      assign_devices(config.devices, discover_accelerators(), workers);
  std::vector<int> device_nodes;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    resources[i].environment = devices[i].environment;
    device_nodes.push_back(devices[i].numa_node);
  }
  if (!config.placement.binds()) return resources;
  const std::vector<WorkerPlacement> placements =
      plan_placement(Topology::this_machine(), config.placement, workers, device_nodes);
  for (std::size_t i = 0; i < placements.size(); ++i) {
    resources[i].placement = placements[i];
    add_placement_variables(placements[i], config.omp_threads_defaulted, resources[i].environment);
  }
  return resources;
}

}  // namespace dist::agent
