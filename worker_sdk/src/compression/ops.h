// What the compressors (compressor.h) run on: memory, collectives and the element-wise and
// small linear-algebra operations of gradient compression, on the host (Gloo: plain loops, the
// exchange on a thread of DDP's own) or on the device (NCCL: CUDA kernels and collectives
// ordered on a side stream). A compressor is written once against this interface.
//
// Everything an Ops does completes in the order it was called, as seen by the next call: on the
// host because each call returns complete; on the device because everything runs in order on
// the exchange stream. Only to_host() (and what returns a host value) waits on the device.
//
// Float buffers are row-major matrices where a shape is given. Messages of sparse entries are
// pairs of 32-bit words: (index, bits of the float value).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "dist/sdk/process_group.h"

namespace dist::sdk::detail {

class Ops {
 public:
  virtual ~Ops() = default;

  // The exchange of a bucket: `job` runs after the buckets posted before it (host: on the
  // exchange thread, so it overlaps the backward pass; device: now, enqueueing on the exchange
  // stream, which first waits for what the caller's stream did until this call).
  virtual void post(std::function<void()> job) = 0;
  // Every posted job has completed (device: the caller's stream waits for them); rethrows the
  // first job's exception (host).
  virtual void drain() = 0;

  // Zeroed memory owned by this object, where the collectives' buffers live.
  virtual void* allocate(std::size_t bytes) = 0;
  float* allocate_floats(std::size_t n) { return static_cast<float*>(allocate(n * sizeof(float))); }
  // Between buffers of this Ops (device to device on the device).
  virtual void copy(void* to, const void* from, std::size_t bytes) = 0;
  // A buffer's bytes all zero.
  virtual void zero(void* x, std::size_t bytes) = 0;
  // From host memory into a buffer, and from a buffer into host memory (complete on return).
  virtual void from_host(void* to, const void* host, std::size_t bytes) = 0;
  virtual void to_host(void* host, const void* from, std::size_t bytes) = 0;

  // Collectives on the group, counted in bytes_sent() (what this rank sends by the ring
  // algorithms Gloo and NCCL use: 2 (n-1)/n of the buffer for an all-reduce, n-1 times its input
  // for an all-gather).
  void all_reduce(void* data, std::size_t count, DataType type, ReduceOp op);
  void all_gather(const void* input, void* output, std::size_t count, DataType type);
  // out[i] = the sum over ranks of input[i] in input's type (input: float32, float16 or
  // bfloat16, overwritten; out may be input when it is float32). Two ranks and up to
  // kGatherBytes, an all-gather and the sum here: as many bytes as a ring all-reduce, in one
  // exchange instead of two (latency), the sum rounded to input's type as the all-reduce's is,
  // so that a parameter's average does not depend on the size of its bucket (a job resumed in
  // DDP's first layout, one bucket, trains on as the rebuilt layout's small ones did). Otherwise
  // Gloo's or NCCL's all-reduce in the input's type: its ring pipelines large messages (on a
  // 100 Mbit/s link, 150 KB of fp16 for two ranks: 18 ms a step against 21 ms as an all-gather),
  // and from three ranks on an all-gather sends more ((W - 1) n against 2 (W - 1) / W n: at four
  // ranks as much as float32's all-reduce, at eight twice as much).
  void all_sum(void* input, DataType type, std::size_t count, float* out);
  static constexpr std::size_t kGatherBytes = 64 * 1024;
  // all_sum in halves, for a caller that runs the collective itself (torch's, asynchronously:
  // dist_launch.compression): plan_sum() says which one all_sum would run over `input` (counted in
  // bytes_sent() as if run), run_sum() runs it here, and once it completed finish_sum() makes
  // `out` of its result. all_sum() is the three in a row.
  struct Sum {
    void* input = nullptr;
    void* gathered = nullptr;  // an all-gather of input into here (world x count); null: an
                               // all-reduce (sum) of input in place
    std::size_t count = 0;     // elements; 0: nothing to run
    DataType type = DataType::kFloat32;
  };
  Sum plan_sum(void* input, DataType type, std::size_t count);
  void run_sum(const Sum& sum);
  void finish_sum(const Sum& sum, float* out);
  std::uint64_t bytes_sent() const { return bytes_sent_; }
  void count_bytes(std::uint64_t bytes) { bytes_sent_ += bytes; }
  int world() const { return group_.size(); }
  ProcessGroup& group() const { return group_; }

  // acc[i] = float(flat[i]) + residual[i] (flat of type `type`: float32, float16 or bfloat16).
  virtual void widen_add(const void* flat, DataType type, const float* residual, float* acc,
                         std::size_t n) = 0;
  // flat[i] = type(src[i]), rounded to nearest even.
  virtual void narrow(const float* src, void* flat, DataType type, std::size_t n) = 0;
  // wire[i] = wire_type(acc[i] * scale) (float16 or bfloat16); residual[i] = acc[i] -
  // float(wire[i]) / scale: what the cast lost.
  virtual void encode16(const float* acc, void* wire, DataType wire_type, float scale,
                        float* residual, std::size_t n) = 0;
  // widen_add then encode16 (acc is scratch: what it holds after is unspecified), in one pass
  // where the Ops can.
  virtual void widen_encode16(const void* flat, DataType type, float* residual, float* acc,
                              void* wire, DataType wire_type, float scale, std::size_t n) {
    widen_add(flat, type, residual, acc, n);
    encode16(acc, wire, wire_type, scale, residual, n);
  }
  // out[i] = float(wire[i]).
  virtual void decode16(const void* wire, DataType wire_type, float* out, std::size_t n) = 0;
  // flat[i] = type(float(wire[i]) x factor) when every such value is finite (*flag = 0), else
  // zeros (*flag = 1); *count += *flag. The same values as decode16, scale, flag_nonfinite, zero_if
  // and narrow through acc (n floats of scratch), which the default runs; in one pass where the
  // Ops can.
  virtual void decode16_guarded(const void* wire, DataType wire_type, float factor, float* acc,
                                void* flat, DataType type, std::size_t n, std::uint32_t* flag,
                                std::uint32_t* count);
  // out[i] = sum over r < ranks, in order, of float(gathered[r * n + i]) (float32, float16 or
  // bfloat16).
  virtual void sum_ranks(const void* gathered, int ranks, DataType type, std::size_t n,
                         float* out) = 0;
  // The k entries of acc largest in magnitude (ties: the lower index) into message (k pairs,
  // in any order); residual = acc with those entries zeroed.
  virtual void select_topk(const float* acc, std::size_t n, std::size_t k, std::int32_t* message,
                           float* residual) = 0;
  // The entries with |acc| >= t into message; residual = acc with them zeroed; their count into
  // *count (a buffer of this Ops).
  virtual void select_threshold(const float* acc, std::size_t n, float t, std::int32_t* message,
                                float* residual, std::int32_t* count) = 0;
  // dense = (sum over ranks r of rank r's first counts[r] entries) * scale; rank r's message
  // starts at messages + r * stride_words. Ranks in order, so every rank adds alike.
  virtual void scatter_add(const std::int32_t* messages, std::size_t stride_words,
                           const std::vector<std::int32_t>& counts, float* dense, std::size_t n,
                           float scale) = 0;
  // c (rows x cols) = a (rows x inner) * b (inner x cols); with transpose_a, a is given as its
  // transpose (inner x rows).
  virtual void matmul(const float* a, const float* b, float* c, std::size_t rows, std::size_t inner,
                      std::size_t cols, bool transpose_a) = 0;
  // out (rows x cols) = p (rows x r) * q^T (q: cols x r).
  virtual void outer(const float* p, const float* q, float* out, std::size_t rows, std::size_t cols,
                     std::size_t r) = 0;
  // Gram-Schmidt on the r columns of m (rows x r): orthonormal columns; a column that becomes
  // zero stays zero.
  virtual void orthogonalize(float* m, std::size_t rows, std::size_t r) = 0;
  // out[i] = a[i] - b[i].
  virtual void subtract(const float* a, const float* b, float* out, std::size_t n) = 0;
  virtual void scale(float* x, std::size_t n, float factor) = 0;

  // Non-finite values (inf, NaN), which would poison a compressor's state for good. The flags and
  // counters are std::uint32_t buffers of this Ops, read without a wait on the device.
  // *flag = 1 when an entry of x is not finite, else 0; *count += *flag.
  virtual void flag_nonfinite(const float* x, std::size_t n, std::uint32_t* flag,
                              std::uint32_t* count) = 0;
  // When *flag is set: x = 0.
  virtual void zero_if(const std::uint32_t* flag, float* x, std::size_t n) = 0;
  // When *flag is set: to = from.
  virtual void copy_if(const std::uint32_t* flag, float* to, const float* from, std::size_t n) = 0;
  // Every entry of x that is not finite becomes 0; *count += 1 when there was one.
  virtual void zero_nonfinite(float* x, std::size_t n, std::uint32_t* count) = 0;

 protected:
  explicit Ops(ProcessGroup& group) : group_(group) {}
  // The collective itself: complete, as seen by later calls, on return.
  virtual void run_all_reduce(void* data, std::size_t count, DataType type, ReduceOp op) = 0;
  virtual void run_all_gather(const void* input, void* output, std::size_t count,
                              DataType type) = 0;

 private:
  ProcessGroup& group_;
  std::uint64_t bytes_sent_ = 0;
  void* gathered_ = nullptr;  // all_sum's, grown as needed
  std::size_t gathered_bytes_ = 0;
};

// Host memory and Gloo (or any group with host buffers).
std::unique_ptr<Ops> make_host_ops(ProcessGroup& group);
// Device memory of the current device, kernels and collectives on a stream of its own that
// follows `caller` (the backward pass's stream) at post() and that `caller` follows at drain().
// CollectiveError in a build without the CUDA kernels.
std::unique_ptr<Ops> make_device_ops(ProcessGroup& group, CudaStream caller);

// IEEE half conversions bit-identical to Half::from_float and Half::to_float, without their libm
// call and division (the fp16 exchange's hot loop).
std::uint16_t half_bits_from_float(float f);
float float_from_half_bits(std::uint16_t h);
// BFloat16::from_float's bits, inline (the bf16 exchange's loops vectorize): round to nearest
// even, a NaN kept quiet.
inline std::uint16_t bf16_bits_from_float(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  return static_cast<std::uint16_t>((x & 0x7FFFFFFFu) > 0x7F800000u ? (x >> 16) | 0x40u : rounded);
}
// The fp16 exchange's loops over a bucket: out = half(acc x scale), residual = acc - out / scale;
// and out = float(in). In hardware where the CPU converts (half_in_hardware: x86-64's F16C), the
// same values as the functions above but for a NaN's payload.
void encode_half(const float* acc, std::uint16_t* out, float scale, float* residual, std::size_t n);
// encode_half of acc = flat + residual, in one pass: the same values as the two.
void widen_encode_half(const float* flat, float* residual, std::uint16_t* out, float scale,
                       std::size_t n);
void decode_half(const std::uint16_t* in, float* out, std::size_t n);
// out = float(in) x factor; whether every value of out is finite.
bool decode_half_checked(const std::uint16_t* in, float* out, float factor, std::size_t n);
bool half_in_hardware();

// Wire bytes this rank sends, by the ring algorithms.
std::uint64_t ring_all_reduce_bytes(std::size_t bytes, int world);
std::uint64_t ring_all_gather_bytes(std::size_t bytes_per_rank, int world);

}  // namespace dist::sdk::detail
