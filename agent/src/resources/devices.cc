#include "resources/devices.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

namespace dist::agent {
namespace {

namespace fs = std::filesystem;

// A shared library loaded for the duration of a lookup.
class Library {
 public:
  Library(const std::string& name, bool keep_loaded)
      : handle_(::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)), keep_loaded_(keep_loaded) {}
  ~Library() {
    if (handle_ && !keep_loaded_) ::dlclose(handle_);
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  explicit operator bool() const { return handle_ != nullptr; }
  template <typename F>
  F* symbol(const char* name) const {
    return reinterpret_cast<F*>(::dlsym(handle_, name));
  }

 private:
  void* handle_;
  bool keep_loaded_;
};

std::optional<std::string> lookup(const DeviceDiscovery& where, const std::string& name) {
  if (where.environment) {
    const auto it = where.environment->find(name);
    if (it == where.environment->end()) return std::nullopt;
    return it->second;
  }
  const char* value = std::getenv(name.c_str());
  if (!value) return std::nullopt;
  return std::string(value);
}

std::string trim(const std::string& s) {
  const auto begin = s.find_first_not_of(" \t\n");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t\n") - begin + 1);
}

std::optional<int> parse_index(const std::string& text) {
  if (text.empty() || text.size() > 6 ||
      !std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); })) {
    return std::nullopt;
  }
  return std::stoi(text);
}

bool is_uuid(const std::string& entry) {
  return entry.rfind("GPU-", 0) == 0 || entry.rfind("MIG-", 0) == 0;
}

// The NUMA node sysfs gives a PCI device; -1 when unknown (single-node machines often say -1).
int pci_numa_node(const fs::path& pci_devices, unsigned domain, unsigned bus, unsigned device) {
  char address[32];
  std::snprintf(address, sizeof address, "%04x:%02x:%02x.0", domain, bus, device);
  std::ifstream in(pci_devices / address / "numa_node");
  int node = -1;
  if (!(in >> node)) return -1;
  return node;
}

std::string describe_variable(const DeviceDiscovery& where, const std::string& name) {
  const auto value = lookup(where, name);
  return value ? " (" + name + "='" + *value + "')" : "";
}

// NVML: the physical devices, then CUDA_VISIBLE_DEVICES over them.
std::optional<Accelerators> from_nvml(const DeviceDiscovery& where,
                                      std::vector<std::string>& tried) {
  struct nvmlDevice_st;
  using Device = nvmlDevice_st*;
  constexpr int kSuccess = 0;
  constexpr int kAffinityScopeNode = 0;   // NVML_AFFINITY_SCOPE_NODE
  constexpr unsigned kNodeSetWords = 16;  // 1024 NUMA nodes

  Library nvml(where.nvml_library, /*keep_loaded=*/false);
  if (!nvml) {
    tried.push_back(where.nvml_library + " not loadable (no NVIDIA driver)");
    return std::nullopt;
  }
  auto init = nvml.symbol<int()>("nvmlInit_v2");
  auto shutdown = nvml.symbol<int()>("nvmlShutdown");
  auto get_count = nvml.symbol<int(unsigned*)>("nvmlDeviceGetCount_v2");
  auto by_index = nvml.symbol<int(unsigned, Device*)>("nvmlDeviceGetHandleByIndex_v2");
  auto by_uuid = nvml.symbol<int(const char*, Device*)>("nvmlDeviceGetHandleByUUID");
  auto affinity =
      nvml.symbol<int(Device, unsigned, unsigned long*, int)>("nvmlDeviceGetMemoryAffinity");
  if (!init || !shutdown || !get_count || !by_index) {
    tried.push_back(where.nvml_library + " lacks nvmlInit_v2 / nvmlDeviceGetCount_v2");
    return std::nullopt;
  }
  if (init() != kSuccess) {
    tried.push_back("NVML did not initialize (driver not loaded?)");
    return std::nullopt;
  }
  unsigned physical = 0;
  if (get_count(&physical) != kSuccess || physical == 0) {
    shutdown();
    tried.push_back("NVML reports no NVIDIA GPU");
    return std::nullopt;
  }
  Accelerators found;
  found.kind = AcceleratorKind::kCuda;
  found.ids =
      cuda_visible_devices(lookup(where, "CUDA_VISIBLE_DEVICES"), static_cast<int>(physical));
  for (const auto& id : found.ids) {
    Device device = nullptr;
    const auto index = parse_index(id);
    const bool have = index ? by_index(static_cast<unsigned>(*index), &device) == kSuccess
                            : by_uuid && by_uuid(id.c_str(), &device) == kSuccess;
    int node = -1;
    unsigned long nodes[kNodeSetWords] = {};
    if (have && affinity &&
        affinity(device, kNodeSetWords, nodes, kAffinityScopeNode) == kSuccess) {
      for (unsigned w = 0; w < kNodeSetWords && node < 0; ++w) {
        if (nodes[w])
          node = static_cast<int>(w * 64 + static_cast<unsigned>(__builtin_ctzl(nodes[w])));
      }
    }
    found.numa_nodes.push_back(node);
  }
  shutdown();
  found.source = "NVML: " + std::to_string(physical) + " NVIDIA GPU(s), " +
                 std::to_string(found.count()) + " visible" +
                 describe_variable(where, "CUDA_VISIBLE_DEVICES");
  return found;
}

// The CUDA driver, when NVML is missing: it applies CUDA_VISIBLE_DEVICES itself. It stays loaded:
// unloading an initialized driver is not supported.
std::optional<Accelerators> from_cuda_driver(const DeviceDiscovery& where,
                                             std::vector<std::string>& tried) {
  constexpr int kSuccess = 0;
  constexpr int kPciBusId = 33, kPciDeviceId = 34, kPciDomainId = 50;  // CUdevice_attribute
  Library cuda(where.cuda_library, /*keep_loaded=*/true);
  if (!cuda) {
    tried.push_back(where.cuda_library + " not loadable");
    return std::nullopt;
  }
  auto init = cuda.symbol<int(unsigned)>("cuInit");
  auto get_count = cuda.symbol<int(int*)>("cuDeviceGetCount");
  auto get_device = cuda.symbol<int(int*, int)>("cuDeviceGet");
  auto attribute = cuda.symbol<int(int*, int, int)>("cuDeviceGetAttribute");
  int count = 0;
  if (!init || !get_count || init(0) != kSuccess || get_count(&count) != kSuccess || count == 0) {
    tried.push_back("the CUDA driver reports no usable device");
    return std::nullopt;
  }
  Accelerators found;
  found.kind = AcceleratorKind::kCuda;
  const auto visible = lookup(where, "CUDA_VISIBLE_DEVICES");
  std::vector<std::string> entries;
  if (visible) {
    std::stringstream items(*visible);
    for (std::string item; std::getline(items, item, ',');) entries.push_back(trim(item));
  }
  for (int i = 0; i < count; ++i) {
    found.ids.push_back(visible && i < static_cast<int>(entries.size())
                            ? entries[static_cast<std::size_t>(i)]
                            : std::to_string(i));
    int device = 0, domain = 0, bus = 0, slot = 0;
    const bool pci = get_device && attribute && get_device(&device, i) == kSuccess &&
                     attribute(&domain, kPciDomainId, device) == kSuccess &&
                     attribute(&bus, kPciBusId, device) == kSuccess &&
                     attribute(&slot, kPciDeviceId, device) == kSuccess;
    found.numa_nodes.push_back(pci ? pci_numa_node(where.pci_devices, static_cast<unsigned>(domain),
                                                   static_cast<unsigned>(bus),
                                                   static_cast<unsigned>(slot))
                                   : -1);
  }
  found.source = "CUDA driver: " + std::to_string(count) + " visible device(s)" +
                 describe_variable(where, "CUDA_VISIBLE_DEVICES");
  return found;
}

// "key value" lines of a KFD node's properties file.
std::map<std::string, unsigned long long> kfd_properties(const fs::path& node) {
  std::map<std::string, unsigned long long> properties;
  std::ifstream in(node / "properties");
  std::string key;
  unsigned long long value = 0;
  while (in >> key >> value) properties[key] = value;
  return properties;
}

// AMD GPUs: the KFD topology's nodes with a gpu_id, narrowed by ROCR_VISIBLE_DEVICES (indices or
// GPU-<unique id> UUIDs), then numbered by HIP and narrowed by HIP_VISIBLE_DEVICES.
std::optional<Accelerators> from_kfd(const DeviceDiscovery& where,
                                     std::vector<std::string>& tried) {
  std::vector<std::pair<int, fs::path>> nodes;
  std::error_code ec;
  for (auto it = fs::directory_iterator(where.kfd_nodes, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    if (const auto index = parse_index(it->path().filename().string())) {
      nodes.emplace_back(*index, it->path());
    }
  }
  std::sort(nodes.begin(), nodes.end());
  struct Gpu {
    std::string uuid;
    int numa_node;
  };
  std::vector<Gpu> gpus;
  for (const auto& [index, path] : nodes) {
    unsigned long long gpu_id = 0;
    std::ifstream(path / "gpu_id") >> gpu_id;
    if (gpu_id == 0) continue;  // a CPU node
    const auto p = kfd_properties(path);
    const auto get = [&](const char* key) {
      const auto it = p.find(key);
      return it == p.end() ? 0ull : it->second;
    };
    const auto location = get("location_id");  // PCI bus << 8 | device << 3 | function
    char uuid[32];
    std::snprintf(uuid, sizeof uuid, "GPU-%016llx", get("unique_id"));
    gpus.push_back({uuid, pci_numa_node(where.pci_devices, static_cast<unsigned>(get("domain")),
                                        static_cast<unsigned>((location >> 8) & 0xff),
                                        static_cast<unsigned>((location >> 3) & 0x1f))});
  }
  if (gpus.empty()) {
    tried.push_back("no AMD GPU in " + where.kfd_nodes.string());
    return std::nullopt;
  }
  std::vector<Gpu> rocr_visible = gpus;
  if (const auto rocr = lookup(where, "ROCR_VISIBLE_DEVICES")) {
    rocr_visible.clear();
    std::set<std::size_t> seen;
    std::stringstream items(*rocr);
    for (std::string item; std::getline(items, item, ',');) {
      item = trim(item);
      std::size_t at = gpus.size();
      if (const auto index = parse_index(item)) {
        at = static_cast<std::size_t>(*index);
      } else {
        for (std::size_t g = 0; g < gpus.size(); ++g) {
          if (gpus[g].uuid == item) at = g;
        }
      }
      if (at >= gpus.size() || !seen.insert(at).second) break;
      rocr_visible.push_back(gpus[at]);
    }
  }
  Accelerators found;
  found.kind = AcceleratorKind::kRocm;
  found.ids = cuda_visible_devices(lookup(where, "HIP_VISIBLE_DEVICES"),
                                   static_cast<int>(rocr_visible.size()));
  for (const auto& id : found.ids) {
    const auto index = parse_index(id);
    found.numa_nodes.push_back(index ? rocr_visible[static_cast<std::size_t>(*index)].numa_node
                                     : -1);
  }
  found.source = "KFD topology: " + std::to_string(gpus.size()) + " AMD GPU(s), " +
                 std::to_string(found.count()) + " visible" +
                 describe_variable(where, "ROCR_VISIBLE_DEVICES") +
                 describe_variable(where, "HIP_VISIBLE_DEVICES");
  return found;
}

bool is_intel_gpu(const fs::path& device) {
  std::string vendor, device_class;
  std::ifstream(device / "vendor") >> vendor;
  std::ifstream(device / "class") >> device_class;
  if (vendor != "0x8086" || !device_class.starts_with("0x03")) return false;  // display
  std::error_code ec;
  const std::string driver = fs::read_symlink(device / "driver", ec).filename().string();
  return !ec && (driver == "i915" || driver == "xe");
}

}  // namespace

Accelerators discover_intel_gpus(const DeviceDiscovery& where) {
  std::vector<fs::path> gpus;
  std::error_code ec;
  for (auto it = fs::directory_iterator(where.pci_devices, ec);
       !ec && it != fs::directory_iterator(); it.increment(ec)) {
    if (is_intel_gpu(it->path())) gpus.push_back(it->path());
  }
  std::sort(gpus.begin(), gpus.end());  // PCI order, as Level Zero numbers them
  Accelerators found;
  if (gpus.empty()) {
    found.source =
        "no Intel GPU found (no display device of vendor 0x8086 bound to i915 or xe in " +
        where.pci_devices.string() + ")";
    return found;
  }
  found.kind = AcceleratorKind::kXpu;
  std::set<int> visible;
  if (const auto mask = lookup(where, "ZE_AFFINITY_MASK")) {
    std::stringstream items(*mask);
    for (std::string item; std::getline(items, item, ',');) {
      const auto index = parse_index(trim(item.substr(0, item.find('.'))));  // "0.1": a tile
      if (index && *index < static_cast<int>(gpus.size())) visible.insert(*index);
    }
  } else {
    for (int i = 0; i < static_cast<int>(gpus.size()); ++i) visible.insert(i);
  }
  for (const int i : visible) {
    found.ids.push_back(std::to_string(i));
    std::ifstream in(gpus[static_cast<std::size_t>(i)] / "numa_node");
    int node = -1;
    if (!(in >> node)) node = -1;
    found.numa_nodes.push_back(node);
  }
  found.source = "PCI: " + std::to_string(gpus.size()) + " Intel GPU(s), " +
                 std::to_string(found.count()) + " visible" +
                 describe_variable(where, "ZE_AFFINITY_MASK");
  return found;
}

std::vector<std::string> cuda_visible_devices(const std::optional<std::string>& variable,
                                              int physical) {
  std::vector<std::string> ids;
  if (!variable) {
    for (int i = 0; i < physical; ++i) ids.push_back(std::to_string(i));
    return ids;
  }
  std::set<std::string> seen;
  std::stringstream items(*variable);
  for (std::string item; std::getline(items, item, ',');) {
    item = trim(item);
    const auto index = parse_index(item);
    const bool valid = index ? *index < physical : is_uuid(item);
    if (!valid || !seen.insert(index ? std::to_string(*index) : item).second) break;
    ids.push_back(index ? std::to_string(*index) : item);
  }
  return ids;
}

Accelerators discover_accelerators(const DeviceDiscovery& where) {
  std::vector<std::string> tried;
  if (auto found = from_nvml(where, tried)) return *found;
  if (auto found = from_cuda_driver(where, tried)) return *found;
  if (auto found = from_kfd(where, tried)) return *found;
  Accelerators none;
  none.source = "no GPU found: ";
  for (std::size_t i = 0; i < tried.size(); ++i) none.source += (i ? "; " : "") + tried[i];
  return none;
}

std::vector<WorkerDevice> assign_devices(const DeviceOptions& options, const Accelerators& found,
                                         int nproc_per_node) {
  const auto workers = static_cast<std::size_t>(nproc_per_node);
  std::vector<WorkerDevice> assigned(workers);
  if (options.devices.empty() && !options.virtual_local_rank) {
    for (std::size_t i = 0; i < workers && i < found.ids.size(); ++i) {
      assigned[i].numa_node = found.numa_nodes[i];
    }
    return assigned;
  }
  const std::string flag = options.devices.empty() ? "--virtual-local-rank" : "--devices";
  const std::string kind = found.kind == AcceleratorKind::kRocm ? "AMD" : "CUDA";
  if (found.count() == 0 && options.devices.empty()) {
    // torchrun runs a CPU job under --virtual-local-rank too: every worker is local rank 0, and
    // there is no device to give it.
    for (WorkerDevice& worker : assigned) worker.environment["LOCAL_RANK"] = "0";
    return assigned;
  }
  if (found.count() == 0) {
    throw DeviceError(flag + ": this node has no GPU to give the workers (" + found.source + ")");
  }
  std::vector<int> chosen = options.devices;
  if (chosen.empty()) {
    for (int i = 0; i < std::min(found.count(), nproc_per_node); ++i) chosen.push_back(i);
  }
  std::set<int> seen;
  for (const int d : chosen) {
    if (d < 0 || d >= found.count()) {
      throw DeviceError(flag + ": device " + std::to_string(d) + " is not one of the " +
                        std::to_string(found.count()) + " " + kind +
                        " devices this node sees (0 to " + std::to_string(found.count() - 1) +
                        "; " + found.source + ")");
    }
    if (!seen.insert(d).second) {
      throw DeviceError(flag + ": device " + std::to_string(d) +
                        " is given twice; each worker needs its own device");
    }
  }
  if (chosen.size() != workers) {
    throw DeviceError(flag + ": " + std::to_string(nproc_per_node) + " worker(s) per node need " +
                      std::to_string(nproc_per_node) + " device(s), but " +
                      (options.devices.empty()
                           ? "this node sees " + std::to_string(found.count()) + " " + kind +
                                 " device(s) (" + found.source + ")"
                           : "--devices names " + std::to_string(chosen.size())) +
                      ": set --nproc-per-node to the device count, or list one device per worker");
  }
  // HIP numbers devices within ROCR_VISIBLE_DEVICES, which the workers inherit unchanged.
  const char* variable =
      found.kind == AcceleratorKind::kRocm ? "HIP_VISIBLE_DEVICES" : "CUDA_VISIBLE_DEVICES";
  for (std::size_t i = 0; i < workers; ++i) {
    const auto d = static_cast<std::size_t>(chosen[i]);
    assigned[i].environment[variable] = found.ids[d];
    if (options.virtual_local_rank) assigned[i].environment["LOCAL_RANK"] = "0";
    assigned[i].numa_node = found.numa_nodes[d];
  }
  return assigned;
}

}  // namespace dist::agent
