// Kernels of the GPU tests (gpu_kernels.cu, compiled by nvcc as C++17), callable from host C++.
#pragma once

#include <cstddef>

struct CUstream_st;

namespace dist::sdk::testing {

using CudaStream = ::CUstream_st*;  // cudaStream_t, as in process_group.h

// A gate in mapped host memory: kernels behind it on a stream cannot run until the host opens
// it, so whatever must wait for them is shown to wait, whatever the timing.
class Gate {
 public:
  Gate();
  ~Gate();  // opens the gate first: no kernel is left spinning
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;
  // Enqueues a kernel that spins until open() on `stream`.
  void hold(CudaStream stream);
  void open();

 private:
  volatile int* flag_ = nullptr;
};

// A kernel on `stream` that runs for `nanoseconds` (the GPU's global timer) and does nothing else:
// a step's compute of a known length.
void busy(CudaStream stream, unsigned long long nanoseconds);

// data[0, count) = value, on `stream`.
void fill(float* data, std::size_t count, float value, CudaStream stream);

}  // namespace dist::sdk::testing
