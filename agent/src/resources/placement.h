// Where each worker runs: its CPUs and the NUMA nodes its memory comes from.
//
// The agent plans once, with hwloc, over the machine's real topology (restricted to the CPUs the
// agent may use) or a synthetic one; each worker applies its plan in the child between fork and
// exec, with two raw system calls (async-signal-safe), from plain data.
//
// --numa-binding follows torchrun 2.x: a worker with a GPU is bound by its GPU's NUMA node
//   node          every CPU of that node
//   socket        every CPU of that node's package
//   exclusive     that node's cores split evenly among the workers whose GPUs are on it
//   core-complex  one cache domain (cores sharing the last-level cache) of that node per worker
// Workers without GPUs are spread by local rank over the machine's NUMA nodes (local rank i of W
// on node i * N / W) and then bound the same way. --cpu-bind core splits every core the agent may
// use into one contiguous block per worker; --cpu-bind LIST;LIST gives local rank i the i-th list.
// Memory is preferred, not forced, on the NUMA nodes of the bound CPUs (when there are several).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dist/agent/config.h"

struct hwloc_topology;

namespace dist::agent {

// A placement that cannot be planned or applied; the message names the flag and what to change.
class PlacementError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

// One worker's placement: plain data, applied after fork without allocating.
struct WorkerPlacement {
  static constexpr int kMaxCpus = 8192;
  static constexpr int kMaxNumaNodes = 1024;
  static constexpr int kBitsPerWord = 64;

  bool bind_cpus = false;
  std::array<std::uint64_t, kMaxCpus / kBitsPerWord> cpus{};
  bool bind_memory = false;
  std::array<std::uint64_t, kMaxNumaNodes / kBitsPerWord> memory_nodes{};
  int cores = 0;  // physical cores among `cpus`: the worker's OMP_NUM_THREADS

  void add_cpu(int cpu);
  void add_memory_node(int node);
  std::vector<int> cpu_list() const;
  std::vector<int> memory_node_list() const;
  // "cpus 0-7 (4 cores), memory nodes 0" or "unbound", for the agent's log.
  std::string describe() const;
};

// The machine as hwloc sees it.
class Topology {
 public:
  // This machine, restricted to the CPUs this process may run on. Loads in about 0.5 ms: hwloc's
  // x86 CPUID backend, which migrates the caller onto every CPU, is not used.
  static Topology this_machine();
  // hwloc's synthetic description, e.g. "pack:2 numa:2 l3:2 core:4 pu:2" (tests, what-ifs).
  static Topology synthetic(const std::string& description);
  ~Topology();
  Topology(Topology&& other) noexcept;
  Topology& operator=(Topology&& other) noexcept;
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  hwloc_topology* get() const { return topology_; }

 private:
  explicit Topology(hwloc_topology* topology) : topology_(topology) {}
  hwloc_topology* topology_;
};

// One placement per local rank. `device_numa_nodes`: local rank i's GPU's NUMA node (from
// assign_devices); when some worker has none (-1) or the list is empty, workers are placed by
// local rank. Throws PlacementError when the machine cannot give what was asked (fewer cores than
// workers with exclusive or core, a CPU not in the machine or not allowed, a list per rank
// missing).
std::vector<WorkerPlacement> plan_placement(const Topology& topology,
                                            const PlacementOptions& options, int nproc_per_node,
                                            const std::vector<int>& device_numa_nodes = {});

// What apply_placement_in_child reports: the failed call and its errno, or error 0.
struct PlacementResult {
  int error = 0;
  const char* call = "";
};

// In the child between clone and exec: sched_setaffinity and set_mempolicy as raw system calls
// that leave errno alone (raw_syscall.h), nothing else (no allocation, no locks). Both survive
// exec.
PlacementResult apply_placement_in_child(const WorkerPlacement& placement) noexcept;

// OMP_NUM_THREADS for a bound worker: its core count, when the user did not set the variable.
void add_placement_variables(const WorkerPlacement& placement, bool omp_threads_defaulted,
                             std::map<std::string, std::string>& variables);

}  // namespace dist::agent
