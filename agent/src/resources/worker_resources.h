// What each local rank gets from its node: a device (devices.h) and a CPU and memory placement
// (placement.h), planned once per agent from --devices / --virtual-local-rank and the binding
// flags.
//
// The agent's spawn code, for local rank i:
//   parent: environment = torchrun_variables(...), then resources[i].environment on top
//   child, between fork and exec: apply_placement_in_child(resources[i].placement)
#pragma once

#include <map>
#include <string>
#include <vector>

#include "dist/agent/config.h"
#include "resources/devices.h"
#include "resources/placement.h"

namespace dist::agent {

struct WorkerResources {
  // Set after torchrun's variables: CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES, LOCAL_RANK=0
  // (--virtual-local-rank), OMP_NUM_THREADS (bound, and unset by the user).
  std::map<std::string, std::string> environment;
  WorkerPlacement placement;
};

// One entry per local rank. Discovers the devices only when a flag needs them and reads the
// topology only when binding; without any of these flags every entry is empty. Throws DeviceError
// or PlacementError with a message for the user.
// `omp_threads_defaulted`: OMP_NUM_THREADS was unset (WorkerCommand), so a bound worker gets its
// core count.
std::vector<WorkerResources> plan_worker_resources(int workers, const DeviceOptions& devices,
                                                   const PlacementOptions& placement,
                                                   bool omp_threads_defaulted);

}  // namespace dist::agent
