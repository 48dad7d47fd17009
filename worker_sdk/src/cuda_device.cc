#include "cuda_device.h"

#include <cuda_runtime_api.h>

#include <utility>

namespace dist::sdk::detail {
namespace {

// The two driver functions, as the runtime hands them out (CUresult, CUdevice are ints).
using DeviceGet = int (*)(int* device, int ordinal);
using PrimaryCtxGetState = int (*)(int device, unsigned int* flags, int* active);

template <typename F>
F driver_function(const char* name) {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &function, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  return reinterpret_cast<F>(function);
}

}  // namespace

bool has_primary_context(int device) {
  static const auto functions =
      std::make_pair(driver_function<DeviceGet>("cuDeviceGet"),
                     driver_function<PrimaryCtxGetState>("cuDevicePrimaryCtxGetState"));
  if (!functions.first || !functions.second) return true;
  int handle = 0;
  unsigned int flags = 0;
  int active = 0;
  if (functions.first(&handle, device) != 0 || functions.second(handle, &flags, &active) != 0) {
    return true;
  }
  return active != 0;
}

DeviceGuard::DeviceGuard(int device) {
  if (cudaGetDevice(&previous_) != cudaSuccess || previous_ == device) {
    previous_ = -1;
    return;
  }
  if (cudaSetDevice(device) != cudaSuccess) previous_ = -1;  // what follows reports the error
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0 && has_primary_context(previous_)) cudaSetDevice(previous_);
}

}  // namespace dist::sdk::detail
