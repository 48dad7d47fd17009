#include "resources/worker_resources.h"

namespace dist::agent {

std::vector<WorkerResources> plan_worker_resources(int workers, const DeviceOptions& device_options,
                                                   const PlacementOptions& placement,
                                                   bool omp_threads_defaulted) {
  std::vector<WorkerResources> resources(static_cast<std::size_t>(workers));
  const bool selects = !device_options.devices.empty() || device_options.virtual_local_rank;
  if (!selects && !placement.binds()) return resources;

  // Binding follows each worker's GPU when there are GPUs, so it needs the devices too.
  const std::vector<WorkerDevice> devices =
      assign_devices(device_options, discover_accelerators(), workers);
  std::vector<int> device_nodes;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    resources[i].environment = devices[i].environment;
    device_nodes.push_back(devices[i].numa_node);
  }
  if (!placement.binds()) return resources;
  const std::vector<WorkerPlacement> placements =
      plan_placement(Topology::this_machine(), placement, workers, device_nodes);
  for (std::size_t i = 0; i < placements.size(); ++i) {
    resources[i].placement = placements[i];
    add_placement_variables(placements[i], omp_threads_defaulted, resources[i].environment);
  }
  return resources;
}

}  // namespace dist::agent
