// Ops on the device (NCCL): CUDA kernels (kernels.cu) and the group's collectives, all on an
// exchange stream of DDP's own. post() makes that stream follow the caller's (the gradients'
// copy into the bucket) and enqueues the job; drain() makes the caller's stream follow it. The
// host waits only where a value must reach it (the counts of threshold:T, state()).
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "compression/ops.h"

#if DIST_HAVE_NCCL && DIST_HAVE_COMPRESSION_KERNELS
#include <cuda_runtime_api.h>

#include "compression/kernels.h"
#endif

namespace dist::sdk::detail {

#if DIST_HAVE_NCCL && DIST_HAVE_COMPRESSION_KERNELS
namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw CollectiveError(std::string("gradient compression on the device: ") + what + ": " +
                          cudaGetErrorString(e));
  }
}

kernels::FloatType float_type(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return kernels::FloatType::kFloat32;
    case DataType::kFloat16:
      return kernels::FloatType::kFloat16;
    case DataType::kBFloat16:
      return kernels::FloatType::kBFloat16;
    default:
      throw std::invalid_argument("gradient compression: buckets of float32, float16 or bfloat16");
  }
}

// A launch failure (std::runtime_error from kernels.cu) as the CollectiveError DDP's callers
// expect of a failing device.
template <typename F>
void launch(F&& f) {
  try {
    f();
  } catch (const CollectiveError&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw CollectiveError(e.what());
  }
}

class DeviceOps final : public Ops {
 public:
  DeviceOps(ProcessGroup& group, CudaStream caller) : Ops(group), caller_(caller) {
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaEventCreateWithFlags(&caller_done_, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventCreateWithFlags(&exchange_done_, cudaEventDisableTiming),
               "cudaEventCreate");
  }
  ~DeviceOps() override {
    cudaStreamSynchronize(stream_);
    for (void* block : blocks_) cudaFree(block);
    cudaEventDestroy(caller_done_);
    cudaEventDestroy(exchange_done_);
    cudaStreamDestroy(stream_);
  }
  DeviceOps(const DeviceOps&) = delete;
  DeviceOps& operator=(const DeviceOps&) = delete;

  void post(std::function<void()> job) override {
    check_cuda(cudaEventRecord(caller_done_, caller_), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream_, caller_done_, 0), "cudaStreamWaitEvent");
    job();
  }
  void drain() override {
    check_cuda(cudaEventRecord(exchange_done_, stream_), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(caller_, exchange_done_, 0), "cudaStreamWaitEvent");
  }

  void* allocate(std::size_t bytes) override {
    void* block = nullptr;
    check_cuda(cudaMalloc(&block, std::max<std::size_t>(bytes, 1)), "cudaMalloc");
    blocks_.push_back(block);
    check_cuda(cudaMemsetAsync(block, 0, std::max<std::size_t>(bytes, 1), stream_),
               "cudaMemsetAsync");
    return block;
  }
  void copy(void* to, const void* from, std::size_t bytes) override {
    if (bytes == 0) return;
    check_cuda(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream_),
               "cudaMemcpyAsync");
  }
  void zero(void* x, std::size_t bytes) override {
    if (bytes == 0) return;
    check_cuda(cudaMemsetAsync(x, 0, bytes, stream_), "cudaMemsetAsync");
  }
  void from_host(void* to, const void* host, std::size_t bytes) override {
    if (bytes == 0) return;
    check_cuda(cudaMemcpyAsync(to, host, bytes, cudaMemcpyHostToDevice, stream_),
               "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  void to_host(void* host, const void* from, std::size_t bytes) override {
    if (bytes == 0) return;
    check_cuda(cudaMemcpyAsync(host, from, bytes, cudaMemcpyDeviceToHost, stream_),
               "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  void widen_add(const void* flat, DataType type, const float* residual, float* acc,
                 std::size_t n) override {
    launch([&] { kernels::widen_add(flat, float_type(type), residual, acc, n, stream_); });
  }
  void narrow(const float* src, void* flat, DataType type, std::size_t n) override {
    launch([&] { kernels::narrow(src, flat, float_type(type), n, stream_); });
  }
  void encode16(const float* acc, void* wire, DataType wire_type, float scale, float* residual,
                std::size_t n) override {
    launch(
        [&] { kernels::encode16(acc, wire, float_type(wire_type), scale, residual, n, stream_); });
  }
  void decode16(const void* wire, DataType wire_type, float* out, std::size_t n) override {
    launch([&] { kernels::decode16(wire, float_type(wire_type), out, n, stream_); });
  }
  void sum_ranks(const void* gathered, int ranks, DataType type, std::size_t n,
                 float* out) override {
    launch([&] { kernels::sum_ranks(gathered, ranks, float_type(type), n, out, stream_); });
  }
  void select_topk(const float* acc, std::size_t n, std::size_t k, std::int32_t* message,
                   float* residual) override {
    const std::size_t needed = kernels::topk_scratch_bytes(n);
    if (needed > scratch_bytes_) {
      scratch_ = allocate(needed);
      scratch_bytes_ = needed;
    }
    launch([&] { kernels::select_topk(acc, n, k, message, residual, scratch_, stream_); });
  }
  void select_threshold(const float* acc, std::size_t n, float t, std::int32_t* message,
                        float* residual, std::int32_t* count) override {
    launch([&] { kernels::select_threshold(acc, n, t, message, residual, count, stream_); });
  }
  void scatter_add(const std::int32_t* messages, std::size_t stride_words,
                   const std::vector<std::int32_t>& counts, float* dense, std::size_t n,
                   float scale) override {
    check_cuda(cudaMemsetAsync(dense, 0, n * sizeof(float), stream_), "cudaMemsetAsync");
    launch([&] {
      for (std::size_t r = 0; r < counts.size(); ++r) {  // ranks in order: every rank adds alike
        kernels::scatter_add(messages + r * stride_words, static_cast<std::size_t>(counts[r]),
                             dense, n, stream_);
      }
      kernels::scale(dense, n, scale, stream_);
    });
  }
  void matmul(const float* a, const float* b, float* c, std::size_t rows, std::size_t inner,
              std::size_t cols, bool transpose_a) override {
    launch([&] { kernels::matmul(a, b, c, rows, inner, cols, transpose_a, stream_); });
  }
  void outer(const float* p, const float* q, float* out, std::size_t rows, std::size_t cols,
             std::size_t r) override {
    launch([&] { kernels::outer(p, q, out, rows, cols, r, stream_); });
  }
  void orthogonalize(float* m, std::size_t rows, std::size_t r) override {
    launch([&] { kernels::orthogonalize(m, rows, r, stream_); });
  }
  void subtract(const float* a, const float* b, float* out, std::size_t n) override {
    launch([&] { kernels::subtract(a, b, out, n, stream_); });
  }
  void scale(float* x, std::size_t n, float factor) override {
    launch([&] { kernels::scale(x, n, factor, stream_); });
  }
  void flag_nonfinite(const float* x, std::size_t n, std::uint32_t* flag,
                      std::uint32_t* count) override {
    launch([&] { kernels::flag_nonfinite(x, n, flag, count, stream_); });
  }
  void zero_if(const std::uint32_t* flag, float* x, std::size_t n) override {
    launch([&] { kernels::zero_if(flag, x, n, stream_); });
  }
  void copy_if(const std::uint32_t* flag, float* to, const float* from, std::size_t n) override {
    launch([&] { kernels::copy_if(flag, to, from, n, stream_); });
  }
  void zero_nonfinite(float* x, std::size_t n, std::uint32_t* count) override {
    if (!found_) found_ = static_cast<std::uint32_t*>(allocate(sizeof(std::uint32_t)));
    launch([&] { kernels::zero_nonfinite(x, n, count, found_, stream_); });
  }

 protected:
  void run_all_reduce(void* data, std::size_t count, DataType type, ReduceOp op) override {
    group().all_reduce_async(data, count, type, op, stream_).wait_on(stream_);
  }
  void run_all_gather(const void* input, void* output, std::size_t count, DataType type) override {
    group().all_gather_async(input, output, count, type, stream_).wait_on(stream_);
  }

 private:
  CudaStream caller_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t caller_done_ = nullptr, exchange_done_ = nullptr;
  std::vector<void*> blocks_;
  void* scratch_ = nullptr;
  std::size_t scratch_bytes_ = 0;
  std::uint32_t* found_ = nullptr;  // zero_nonfinite()'s flag
};

}  // namespace

std::unique_ptr<Ops> make_device_ops(ProcessGroup& group, CudaStream caller) {
  return std::make_unique<DeviceOps>(group, caller);
}

#else

std::unique_ptr<Ops> make_device_ops(ProcessGroup&, CudaStream) {
  throw CollectiveError(
      "gradient compression over device buffers needs a build with CUDA, NCCL and nvcc (its "
      "kernels); this build has none: use compression 'none' or a Gloo group");
}

#endif

}  // namespace dist::sdk::detail
