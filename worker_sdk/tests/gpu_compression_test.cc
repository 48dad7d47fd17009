// DDP's gradient compression over device buffers (NCCL, world size 1, the CUDA kernels) against
// the same steps over host buffers (Gloo, the host's loops): the casts, top-k (radix select over
// several tiles, ties included) and threshold give the same bits, residuals included (the states
// are equal byte for byte); PowerSGD the same within float rounding; the inf/NaN guard's kernels
// do what the host's loops do with a NaN gradient. Without a GPU every test skips, saying so.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "dist/sdk/ddp.h"
#include "dist/sdk/process_group.h"
#include "dist/store/server.h"
#include "ranks.h"

namespace dist::sdk {
namespace {

constexpr std::size_t kRows = 40, kCols = 50, kBias = 12;  // 2,012 floats: several top-k tiles
constexpr int kSteps = 4;

bool have_gpu() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
}

bool poison = false;  // a NaN in w's gradient at step 2 (the guard's test)

// Step s's gradients: normal values, then a run of equal magnitudes (ties for top-k).
std::vector<float> gradients(std::size_t n, int step, unsigned salt) {
  std::mt19937 g(static_cast<unsigned>(1000 * step) + salt);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  for (std::size_t i = 0; i < n / 10; ++i) v[3 * i % n] = (i % 2 ? 2.5f : -2.5f);
  if (poison && step == 2 && salt == 1) v[7] = std::nanf("");
  return v;
}

struct Result {
  std::vector<std::vector<float>> grads;  // per step: b then w
  std::string state;
  CommunicationStats stats;
};

Result on_host(const std::string& spec) {
  Result out;
  testing::on_ranks(1, [&](ProcessGroup& g) {
    std::vector<float> w(kRows * kCols), b(kBias), dw(w.size()), db(b.size());
    DdpOptions options;
    options.compression = Compression::parse(spec);
    DistributedDataParallel ddp(g, {{"w", w, dw, {kRows, kCols}}, {"b", b, db}}, options);
    for (int s = 0; s < kSteps; ++s) {
      const auto gw = gradients(dw.size(), s, 1), gb = gradients(db.size(), s, 2);
      std::copy(gw.begin(), gw.end(), dw.begin());
      std::copy(gb.begin(), gb.end(), db.begin());
      ddp.grad_ready(1);
      ddp.grad_ready(0);
      ddp.synchronize();
      std::vector<float> flat = db;
      flat.insert(flat.end(), dw.begin(), dw.end());
      out.grads.push_back(flat);
    }
    out.state = ddp.state();
    out.stats = ddp.stats();
  });
  return out;
}

Result on_device(const std::string& spec) {
  Result out;
  store::StoreServerThread store;
  store::ClientOptions client;
  client.port = store.port();
  NcclOptions nccl;
  nccl.device = 0;
  auto group = make_nccl_group(store::StoreClient::connect(client), 0, 1, 0, nccl);
  CudaStream stream = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  std::vector<float*> buffers(4);
  const std::size_t sizes[] = {kRows * kCols, kBias, kRows * kCols, kBias};  // w, b, dw, db
  for (std::size_t i = 0; i < 4; ++i) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, sizes[i] * sizeof(float)), cudaSuccess);
    cudaMemset(p, 0, sizes[i] * sizeof(float));
    buffers[i] = static_cast<float*>(p);
  }
  cudaDeviceSynchronize();
  {
    DdpOptions options;
    options.compression = Compression::parse(spec);
    options.stream = stream;
    DistributedDataParallel ddp(
        *group,
        {{"w", {buffers[0], sizes[0]}, {buffers[2], sizes[2]}, {kRows, kCols}},
         {"b", {buffers[1], sizes[1]}, {buffers[3], sizes[3]}}},
        options);
    for (int s = 0; s < kSteps; ++s) {
      const auto gw = gradients(sizes[2], s, 1), gb = gradients(sizes[3], s, 2);
      cudaMemcpyAsync(buffers[2], gw.data(), gw.size() * sizeof(float), cudaMemcpyHostToDevice,
                      stream);
      cudaMemcpyAsync(buffers[3], gb.data(), gb.size() * sizeof(float), cudaMemcpyHostToDevice,
                      stream);
      ddp.grad_ready(1);
      ddp.grad_ready(0);
      ddp.synchronize();
      std::vector<float> flat(kBias + kRows * kCols);
      cudaMemcpyAsync(flat.data(), buffers[3], kBias * sizeof(float), cudaMemcpyDeviceToHost,
                      stream);
      cudaMemcpyAsync(flat.data() + kBias, buffers[2], sizes[2] * sizeof(float),
                      cudaMemcpyDeviceToHost, stream);
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      out.grads.push_back(flat);
    }
    out.state = ddp.state();
    out.stats = ddp.stats();
  }
  for (float* p : buffers) cudaFree(p);
  cudaStreamDestroy(stream);
  return out;
}

class GpuCompression : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuCompression, DeviceKernelsGiveTheHostsResults) {
  if (!have_gpu()) {
    GTEST_SKIP() << "no CUDA device on this machine: the compression kernels run on a GPU host";
  }
  const std::string spec = GetParam();
  const Result host = on_host(spec), device = on_device(spec);
  ASSERT_EQ(device.grads.size(), host.grads.size());
  for (std::size_t s = 0; s < host.grads.size(); ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    if (spec.rfind("powersgd", 0) == 0) {  // matmuls: another summation order, FMA
      for (std::size_t i = 0; i < host.grads[s].size(); ++i) {
        ASSERT_NEAR(device.grads[s][i], host.grads[s][i], 1e-4 * (1 + std::fabs(host.grads[s][i])))
            << i;
      }
    } else {
      EXPECT_EQ(device.grads[s], host.grads[s]);
    }
  }
  if (spec.rfind("powersgd", 0) != 0) {
    EXPECT_EQ(device.state, host.state) << "residuals differ";
  }
}

TEST_P(GpuCompression, TheInfNanGuardOnTheDeviceIsTheHosts) {
  if (!have_gpu()) {
    GTEST_SKIP() << "no CUDA device on this machine: the compression kernels run on a GPU host";
  }
  const std::string spec = GetParam();
  poison = true;
  const Result host = on_host(spec), device = on_device(spec);
  poison = false;
  EXPECT_EQ(device.stats.nonfinite_skipped, host.stats.nonfinite_skipped);
  EXPECT_EQ(device.stats.nonfinite_cleaned, host.stats.nonfinite_cleaned);
  EXPECT_GE(host.stats.nonfinite_skipped + host.stats.nonfinite_cleaned, 1u);
  ASSERT_EQ(device.grads.size(), host.grads.size());
  for (std::size_t s = 0; s < host.grads.size(); ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    for (std::size_t i = 0; i < host.grads[s].size(); ++i) {
      ASSERT_TRUE(std::isfinite(device.grads[s][i])) << i;
      ASSERT_NEAR(device.grads[s][i], host.grads[s][i], 1e-4 * (1 + std::fabs(host.grads[s][i])))
          << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryLossyMode, GpuCompression,
                         // topk:1 and the warm-up: the dense exchange (a ring all-reduce).
                         ::testing::Values("fp16", "bf16", "topk:0.05", "topk:0.3", "threshold:1.5",
                                           "powersgd:2", "topk:1", "powersgd:2:2"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace dist::sdk
