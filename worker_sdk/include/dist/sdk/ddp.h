// Data-parallel training in the manner of PyTorch's DistributedDataParallel, for models whose
// parameters and gradients are float buffers.
//
//   DistributedDataParallel ddp(group, {{"w2", w2, dw2}, {"b2", b2, db2}, ...});  // broadcasts
//   rank 0's
//   ... backward: as each gradient is final, ddp.grad_ready(i): its bucket's all-reduce starts
//       at once and overlaps the rest of the backward pass
//   ddp.synchronize();   // every gradient is now the average over all ranks
//   optimizer step
//
// Buckets hold parameters in reverse registration order (the order a backward pass produces them):
// the first up to first_bucket_cap_bytes, the others up to bucket_cap_bytes. Buckets are reduced in
// index order on every rank, whatever order gradients become ready in.
//
// With a group whose buffers live on the device (NCCL), parameters and gradients are device
// memory and the buckets are too. Everything DDP does is enqueued on DdpOptions::stream, the
// stream the backward pass writes gradients on: a bucket's copy-in follows the kernels that
// produced its gradients, its all-reduce runs on the group's own stream while the backward pass
// goes on, and synchronize() makes `stream` wait for the all-reduces and enqueues the write-back,
// without blocking the host. Kernels enqueued on `stream` afterwards (the optimizer step) see the
// averaged gradients.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dist/sdk/process_group.h"

namespace dist::sdk {

namespace detail {
class BucketMemory;
}

// Host memory, or device memory with a group whose device_buffers() is true.
struct Parameter {
  std::string name;
  std::span<float> value;
  std::span<float> grad;  // same size as value
};

struct DdpOptions {
  std::size_t bucket_cap_bytes = 25 * 1024 * 1024;
  std::size_t first_bucket_cap_bytes = 1024 * 1024;
  // Device buffers: the stream the backward pass writes gradients on (see above).
  CudaStream stream = nullptr;
};

class DistributedDataParallel {
 public:
  // Broadcasts every parameter from rank 0, and checks that all ranks built the same buckets
  // (std::runtime_error naming the first rank that differs).
  DistributedDataParallel(ProcessGroup& group, std::vector<Parameter> parameters,
                          DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Parameter `index` (registration order) has its final gradient for this backward pass.
  void grad_ready(std::size_t index);
  // Launches what is left, waits for every bucket and writes the averaged gradients back (device
  // buffers: enqueues the wait and the write-back on DdpOptions::stream).
  // Parameters never marked ready are reduced with the gradient they hold.
  void synchronize();

  // While a NoSync lives, gradients are not communicated: they accumulate locally (do not zero
  // them), and the first synchronize() after it reduces the accumulated sum's average.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(ddp) { ddp_.sync_enabled_ = false; }
    ~NoSync() { ddp_.sync_enabled_ = true; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  // Parameter indices of each bucket, in bucket order (for tests and diagnostics).
  std::vector<std::vector<std::size_t>> bucket_layout() const;

 private:
  struct Bucket {
    std::vector<std::size_t> params;
    std::vector<std::size_t> offsets;  // of each parameter in `flat`
    std::size_t elements = 0;
    float* flat = nullptr;    // in memory_
    std::size_t pending = 0;  // parameters not yet ready in this pass
    bool launched = false;
    Work work;
  };
  void check_same_buckets_on_every_rank();
  void launch_ready_buckets();
  void copy_in(const Bucket& b, bool values);   // parameters (values or grads) into the bucket
  void copy_out(const Bucket& b, bool values);  // and back
  void reset_pass();

  ProcessGroup& group_;
  std::unique_ptr<detail::BucketMemory> memory_;
  std::vector<Parameter> params_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;  // parameter index -> bucket
  std::vector<bool> ready_;
  std::size_t next_launch_ = 0;
  bool sync_enabled_ = true;
};

}  // namespace dist::sdk
