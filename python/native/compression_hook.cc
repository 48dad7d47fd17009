// The C ABI of the SDK's gradient compressors, for dist_launch.compression's torch DDP
// communication hooks (python/dist_launch/compression.py loads it with ctypes: no torch headers,
// no Python ABI, one library for every Python and torch version).
//
// The compressors are the SDK's own (worker_sdk/src/compression: residuals, sparse messages,
// PowerSGD, the inf/NaN guard, the dense fallback), on its host Ops. Their collectives are torch's:
// the caller passes a function that runs an all-reduce (sum) or an all-gather on the buffers it is
// given, through torch.distributed on the DDP's process group, and returns once it completed.
//
// A hook state (dlc_state_new) is one such group; a bucket (dlc_bucket_new) is one compressor of a
// DDP bucket's layout, with the host Ops that hold its memory. An exchange runs on the calling
// thread, one at a time per state (the host Ops complete each call on return); one that splits
// (fp16, bf16: dlc_bucket_begin) runs the caller's collective in between, asynchronously. Every
// function returns 0 (or a handle) on success, and -1 (or null) with dlc_last_error() saying why:
// nothing throws across the ABI.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "compression/compressor.h"
#include "compression/ops.h"
#include "dist/sdk/compression.h"
#include "dist/sdk/process_group.h"

namespace {

using dist::sdk::CollectiveError;
using dist::sdk::Compression;
using dist::sdk::CudaStream;
using dist::sdk::DataType;
using dist::sdk::ReduceOp;
using dist::sdk::Work;

// What the caller's function is asked to run. Must match compression.py.
enum CollectiveKind : int { kAllReduceSum = 0, kAllGather = 1 };
// Element types of the ABI (compression.py's _DTYPES), DataType's values as numbers.
constexpr int kMaxDataType = static_cast<int>(DataType::kInt64);

// (ctx, kind, input, output, count, dtype) -> 0 once complete, anything else on failure. For the
// all-reduce, input == output (in place); for the all-gather, output holds world x count.
using CollectiveFn = int (*)(void*, int, const void*, void*, std::uint64_t, int);

thread_local std::string last_error;

// A process group whose collectives are the caller's function: the compressors use only the
// synchronous all-reduce (sum) and all-gather.
class CallbackGroup final : public dist::sdk::ProcessGroup {
 public:
  CallbackGroup(int rank, int size, CollectiveFn fn, void* ctx)
      : rank_(rank), size_(size), fn_(fn), ctx_(ctx) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "torch"; }
  bool device_buffers() const override { return false; }

  void all_reduce(void* data, std::size_t count, DataType type, ReduceOp op, CudaStream) override {
    if (op != ReduceOp::kSum) unsupported("an all-reduce other than a sum");
    call(kAllReduceSum, data, data, count, type, "all-reduce");
  }
  void all_gather(const void* input, void* output, std::size_t count, DataType type,
                  CudaStream) override {
    call(kAllGather, input, output, count, type, "all-gather");
  }
  Work all_reduce_async(void* data, std::size_t count, DataType type, ReduceOp op,
                        CudaStream stream) override {
    all_reduce(data, count, type, op, stream);
    return Work();
  }
  Work all_gather_async(const void* input, void* output, std::size_t count, DataType type,
                        CudaStream stream) override {
    all_gather(input, output, count, type, stream);
    return Work();
  }
  Work broadcast_async(void*, std::size_t, DataType, int, CudaStream) override {
    unsupported("broadcast");
  }
  Work reduce_scatter_async(const void*, void*, std::size_t, DataType, ReduceOp,
                            CudaStream) override {
    unsupported("reduce-scatter");
  }
  Work barrier_async() override { unsupported("barrier"); }

 private:
  void call(int kind, const void* input, void* output, std::size_t count, DataType type,
            const char* what) {
    if (fn_(ctx_, kind, input, output, count, static_cast<int>(type)) != 0) {
      throw CollectiveError("torch's " + std::string(what) + " of " + std::to_string(count) +
                            " elements failed on rank " + std::to_string(rank_) +
                            " (the Python exception says why)");
    }
  }
  [[noreturn]] static void unsupported(const char* what) {
    throw CollectiveError(std::string("the compression hook's group has no ") + what);
  }

  int rank_, size_;
  CollectiveFn fn_;
  void* ctx_;
};

struct State {
  CallbackGroup group;
};

// A bucket owns its Ops (its memory: freed with it, when DDP rebuilds its buckets) and compressor.
struct Bucket {
  std::unique_ptr<dist::sdk::detail::Ops> ops;
  std::unique_ptr<dist::sdk::detail::BucketCompressor> compressor;
};

template <typename T>
T* checked(void* handle, const char* what) {
  if (handle == nullptr) throw std::invalid_argument(std::string("no ") + what + " (null)");
  return static_cast<T*>(handle);
}
Bucket& bucket_of(void* handle) {
  return *checked<Bucket>(handle, "bucket");
}

// Runs `f`, turning any exception into -1 and dlc_last_error().
template <typename F>
int guarded(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown error";
  }
  return -1;
}

}  // namespace

extern "C" {

// Why the last call on this thread failed.
__attribute__((visibility("default"))) const char* dlc_last_error() {
  return last_error.c_str();
}

// The canonical form of a compression spec (compression.h) into out (NUL-terminated, at most
// capacity bytes), whether it is lossy into *lossy; -1 on a spec that does not parse.
__attribute__((visibility("default"))) int dlc_parse(const char* spec, char* out,
                                                     std::uint64_t capacity, int* lossy) {
  return guarded([&] {
    const Compression c = Compression::parse(spec);
    const std::string text = c.to_string();
    if (text.size() + 1 > capacity) throw std::length_error("dlc_parse: buffer too small");
    std::memcpy(out, text.c_str(), text.size() + 1);
    *lossy = c.lossy() ? 1 : 0;
  });
}

// Whether the compressors of `spec` split their exchange (dlc_bucket_begin): 1 or 0; -1 on a spec
// that does not parse.
__attribute__((visibility("default"))) int dlc_spec_splits(const char* spec) {
  int splits = -1;
  guarded([&] {
    splits =
        dist::sdk::detail::exchange_splits(Compression::parse(spec == nullptr ? "" : spec)) ? 1 : 0;
  });
  return splits;
}

// Bytes per element of DataType `dtype` (0 for none): compression.py checks its numbers by it.
__attribute__((visibility("default"))) std::uint64_t dlc_element_size(int dtype) {
  if (dtype < 0 || dtype > kMaxDataType) return 0;
  return dist::sdk::element_size(static_cast<DataType>(dtype));
}

__attribute__((visibility("default"))) void* dlc_state_new(int rank, int world, CollectiveFn fn,
                                                           void* ctx) {
  State* made = nullptr;
  guarded([&] {
    if (world < 1 || rank < 0 || rank >= world) {
      throw std::invalid_argument("rank " + std::to_string(rank) + " of a world of " +
                                  std::to_string(world));
    }
    if (fn == nullptr) throw std::invalid_argument("no collective function (null)");
    made = new State{CallbackGroup(rank, world, fn, ctx)};
  });
  return made;
}

__attribute__((visibility("default"))) void dlc_state_free(void* state) {
  delete static_cast<State*>(state);
}

// A compressor for one bucket of `elements` elements of `dtype` (float32, float16, bfloat16),
// holding `tensors` parameters: tensor i at offsets[i] elements, counts[i] of them, rows[i] rows
// as a matrix (0: one-dimensional). `index` (the bucket's) seeds PowerSGD's first Q, alike on
// every rank.
__attribute__((visibility("default"))) void* dlc_bucket_new(
    void* state, const char* spec, int dtype, std::uint64_t elements, std::uint64_t tensors,
    const std::uint64_t* offsets, const std::uint64_t* counts, const std::uint64_t* rows,
    std::uint64_t index) {
  Bucket* made = nullptr;
  guarded([&] {
    auto* s = checked<State>(state, "state");
    const Compression c = Compression::parse(spec == nullptr ? "" : spec);
    if (!c.lossy()) throw std::invalid_argument("compression 'none' has no compressor");
    const auto type = static_cast<DataType>(dtype);
    if (type != DataType::kFloat32 && type != DataType::kFloat16 && type != DataType::kBFloat16) {
      throw std::invalid_argument("gradients of float32, float16 or bfloat16 only");
    }
    if (tensors > 0 && (offsets == nullptr || counts == nullptr || rows == nullptr)) {
      throw std::invalid_argument("no layout (null)");
    }
    dist::sdk::detail::BucketLayout layout{type, elements, {}};
    for (std::uint64_t i = 0; i < tensors; ++i) {
      if (offsets[i] > elements || counts[i] > elements - offsets[i]) {
        throw std::invalid_argument("parameter " + std::to_string(i) + " lies outside its bucket");
      }
      layout.tensors.push_back({offsets[i], counts[i], rows[i]});
    }
    auto bucket = std::make_unique<Bucket>();
    bucket->ops = dist::sdk::detail::make_host_ops(s->group);
    bucket->compressor = dist::sdk::detail::make_compressor(c, *bucket->ops, layout, index);
    made = bucket.release();
  });
  return made;
}

__attribute__((visibility("default"))) void dlc_bucket_free(void* bucket) {
  delete static_cast<Bucket*>(bucket);
}

// The bucket's gradients (flat: the layout's elements, host memory) in, the approximate average
// out.
__attribute__((visibility("default"))) int dlc_exchange(void* bucket, void* flat) {
  return guarded([&] {
    if (flat == nullptr) throw std::invalid_argument("no gradients (null)");
    bucket_of(bucket).compressor->exchange(flat);
  });
}

// The bucket's exchange in three steps, for a caller that runs the collective itself (torch's,
// asynchronously): dlc_bucket_begin() encodes the gradients (flat, as dlc_exchange takes them)
// and writes the collective into out: out[0] its kind (kAllReduceSum: in place over out[1];
// kAllGather: of out[1] into out[2]), out[3] the elements per rank (0: nothing to run), out[4]
// their DataType. Once it completed, dlc_bucket_finish() writes the average into flat. The
// bucket's buffers stay as begin() left them until finish() returns: nothing else may run on the
// bucket in between.
__attribute__((visibility("default"))) int dlc_bucket_begin(void* bucket, void* flat,
                                                            std::uint64_t* out) {
  return guarded([&] {
    if (flat == nullptr || out == nullptr) throw std::invalid_argument("no gradients (null)");
    const auto sum = bucket_of(bucket).compressor->begin(flat);
    out[0] = sum.gathered != nullptr ? kAllGather : kAllReduceSum;
    out[1] = reinterpret_cast<std::uintptr_t>(sum.input);
    out[2] = reinterpret_cast<std::uintptr_t>(sum.gathered);
    out[3] = sum.count;
    out[4] = static_cast<std::uint64_t>(sum.type);
  });
}

__attribute__((visibility("default"))) int dlc_bucket_finish(void* bucket, void* flat) {
  return guarded([&] {
    if (flat == nullptr) throw std::invalid_argument("no gradients (null)");
    bucket_of(bucket).compressor->finish(flat);
  });
}

// Copies `n` spans of elements of `element_size` bytes from src (`src_elements` long) to dst
// (`dst_elements` long): spans[3i] the span's offset in src, spans[3i + 1] in dst, spans[3i + 2]
// its count. A DDP bucket staged into its compressor's order and back, in one call (where one torch
// copy a parameter cost more than the exchange's encoding). Every span is checked first: nothing is
// copied when one lies outside either buffer.
__attribute__((visibility("default"))) int dlc_copy_spans(
    void* dst, std::uint64_t dst_elements, const void* src, std::uint64_t src_elements,
    std::uint64_t element_size, std::uint64_t n, const std::uint64_t* spans) {
  return guarded([&] {
    if (dst == nullptr || src == nullptr || (n > 0 && spans == nullptr)) {
      throw std::invalid_argument("dlc_copy_spans: null buffer or spans");
    }
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::uint64_t from = spans[3 * i], to = spans[3 * i + 1], count = spans[3 * i + 2];
      if (from > src_elements || count > src_elements - from || to > dst_elements ||
          count > dst_elements - to) {
        throw std::out_of_range("dlc_copy_spans: span " + std::to_string(i) + " (" +
                                std::to_string(count) + " elements from " + std::to_string(from) +
                                " to " + std::to_string(to) + ") lies outside its buffers (" +
                                std::to_string(src_elements) + " and " +
                                std::to_string(dst_elements) + " elements)");
      }
    }
    auto* out = static_cast<std::byte*>(dst);
    const auto* in = static_cast<const std::byte*>(src);
    for (std::uint64_t i = 0; i < n; ++i) {
      std::memcpy(out + spans[3 * i + 1] * element_size, in + spans[3 * i] * element_size,
                  spans[3 * i + 2] * element_size);
    }
  });
}

// Since the bucket was made: out[0] exchanges skipped for inf/NaN, out[1] residuals cleaned,
// out[2] exchanges averaged whole, out[3] the bytes this rank sent for it (by the ring
// algorithms' formulas).
__attribute__((visibility("default"))) int dlc_bucket_events(void* bucket, std::uint64_t* out) {
  return guarded([&] {
    const Bucket& b = bucket_of(bucket);
    const auto events = b.compressor->events();
    out[0] = events.skipped;
    out[1] = events.cleaned;
    out[2] = events.dense;
    out[3] = b.ops->bytes_sent();
  });
}

// The format dlc_bucket_save() writes (compressor.h: kStateFormat).
__attribute__((visibility("default"))) int dlc_state_format() {
  return dist::sdk::detail::kStateFormat;
}

// The bucket's state (residual, PowerSGD's Q and warm-up count) as bytes: its size into *size;
// copied into out when capacity allows (call with capacity 0 to learn the size).
__attribute__((visibility("default"))) int dlc_bucket_save(void* bucket, char* out,
                                                           std::uint64_t capacity,
                                                           std::uint64_t* size) {
  return guarded([&] {
    std::string saved;
    bucket_of(bucket).compressor->save(saved);
    *size = saved.size();
    if (saved.size() <= capacity) std::memcpy(out, saved.data(), saved.size());
  });
}

// What dlc_bucket_save() wrote, in `format` (dlc_state_format() then, or an earlier one).
__attribute__((visibility("default"))) int dlc_bucket_load(void* bucket, const char* in,
                                                           std::uint64_t size, int format) {
  return guarded([&] {
    if (format < 1 || format > dist::sdk::detail::kStateFormat) {
      throw std::invalid_argument(
          "a state of format " + std::to_string(format) + ": this library reads 1 to " +
          std::to_string(dist::sdk::detail::kStateFormat) + " (saved by a newer dist-launch?)");
    }
    std::string_view view(in, size);
    bucket_of(bucket).compressor->load(view, format);
    if (!view.empty()) throw std::invalid_argument("a bucket's saved state is longer than its own");
  });
}

// The bucket's residual (its layout's elements, float32) into out / from in.
__attribute__((visibility("default"))) int dlc_bucket_residual(void* bucket, float* out) {
  return guarded([&] { bucket_of(bucket).compressor->residual(out); });
}

__attribute__((visibility("default"))) int dlc_bucket_set_residual(void* bucket, const float* in) {
  return guarded([&] { bucket_of(bucket).compressor->set_residual(in); });
}

// The job's steps before the bucket was made (compressor.h: steps_before): PowerSGD's warm-up
// goes on from there.
__attribute__((visibility("default"))) int dlc_bucket_steps_before(void* bucket,
                                                                   std::uint64_t steps) {
  return guarded([&] { bucket_of(bucket).compressor->steps_before(steps); });
}

}  // extern "C"
