// What the agent hands each local rank: nothing without flags, bound CPUs and OMP_NUM_THREADS
// with binding, devices only where this node has them.
#include "resources/worker_resources.h"

#include <gtest/gtest.h>

#include <set>

namespace dist::agent {
namespace {

std::vector<WorkerResources> plan(const LaunchConfig& c) {
  return plan_worker_resources(c.nproc_per_node, c.devices, c.placement, c.omp_threads_defaulted);
}

TEST(WorkerResources, WithoutFlagsEveryWorkerInheritsTheAgentsView) {
  LaunchConfig config;
  config.nproc_per_node = 3;
  const auto resources = plan(config);
  ASSERT_EQ(resources.size(), 3u);
  for (const auto& r : resources) {
    EXPECT_TRUE(r.environment.empty());
    EXPECT_FALSE(r.placement.bind_cpus);
    EXPECT_FALSE(r.placement.bind_memory);
  }
}

TEST(WorkerResources, BindingGivesEachWorkerItsCoresAndThreadCount) {
  LaunchConfig config;
  config.placement.cpu_bind = CpuBind::kCore;
  config.omp_threads_defaulted = true;
  config.nproc_per_node = 1;
  const int cores = plan(config)[0].placement.cores;
  ASSERT_GT(cores, 0);
  config.nproc_per_node = std::min(cores, 4);
  const auto resources = plan(config);
  std::set<int> used;
  for (const auto& r : resources) {
    ASSERT_TRUE(r.placement.bind_cpus);
    EXPECT_EQ(r.environment.at("OMP_NUM_THREADS"), std::to_string(r.placement.cores));
    for (const int cpu : r.placement.cpu_list()) EXPECT_TRUE(used.insert(cpu).second) << cpu;
  }
}

TEST(WorkerResources, DevicesNeedDevicesOnThisNodeAndVirtualLocalRanksDoNot) {
  LaunchConfig config;
  config.nproc_per_node = 1;
  config.devices.devices = {0};
  if (discover_accelerators().count() == 0) {
    EXPECT_THROW(plan(config), DeviceError);
  } else {
    const auto resources = plan(config);
    const auto& environment = resources[0].environment;
    EXPECT_EQ(environment.count("CUDA_VISIBLE_DEVICES") + environment.count("HIP_VISIBLE_DEVICES"),
              1u);
  }
  config.devices.devices.clear();
  config.devices.virtual_local_rank = true;
  EXPECT_EQ(plan(config)[0].environment.at("LOCAL_RANK"), "0");
}

}  // namespace
}  // namespace dist::agent
