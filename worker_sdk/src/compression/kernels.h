// The CUDA kernels of gradient compression on the device (kernels.cu, compiled by nvcc as
// C++17), callable from host C++ without CUDA's headers. Each function enqueues on `stream` and
// returns at once; it throws std::runtime_error when a launch fails. The semantics are those of
// the same operations in ops.h (the host's loops are the reference).
#pragma once

#include <cstddef>
#include <cstdint>

struct CUstream_st;

namespace dist::sdk::detail::kernels {

using Stream = ::CUstream_st*;

enum class FloatType { kFloat32, kFloat16, kBFloat16 };

void widen_add(const void* flat, FloatType type, const float* residual, float* acc, std::size_t n,
               Stream stream);
void narrow(const float* src, void* flat, FloatType type, std::size_t n, Stream stream);
void encode16(const float* acc, void* wire, FloatType wire_type, float scale, float* residual,
              std::size_t n, Stream stream);
void decode16(const void* wire, FloatType wire_type, float* out, std::size_t n, Stream stream);
// out[i] = sum over r < ranks, in order, of gathered[r * n + i].
void sum_ranks(const void* gathered, int ranks, FloatType type, std::size_t n, float* out,
               Stream stream);

// Top-k by a radix select of the k-th largest magnitude (four 8-bit passes), then the entries
// above it (in any order) and the first ties by index. `scratch` holds topk_scratch_bytes(n).
std::size_t topk_scratch_bytes(std::size_t n);
void select_topk(const float* acc, std::size_t n, std::size_t k, std::int32_t* message,
                 float* residual, void* scratch, Stream stream);
void select_threshold(const float* acc, std::size_t n, float t, std::int32_t* message,
                      float* residual, std::int32_t* count, Stream stream);
// dense[message[2j]] += value of message[2j + 1] for j < count (the indices of one rank's message
// are distinct, so no two threads add to one entry).
void scatter_add(const std::int32_t* message, std::size_t count, float* dense, std::size_t n,
                 Stream stream);

void matmul(const float* a, const float* b, float* c, std::size_t rows, std::size_t inner,
            std::size_t cols, bool transpose_a, Stream stream);
void outer(const float* p, const float* q, float* out, std::size_t rows, std::size_t cols,
           std::size_t r, Stream stream);
void orthogonalize(float* m, std::size_t rows, std::size_t r, Stream stream);
void subtract(const float* a, const float* b, float* out, std::size_t n, Stream stream);
void scale(float* x, std::size_t n, float factor, Stream stream);
// As Ops' (ops.h); `scratch` is one std::uint32_t of device memory.
void flag_nonfinite(const float* x, std::size_t n, std::uint32_t* flag, std::uint32_t* count,
                    Stream stream);
void zero_if(const std::uint32_t* flag, float* x, std::size_t n, Stream stream);
void copy_if(const std::uint32_t* flag, float* to, const float* from, std::size_t n, Stream stream);
void zero_nonfinite(float* x, std::size_t n, std::uint32_t* count, std::uint32_t* scratch,
                    Stream stream);

}  // namespace dist::sdk::detail::kernels
