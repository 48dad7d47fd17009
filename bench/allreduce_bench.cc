// allreduce-bench: nccl-tests style all-reduce bandwidth of the SDK's Gloo process group beside raw
// Gloo (gloo::allreduce on its own context), in one run. Start it under dist-launch:
//
//   dist-launch --nproc-per-node 2 --no-python build/bin/allreduce-bench
//
// For each size: --rounds alternating rounds of SDK then raw Gloo; each round is 2 warm-ups and
// enough back-to-back all-reduces to fill its share of --min-seconds (at least 3). time = the
// median round's mean per all-reduce; algbw = bytes / time; busbw = algbw * 2 (n - 1) / n.
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "dist/sdk/env.h"
#include "dist/sdk/process_group.h"

namespace {

using Clock = std::chrono::steady_clock;

// Gloo's rendezvous through the store, for the raw-Gloo side.
class RawStore : public gloo::rendezvous::Store {
 public:
  explicit RawStore(dist::store::StoreClient c) : c_(std::move(c)) {}
  void set(const std::string& k, const std::vector<char>& v) override {
    c_.set("raw/" + k, std::string(v.begin(), v.end()));
  }
  std::vector<char> get(const std::string& k) override {
    const auto v = c_.get("raw/" + k);
    return {v.begin(), v.end()};
  }
  void wait(const std::vector<std::string>& keys) override {
    std::vector<std::string> p;
    for (const auto& k : keys) p.push_back("raw/" + k);
    c_.wait(p);
  }

 private:
  dist::store::StoreClient c_;
};

// Mean seconds per operation: two warm-ups, a probe that lets rank 0 choose how many iterations
// fill --min-seconds (broadcast once, so every rank runs the same count), then that many
// operations back to back with nothing else on the wire, timed on rank 0.
template <typename F>
double seconds_per_op(F&& op, double min_seconds, dist::sdk::ProcessGroup& control) {
  op();
  op();
  const auto probe_start = Clock::now();
  op();
  const double probe = std::chrono::duration<double>(Clock::now() - probe_start).count();
  std::vector<std::int64_t> iterations{
      std::clamp<std::int64_t>(static_cast<std::int64_t>(min_seconds / probe), 3, 100000)};
  control.broadcast(std::span<std::int64_t>(iterations), 0);
  control.barrier();
  const auto start = Clock::now();
  for (std::int64_t i = 0; i < iterations[0]; ++i) op();
  const double total = std::chrono::duration<double>(Clock::now() - start).count();
  return total / static_cast<double>(iterations[0]);
}

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t min_bytes = 4 << 10, max_bytes = 256 << 20;
  double min_seconds = 1.0;
  int rounds = 7;
  CLI::App app{"allreduce-bench: SDK Gloo process group vs raw Gloo all-reduce bandwidth"};
  app.add_option("--min-bytes", min_bytes)->capture_default_str();
  app.add_option("--max-bytes", max_bytes)->capture_default_str();
  app.add_option("--min-seconds", min_seconds, "per size and side, over all rounds")
      ->capture_default_str();
  app.add_option("--rounds", rounds, "alternating rounds per size; the median is reported")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const auto env = dist::sdk::WorkerEnv::from_environment();
  dist::sdk::GlooOptions options;
  options.route_to = env.master_addr;
  auto group =
      dist::sdk::make_gloo_group(dist::sdk::connect_store(env), env.rank, env.world_size, options);
  // A second SDK group agrees on iteration counts, outside the timed loops.
  options.key_prefix = "bench/control";
  auto control =
      dist::sdk::make_gloo_group(dist::sdk::connect_store(env), env.rank, env.world_size, options);
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto raw = std::make_shared<gloo::rendezvous::Context>(env.rank, env.world_size);
  RawStore raw_store(dist::sdk::connect_store(env));
  auto device = gloo::transport::tcp::CreateDevice(attr);
  raw->connectFullMesh(raw_store, device);

  const int n = env.world_size;
  const double bus_factor = n > 1 ? 2.0 * (n - 1) / n : 1.0;
  if (env.rank == 0) {
    std::printf("# %d ranks, float32 sum, in place, median of %d rounds; GB/s = 1e9 bytes/s\n", n,
                rounds);
    std::printf("%12s %12s %10s %10s %12s %10s %10s %8s\n", "bytes", "sdk us", "sdk algbw",
                "sdk busbw", "raw us", "raw algbw", "raw busbw", "sdk/raw");
  }
  for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    const std::size_t count = bytes / sizeof(float);
    std::vector<float> data(count, 1.0f);
    // Alternate the two sides over several rounds and keep each side's median: wake-up latency on
    // a small shared machine drifts, and interleaving exposes both sides to the same drift.
    auto sdk_op = [&] { group->all_reduce(std::span<float>(data), dist::sdk::ReduceOp::kSum); };
    auto raw_op = [&] {
      gloo::AllreduceOptions opts(raw);
      opts.setOutput(data.data(), count);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      gloo::allreduce(opts);
    };
    std::vector<double> sdk_rounds, raw_rounds;
    for (int round = 0; round < rounds; ++round) {  // alternate which side goes first, too
      const double share = min_seconds / rounds;
      if (round % 2 == 0) {
        sdk_rounds.push_back(seconds_per_op(sdk_op, share, *control));
        raw_rounds.push_back(seconds_per_op(raw_op, share, *control));
      } else {
        raw_rounds.push_back(seconds_per_op(raw_op, share, *control));
        sdk_rounds.push_back(seconds_per_op(sdk_op, share, *control));
      }
    }
    const double sdk = median(sdk_rounds), raw_time = median(raw_rounds);
    if (env.rank == 0) {
      const double sdk_alg = static_cast<double>(bytes) / sdk / 1e9;
      const double raw_alg = static_cast<double>(bytes) / raw_time / 1e9;
      std::printf("%12zu %12.1f %10.3f %10.3f %12.1f %10.3f %10.3f %8.3f\n", bytes, sdk * 1e6,
                  sdk_alg, sdk_alg * bus_factor, raw_time * 1e6, raw_alg, raw_alg * bus_factor,
                  sdk_alg / raw_alg);
      std::fflush(stdout);
    }
  }
  control->barrier();
  return 0;
}
