// The placement planner on hwloc's synthetic topologies (large machines, table-driven), and real
// worker processes placed on this machine: each one's /proc/<pid>/status says where it may run.
#include "resources/placement.h"

#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/mempolicy.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

namespace dist::agent {
namespace {

// 2 packages x 2 NUMA nodes x 2 L3 caches x 4 cores x 2 threads: NUMA node n holds CPUs
// 16n..16n+15, each L3 8 CPUs, each core 2.
constexpr const char* kTwoSockets = "pack:2 numa:2 l3:2 core:4 pu:2";

std::string ranges_of(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

PlacementOptions numa(NumaBinding mode) {
  PlacementOptions o;
  o.numa_binding = mode;
  return o;
}
PlacementOptions cores() {
  PlacementOptions o;
  o.cpu_bind = CpuBind::kCore;
  return o;
}
PlacementOptions lists(std::vector<std::vector<int>> cpu_lists) {
  PlacementOptions o;
  o.cpu_bind = CpuBind::kList;
  o.cpu_lists = std::move(cpu_lists);
  return o;
}

TEST(PlanPlacement, SyntheticTopologies) {
  struct Case {
    const char* name;
    const char* topology;
    PlacementOptions options;
    int workers;
    std::vector<int> device_nodes;
    std::vector<std::string> cpus;    // per local rank
    std::vector<std::string> memory;  // per local rank
    int cores;                        // of local rank 0
  };
  const std::vector<Case> cases = {
      {"core: a block of 4 cores each",
       kTwoSockets,
       cores(),
       8,
       {},
       {"0-7", "8-15", "16-23", "24-31", "32-39", "40-47", "48-55", "56-63"},
       {"0", "0", "1", "1", "2", "2", "3", "3"},
       4},
      {"exclusive, no GPUs: 2 workers per node, half its cores each",
       kTwoSockets,
       numa(NumaBinding::kExclusive),
       8,
       {},
       {"0-7", "8-15", "16-23", "24-31", "32-39", "40-47", "48-55", "56-63"},
       {"0", "0", "1", "1", "2", "2", "3", "3"},
       4},
      {"node, no GPUs: one node each",
       kTwoSockets,
       numa(NumaBinding::kNode),
       4,
       {},
       {"0-15", "16-31", "32-47", "48-63"},
       {"0", "1", "2", "3"},
       8},
      {"node, no GPUs, 8 workers: two per node",
       kTwoSockets,
       numa(NumaBinding::kNode),
       8,
       {},
       {"0-15", "0-15", "16-31", "16-31", "32-47", "32-47", "48-63", "48-63"},
       {"0", "0", "1", "1", "2", "2", "3", "3"},
       8},
      {"socket, no GPUs",
       kTwoSockets,
       numa(NumaBinding::kSocket),
       4,
       {},
       {"0-31", "0-31", "32-63", "32-63"},
       {"0-1", "0-1", "2-3", "2-3"},
       16},
      {"core-complex: one L3 each",
       kTwoSockets,
       numa(NumaBinding::kCoreComplex),
       8,
       {},
       {"0-7", "8-15", "16-23", "24-31", "32-39", "40-47", "48-55", "56-63"},
       {"0", "0", "1", "1", "2", "2", "3", "3"},
       4},
      {"core-complex, more workers than L3s: they share",
       kTwoSockets,
       numa(NumaBinding::kCoreComplex),
       16,
       {},
       {"0-7", "8-15", "0-7", "8-15", "16-23", "24-31", "16-23", "24-31", "32-39", "40-47", "32-39",
        "40-47", "48-55", "56-63", "48-55", "56-63"},
       {"0", "0", "0", "0", "1", "1", "1", "1", "2", "2", "2", "2", "3", "3", "3", "3"},
       4},
      {"exclusive by GPU: each GPU's node split between its two workers",
       kTwoSockets,
       numa(NumaBinding::kExclusive),
       8,
       {3, 3, 2, 2, 1, 1, 0, 0},
       {"48-55", "56-63", "32-39", "40-47", "16-23", "24-31", "0-7", "8-15"},
       {"3", "3", "2", "2", "1", "1", "0", "0"},
       4},
      {"node by GPU",
       kTwoSockets,
       numa(NumaBinding::kNode),
       2,
       {1, 1},
       {"16-31", "16-31"},
       {"1", "1"},
       8},
      {"socket by GPU",
       kTwoSockets,
       numa(NumaBinding::kSocket),
       2,
       {3, 0},
       {"32-63", "0-31"},
       {"2-3", "0-1"},
       16},
      {"a GPU on an unknown node: placed by local rank",
       kTwoSockets,
       numa(NumaBinding::kNode),
       2,
       {7, -1},
       {"0-15", "32-47"},
       {"0", "2"},
       8},
      {"explicit lists",
       kTwoSockets,
       lists({{0, 1, 2, 3}, {4, 6, 40}}),
       2,
       {},
       {"0-3", "4,6,40"},
       {"0", "0,2"},
       2},
      {"exclusive, uneven: the first worker gets the extra core",
       "numa:1 core:5 pu:1",
       numa(NumaBinding::kExclusive),
       2,
       {},
       {"0-2", "3-4"},
       {"", ""},
       3},
      {"one NUMA node: CPUs bound, memory left alone",
       "numa:1 core:4 pu:2",
       cores(),
       2,
       {},
       {"0-3", "4-7"},
       {"", ""},
       2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const auto plan =
        plan_placement(Topology::synthetic(c.topology), c.options, c.workers, c.device_nodes);
    ASSERT_EQ(plan.size(), static_cast<std::size_t>(c.workers));
    for (std::size_t i = 0; i < plan.size(); ++i) {
      EXPECT_EQ(ranges_of(plan[i].cpu_list()), c.cpus[i]) << "local rank " << i;
      EXPECT_EQ(ranges_of(plan[i].memory_node_list()), c.memory[i]) << "local rank " << i;
      EXPECT_TRUE(plan[i].bind_cpus);
    }
    EXPECT_EQ(plan[0].cores, c.cores);
  }
}

// On a 512-thread machine: every worker its own cores, all of them used, for every mode meant to
// be exclusive.
TEST(PlanPlacement, DisjointOnALargeMachine) {
  const Topology big = Topology::synthetic("pack:4 numa:2 l3:4 core:8 pu:2");
  struct Case {
    const char* name;
    PlacementOptions options;
    int workers;
    std::vector<int> device_nodes;
  };
  std::vector<int> gpu_nodes;  // 8 GPUs, one per NUMA node
  for (int n = 0; n < 8; ++n) gpu_nodes.push_back(n);
  const Case cases[] = {
      {"core, 64 workers", cores(), 64, {}},
      {"core, 100 workers (uneven)", cores(), 100, {}},
      {"exclusive, 64 workers", numa(NumaBinding::kExclusive), 64, {}},
      {"exclusive by GPU, 8 workers", numa(NumaBinding::kExclusive), 8, gpu_nodes},
      {"core-complex, 32 workers", numa(NumaBinding::kCoreComplex), 32, {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const auto plan = plan_placement(big, c.options, c.workers, c.device_nodes);
    std::set<int> used;
    for (const auto& p : plan) {
      ASSERT_GT(p.cores, 0);
      for (const int cpu : p.cpu_list()) EXPECT_TRUE(used.insert(cpu).second) << "CPU " << cpu;
    }
    EXPECT_EQ(used.size(), 512u);
  }
}

TEST(PlanPlacement, WhatTheMachineCannotGiveIsAClearError) {
  struct Case {
    const char* name;
    PlacementOptions options;
    int workers;
    std::string error;
  };
  PlacementOptions both = cores();
  both.numa_binding = NumaBinding::kNode;
  const Case cases[] = {
      {"exclusive, more workers than a node's cores", numa(NumaBinding::kExclusive), 9,
       "NUMA node 0 has 4 cores for 5 workers"},
      {"core, more workers than cores", cores(), 9, "--cpu-bind core: 9 workers but 8 cores"},
      {"a list per worker missing", lists({{0}}), 2, "gives 1 CPU list(s) for 2 workers"},
      {"a CPU that is not there", lists({{0}, {99}}), 2, "CPU 99 of local rank 1"},
      {"both flags", both, 2, "use one of them"},
  };
  const Topology small = Topology::synthetic("numa:2 core:4 pu:2");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    try {
      plan_placement(small, c.options, c.workers);
      ADD_FAILURE() << "no PlacementError";
    } catch (const PlacementError& e) {
      EXPECT_NE(std::string(e.what()).find(c.error), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(Topology::synthetic("not a topology"), PlacementError);
}

TEST(PlanPlacement, NoFlagBindsNothing) {
  for (const auto& p : plan_placement(Topology::synthetic(kTwoSockets), {}, 3)) {
    EXPECT_FALSE(p.bind_cpus);
    EXPECT_FALSE(p.bind_memory);
    EXPECT_EQ(p.describe(), "unbound");
  }
}

TEST(Placement, CpuListsAndOmpThreads) {
  EXPECT_EQ(parse_cpu_list("--cpu-bind", "0-3,8,10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  for (const char* bad : {"", "a", "3-1", "1,,2", "-4", "99999"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(parse_cpu_list("--cpu-bind", bad), PlacementError);
  }
  WorkerPlacement p;
  p.add_cpu(2);
  p.add_cpu(3);
  p.cores = 2;
  std::map<std::string, std::string> vars;
  add_placement_variables(p, /*omp_threads_defaulted=*/false, vars);
  EXPECT_TRUE(vars.empty()) << "the user's OMP_NUM_THREADS stays";
  add_placement_variables(p, /*omp_threads_defaulted=*/true, vars);
  EXPECT_EQ(vars["OMP_NUM_THREADS"], "2");
  EXPECT_EQ(p.describe(), "cpus 2-3 (2 cores)");
}

// A worker started as the agent starts one: fork, apply_placement_in_child, exec.
class PlacedWorker {
 public:
  explicit PlacedWorker(const WorkerPlacement& placement) {
    int in[2], out[2];
    // Close-on-exec: a later worker must not hold this one's stdin open.
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0)
      throw std::runtime_error("pipe");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      ::close(in[1]);
      ::close(out[0]);
      const PlacementResult r = apply_placement_in_child(placement);
      if (r.error != 0) {
        ::write(STDOUT_FILENO, r.call, std::strlen(r.call));
        ::write(STDOUT_FILENO, " failed\n", 8);
        ::_exit(90);
      }
      ::execl(DIST_PLACEMENT_PROBE_BIN, DIST_PLACEMENT_PROBE_BIN, nullptr);
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    // The probe's first line says it runs (after exec) and what memory policy it has.
    char c;
    while (::read(out[0], &c, 1) == 1 && c != '\n') line_ += c;
    ::close(out[0]);
  }
  ~PlacedWorker() {
    ::close(stdin_);  // the probe exits
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  PlacedWorker(const PlacedWorker&) = delete;
  PlacedWorker& operator=(const PlacedWorker&) = delete;

  const std::string& line() const { return line_; }
  std::string status_field(const std::string& name) const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    for (std::string l; std::getline(in, l);) {
      if (l.rfind(name + ":", 0) == 0) {
        const auto value = l.find_first_not_of(" \t", name.size() + 1);
        return l.substr(value);
      }
    }
    return "";
  }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  std::string line_;
};

int allowed_cores_here() {
  return plan_placement(Topology::this_machine(), cores(), 1)[0].cores;
}

TEST(PlacedWorkers, RunOnDisjointCoresOfThisMachine) {
  const int workers = std::min(allowed_cores_here(), 8);
  for (const PlacementOptions& options : {cores(), numa(NumaBinding::kExclusive)}) {
    const auto plan = plan_placement(Topology::this_machine(), options, workers);
    std::vector<std::unique_ptr<PlacedWorker>> running;
    for (const auto& p : plan) running.push_back(std::make_unique<PlacedWorker>(p));
    std::set<int> used;
    for (std::size_t i = 0; i < running.size(); ++i) {
      SCOPED_TRACE("local rank " + std::to_string(i));
      ASSERT_EQ(running[i]->line().rfind("ready", 0), 0u) << running[i]->line();
      const std::string allowed = running[i]->status_field("Cpus_allowed_list");
      EXPECT_EQ(parse_cpu_list("Cpus_allowed_list", allowed), plan[i].cpu_list()) << allowed;
      for (const int cpu : plan[i].cpu_list()) EXPECT_TRUE(used.insert(cpu).second) << cpu;
    }
  }
}

TEST(PlacedWorkers, MemoryPolicySurvivesExec) {
  WorkerPlacement p;
  p.add_memory_node(0);
  PlacedWorker worker(p);
  EXPECT_EQ(worker.line(), "ready " + std::to_string(MPOL_PREFERRED) + " 1 -");
  PlacedWorker unbound{WorkerPlacement{}};
  EXPECT_EQ(unbound.line(), "ready " + std::to_string(MPOL_DEFAULT) + " 0 -");
}

TEST(PlacedWorkers, AFailedCallIsReportedNotHidden) {
  WorkerPlacement p;
  p.add_cpu(WorkerPlacement::kMaxCpus - 1);  // no such CPU here
  const pid_t pid = ::fork();
  if (pid == 0) {
    const PlacementResult r = apply_placement_in_child(p);
    ::_exit(r.error == EINVAL && std::strcmp(r.call, "sched_setaffinity") == 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace dist::agent
