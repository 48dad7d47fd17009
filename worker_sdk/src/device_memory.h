// Where DDP keeps its buckets and how it moves data in and out of them: host memory with plain
// copies (Gloo), or device memory with copies ordered on the caller's CUDA stream (NCCL), so
// that bucketing, the collectives and the write-back all follow the backward pass's kernels
// without the host waiting.
#pragma once

#include <cstddef>
#include <memory>

#include "dist/sdk/process_group.h"

namespace dist::sdk::detail {

class BucketMemory {
 public:
  virtual ~BucketMemory() = default;
  static std::unique_ptr<BucketMemory> host();
  // Memory of CUDA device `device` (the group's), whatever device the calling thread has current;
  // CollectiveError in a build without CUDA.
  static std::unique_ptr<BucketMemory> device(CudaStream stream, int device);

  // Zeroed `bytes`, owned by this object.
  virtual void* allocate(std::size_t bytes) = 0;
  // Either side may be host memory; device copies run in order on stream().
  virtual void copy(void* to, const void* from, std::size_t bytes) = 0;
  // Host memory written by copy() holds its data once this returns.
  virtual void synchronize() = 0;
  // Later copies see the collective's result.
  virtual void complete(const Work& work) = 0;
  virtual CudaStream stream() const = 0;

  // A step's own work, the agent's straggler measure (detail::add_work): from step_began()
  // (after the last step's optimizer) to step_ended() (where the step starts waiting for its
  // peers). Host: the host's clock. Device: the time stream() took between the two, from CUDA
  // timing events read once they completed (never waited for): the GPU's time, which the host,
  // launching kernels ahead of it, does not see. A step's measure may arrive a few steps late.
  // (Not the GPU's alone where the host itself waits for peers inside the span: threshold
  // compression over device buffers reads its counts to the host in grad_ready(), and the
  // stream runs dry meanwhile, as the host's clock counted that wait too.)
  virtual void step_began() = 0;
  virtual void step_ended() = 0;
};

}  // namespace dist::sdk::detail
