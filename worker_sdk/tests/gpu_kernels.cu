#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "gpu_kernels.h"

namespace dist::sdk::testing {
namespace {

constexpr unsigned kSpinSleepNs = 1000;
constexpr int kThreads = 256;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

__global__ void wait_for_flag(const volatile int* flag) {
  while (*flag == 0) __nanosleep(kSpinSleepNs);
}

__device__ unsigned long long global_timer_ns() {
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

__global__ void busy_kernel(unsigned long long nanoseconds) {
  const unsigned long long until = global_timer_ns() + nanoseconds;
  while (global_timer_ns() < until) __nanosleep(kSpinSleepNs);
}

__global__ void fill_kernel(float* data, std::size_t count, float value) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < count) data[i] = value;
}

}  // namespace

Gate::Gate() {
  void* memory = nullptr;
  check(cudaHostAlloc(&memory, sizeof(int), cudaHostAllocMapped), "cudaHostAlloc (gate)");
  flag_ = static_cast<volatile int*>(memory);
  *flag_ = 0;
}

Gate::~Gate() {
  open();
  cudaDeviceSynchronize();
  cudaFreeHost(const_cast<int*>(flag_));
}

void Gate::hold(CudaStream stream) {
  wait_for_flag<<<1, 1, 0, stream>>>(flag_);
  check(cudaGetLastError(), "launching the gate");
}

void Gate::open() {
  __atomic_store_n(const_cast<int*>(flag_), 1, __ATOMIC_SEQ_CST);
}

void busy(CudaStream stream, unsigned long long nanoseconds) {
  busy_kernel<<<1, 1, 0, stream>>>(nanoseconds);
  check(cudaGetLastError(), "launching busy");
}

void fill(float* data, std::size_t count, float value, CudaStream stream) {
  const auto blocks = static_cast<unsigned>((count + kThreads - 1) / kThreads);
  fill_kernel<<<blocks, kThreads, 0, stream>>>(data, count, value);
  check(cudaGetLastError(), "launching fill");
}

}  // namespace dist::sdk::testing
