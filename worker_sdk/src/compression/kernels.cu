// Gradient compression on the device: see kernels.h. Element-wise kernels loop grid-stride; the
// radix select and the small linear algebra are written for clarity over peak speed (PowerSGD's
// matrices are rows x RANK).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "compression/kernels.h"

namespace dist::sdk::detail::kernels {
namespace {

constexpr unsigned kThreads = 256;  // per block; a power of two (block_sum)
constexpr unsigned kPerThread = 4;  // elements per thread in the top-k tie pass
constexpr unsigned kTile = kThreads * kPerThread;
constexpr std::size_t kMaxBlocks = 1u << 16;

void check(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("gradient compression kernel ") + what + ": " +
                             cudaGetErrorString(e));
  }
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("gradient compression: ") + what + ": " +
                             cudaGetErrorString(e));
  }
}

unsigned blocks_for(std::size_t n) {
  const std::size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks == 0 ? 1 : (blocks < kMaxBlocks ? blocks : kMaxBlocks));
}

__device__ std::size_t first_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ std::size_t grid_stride() {
  return static_cast<std::size_t>(blockDim.x) * gridDim.x;
}

__device__ float to_float(float v) {
  return v;
}
__device__ float to_float(__half v) {
  return __half2float(v);
}
__device__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ T from_float(float v);
template <>
__device__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// |x| as an unsigned integer ordered as |x| (NaN above infinity), as magnitude_key on the host.
__device__ unsigned key_of(float x) {
  return __float_as_uint(x) & 0x7FFFFFFFu;
}

template <typename F>
void with_type(FloatType type, F&& f) {
  switch (type) {
    case FloatType::kFloat32:
      return f(float{});
    case FloatType::kFloat16:
      return f(__half{});
    case FloatType::kBFloat16:
      return f(__nv_bfloat16{});
  }
}

template <typename T>
__global__ void widen_add_kernel(const T* flat, const float* residual, float* acc, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    acc[i] = to_float(flat[i]) + residual[i];
  }
}

template <typename T>
__global__ void narrow_kernel(const float* src, T* flat, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) flat[i] = from_float<T>(src[i]);
}

template <typename T>
__global__ void encode_kernel(const float* acc, T* wire, float scale, float* residual,
                              std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const T w = from_float<T>(acc[i] * scale);
    wire[i] = w;
    residual[i] = acc[i] - to_float(w) / scale;
  }
}

template <typename T>
__global__ void decode_kernel(const T* wire, float* out, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) out[i] = to_float(wire[i]);
}

template <typename T>
__global__ void sum_ranks_kernel(const T* gathered, int ranks, std::size_t n, float* out) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    float sum = 0.0f;
    for (int r = 0; r < ranks; ++r) sum += to_float(gathered[static_cast<std::size_t>(r) * n + i]);
    out[i] = sum;
  }
}

// The radix select's state: the key prefix found so far, its mask, how many entries are still
// to take at or below it, and the slots taken by the entries above the final key.
struct SelectState {
  unsigned prefix, mask, remaining, taken;
};
constexpr std::size_t kHistogramOffset = 16;
constexpr std::size_t kTilesOffset = kHistogramOffset + 256 * sizeof(unsigned);

__global__ void select_start(SelectState* state, unsigned* histogram, unsigned k) {
  for (unsigned b = threadIdx.x; b < 256; b += blockDim.x) histogram[b] = 0;
  if (threadIdx.x == 0) *state = SelectState{0, 0, k, 0};
}

__global__ void radix_histogram(const float* acc, std::size_t n, const SelectState* state,
                                unsigned* histogram, int shift) {
  __shared__ unsigned local[256];
  for (unsigned b = threadIdx.x; b < 256; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const unsigned prefix = state->prefix, mask = state->mask;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const unsigned key = key_of(acc[i]);
    if ((key & mask) == prefix) atomicAdd(&local[(key >> shift) & 0xFFu], 1u);
  }
  __syncthreads();
  for (unsigned b = threadIdx.x; b < 256; b += blockDim.x) {
    if (local[b]) atomicAdd(&histogram[b], local[b]);
  }
}

// One thread: the digit of the k-th largest key at `shift`, from the top bin down.
__global__ void radix_choose(SelectState* state, unsigned* histogram, int shift) {
  unsigned remaining = state->remaining;
  for (int b = 255; b >= 0; --b) {
    const unsigned count = histogram[b];
    if (count >= remaining) {
      state->prefix |= static_cast<unsigned>(b) << shift;
      state->mask |= 0xFFu << shift;
      break;
    }
    remaining -= count;
  }
  state->remaining = remaining;
  for (int b = 0; b < 256; ++b) histogram[b] = 0;
}

__global__ void take_greater(const float* acc, std::size_t n, SelectState* state,
                             std::int32_t* message, float* residual) {
  const unsigned bar = state->prefix;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float v = acc[i];
    if (key_of(v) > bar) {
      const unsigned slot = atomicAdd(&state->taken, 1u);
      message[2 * static_cast<std::size_t>(slot)] = static_cast<std::int32_t>(i);
      message[2 * static_cast<std::size_t>(slot) + 1] = __float_as_int(v);
      residual[i] = 0.0f;
    } else {
      residual[i] = v;
    }
  }
}

// The ties (key equal to the k-th largest) by tile of kTile entries, kPerThread per thread.
__device__ unsigned ties_of_thread(const float* acc, std::size_t n, unsigned bar) {
  const std::size_t base = static_cast<std::size_t>(blockIdx.x) * kTile + threadIdx.x * kPerThread;
  unsigned count = 0;
  for (unsigned j = 0; j < kPerThread; ++j) {
    if (base + j < n && key_of(acc[base + j]) == bar) ++count;
  }
  return count;
}

__global__ void count_ties(const float* acc, std::size_t n, const SelectState* state,
                           unsigned* tile_ties) {
  __shared__ unsigned total;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  const unsigned count = ties_of_thread(acc, n, state->prefix);
  if (count) atomicAdd(&total, count);
  __syncthreads();
  if (threadIdx.x == 0) tile_ties[blockIdx.x] = total;
}

// One thread: exclusive prefix sum of the tiles' tie counts, in place.
__global__ void scan_tiles(unsigned* tile_ties, std::size_t tiles) {
  unsigned sum = 0;
  for (std::size_t t = 0; t < tiles; ++t) {
    const unsigned count = tile_ties[t];
    tile_ties[t] = sum;
    sum += count;
  }
}

// The first `remaining` ties in index order take the last slots of the message.
__global__ void take_ties(const float* acc, std::size_t n, const SelectState* state,
                          const unsigned* tile_offset, std::size_t k, std::int32_t* message,
                          float* residual) {
  __shared__ unsigned before[kThreads];
  const unsigned bar = state->prefix, remaining = state->remaining;
  before[threadIdx.x] = ties_of_thread(acc, n, bar);
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned sum = 0;
    for (unsigned t = 0; t < blockDim.x; ++t) {
      const unsigned count = before[t];
      before[t] = sum;
      sum += count;
    }
  }
  __syncthreads();
  unsigned rank = tile_offset[blockIdx.x] + before[threadIdx.x];
  const std::size_t base = static_cast<std::size_t>(blockIdx.x) * kTile + threadIdx.x * kPerThread;
  for (unsigned j = 0; j < kPerThread; ++j) {
    const std::size_t i = base + j;
    if (i >= n || key_of(acc[i]) != bar) continue;
    if (rank < remaining) {
      const std::size_t slot = k - remaining + rank;
      message[2 * slot] = static_cast<std::int32_t>(i);
      message[2 * slot + 1] = __float_as_int(acc[i]);
      residual[i] = 0.0f;
    }
    ++rank;
  }
}

__global__ void take_threshold(const float* acc, std::size_t n, unsigned bar, std::int32_t* message,
                               float* residual, std::int32_t* count) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float v = acc[i];
    if (key_of(v) >= bar) {
      const auto slot = static_cast<std::size_t>(atomicAdd(count, 1));
      message[2 * slot] = static_cast<std::int32_t>(i);
      message[2 * slot + 1] = __float_as_int(v);
      residual[i] = 0.0f;
    } else {
      residual[i] = v;
    }
  }
}

__global__ void scatter_add_kernel(const std::int32_t* message, std::size_t count, float* dense,
                                   std::size_t n) {
  for (std::size_t j = first_index(); j < count; j += grid_stride()) {
    const std::int32_t i = message[2 * j];
    if (i >= 0 && static_cast<std::size_t>(i) < n) dense[i] += __int_as_float(message[2 * j + 1]);
  }
}

__global__ void matmul_kernel(const float* a, const float* b, float* c, std::size_t rows,
                              std::size_t inner, std::size_t cols, bool transpose_a) {
  for (std::size_t e = first_index(); e < rows * cols; e += grid_stride()) {
    const std::size_t i = e / cols, j = e % cols;
    float sum = 0.0f;
    for (std::size_t k = 0; k < inner; ++k) {
      const float av = transpose_a ? a[k * rows + i] : a[i * inner + k];
      sum += av * b[k * cols + j];
    }
    c[e] = sum;
  }
}

__global__ void outer_kernel(const float* p, const float* q, float* out, std::size_t rows,
                             std::size_t cols, std::size_t r) {
  for (std::size_t e = first_index(); e < rows * cols; e += grid_stride()) {
    const std::size_t i = e / cols, j = e % cols;
    float sum = 0.0f;
    for (std::size_t c = 0; c < r; ++c) sum += p[i * r + c] * q[j * r + c];
    out[e] = sum;
  }
}

// The sum of every thread's `value` in the block (blockDim.x == kThreads), on every thread.
__device__ float block_sum(float value, float* partial) {
  partial[threadIdx.x] = value;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float total = partial[0];
  __syncthreads();
  return total;
}

// One block: Gram-Schmidt on the r columns of m (rows x r).
__global__ void orthogonalize_kernel(float* m, std::size_t rows, std::size_t r) {
  __shared__ float partial[kThreads];
  for (std::size_t c = 0; c < r; ++c) {
    float own = 0.0f;
    for (std::size_t i = threadIdx.x; i < rows; i += blockDim.x) own += m[i * r + c] * m[i * r + c];
    const float norm = sqrtf(block_sum(own, partial));
    for (std::size_t i = threadIdx.x; i < rows; i += blockDim.x) {
      m[i * r + c] = norm > 0.0f ? m[i * r + c] / norm : 0.0f;
    }
    __syncthreads();
    for (std::size_t d = c + 1; d < r; ++d) {
      float dot = 0.0f;
      for (std::size_t i = threadIdx.x; i < rows; i += blockDim.x)
        dot += m[i * r + c] * m[i * r + d];
      const float total = block_sum(dot, partial);
      for (std::size_t i = threadIdx.x; i < rows; i += blockDim.x)
        m[i * r + d] -= total * m[i * r + c];
      __syncthreads();
    }
  }
}

__global__ void subtract_kernel(const float* a, const float* b, float* out, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) out[i] = a[i] - b[i];
}

__global__ void scale_kernel(float* x, std::size_t n, float factor) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) x[i] *= factor;
}

// Any thread that finds a non-finite entry writes 1 (every writer writes the same value).
__global__ void flag_nonfinite_kernel(const float* x, std::size_t n, std::uint32_t* flag) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    if (!isfinite(x[i])) *flag = 1;
  }
}

__global__ void add_flag_kernel(const std::uint32_t* flag, std::uint32_t* count) {
  *count += *flag;
}

__global__ void zero_if_kernel(const std::uint32_t* flag, float* x, std::size_t n) {
  if (!*flag) return;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) x[i] = 0.0f;
}

__global__ void copy_if_kernel(const std::uint32_t* flag, float* to, const float* from,
                               std::size_t n) {
  if (!*flag) return;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) to[i] = from[i];
}

__global__ void zero_nonfinite_kernel(float* x, std::size_t n, std::uint32_t* found) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    if (!isfinite(x[i])) {
      x[i] = 0.0f;
      *found = 1;
    }
  }
}

}  // namespace

void widen_add(const void* flat, FloatType type, const float* residual, float* acc, std::size_t n,
               Stream stream) {
  with_type(type, [&](auto zero) {
    using T = decltype(zero);
    widen_add_kernel<T>
        <<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(flat), residual, acc, n);
  });
  check("widen_add");
}

void narrow(const float* src, void* flat, FloatType type, std::size_t n, Stream stream) {
  with_type(type, [&](auto zero) {
    using T = decltype(zero);
    narrow_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(src, static_cast<T*>(flat), n);
  });
  check("narrow");
}

void encode16(const float* acc, void* wire, FloatType wire_type, float scale, float* residual,
              std::size_t n, Stream stream) {
  with_type(wire_type, [&](auto zero) {
    using T = decltype(zero);
    encode_kernel<T>
        <<<blocks_for(n), kThreads, 0, stream>>>(acc, static_cast<T*>(wire), scale, residual, n);
  });
  check("encode16");
}

void decode16(const void* wire, FloatType wire_type, float* out, std::size_t n, Stream stream) {
  with_type(wire_type, [&](auto zero) {
    using T = decltype(zero);
    decode_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(wire), out, n);
  });
  check("decode16");
}

void sum_ranks(const void* gathered, int ranks, FloatType type, std::size_t n, float* out,
               Stream stream) {
  with_type(type, [&](auto zero) {
    using T = decltype(zero);
    sum_ranks_kernel<T>
        <<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(gathered), ranks, n, out);
  });
  check("sum_ranks");
}

std::size_t topk_scratch_bytes(std::size_t n) {
  return kTilesOffset + ((n + kTile - 1) / kTile + 1) * sizeof(unsigned);
}

void select_topk(const float* acc, std::size_t n, std::size_t k, std::int32_t* message,
                 float* residual, void* scratch, Stream stream) {
  auto* bytes = static_cast<unsigned char*>(scratch);
  auto* state = reinterpret_cast<SelectState*>(bytes);
  auto* histogram = reinterpret_cast<unsigned*>(bytes + kHistogramOffset);
  auto* tiles = reinterpret_cast<unsigned*>(bytes + kTilesOffset);
  const std::size_t tile_count = (n + kTile - 1) / kTile;
  select_start<<<1, kThreads, 0, stream>>>(state, histogram, static_cast<unsigned>(k));
  for (int shift = 24; shift >= 0; shift -= 8) {
    radix_histogram<<<blocks_for(n), kThreads, 0, stream>>>(acc, n, state, histogram, shift);
    radix_choose<<<1, 1, 0, stream>>>(state, histogram, shift);
  }
  take_greater<<<blocks_for(n), kThreads, 0, stream>>>(acc, n, state, message, residual);
  if (tile_count > 0) {
    const auto grid = static_cast<unsigned>(tile_count);
    count_ties<<<grid, kThreads, 0, stream>>>(acc, n, state, tiles);
    scan_tiles<<<1, 1, 0, stream>>>(tiles, tile_count);
    take_ties<<<grid, kThreads, 0, stream>>>(acc, n, state, tiles, k, message, residual);
  }
  check("select_topk");
}

void select_threshold(const float* acc, std::size_t n, float t, std::int32_t* message,
                      float* residual, std::int32_t* count, Stream stream) {
  check(cudaMemsetAsync(count, 0, sizeof(std::int32_t), stream), "cudaMemsetAsync");
  unsigned bar = 0;
  static_assert(sizeof bar == sizeof t);
  std::memcpy(&bar, &t, sizeof bar);
  take_threshold<<<blocks_for(n), kThreads, 0, stream>>>(acc, n, bar & 0x7FFFFFFFu, message,
                                                         residual, count);
  check("select_threshold");
}

void scatter_add(const std::int32_t* message, std::size_t count, float* dense, std::size_t n,
                 Stream stream) {
  if (count == 0) return;
  scatter_add_kernel<<<blocks_for(count), kThreads, 0, stream>>>(message, count, dense, n);
  check("scatter_add");
}

void matmul(const float* a, const float* b, float* c, std::size_t rows, std::size_t inner,
            std::size_t cols, bool transpose_a, Stream stream) {
  matmul_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(a, b, c, rows, inner, cols,
                                                                  transpose_a);
  check("matmul");
}

void outer(const float* p, const float* q, float* out, std::size_t rows, std::size_t cols,
           std::size_t r, Stream stream) {
  outer_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(p, q, out, rows, cols, r);
  check("outer");
}

void orthogonalize(float* m, std::size_t rows, std::size_t r, Stream stream) {
  orthogonalize_kernel<<<1, kThreads, 0, stream>>>(m, rows, r);
  check("orthogonalize");
}

void subtract(const float* a, const float* b, float* out, std::size_t n, Stream stream) {
  subtract_kernel<<<blocks_for(n), kThreads, 0, stream>>>(a, b, out, n);
  check("subtract");
}

void scale(float* x, std::size_t n, float factor, Stream stream) {
  scale_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, factor);
  check("scale");
}

void flag_nonfinite(const float* x, std::size_t n, std::uint32_t* flag, std::uint32_t* count,
                    Stream stream) {
  check(cudaMemsetAsync(flag, 0, sizeof *flag, stream), "flag_nonfinite");
  if (n > 0) flag_nonfinite_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, flag);
  add_flag_kernel<<<1, 1, 0, stream>>>(flag, count);
  check("flag_nonfinite");
}

void zero_if(const std::uint32_t* flag, float* x, std::size_t n, Stream stream) {
  if (n == 0) return;
  zero_if_kernel<<<blocks_for(n), kThreads, 0, stream>>>(flag, x, n);
  check("zero_if");
}

void copy_if(const std::uint32_t* flag, float* to, const float* from, std::size_t n,
             Stream stream) {
  if (n == 0) return;
  copy_if_kernel<<<blocks_for(n), kThreads, 0, stream>>>(flag, to, from, n);
  check("copy_if");
}

void zero_nonfinite(float* x, std::size_t n, std::uint32_t* count, std::uint32_t* scratch,
                    Stream stream) {
  check(cudaMemsetAsync(scratch, 0, sizeof *scratch, stream), "zero_nonfinite");
  if (n > 0) zero_nonfinite_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, scratch);
  add_flag_kernel<<<1, 1, 0, stream>>>(scratch, count);
  check("zero_nonfinite");
}

}  // namespace dist::sdk::detail::kernels
