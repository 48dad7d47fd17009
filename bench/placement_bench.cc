// placement-bench: what CPU and NUMA binding adds to launching workers on this machine.
//
//   build/bin/placement-bench [--workers N] [--runs 200] [--exec /bin/true]
//
// 1. Planning, once per agent start: Topology::this_machine() then plan_placement for N workers
//    (--cpu-bind core and --numa-binding exclusive); median of --runs.
// 2. Per worker: fork, apply_placement_in_child (bound) or nothing (unbound), exec --exec,
//    waitpid. Bound and unbound alternate (A B A B) so both see the same machine load; median of
//    each over --runs, and their difference. On a loaded machine the difference is mostly a
//    bound child waiting for its own CPU, which an unbound one need not do.
// 3. The apply itself, timed inside the child (the two system calls and the migration).
// Binding adds plan + N x (bound - unbound) to a launch of N workers.
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <vector>

#include "resources/placement.h"

namespace {

using Clock = std::chrono::steady_clock;
using dist::agent::WorkerPlacement;

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

template <typename F>
double microseconds(F&& f) {
  const auto start = Clock::now();
  f();
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

// One worker launch as the agent does it; returns false when the child did not exit 0. A bound
// child reports how long apply_placement_in_child took through `report` (async-signal-safe
// calls only, as in the agent).
bool launch(const char* program, const WorkerPlacement* placement, double* apply_us) {
  int report[2];
  if (::pipe(report) != 0) return false;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(report[0]);
    if (placement) {
      timespec before{}, after{};
      ::clock_gettime(CLOCK_MONOTONIC, &before);
      if (apply_placement_in_child(*placement).error != 0) ::_exit(90);
      ::clock_gettime(CLOCK_MONOTONIC, &after);
      const long long ns =
          (after.tv_sec - before.tv_sec) * 1000000000LL + (after.tv_nsec - before.tv_nsec);
      if (::write(report[1], &ns, sizeof ns) != sizeof ns) ::_exit(91);
    }
    ::close(report[1]);
    ::execl(program, program, nullptr);
    ::_exit(127);
  }
  ::close(report[1]);
  long long ns = 0;
  if (placement && ::read(report[0], &ns, sizeof ns) == sizeof ns) *apply_us = ns / 1e3;
  ::close(report[0]);
  int status = 0;
  return pid > 0 && ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
         WEXITSTATUS(status) == 0;
}

}  // namespace

int main(int argc, char** argv) try {
  int workers = 0, runs = 200;
  std::string program = "/bin/true";
  CLI::App app{"placement-bench: the cost of CPU and NUMA binding at launch"};
  app.add_option("--workers", workers, "workers per node (default: one per core)");
  app.add_option("--runs", runs)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--exec", program, "what each worker runs")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  dist::agent::PlacementOptions core_bind;
  core_bind.cpu_bind = dist::agent::CpuBind::kCore;
  if (workers <= 0) {
    workers = plan_placement(dist::agent::Topology::this_machine(), core_bind, 1)[0].cores;
  }
  dist::agent::PlacementOptions exclusive;
  exclusive.numa_binding = dist::agent::NumaBinding::kExclusive;

  std::vector<double> load, plan_core, plan_exclusive;
  std::vector<WorkerPlacement> plan;
  for (int r = 0; r < runs; ++r) {
    std::optional<dist::agent::Topology> topology;
    load.push_back(microseconds([&] { topology.emplace(dist::agent::Topology::this_machine()); }));
    plan_core.push_back(
        microseconds([&] { plan = plan_placement(*topology, core_bind, workers); }));
    plan_exclusive.push_back(microseconds([&] { plan_placement(*topology, exclusive, workers); }));
  }

  std::vector<double> bound, unbound, apply;
  int failures = 0;
  for (int r = 0; r < runs; ++r) {
    const WorkerPlacement& p = plan[static_cast<std::size_t>(r % workers)];
    const bool bound_first = r % 2 == 0;
    for (int side = 0; side < 2; ++side) {
      const bool bind = (side == 0) == bound_first;
      bool ok = true;
      double apply_us = 0;
      const double t =
          microseconds([&] { ok = launch(program.c_str(), bind ? &p : nullptr, &apply_us); });
      (bind ? bound : unbound).push_back(t);
      if (bind) apply.push_back(apply_us);
      failures += ok ? 0 : 1;
    }
  }
  const double plan_us = median(load) + median(plan_core);
  const double per_worker_us = median(bound) - median(unbound);
  std::printf("# %d workers, %d runs, medians; worker program %s\n", workers, runs,
              program.c_str());
  std::printf("topology load (once per agent)     %10.1f us\n", median(load));
  std::printf("plan --cpu-bind core               %10.1f us\n", median(plan_core));
  std::printf("plan --numa-binding exclusive      %10.1f us\n", median(plan_exclusive));
  std::printf("launch unbound (fork+exec+wait)    %10.1f us\n", median(unbound));
  std::printf("launch bound                       %10.1f us\n", median(bound));
  std::printf("apply_placement_in_child (in child) %9.1f us\n", median(apply));
  std::printf("binding adds per worker            %10.1f us\n", per_worker_us);
  std::printf("binding adds to a launch of %d     %10.1f us\n", workers,
              plan_us + workers * per_worker_us);
  if (failures) std::fprintf(stderr, "placement-bench: %d launches failed\n", failures);
  return failures ? 1 : 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "placement-bench: %s\n", e.what());
  return 1;
}
