// The NCCL backend. Its unique-id exchange needs no GPU and is tested everywhere NCCL is built;
// collectives need GPUs and skip, saying so, where there are none.
#include <gtest/gtest.h>

#include <thread>

#include "dist/sdk/process_group.h"
#include "dist/store/server.h"

#if DIST_HAVE_NCCL
#include <cuda_runtime_api.h>
#endif

namespace dist::sdk {
namespace {

using namespace std::chrono_literals;

store::StoreClient client(std::uint16_t port) {
  store::ClientOptions options;
  options.port = port;
  return store::StoreClient::connect(options);
}

TEST(Nccl, UniqueIdOfRankZeroReachesEveryRankThroughTheStore) {
  if (!nccl_available()) GTEST_SKIP() << "this build has no NCCL backend (DIST_WITH_NCCL)";
  store::StoreServerThread store;
  constexpr int kWorld = 4;
  std::vector<std::string> ids(kWorld);
  std::vector<std::thread> ranks;
  for (int r = kWorld - 1; r >= 0; --r) {  // the readers start first and wait for rank 0
    ranks.emplace_back([&, r] {
      auto c = client(store.port());
      ids[static_cast<std::size_t>(r)] = exchange_nccl_unique_id(c, r, "job/nccl/id", 10s);
    });
  }
  for (auto& t : ranks) t.join();
  ASSERT_EQ(ids[0].size(), 128u);
  EXPECT_NE(ids[0], std::string(128, '\0'));
  for (int r = 1; r < kWorld; ++r) EXPECT_EQ(ids[static_cast<std::size_t>(r)], ids[0]);
}

TEST(Nccl, AMissingIdIsATimeoutNotAHang) {
  if (!nccl_available()) GTEST_SKIP() << "this build has no NCCL backend (DIST_WITH_NCCL)";
  store::StoreServerThread store;
  auto c = client(store.port());
  EXPECT_THROW(exchange_nccl_unique_id(c, 1, "never/published", 200ms), store::StoreError);
}

TEST(Nccl, WithoutAGpuTheGroupIsAClearError) {
  if (!nccl_available()) GTEST_SKIP() << "this build has no NCCL backend (DIST_WITH_NCCL)";
  store::StoreServerThread store;
  try {
    auto group = make_nccl_group(client(store.port()), 0, 1, 0);
    GTEST_SKIP() << "a CUDA device is present: the GPU collective tests below apply instead";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("no usable CUDA device"), std::string::npos) << e.what();
  }
}

#if DIST_HAVE_NCCL
// One rank per visible GPU, as threads: all_reduce, broadcast and barrier on device buffers.
TEST(Nccl, CollectivesOnEveryVisibleGpu) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    GTEST_SKIP() << "no CUDA device on this machine: the NCCL collectives are compile-tested "
                    "here and run on a GPU host";
  }
  store::StoreServerThread store;
  std::vector<std::string> errors(static_cast<std::size_t>(devices));
  std::vector<std::thread> ranks;
  for (int r = 0; r < devices; ++r) {
    ranks.emplace_back([&, r] {
      try {
        NcclOptions options;
        options.init_timeout = 60s;
        auto group = make_nccl_group(client(store.port()), r, devices, r, options);
        constexpr std::size_t kCount = 1 << 20;
        std::vector<float> host(kCount, float(r + 1));
        void* memory = nullptr;
        ASSERT_EQ(cudaMalloc(&memory, kCount * sizeof(float)), cudaSuccess);
        auto* device = static_cast<float*>(memory);
        cudaMemcpy(device, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice);
        group->all_reduce_async(device, kCount, DataType::kFloat32, ReduceOp::kSum).wait();
        cudaMemcpy(host.data(), device, kCount * sizeof(float), cudaMemcpyDeviceToHost);
        EXPECT_EQ(host.front(), float(devices * (devices + 1) / 2));
        EXPECT_EQ(host.back(), float(devices * (devices + 1) / 2));
        std::fill(host.begin(), host.end(), float(r == 0 ? 7 : -1));
        cudaMemcpy(device, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice);
        group->broadcast_async(device, kCount, DataType::kFloat32, 0).wait();
        cudaMemcpy(host.data(), device, kCount * sizeof(float), cudaMemcpyDeviceToHost);
        EXPECT_EQ(host[kCount / 2], 7.0f);
        group->barrier();
        cudaFree(device);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < devices; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << r;
}
#endif

TEST(Nccl, BuildsWithoutTheBackendSayWhatToDo) {
  if (nccl_available()) GTEST_SKIP() << "this build has the NCCL backend";
  store::StoreServerThread store;
  EXPECT_THROW(make_nccl_group(client(store.port()), 0, 1, 0), CollectiveError);
}

}  // namespace
}  // namespace dist::sdk
