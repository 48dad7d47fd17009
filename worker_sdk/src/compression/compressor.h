// The lossy exchanges of one DDP bucket (compression.h): each replaces the bucket's gradients by
// an approximation of their average over the ranks, keeping what it did not send in a residual
// that joins the next step's gradients (error feedback). Written against Ops, so the same code
// runs on the host (Gloo) and on the device (NCCL).
#pragma once

#include <cstddef>
#include <memory>
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
  // The state a restart needs (residual, PowerSGD's Q), appended to `out`; load() reads what
  // save() wrote from the front of `in` and advances it (std::invalid_argument when it does not
  // fit this bucket).
  virtual void save(std::string& out) const = 0;
  virtual void load(std::string_view& in) = 0;
};

// `compression` must be lossy. `index` (the bucket's) seeds PowerSGD's first Q.
std::unique_ptr<BucketCompressor> make_compressor(const Compression& compression, Ops& ops,
                                                  const BucketLayout& layout, std::size_t index);

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
