// Device discovery and per-worker device assignment, table-driven.
#include "resources/devices.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace dist::agent {
namespace {

namespace fs = std::filesystem;

TEST(CudaVisibleDevices, ReadsTheVariableAsCudaDoes) {
  struct Case {
    const char* name;
    std::optional<std::string> variable;
    int physical;
    std::vector<std::string> visible;
  };
  const Case cases[] = {
      {"unset: every device", std::nullopt, 3, {"0", "1", "2"}},
      {"empty: none", "", 4, {}},
      {"a subset, in its order", "3,1", 4, {"3", "1"}},
      {"spaces", " 0 , 2", 4, {"0", "2"}},
      {"stops at an index out of range", "1,7,2", 4, {"1"}},
      {"stops at a repeat", "2,2,1", 4, {"2"}},
      {"-1 hides all", "-1", 4, {}},
      {"stops at garbage", "0,x,1", 4, {"0"}},
      {"UUIDs count", "GPU-8e1c,MIG-77aa,1", 2, {"GPU-8e1c", "MIG-77aa", "1"}},
      {"no device at all", std::nullopt, 0, {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(cuda_visible_devices(c.variable, c.physical), c.visible);
  }
}

Accelerators cuda(std::vector<std::string> ids, std::vector<int> numa) {
  Accelerators a;
  a.kind = AcceleratorKind::kCuda;
  a.ids = std::move(ids);
  a.numa_nodes = std::move(numa);
  a.source = "test inventory";
  return a;
}

DeviceOptions pick(std::vector<int> devices, bool virtual_local_rank) {
  DeviceOptions o;
  o.devices = std::move(devices);
  o.virtual_local_rank = virtual_local_rank;
  return o;
}

TEST(AssignDevices, GivesEachWorkerItsOwnDeviceOrSaysWhyNot) {
  const Accelerators four = cuda({"0", "1", "2", "3"}, {0, 0, 1, 1});
  const Accelerators narrowed =
      cuda({"4", "6"}, {1, 1});  // the agent ran with CUDA_VISIBLE_DEVICES=4,6
  Accelerators amd = cuda({"0", "1"}, {0, 1});
  amd.kind = AcceleratorKind::kRocm;
  const Accelerators none;
  struct Case {
    const char* name;
    DeviceOptions options;
    Accelerators found;
    int workers;
    std::vector<std::map<std::string, std::string>> environment;  // empty when an error
    std::vector<int> numa_nodes;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"no flag: nothing set, device i taken to be local rank i's",
       pick({}, false),
       four,
       3,
       {{}, {}, {}},
       {0, 0, 1},
       ""},
      {"no flag, more workers than devices: the others have no known device",
       pick({}, false),
       four,
       5,
       {{}, {}, {}, {}, {}},
       {0, 0, 1, 1, -1},
       ""},
      {"--devices: its own CUDA_VISIBLE_DEVICES each",
       pick({0, 2}, false),
       four,
       2,
       {{{"CUDA_VISIBLE_DEVICES", "0"}}, {{"CUDA_VISIBLE_DEVICES", "2"}}},
       {0, 1},
       ""},
      {"--virtual-local-rank: the first devices, LOCAL_RANK=0",
       pick({}, true),
       four,
       2,
       {{{"CUDA_VISIBLE_DEVICES", "0"}, {"LOCAL_RANK", "0"}},
        {{"CUDA_VISIBLE_DEVICES", "1"}, {"LOCAL_RANK", "0"}}},
       {0, 0},
       ""},
      {"both: the chosen devices, LOCAL_RANK=0",
       pick({3, 1}, true),
       four,
       2,
       {{{"CUDA_VISIBLE_DEVICES", "3"}, {"LOCAL_RANK", "0"}},
        {{"CUDA_VISIBLE_DEVICES", "1"}, {"LOCAL_RANK", "0"}}},
       {1, 0},
       ""},
      {"indices into what the agent sees",
       pick({1}, false),
       narrowed,
       1,
       {{{"CUDA_VISIBLE_DEVICES", "6"}}},
       {1},
       ""},
      {"AMD: HIP_VISIBLE_DEVICES",
       pick({}, true),
       amd,
       2,
       {{{"HIP_VISIBLE_DEVICES", "0"}, {"LOCAL_RANK", "0"}},
        {{"HIP_VISIBLE_DEVICES", "1"}, {"LOCAL_RANK", "0"}}},
       {0, 1},
       ""},
      {"fewer devices than workers",
       pick({}, true),
       four,
       6,
       {},
       {},
       "6 worker(s) per node need 6"},
      {"--devices shorter than the workers",
       pick({0, 1}, false),
       four,
       3,
       {},
       {},
       "--devices names 2"},
      {"an index beyond the devices",
       pick({0, 4}, false),
       four,
       2,
       {},
       {},
       "device 4 is not one of the 4"},
      {"a device twice", pick({1, 1}, false), four, 2, {}, {}, "device 1 is given twice"},
      {"--virtual-local-rank, no GPU at all: LOCAL_RANK=0 (a CPU job, as torchrun runs it)",
       pick({}, true),
       none,
       2,
       {{{"LOCAL_RANK", "0"}}, {{"LOCAL_RANK", "0"}}},
       {-1, -1},
       ""},
      {"--devices, no GPU at all", pick({0}, false), none, 1, {}, {}, "no GPU to give the workers"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    if (!c.error.empty()) {
      try {
        assign_devices(c.options, c.found, c.workers);
        ADD_FAILURE() << "no DeviceError";
      } catch (const DeviceError& e) {
        EXPECT_NE(std::string(e.what()).find(c.error), std::string::npos) << e.what();
      }
      continue;
    }
    const auto assigned = assign_devices(c.options, c.found, c.workers);
    ASSERT_EQ(assigned.size(), static_cast<std::size_t>(c.workers));
    for (std::size_t i = 0; i < assigned.size(); ++i) {
      EXPECT_EQ(assigned[i].environment, c.environment[i]) << "local rank " << i;
      EXPECT_EQ(assigned[i].numa_node, c.numa_nodes[i]) << "local rank " << i;
    }
  }
}

class TempDir {
 public:
  TempDir()
      : path_(fs::temp_directory_path() / ("dist-devices-test-" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }
  void write(const fs::path& relative, const std::string& text) const {
    fs::create_directories((path_ / relative).parent_path());
    std::ofstream(path_ / relative) << text;
  }

 private:
  fs::path path_;
};

// Discovery with no NVIDIA library to load and no KFD node: zero devices, each way named.
DeviceDiscovery nowhere(const TempDir& dir) {
  DeviceDiscovery where;
  where.nvml_library = "libdist-test-absent-nvml.so.1";
  where.cuda_library = "libdist-test-absent-cuda.so.1";
  where.kfd_nodes = dir.path() / "kfd" / "nodes";
  where.pci_devices = dir.path() / "pci";
  where.environment = std::map<std::string, std::string>{};
  return where;
}

TEST(DiscoverAccelerators, NoDriverMeansNoDeviceAndAMessage) {
  TempDir dir;
  const Accelerators found = discover_accelerators(nowhere(dir));
  EXPECT_EQ(found.kind, AcceleratorKind::kNone);
  EXPECT_EQ(found.count(), 0);
  EXPECT_NE(found.source.find("libdist-test-absent-nvml.so.1 not loadable"), std::string::npos)
      << found.source;
  EXPECT_NE(found.source.find("no AMD GPU"), std::string::npos) << found.source;
}

TEST(DiscoverAccelerators, ThisMachineAnswersConsistently) {
  const Accelerators found = discover_accelerators();
  EXPECT_EQ(found.ids.size(), found.numa_nodes.size());
  EXPECT_FALSE(found.source.empty());
  if (found.count() == 0) {
    EXPECT_EQ(found.source.rfind("no GPU found: ", 0), 0u) << found.source;
  }
}

// The KFD topology in sysfs's format: node 0 a CPU, nodes 1 and 2 GPUs, node 1 on PCI 0000:03:00.0
// whose NUMA node is 1.
TEST(DiscoverAccelerators, AmdGpusComeFromTheKfdTopologyAndTheirVisibilityVariables) {
  TempDir dir;
  DeviceDiscovery where = nowhere(dir);
  dir.write("kfd/nodes/0/gpu_id", "0\n");
  dir.write("kfd/nodes/0/properties", "cpu_cores_count 64\nsimd_count 0\n");
  dir.write("kfd/nodes/1/gpu_id", "51627\n");
  dir.write("kfd/nodes/1/properties", "simd_count 304\nlocation_id 768\ndomain 0\nunique_id 255\n");
  dir.write("kfd/nodes/2/gpu_id", "7731\n");
  dir.write("kfd/nodes/2/properties",
            "simd_count 304\nlocation_id 1024\ndomain 0\nunique_id 256\n");
  dir.write("pci/0000:03:00.0/numa_node", "1\n");

  Accelerators found = discover_accelerators(where);
  EXPECT_EQ(found.kind, AcceleratorKind::kRocm);
  EXPECT_EQ(found.ids, (std::vector<std::string>{"0", "1"}));
  EXPECT_EQ(found.numa_nodes, (std::vector<int>{1, -1}));

  where.environment =
      std::map<std::string, std::string>{{"ROCR_VISIBLE_DEVICES", "GPU-0000000000000100"}};
  found = discover_accelerators(where);
  EXPECT_EQ(found.ids, (std::vector<std::string>{"0"})) << found.source;
  EXPECT_EQ(found.numa_nodes, (std::vector<int>{-1}));

  where.environment = std::map<std::string, std::string>{{"HIP_VISIBLE_DEVICES", "1,0"}};
  found = discover_accelerators(where);
  EXPECT_EQ(found.ids, (std::vector<std::string>{"1", "0"}));
  EXPECT_EQ(found.numa_nodes, (std::vector<int>{-1, 1}));
  EXPECT_NE(found.source.find("HIP_VISIBLE_DEVICES='1,0'"), std::string::npos) << found.source;
}

// PCI in sysfs's format: two Intel GPUs (one bound to i915, one to xe), an Intel device that is
// not a display controller, an Intel GPU with no driver bound, and an NVIDIA GPU.
TEST(DiscoverIntelGpus, CountsDisplayDevicesOfIntelBoundToTheirDriverAndReadsTheAffinityMask) {
  TempDir dir;
  DeviceDiscovery where = nowhere(dir);
  EXPECT_EQ(discover_intel_gpus(where).count(), 0);
  EXPECT_NE(discover_intel_gpus(where).source.find("no Intel GPU found"), std::string::npos);
  const auto device = [&](const std::string& address, const std::string& vendor,
                          const std::string& device_class, const std::string& driver) {
    dir.write("pci/" + address + "/vendor", vendor + "\n");
    dir.write("pci/" + address + "/class", device_class + "\n");
    if (driver.empty()) return;
    fs::create_directories(dir.path() / "drivers" / driver);
    fs::create_directory_symlink(dir.path() / "drivers" / driver,
                                 dir.path() / "pci" / address / "driver");
  };
  device("0000:03:00.0", "0x8086", "0x038000", "xe");
  device("0000:02:00.0", "0x8086", "0x030000", "i915");
  device("0000:00:1f.0", "0x8086", "0x060100", "lpc_ich");
  device("0000:04:00.0", "0x8086", "0x030000", "");
  device("0000:05:00.0", "0x10de", "0x030200", "nvidia");
  dir.write("pci/0000:03:00.0/numa_node", "1\n");

  Accelerators found = discover_intel_gpus(where);
  EXPECT_EQ(found.kind, AcceleratorKind::kXpu);
  EXPECT_EQ(found.ids, (std::vector<std::string>{"0", "1"}));
  EXPECT_EQ(found.numa_nodes, (std::vector<int>{-1, 1})) << "PCI order: 02:00.0 first";

  where.environment = std::map<std::string, std::string>{{"ZE_AFFINITY_MASK", "1.0,1.1,7"}};
  found = discover_intel_gpus(where);
  EXPECT_EQ(found.ids, (std::vector<std::string>{"1"})) << found.source;
  EXPECT_NE(found.source.find("ZE_AFFINITY_MASK='1.0,1.1,7'"), std::string::npos) << found.source;
}

}  // namespace
}  // namespace dist::agent
