// Data-parallel training in the manner of PyTorch's DistributedDataParallel, for models whose
// parameters and gradients are float32, float16 or bfloat16 buffers.
//
//   DistributedDataParallel ddp(group, {{"w2", w2, dw2}, {"b2", b2, db2}, ...});  // broadcasts
//   rank 0's
//   ... backward: as each gradient is final, ddp.grad_ready(i): its bucket's all-reduce starts
//       at once and overlaps the rest of the backward pass
//   ddp.synchronize();   // every gradient is now the average over all ranks
//   optimizer step
//   ddp.after_step();    // local-sgd and partial: parameters averaged (else nothing)
//
// Buckets hold parameters in reverse registration order (the order a backward pass produces them):
// the first up to first_bucket_cap_bytes, the others up to bucket_cap_bytes; a parameter of
// another element type than the bucket's opens a new one. Buckets are reduced in index order on
// every rank, whatever order gradients become ready in.
//
// DdpOptions::compression and ::sync (compression.h) make DDP send fewer bytes: a lossy
// compression replaces each bucket's all-reduce by its exchange (fp16, top-k, PowerSGD...), which
// starts as the bucket is ready, on a thread of DDP's own (host buffers) or on a stream of its own
// (device buffers), so it overlaps the backward pass as the plain all-reduce does. Between the
// first grad_ready() of a pass and synchronize(), issue no other collective on the group. state()
// and load_state() carry what a restart needs (residuals, PowerSGD's Q, the step counter):
// save them in the checkpoint of every rank, as they differ between ranks.
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
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dist/sdk/compression.h"
#include "dist/sdk/process_group.h"

namespace dist::sdk {

namespace detail {
class BucketMemory;
class BucketCompressor;
class Ops;
}  // namespace detail

// Host memory, or device memory with a group whose device_buffers() is true. `shape` matters to
// PowerSGD only, which sees a parameter as a shape[0] x (the rest) matrix; empty: one dimension.
struct Parameter {
  Parameter(std::string name, std::span<float> value, std::span<float> grad,
            std::vector<std::size_t> shape = {});
  Parameter(std::string name, std::span<Half> value, std::span<Half> grad,
            std::vector<std::size_t> shape = {});
  Parameter(std::string name, std::span<BFloat16> value, std::span<BFloat16> grad,
            std::vector<std::size_t> shape = {});

  std::string name;
  void* value = nullptr;
  void* grad = nullptr;
  std::size_t count = 0;       // elements of value
  std::size_t grad_count = 0;  // must equal count
  DataType type = DataType::kFloat32;
  std::vector<std::size_t> shape;
};

struct DdpOptions {
  std::size_t bucket_cap_bytes = 25 * 1024 * 1024;
  std::size_t first_bucket_cap_bytes = 1024 * 1024;
  // Device buffers: the stream the backward pass writes gradients on (see above).
  CudaStream stream = nullptr;
  Compression compression;  // of the gradients; lossy ones need sync every-step
  SyncStrategy sync;
};

// What DDP sent: bytes this rank put on the wire by the ring algorithms of Gloo and NCCL (2 (n-1)/n
// of each all-reduce's buffer, n-1 times each all-gather's input), over `steps` synchronize()
// calls (after_step()'s averaging included).
struct CommunicationStats {
  std::uint64_t steps = 0;
  std::uint64_t bytes_sent = 0;
  // Lossy compression's inf/NaN guard (compression.h): bucket updates skipped because their
  // average held an inf or NaN (their gradients zeroed, residual and PowerSGD's Q reset on every
  // rank), and residuals of this rank cleaned of an inf or NaN only it held.
  std::uint64_t nonfinite_skipped = 0;
  std::uint64_t nonfinite_cleaned = 0;
  // Bucket exchanges that averaged the bucket whole (compression.h): a sparse mode where dense
  // costs less at this world size, PowerSGD's warm-up.
  std::uint64_t dense_exchanges = 0;
  // What the group's transport counted instead of the formulas (ProcessGroup::
  // transport_bytes_sent(): Gloo's TCP payload, its framing included), since the DDP was built
  // (its first broadcast not counted), collectives the program ran on the same group between
  // included; counted as the kernel transmits, so a step's last bytes may count in the next;
  // nullopt where the backend cannot tell (NCCL).
  std::optional<std::uint64_t> transport_bytes_sent;
  std::uint64_t bytes_per_step() const { return steps ? bytes_sent / steps : 0; }
  std::optional<std::uint64_t> transport_bytes_per_step() const {
    if (!transport_bytes_sent || steps == 0) return std::nullopt;
    return *transport_bytes_sent / steps;
  }
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
  // Parameters never marked ready are reduced with the gradient they hold. With a local sync
  // strategy, gradients stay as they are.
  void synchronize();
  // After the optimizer step: local-sgd:K averages every parameter each K-th call; partial:CHUNKS
  // averages one slice of them; every-step does nothing. Counts a step for dist-launch's hang and
  // straggler detection either way (dist/sdk/progress.h).
  void after_step();
  // Every parameter becomes the average over the ranks (local strategies: at the end of training,
  // so that every rank holds the same model).
  void average_parameters();

  // The state a restart needs to continue bit-identically: the compression and sync specs, the
  // step counter of the sync strategy, each bucket's residual, PowerSGD's Q and its warm-up count.
  // Rank-specific; every rank must load the state it saved at the same step as the others (a
  // warm-up count that differs between ranks would have them run different collectives).
  // Call between steps.
  std::string state() const;
  // What state() returned, on the same rank of a job with the same model, world size, compression
  // and sync; std::invalid_argument saying what differs otherwise.
  void load_state(std::string_view state);
  // Totals since construction (call between steps; on the device it waits for the exchanges).
  CommunicationStats stats() const;

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
    DataType type = DataType::kFloat32;
    std::byte* flat = nullptr;  // in memory_
    std::size_t pending = 0;    // parameters not yet ready in this pass
    bool launched = false;
    Work work;
  };
  void build_buckets(const DdpOptions& options);
  void check_same_buckets_on_every_rank();
  void launch_ready_buckets();
  void launch(std::size_t bucket);
  void copy_in(const Bucket& b, bool values);   // parameters (values or grads) into the bucket
  void copy_out(const Bucket& b, bool values);  // and back
  // Averages slice `chunk` of `chunks` equal slices of every bucket's parameter values.
  void average_values(std::uint64_t chunk, std::uint64_t chunks);
  void reset_pass();
  void say_skipped_updates();
  void warn_powersgd_compresses_nothing() const;
  void say_dense_buckets() const;

  ProcessGroup& group_;
  DdpOptions options_;
  std::unique_ptr<detail::BucketMemory> memory_;
  std::vector<Parameter> params_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;  // parameter index -> bucket
  std::vector<bool> ready_;
  std::size_t next_launch_ = 0;
  bool sync_enabled_ = true;
  // Lossy compression and local strategies: the exchanges' operations; lossy compression: one
  // compressor per bucket.
  std::unique_ptr<detail::Ops> ops_;
  std::vector<std::unique_ptr<detail::BucketCompressor>> compressors_;
  std::vector<float*> sums_;  // average_values(): each bucket's float sums, in ops_

  std::uint64_t local_steps_ = 0;   // after_step() calls (local strategies)
  std::uint64_t plain_bytes_ = 0;   // sent outside ops_
  std::uint64_t skipped_said_ = 0;  // nonfinite_skipped when last told on stderr (host buffers)
  std::optional<std::uint64_t> transport_start_;  // the group's transport count once built
  CommunicationStats stats_;
};

}  // namespace dist::sdk
