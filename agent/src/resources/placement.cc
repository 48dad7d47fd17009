#include "resources/placement.h"

#include <errno.h>
#include <hwloc.h>
#include <linux/mempolicy.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <functional>
#include <set>
#include <sstream>
#include <utility>

#include "processes/raw_syscall.h"

namespace dist::agent {
namespace {

// Memory policies (linux/mempolicy.h); PREFERRED_MANY needs Linux 5.15.
#ifndef MPOL_PREFERRED_MANY
constexpr int MPOL_PREFERRED_MANY = 5;
#endif

// The machine as the planner needs it, read once from hwloc.
struct Core {
  std::vector<int> cpus;           // its hardware threads
  int numa_node = -1;              // OS index of the NUMA node holding it
  int package = 0;                 // logical index of its package (socket)
  std::uint64_t cache_domain = 0;  // its last-level data cache (cores sharing it share this)
};

struct Machine {
  std::vector<Core> cores;      // in topology order
  std::vector<int> numa_nodes;  // OS indices of the NUMA nodes that have CPUs, in order
  std::vector<int> packages;    // logical indices, in order
};

Machine read_machine(hwloc_topology_t t) {
  Machine m;
  const int numa_count = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < numa_count; ++i) {
    const hwloc_obj_t node = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    if (!hwloc_bitmap_iszero(node->cpuset))
      m.numa_nodes.push_back(static_cast<int>(node->os_index));
  }
  const hwloc_obj_type_t unit =
      hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  const int units = hwloc_get_nbobjs_by_type(t, unit);
  std::set<int> packages;
  for (int i = 0; i < units; ++i) {
    const hwloc_obj_t obj = hwloc_get_obj_by_type(t, unit, static_cast<unsigned>(i));
    Core core;
    for (int cpu = hwloc_bitmap_first(obj->cpuset); cpu >= 0;
         cpu = hwloc_bitmap_next(obj->cpuset, cpu)) {
      core.cpus.push_back(cpu);
    }
    if (core.cpus.empty()) continue;
    for (int n = 0; n < numa_count; ++n) {
      const hwloc_obj_t node =
          hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(n));
      if (hwloc_bitmap_isincluded(obj->cpuset, node->cpuset)) {
        core.numa_node = static_cast<int>(node->os_index);
        break;
      }
    }
    if (const hwloc_obj_t package = hwloc_get_ancestor_obj_by_type(t, HWLOC_OBJ_PACKAGE, obj)) {
      core.package = static_cast<int>(package->logical_index);
    }
    packages.insert(core.package);
    hwloc_obj_t last_level = nullptr;
    for (hwloc_obj_t p = obj->parent; p; p = p->parent) {
      if (hwloc_obj_type_is_dcache(p->type) &&
          (!last_level || p->attr->cache.depth > last_level->attr->cache.depth)) {
        last_level = p;
      }
    }
    core.cache_domain = last_level ? last_level->gp_index : obj->gp_index;
    m.cores.push_back(std::move(core));
  }
  m.packages.assign(packages.begin(), packages.end());
  return m;
}

using CoreSet = std::vector<const Core*>;

CoreSet cores_where(const Machine& m, const std::function<bool(const Core&)>& keep) {
  CoreSet out;
  for (const Core& c : m.cores) {
    if (keep(c)) out.push_back(&c);
  }
  return out;
}

// Item k of `count` taking their share of `total` in order, the first total % count one more.
std::pair<std::size_t, std::size_t> share(std::size_t k, std::size_t count, std::size_t total) {
  const std::size_t per = total / count, extra = total % count;
  const std::size_t begin = k * per + std::min(k, extra);
  return {begin, begin + per + (k < extra ? 1 : 0)};
}

const char* mode_name(NumaBinding mode) {
  switch (mode) {
    case NumaBinding::kNode:
      return "node";
    case NumaBinding::kSocket:
      return "socket";
    case NumaBinding::kExclusive:
      return "exclusive";
    case NumaBinding::kCoreComplex:
      return "core-complex";
    case NumaBinding::kNone:
      break;
  }
  return "none";
}

// --numa-binding: the cores of each worker.
std::vector<CoreSet> plan_numa(const Machine& m, NumaBinding mode, std::size_t workers,
                               const std::vector<int>& device_nodes) {
  const std::string flag = std::string("--numa-binding ") + mode_name(mode);
  if (m.numa_nodes.empty()) throw PlacementError(flag + ": hwloc found no NUMA node with CPUs");
  const bool by_device =
      device_nodes.size() == workers &&
      std::all_of(device_nodes.begin(), device_nodes.end(), [&](int n) {
        return std::find(m.numa_nodes.begin(), m.numa_nodes.end(), n) != m.numa_nodes.end();
      });
  std::vector<int> node_of(workers);
  for (std::size_t i = 0; i < workers; ++i) {
    node_of[i] = by_device ? device_nodes[i] : m.numa_nodes[i * m.numa_nodes.size() / workers];
  }
  std::vector<CoreSet> plan(workers);
  for (std::size_t i = 0; i < workers; ++i) {
    const int node = node_of[i];
    const CoreSet local = cores_where(m, [&](const Core& c) { return c.numa_node == node; });
    // This worker's position among the workers placed on the same node.
    std::size_t k = 0, sharing = 0;
    for (std::size_t j = 0; j < workers; ++j) {
      if (node_of[j] != node) continue;
      if (j < i) ++k;
      ++sharing;
    }
    switch (mode) {
      case NumaBinding::kNode:
        plan[i] = local;
        break;
      case NumaBinding::kSocket: {
        const int package =
            by_device ? local.front()->package : m.packages[i * m.packages.size() / workers];
        plan[i] = cores_where(m, [&](const Core& c) { return c.package == package; });
        break;
      }
      case NumaBinding::kExclusive: {
        if (local.size() < sharing) {
          throw PlacementError(flag + ": NUMA node " + std::to_string(node) + " has " +
                               std::to_string(local.size()) + " cores for " +
                               std::to_string(sharing) +
                               " workers; use --numa-binding node, or fewer workers");
        }
        const auto [begin, end] = share(k, sharing, local.size());
        plan[i].assign(local.begin() + static_cast<std::ptrdiff_t>(begin),
                       local.begin() + static_cast<std::ptrdiff_t>(end));
        break;
      }
      case NumaBinding::kCoreComplex: {
        // The node's cache domains, larger first, then in topology order (torchrun's order).
        std::vector<CoreSet> domains;
        for (const Core* c : local) {
          auto it = std::find_if(domains.begin(), domains.end(), [&](const CoreSet& d) {
            return d.front()->cache_domain == c->cache_domain;
          });
          if (it == domains.end()) {
            domains.push_back({c});
          } else {
            it->push_back(c);
          }
        }
        std::stable_sort(domains.begin(), domains.end(),
                         [](const CoreSet& a, const CoreSet& b) { return a.size() > b.size(); });
        plan[i] = domains[k % domains.size()];
        break;
      }
      case NumaBinding::kNone:
        break;
    }
  }
  return plan;
}

// --cpu-bind core: every core, one contiguous block per worker.
std::vector<CoreSet> plan_cores(const Machine& m, std::size_t workers) {
  if (m.cores.size() < workers) {
    throw PlacementError("--cpu-bind core: " + std::to_string(workers) + " workers but " +
                         std::to_string(m.cores.size()) +
                         " cores this node lets the agent use; use --cpu-bind none, or fewer "
                         "workers");
  }
  std::vector<CoreSet> plan(workers);
  for (std::size_t i = 0; i < workers; ++i) {
    const auto [begin, end] = share(i, workers, m.cores.size());
    for (std::size_t c = begin; c < end; ++c) plan[i].push_back(&m.cores[c]);
  }
  return plan;
}

std::string ranges(const std::vector<int>& values) {
  std::string out;
  for (std::size_t i = 0; i < values.size();) {
    std::size_t j = i;
    while (j + 1 < values.size() && values[j + 1] == values[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(values[i]);
    if (j > i) out += "-" + std::to_string(values[j]);
    i = j + 1;
  }
  return out;
}

std::vector<int> bits_of(const std::uint64_t* words, std::size_t count) {
  std::vector<int> out;
  for (std::size_t w = 0; w < count; ++w) {
    for (std::uint64_t bits = words[w]; bits; bits &= bits - 1) {
      out.push_back(static_cast<int>(w * WorkerPlacement::kBitsPerWord) + std::countr_zero(bits));
    }
  }
  return out;
}

}  // namespace

void WorkerPlacement::add_cpu(int cpu) {
  if (cpu < 0 || cpu >= kMaxCpus) {
    throw PlacementError("CPU " + std::to_string(cpu) + " is beyond the " +
                         std::to_string(kMaxCpus) + " CPUs a placement can name");
  }
  cpus[static_cast<std::size_t>(cpu / kBitsPerWord)] |= std::uint64_t{1} << (cpu % kBitsPerWord);
  bind_cpus = true;
}

void WorkerPlacement::add_memory_node(int node) {
  if (node < 0 || node >= kMaxNumaNodes) {
    throw PlacementError("NUMA node " + std::to_string(node) + " is beyond the " +
                         std::to_string(kMaxNumaNodes) + " a placement can name");
  }
  memory_nodes[static_cast<std::size_t>(node / kBitsPerWord)] |= std::uint64_t{1}
                                                                 << (node % kBitsPerWord);
  bind_memory = true;
}

std::vector<int> WorkerPlacement::cpu_list() const {
  return bits_of(cpus.data(), cpus.size());
}

std::vector<int> WorkerPlacement::memory_node_list() const {
  return bits_of(memory_nodes.data(), memory_nodes.size());
}

std::string WorkerPlacement::describe() const {
  if (!bind_cpus && !bind_memory) return "unbound";
  std::string out;
  if (bind_cpus) {
    out = "cpus " + ranges(cpu_list()) + " (" + std::to_string(cores) + " core" +
          (cores == 1 ? "" : "s") + ")";
  }
  if (bind_memory)
    out += (out.empty() ? "" : ", ") + std::string("memory nodes ") + ranges(memory_node_list());
  return out;
}

Topology Topology::this_machine() {
  hwloc_topology_t t = nullptr;
  if (hwloc_topology_init(&t) != 0) throw PlacementError("hwloc_topology_init failed");
  Topology topology(t);
  hwloc_topology_set_components(t, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "x86");
  hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_NONE);
  hwloc_topology_set_icache_types_filter(t, HWLOC_TYPE_FILTER_KEEP_NONE);
  hwloc_topology_set_type_filter(t, HWLOC_OBJ_MISC, HWLOC_TYPE_FILTER_KEEP_NONE);
  if (hwloc_topology_load(t) != 0) {
    throw PlacementError(std::string("hwloc could not read this machine's topology: ") +
                         std::strerror(errno));
  }
  // Only the CPUs this process may use (taskset, srun --cpu-bind, a container's cpuset).
  const hwloc_bitmap_t allowed = hwloc_bitmap_alloc();
  if (hwloc_get_cpubind(t, allowed, HWLOC_CPUBIND_THREAD) == 0 && !hwloc_bitmap_iszero(allowed)) {
    hwloc_topology_restrict(t, allowed, 0);
  }
  hwloc_bitmap_free(allowed);
  return topology;
}

Topology Topology::synthetic(const std::string& description) {
  hwloc_topology_t t = nullptr;
  if (hwloc_topology_init(&t) != 0) throw PlacementError("hwloc_topology_init failed");
  Topology topology(t);
  if (hwloc_topology_set_synthetic(t, description.c_str()) != 0 || hwloc_topology_load(t) != 0) {
    throw PlacementError("'" + description + "' is not a topology hwloc can build");
  }
  return topology;
}

Topology::~Topology() {
  if (topology_) hwloc_topology_destroy(topology_);
}

Topology::Topology(Topology&& other) noexcept
    : topology_(std::exchange(other.topology_, nullptr)) {}

Topology& Topology::operator=(Topology&& other) noexcept {
  if (this != &other) {
    if (topology_) hwloc_topology_destroy(topology_);
    topology_ = std::exchange(other.topology_, nullptr);
  }
  return *this;
}

std::vector<WorkerPlacement> plan_placement(const Topology& topology,
                                            const PlacementOptions& options, int nproc_per_node,
                                            const std::vector<int>& device_numa_nodes) {
  const auto workers = static_cast<std::size_t>(nproc_per_node);
  std::vector<WorkerPlacement> plan(workers);
  if (!options.binds()) return plan;
  if (options.numa_binding != NumaBinding::kNone && options.cpu_bind != CpuBind::kNone) {
    throw PlacementError("--numa-binding and --cpu-bind both given: use one of them");
  }
  const Machine m = read_machine(topology.get());
  const bool several_nodes = m.numa_nodes.size() > 1;
  const auto core_of_cpu = [&](int cpu) -> const Core* {
    for (const Core& c : m.cores) {
      if (std::find(c.cpus.begin(), c.cpus.end(), cpu) != c.cpus.end()) return &c;
    }
    return nullptr;
  };

  if (options.cpu_bind == CpuBind::kList) {
    if (options.cpu_lists.size() != workers) {
      throw PlacementError("--cpu-bind gives " + std::to_string(options.cpu_lists.size()) +
                           " CPU list(s) for " + std::to_string(workers) +
                           " workers per node: give one list per local rank, separated by ';'");
    }
    for (std::size_t i = 0; i < workers; ++i) {
      std::set<const Core*> cores;
      for (const int cpu : options.cpu_lists[i]) {
        const Core* core = core_of_cpu(cpu);
        if (!core) {
          std::vector<int> allowed;
          for (const Core& c : m.cores) allowed.insert(allowed.end(), c.cpus.begin(), c.cpus.end());
          std::sort(allowed.begin(), allowed.end());
          throw PlacementError("--cpu-bind: CPU " + std::to_string(cpu) + " of local rank " +
                               std::to_string(i) + " is not one this node lets the agent use (" +
                               ranges(allowed) + ")");
        }
        plan[i].add_cpu(cpu);
        cores.insert(core);
        if (several_nodes && core->numa_node >= 0) plan[i].add_memory_node(core->numa_node);
      }
      plan[i].cores = static_cast<int>(cores.size());
    }
    return plan;
  }

  const std::vector<CoreSet> cores =
      options.cpu_bind == CpuBind::kCore
          ? plan_cores(m, workers)
          : plan_numa(m, options.numa_binding, workers, device_numa_nodes);
  for (std::size_t i = 0; i < workers; ++i) {
    for (const Core* core : cores[i]) {
      for (const int cpu : core->cpus) plan[i].add_cpu(cpu);
      if (several_nodes && core->numa_node >= 0) plan[i].add_memory_node(core->numa_node);
    }
    plan[i].cores = static_cast<int>(cores[i].size());
  }
  return plan;
}

PlacementResult apply_placement_in_child(const WorkerPlacement& placement) noexcept {
  if (placement.bind_cpus) {
    const long done = raw_syscall(SYS_sched_setaffinity, 0, sizeof placement.cpus,
                                  syscall_arg(placement.cpus.data()));
    if (done < 0) return {static_cast<int>(-done), "sched_setaffinity"};
  }
  if (placement.bind_memory) {
    // The kernel reads maxnode - 1 bits of the mask.
    constexpr long kMaxNode = WorkerPlacement::kMaxNumaNodes + 1;
    int nodes = 0, first = -1;
    for (std::size_t w = 0; w < placement.memory_nodes.size(); ++w) {
      const std::uint64_t bits = placement.memory_nodes[w];
      if (bits && first < 0) {
        first = static_cast<int>(w) * WorkerPlacement::kBitsPerWord + std::countr_zero(bits);
      }
      nodes += std::popcount(bits);
    }
    long done = -EINVAL;
    if (nodes > 1) {
      done = raw_syscall(SYS_set_mempolicy, MPOL_PREFERRED_MANY,
                         syscall_arg(placement.memory_nodes.data()), kMaxNode);
    }
    if (done != 0 && first >= 0) {  // one node, or a kernel before 5.15: the first node
      std::array<std::uint64_t, WorkerPlacement::kMaxNumaNodes / WorkerPlacement::kBitsPerWord>
          one{};
      one[static_cast<std::size_t>(first / WorkerPlacement::kBitsPerWord)] =
          std::uint64_t{1} << (first % WorkerPlacement::kBitsPerWord);
      done = raw_syscall(SYS_set_mempolicy, MPOL_PREFERRED, syscall_arg(one.data()), kMaxNode);
    }
    if (done != 0) return {static_cast<int>(-done), "set_mempolicy"};
  }
  return {};
}

void add_placement_variables(const WorkerPlacement& placement, bool omp_threads_defaulted,
                             std::map<std::string, std::string>& variables) {
  if (omp_threads_defaulted && placement.bind_cpus && placement.cores > 0) {
    variables["OMP_NUM_THREADS"] = std::to_string(placement.cores);
  }
}

std::vector<int> parse_cpu_list(const std::string& flag, const std::string& text) {
  std::vector<int> cpus;
  const auto number = [&](const std::string& s) {
    std::size_t used = 0;
    int v = -1;
    try {
      v = std::stoi(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != s.size() || v < 0 || v >= WorkerPlacement::kMaxCpus) {
      throw PlacementError(flag + ": '" + text + "' is not a CPU list like 0-3,8 ('" + s +
                           "' is not a CPU number)");
    }
    return v;
  };
  std::stringstream items(text);
  for (std::string item; std::getline(items, item, ',');) {
    const auto dash = item.find('-');
    const int low = number(item.substr(0, dash));
    const int high = dash == std::string::npos ? low : number(item.substr(dash + 1));
    if (high < low) throw PlacementError(flag + ": range '" + item + "' runs backwards");
    for (int cpu = low; cpu <= high; ++cpu) cpus.push_back(cpu);
  }
  if (cpus.empty()) throw PlacementError(flag + ": an empty CPU list");
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

}  // namespace dist::agent
