// The lossy exchanges of one DDP bucket (compression.h): each replaces the bucket's gradients by
// an approximation of their average over the ranks, keeping what it did not send in a residual
// that joins the next step's gradients (error feedback). Written against Ops, so the same code
// runs on the host (Gloo) and on the device (NCCL). Where compressing costs more than it saves
// (a sparse mode at a large world size) or has not begun (PowerSGD's warm-up), an exchange
// averages the bucket whole, in float32, and empties the residual.
//
// An inf or NaN gradient (one rank's overflow, a bad batch) must not ruin training for good: the
// residual would carry it into every later step, and PowerSGD's reused Q too. After each exchange
// the average (the same on every rank) is checked: when it holds an inf or NaN, the bucket's update
// is skipped (its averaged gradients are zeros) and its residual and PowerSGD's Q are reset, on
// every rank alike, without a collective more; and a residual that took an inf or NaN only this
// rank held (a sparse mode that did not send it) is cleaned here. Saved and loaded states are
// never poisoned either. On the device the checks are kernels: no wait, no host copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "compression/ops.h"
#include "dist/sdk/compression.h"

namespace dist::sdk::detail {

// Where a bucket's parameters sit in it.
struct BucketLayout {
  struct Tensor {
    std::size_t offset = 0;  // elements into the bucket
    std::size_t count = 0;
    std::size_t rows = 0;  // as a matrix: rows x count / rows; 0: one-dimensional
  };
  DataType type = DataType::kFloat32;  // of the bucket's elements
  std::size_t elements = 0;
  std::vector<Tensor> tensors;
};

class BucketCompressor {
 public:
  virtual ~BucketCompressor() = default;
  // flat (layout.type, in the Ops' memory): this rank's gradients in, the approximate average out.
  // Runs inside an Ops job (Ops::post).
  virtual void exchange(void* flat) = 0;
  // An exchange whose communication is one sum (Ops::all_sum: fp16, bf16) may also run in three
  // steps, for a caller that runs that collective itself, asynchronously on a thread of its own
  // (torch's process group: dist_launch.compression's hooks): begin() encodes flat and returns
  // the collective to run, finish() makes the average in flat once it completed. exchange() is
  // the same three in a row. The others do not split (std::logic_error).
  virtual bool splits() const { return false; }
  virtual Ops::Sum begin(void* /*flat*/) { throw std::logic_error("this exchange does not split"); }
  virtual void finish(void* /*flat*/) { throw std::logic_error("this exchange does not split"); }
  // The state a restart needs (residual, fp16's scale, PowerSGD's Q), appended to `out` in
  // kStateFormat; load() reads what save() wrote in `format` (kStateFormat, or an earlier one)
  // from the front of `in` and advances it (std::invalid_argument when it does not fit this
  // bucket).
  virtual void save(std::string& out) const = 0;
  virtual void load(std::string_view& in, int format) = 0;
  // The residual alone (layout.elements floats in host memory), for a caller that moves it
  // between layouts of the same parameters (torch's DDP rebuilds its buckets); set_residual()
  // drops an inf or NaN in it, as load() does.
  virtual void residual(float* out) const = 0;
  virtual void set_residual(const float* in) = 0;
  // The job's steps before this compressor was made (a caller whose buckets change: torch's DDP
  // rebuilds them after its first step, a resumed job makes them again): a warm-up counted in
  // steps (PowerSGD's) goes on from there, as torch's start_powerSGD_iter counts its iterations.
  virtual void steps_before(std::uint64_t /*steps*/) {}

  // What the exchanges did besides compressing (call between steps: on the device it waits for
  // them).
  struct Events {
    std::uint64_t skipped = 0;  // exchanges whose average held inf or NaN: zeroed, state reset
    std::uint64_t cleaned = 0;  // this rank's residual cleaned of inf or NaN it alone held
    std::uint64_t dense = 0;    // exchanges that averaged the bucket whole (compression.h)
  };
  virtual Events events() const = 0;
  // Every exchange averages the bucket whole (top-k where k x world >= its size).
  virtual bool always_dense() const { return false; }
};

// The format of save(); 1 is the one before fp16 kept a scale (loaded with the scale at 1).
constexpr int kStateFormat = 2;

// `compression` must be lossy. `index` (the bucket's) seeds PowerSGD's first Q.
std::unique_ptr<BucketCompressor> make_compressor(const Compression& compression, Ops& ops,
                                                  const BucketLayout& layout, std::size_t index);
// Whether make_compressor's compressors for `compression` split their exchange
// (BucketCompressor::splits).
bool exchange_splits(const Compression& compression);

// PowerSGD's split of a bucket: which tensors it compresses (rank r = min(rows, cols, RANK), worth
// it when (rows + cols) r 2 < rows cols, as torch's min_compression_rate 2) and which it sends
// whole.
struct PowerSgdPlan {
  struct Matrix {
    std::size_t offset, rows, cols, rank, p_offset, q_offset;
  };
  std::vector<Matrix> matrices;
  std::vector<BucketLayout::Tensor> uncompressed;
  std::size_t p_size = 0, q_size = 0, uncompressed_size = 0;
};
PowerSgdPlan plan_powersgd(const BucketLayout& layout, int rank);

// Serialisation helpers of DDP's state (little-endian host layout, as the checkpoints).
void put_u64(std::string& out, std::uint64_t v);
std::uint64_t take_u64(std::string_view& in);
void put_floats(std::string& out, Ops& ops, const float* buffer, std::size_t n);
void take_floats(std::string_view& in, Ops& ops, float* buffer, std::size_t n);

}  // namespace dist::sdk::detail
