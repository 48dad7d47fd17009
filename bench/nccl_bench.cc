// nccl-bench: the SDK's NCCL group beside raw NCCL on the same GPU, in one run: a synchronous
// all-reduce (issued, then waited for until its result is complete) at each size. Alone it is
// world size 1 on device 0; under dist-launch every rank takes its own GPU:
//
//   build/bin/nccl-bench
//   dist-launch --nproc-per-node 2 --no-python build/bin/nccl-bench     (two GPUs)
//
// sdk: group->all_reduce(data, n, float32, op, stream), which returns once the collective's
// completion event fired. raw: ncclAllReduce on a stream, then cudaStreamSynchronize: the floor.
// --op sum (default) or avg: at one rank NCCL does nothing for an in-place sum (the time is the
// API's and the synchronization's), while avg runs its kernel over every byte (memory-bound: GB/s
// is the GPU's memory, not a network). Each side's NCCL version is printed.
// For each size: --rounds rounds alternating which side goes first; each round is 3 warm-ups and
// enough back-to-back operations to fill its share of --min-seconds (at least 5). time = the
// median round's mean per operation. bench/nccl_torch_bench.py measures torch's ProcessGroupNCCL
// the same way; bench/nccl_compare.py runs both, interleaved.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "dist/sdk/init.h"
#include "dist/sdk/process_group.h"

namespace {

using Clock = std::chrono::steady_clock;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r));
}

// Mean seconds per operation; rank 0 chooses the count (broadcast over the host group, so every
// rank runs the same number).
template <typename F>
double seconds_per_op(F&& op, double min_seconds, dist::sdk::ProcessGroup& control) {
  for (int i = 0; i < 3; ++i) op();
  const auto probe_start = Clock::now();
  op();
  const double probe = std::chrono::duration<double>(Clock::now() - probe_start).count();
  std::vector<std::int64_t> iterations{
      std::clamp<std::int64_t>(static_cast<std::int64_t>(min_seconds / probe), 5, 1000000)};
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

int main(int argc, char** argv) try {
  std::vector<std::size_t> sizes{8, 1024, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
  double min_seconds = 2.0;
  int rounds = 7;
  std::string op_name = "sum";
  CLI::App app{"nccl-bench: synchronous all-reduce of the SDK's NCCL group vs raw NCCL"};
  app.add_option("--sizes", sizes, "message sizes in bytes")->delimiter(',')->capture_default_str();
  app.add_option("--min-seconds", min_seconds, "per size and side, over all rounds")
      ->capture_default_str();
  app.add_option("--rounds", rounds, "alternating rounds per size; the median is reported")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--op", op_name, "reduction: sum (nothing to do at one rank) or avg (a kernel)")
      ->check(CLI::IsMember({"sum", "avg"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const auto op = op_name == "avg" ? dist::sdk::ReduceOp::kAvg : dist::sdk::ReduceOp::kSum;
  const ncclRedOp_t raw_op_code = op_name == "avg" ? ncclAvg : ncclSum;

  auto dist = dist::sdk::init(dist::sdk::Backend::kNccl);
  const auto& env = dist.env;
  dist::sdk::GlooOptions gloo;
  gloo.route_to = env.master_addr;
  gloo.key_prefix = "bench/control";
  auto control =
      dist::sdk::make_gloo_group(dist::sdk::connect_store(env), env.rank, env.world_size, gloo);

  // The raw side: its own communicator on the device the SDK chose (the current one).
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  auto store = dist::sdk::connect_store(env);
  // Keys of this attempt: a restarted bench never reads the previous attempt's id.
  const std::string id_bytes = dist::sdk::exchange_nccl_unique_id(
      store, env.rank,
      "bench/" + env.run_id + "/attempt_" + std::to_string(env.restart_count) + "/raw_nccl_id",
      std::chrono::minutes(1));
  ncclUniqueId id;
  std::memcpy(&id, id_bytes.data(), sizeof id);
  ncclComm_t raw = nullptr;
  check(ncclCommInitRank(&raw, env.world_size, id, env.rank), "ncclCommInitRank");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  if (env.rank == 0) {
    cudaDeviceProp properties{};
    cudaGetDeviceProperties(&properties, device);
    std::printf(
        "# nccl-bench: NCCL %s, %d rank(s), device %d (%s), float32 %s in place, "
        "synchronous; median of %d rounds\n",
        dist::sdk::nccl_version().c_str(), env.world_size, device, properties.name, op_name.c_str(),
        rounds);
    std::printf("%12s %12s %12s %10s %12s\n", "bytes", "sdk us", "raw us", "sdk-raw us",
                "sdk GB/s");
  }
  for (const std::size_t bytes : sizes) {
    const std::size_t count = std::max<std::size_t>(1, bytes / sizeof(float));
    void* data = nullptr;
    check(cudaMalloc(&data, count * sizeof(float)), "cudaMalloc");
    check(cudaMemset(data, 0, count * sizeof(float)), "cudaMemset");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    auto sdk_op = [&] {
      dist.group->all_reduce(data, count, dist::sdk::DataType::kFloat32, op, stream);
    };
    auto raw_op = [&] {
      check(ncclAllReduce(data, data, count, ncclFloat32, raw_op_code, raw, stream),
            "ncclAllReduce");
      check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    };
    std::vector<double> sdk_rounds, raw_rounds;
    const double share = min_seconds / rounds;
    for (int round = 0; round < rounds; ++round) {
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
      std::printf("%12zu %12.2f %12.2f %10.2f %12.3f\n", count * sizeof(float), sdk * 1e6,
                  raw_time * 1e6, (sdk - raw_time) * 1e6,
                  static_cast<double>(count * sizeof(float)) / sdk / 1e9);
      std::fflush(stdout);
    }
    cudaFree(data);
  }
  control->barrier();
  ncclCommDestroy(raw);
  cudaStreamDestroy(stream);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "nccl-bench: %s\n", e.what());
  return 1;
}
