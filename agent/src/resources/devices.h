// The accelerators of this host, and which of them each worker gets.
//
// Nothing here links CUDA: NVIDIA GPUs are counted through NVML (libnvidia-ml.so.1), or else the
// CUDA driver (libcuda.so.1), both loaded with dlopen; AMD GPUs through the KFD topology in sysfs;
// Intel GPUs (torch's "xpu") through PCI in sysfs. A host with none has no devices, and says why.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dist/agent/config.h"

namespace dist::agent {

enum class AcceleratorKind { kNone, kCuda, kRocm, kXpu };

struct Accelerators {
  AcceleratorKind kind = AcceleratorKind::kNone;
  // The devices this process may use, in the order the runtime numbers them, each named as its
  // visibility variable takes it: the entry of CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES, or the
  // index when none is set.
  std::vector<std::string> ids;
  std::vector<int> numa_nodes;  // each device's NUMA node; -1: unknown
  std::string source;           // what found them, or why there are none (for messages)
  int count() const { return static_cast<int>(ids.size()); }
};

// Where discovery looks; the defaults are this host and this process's environment.
struct DeviceDiscovery {
  std::string nvml_library = "libnvidia-ml.so.1";
  std::string cuda_library = "libcuda.so.1";
  std::filesystem::path kfd_nodes = "/sys/class/kfd/kfd/topology/nodes";
  std::filesystem::path pci_devices = "/sys/bus/pci/devices";
  // CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES, ZE_AFFINITY_MASK; unset:
  // getenv.
  std::optional<std::map<std::string, std::string>> environment;
};

Accelerators discover_accelerators(const DeviceDiscovery& where = {});

// Intel GPUs, as torch.xpu counts them (--nproc-per-node xpu): PCI display controllers of vendor
// 0x8086 bound to the i915 or xe driver, limited by ZE_AFFINITY_MASK (its distinct device
// indices) when that is set. Counted only: --devices and --virtual-local-rank are for CUDA and
// ROCm.
Accelerators discover_intel_gpus(const DeviceDiscovery& where = {});

// CUDA's reading of CUDA_VISIBLE_DEVICES over `physical` devices: the entries up to the first
// one that is not a device (an index out of range or repeated, "-1", an empty entry); UUID
// entries (GPU-..., MIG-...) count as devices. Unset: every device, as its index.
std::vector<std::string> cuda_visible_devices(const std::optional<std::string>& variable,
                                              int physical);

// A device selection that cannot be satisfied; the message names the flag and what to change.
class DeviceError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

// What one worker gets.
struct WorkerDevice {
  // Variables to set for it, after torchrun's (LOCAL_RANK=0 with --virtual-local-rank).
  std::map<std::string, std::string> environment;
  int numa_node = -1;  // of its device; -1: none or unknown (for the placement planner)
};

// One entry per local rank. With neither --devices nor --virtual-local-rank nothing is set, and
// local rank i's device is taken to be device i (PyTorch's cuda:LOCAL_RANK convention) for its
// NUMA node. --virtual-local-rank on a host with no GPU gives every worker LOCAL_RANK=0 and no
// device, as torchrun does. Throws DeviceError when devices < workers, an index is out of range or
// repeated, or --devices names devices on a host with none.
std::vector<WorkerDevice> assign_devices(const DeviceOptions& options, const Accelerators& found,
                                         int nproc_per_node);

}  // namespace dist::agent
