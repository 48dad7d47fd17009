// heartbeat-cost-bench: what dist::sdk::heartbeat() costs a worker per call.
//
//   build/bin/dist-launch --worker-heartbeat-timeout 60 --no-python
//       build/bin/heartbeat-cost-bench [--calls 1000000] [--runs 9]
//
// Run under dist-launch, so that the worker has its heartbeat slot (without one, heartbeat() is a
// check and a return, and the bench says so). Batches of --calls heartbeat() calls alternate with
// batches of the anchor, a bare clock_gettime(CLOCK_MONOTONIC) (A B A B); median ns per call of
// each over --runs, and their difference: what the store to shared memory adds to the clock read.
#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "dist/sdk/heartbeat.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

template <typename F>
double ns_per_call(long calls, F&& f) {
  const auto start = Clock::now();
  for (long i = 0; i < calls; ++i) f();
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count() /
         static_cast<double>(calls);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"heartbeat-cost-bench: ns per dist::sdk::heartbeat() call"};
  long calls = 1'000'000;
  int runs = 9;
  app.add_option("--calls", calls, "Calls per batch")->check(CLI::PositiveNumber);
  app.add_option("--runs", runs, "Batches of each")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  std::printf("heartbeat slot: %s\n", dist::sdk::heartbeat_enabled()
                                          ? "yes (under dist-launch --worker-heartbeat-timeout)"
                                          : "NO: heartbeat() only returns (run under dist-launch)");
  std::vector<double> anchor, beat;
  timespec sink{};
  for (int r = 0; r < runs; ++r) {
    anchor.push_back(ns_per_call(calls, [&] { ::clock_gettime(CLOCK_MONOTONIC, &sink); }));
    beat.push_back(ns_per_call(calls, [] { dist::sdk::heartbeat(); }));
  }
  const double a = median(anchor), b = median(beat);
  std::printf("A clock_gettime(CLOCK_MONOTONIC): median %.1f ns/call\n", a);
  std::printf("B dist::sdk::heartbeat():          median %.1f ns/call (%+.1f ns over A)\n", b,
              b - a);
  return 0;
}
