#include "device_memory.h"

#include <cstring>
#include <vector>

#if DIST_HAVE_NCCL
#include <cuda_runtime_api.h>

#include "cuda_device.h"
#endif

namespace dist::sdk::detail {
namespace {

class HostMemory final : public BucketMemory {
 public:
  void* allocate(std::size_t bytes) override {
    blocks_.push_back(std::make_unique<std::byte[]>(bytes));  // value-initialized: zeroed
    return blocks_.back().get();
  }
  void copy(void* to, const void* from, std::size_t bytes) override {
    std::memcpy(to, from, bytes);
  }
  void synchronize() override {}  // copies completed when they returned
  void complete(const Work& work) override { work.wait(); }
  CudaStream stream() const override { return nullptr; }

 private:
  std::vector<std::unique_ptr<std::byte[]>> blocks_;
};

#if DIST_HAVE_NCCL
void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw CollectiveError(std::string("DDP over device buffers: ") + what + ": " +
                          cudaGetErrorString(e));
  }
}

// Every call under the group's device: a DDP built or used on another thread (whose current
// device is 0) must neither put its buckets there nor create a context there.
class DeviceMemory final : public BucketMemory {
 public:
  DeviceMemory(CudaStream stream, int device) : stream_(stream), device_(device) {}
  ~DeviceMemory() override {
    DeviceGuard guard(device_);
    cudaStreamSynchronize(stream_);  // copies out of the buckets may still run
    for (void* block : blocks_) cudaFree(block);
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  void* allocate(std::size_t bytes) override {
    DeviceGuard guard(device_);
    void* block = nullptr;
    check_cuda(cudaMalloc(&block, bytes), "cudaMalloc of a bucket");
    blocks_.push_back(block);
    check_cuda(cudaMemsetAsync(block, 0, bytes, stream_), "cudaMemsetAsync");
    return block;
  }
  void copy(void* to, const void* from, std::size_t bytes) override {
    DeviceGuard guard(device_);
    check_cuda(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDefault, stream_), "cudaMemcpyAsync");
  }
  void synchronize() override {
    DeviceGuard guard(device_);
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  void complete(const Work& work) override { work.wait_on(stream_); }
  CudaStream stream() const override { return stream_; }

 private:
  CudaStream stream_;
  int device_;
  std::vector<void*> blocks_;
};
#endif

}  // namespace

std::unique_ptr<BucketMemory> BucketMemory::host() {
  return std::make_unique<HostMemory>();
}

std::unique_ptr<BucketMemory> BucketMemory::device([[maybe_unused]] CudaStream stream,
                                                   [[maybe_unused]] int device) {
#if DIST_HAVE_NCCL
  return std::make_unique<DeviceMemory>(stream, device);
#else
  throw CollectiveError(
      "DDP over device buffers needs a build with CUDA and NCCL (DIST_WITH_NCCL=ON)");
#endif
}

}  // namespace dist::sdk::detail
