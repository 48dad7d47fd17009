// The CUDA device the SDK's GPU code runs on, whatever device the calling thread has current
// (built with the NCCL backend only).
#pragma once

namespace dist::sdk::detail {

// True when `device` has an active primary context (cuDevicePrimaryCtxGetState, reached through
// the runtime: no link to the driver library); true as well when that cannot be told.
bool has_primary_context(int device);

// Makes `device` current for a scope. The previous device is given back only when it has a
// context already: a fresh thread's "previous device" is 0, and making it current again would
// create a context there (about 0.5 GB of GPU 0 per process since CUDA 12), as torch's
// MaybeSetDevice avoids; `device` stays current instead.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace dist::sdk::detail
