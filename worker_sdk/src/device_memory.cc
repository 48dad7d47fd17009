#include "device_memory.h"

#include <cstdint>
#include <cstring>
#include <deque>
#include <utility>
#include <vector>

#include "progress_slot.h"

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
  void step_began() override { began_ns_ = monotonic_ns(); }
  void step_ended() override {
    if (began_ns_ != 0) add_work(monotonic_ns() - began_ns_);
    began_ns_ = 0;
  }

 private:
  std::vector<std::unique_ptr<std::byte[]>> blocks_;
  std::uint64_t began_ns_ = 0;  // step_began(), until step_ended()
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
    if (began_) cudaEventDestroy(began_);
    for (auto [began, ended] : timed_) {
      cudaEventDestroy(began);
      cudaEventDestroy(ended);
    }
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
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

  // The measure is best effort: a step whose events cannot be made or recorded (a CUDA error,
  // which whatever waits on the stream reports) goes unmeasured, and is not failed for it.
  void step_began() override {
    DeviceGuard guard(device_);
    add_completed_steps();
    if (!began_) began_ = take_event();
    if (began_ && cudaEventRecord(began_, stream_) != cudaSuccess) {
      free_.push_back(std::exchange(began_, nullptr));
    }
  }
  void step_ended() override {
    if (!began_) return;
    DeviceGuard guard(device_);
    const Timed step{std::exchange(began_, nullptr), take_event()};
    if (!step.second || cudaEventRecord(step.second, stream_) != cudaSuccess) {
      give_back(step);
      return;
    }
    timed_.push_back(step);
    if (timed_.size() > kMostTimedSteps) {  // a stream that stopped: its steps go unmeasured
      give_back(timed_.front());
      timed_.pop_front();
    }
    add_completed_steps();
  }

 private:
  // Steps the stream has not reached the end of yet, before the oldest goes unmeasured.
  static constexpr std::size_t kMostTimedSteps = 64;
  using Timed = std::pair<cudaEvent_t, cudaEvent_t>;  // a step's start and end

  // A timing event; null when none can be made.
  cudaEvent_t take_event() {
    if (free_.empty()) {
      cudaEvent_t e = nullptr;
      return cudaEventCreateWithFlags(&e, cudaEventDefault) == cudaSuccess ? e : nullptr;
    }
    cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }
  void give_back(const Timed& step) {
    for (cudaEvent_t e : {step.first, step.second}) {
      if (e) free_.push_back(e);
    }
  }
  // The steps whose end the stream has passed, oldest first, to the straggler measure. A step
  // whose events cannot be read (a failed stream: what failed is said where it is waited for)
  // goes unmeasured.
  void add_completed_steps() {
    while (!timed_.empty()) {
      const auto [began, ended] = timed_.front();
      const cudaError_t state = cudaEventQuery(ended);
      if (state == cudaErrorNotReady) return;
      float ms = 0.0f;
      if (state == cudaSuccess && cudaEventElapsedTime(&ms, began, ended) == cudaSuccess &&
          ms > 0.0f) {
        add_work(static_cast<std::uint64_t>(static_cast<double>(ms) * 1e6));
      }
      give_back(timed_.front());
      timed_.pop_front();
    }
  }

  CudaStream stream_;
  int device_;
  std::vector<void*> blocks_;
  cudaEvent_t began_ = nullptr;  // step_began()'s, until step_ended()
  std::deque<Timed> timed_;      // ended steps not yet read, oldest first
  std::vector<cudaEvent_t> free_;
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
