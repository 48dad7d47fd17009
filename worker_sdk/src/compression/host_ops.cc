// Ops on host memory: plain loops, the collectives of the group (synchronous, called on the
// exchange thread), and that thread, which runs the buckets' exchanges in order while the caller
// goes on with its backward pass.
#include <algorithm>
#include <bit>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "compression/ops.h"

namespace dist::sdk::detail {
namespace {

// |x| as an unsigned integer that orders like |x| (NaN above infinity): the selection key of the
// sparse compressors, the same on the device.
std::uint32_t magnitude_key(float x) {
  return std::bit_cast<std::uint32_t>(x) & 0x7FFFFFFFu;
}

template <typename F>
void with_float_type(DataType type, F&& f) {
  switch (type) {
    case DataType::kFloat32:
      return f(float{});
    case DataType::kFloat16:
      return f(Half{});
    case DataType::kBFloat16:
      return f(BFloat16{});
    default:
      throw std::invalid_argument("gradient compression: buckets of float32, float16 or bfloat16");
  }
}

template <typename T>
float to_float(T v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, Half>) {
    return float_from_half_bits(v.bits);
  } else {
    return std::bit_cast<float>(static_cast<std::uint32_t>(v.bits) << 16);
  }
}

template <typename T>
T from_float(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, Half>) {
    return Half{half_bits_from_float(v)};
  } else {
    return T{bf16_bits_from_float(v)};
  }
}

// Runs jobs one at a time, in order, on its own thread, started by the first post() (a caller
// that runs its exchanges itself, as the torch hooks' library, has none). After a job throws, the
// jobs queued behind it are dropped (the group is unusable) and drain() rethrows.
class ExchangeThread {
 public:
  ExchangeThread() = default;
  ~ExchangeThread() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
  }
  ExchangeThread(const ExchangeThread&) = delete;
  ExchangeThread& operator=(const ExchangeThread&) = delete;

  void post(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(job));
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    }
    wake_.notify_one();
  }
  // Runs on the calling thread the jobs the exchange thread has not started (in order, one at a
  // time, as the thread would: the last bucket's exchange then costs no thread hand-off), then
  // waits for the one it runs.
  void drain() {
    std::unique_lock lock(mutex_);
    while (!queue_.empty() && !busy_) run_front(lock);
    idle_.wait(lock, [this] { return queue_.empty() && !busy_; });
    if (error_) {
      auto error = std::exchange(error_, nullptr);
      std::rethrow_exception(error);
    }
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    while (true) {
      wake_.wait(lock, [this] { return !busy_ && (stopping_ || !queue_.empty()); });
      if (queue_.empty()) return;  // stopping, and everything posted has run
      run_front(lock);
    }
  }

  // Pops the first job and runs it unlocked (skipped once a job failed); `lock` holds mutex_.
  void run_front(std::unique_lock<std::mutex>& lock) {
    auto job = std::move(queue_.front());
    queue_.pop_front();
    if (!error_) {
      busy_ = true;
      lock.unlock();
      std::exception_ptr failed;
      try {
        job();
      } catch (...) {
        failed = std::current_exception();
      }
      lock.lock();
      busy_ = false;
      if (failed) error_ = failed;
    }
    if (queue_.empty()) idle_.notify_all();
    if (!queue_.empty()) wake_.notify_one();
  }

  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false, stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // started by the first post()
};

class HostOps final : public Ops {
 public:
  explicit HostOps(ProcessGroup& group) : Ops(group) {}

  void post(std::function<void()> job) override { thread_.post(std::move(job)); }
  void drain() override { thread_.drain(); }

  void* allocate(std::size_t bytes) override {
    blocks_.push_back(std::make_unique<std::byte[]>(std::max<std::size_t>(bytes, 1)));
    return blocks_.back().get();
  }
  void copy(void* to, const void* from, std::size_t bytes) override {
    if (bytes) std::memcpy(to, from, bytes);
  }
  void zero(void* x, std::size_t bytes) override {
    if (bytes) std::memset(x, 0, bytes);
  }
  void from_host(void* to, const void* host, std::size_t bytes) override { copy(to, host, bytes); }
  void to_host(void* host, const void* from, std::size_t bytes) override {
    copy(host, from, bytes);
  }

  void widen_add(const void* flat, DataType type, const float* residual, float* acc,
                 std::size_t n) override {
    with_float_type(type, [&](auto zero) {
      using T = decltype(zero);
      const T* in = static_cast<const T*>(flat);
      for (std::size_t i = 0; i < n; ++i) acc[i] = to_float(in[i]) + residual[i];
    });
  }
  void narrow(const float* src, void* flat, DataType type, std::size_t n) override {
    with_float_type(type, [&](auto zero) {
      using T = decltype(zero);
      T* out = static_cast<T*>(flat);
      for (std::size_t i = 0; i < n; ++i) out[i] = from_float<T>(src[i]);
    });
  }
  void encode16(const float* acc, void* wire, DataType wire_type, float scale, float* residual,
                std::size_t n) override {
    if (wire_type == DataType::kFloat16) {
      return encode_half(acc, static_cast<std::uint16_t*>(wire), scale, residual, n);
    }
    with_float_type(wire_type, [&](auto zero) {
      using T = decltype(zero);
      T* out = static_cast<T*>(wire);
      for (std::size_t i = 0; i < n; ++i) {
        out[i] = from_float<T>(acc[i] * scale);
        residual[i] = acc[i] - to_float(out[i]) / scale;
      }
    });
  }
  void widen_encode16(const void* flat, DataType type, float* residual, float* acc, void* wire,
                      DataType wire_type, float scale, std::size_t n) override {
    if (type != DataType::kFloat32 || wire_type != DataType::kFloat16) {
      return Ops::widen_encode16(flat, type, residual, acc, wire, wire_type, scale, n);
    }
    widen_encode_half(static_cast<const float*>(flat), residual, static_cast<std::uint16_t*>(wire),
                      scale, n);
  }
  void decode16(const void* wire, DataType wire_type, float* out, std::size_t n) override {
    if (wire_type == DataType::kFloat16) {
      return decode_half(static_cast<const std::uint16_t*>(wire), out, n);
    }
    with_float_type(wire_type, [&](auto zero) {
      using T = decltype(zero);
      const T* in = static_cast<const T*>(wire);
      for (std::size_t i = 0; i < n; ++i) out[i] = to_float(in[i]);
    });
  }

  void decode16_guarded(const void* wire, DataType wire_type, float factor, float* acc, void* flat,
                        DataType type, std::size_t n, std::uint32_t* flag,
                        std::uint32_t* count) override {
    if (type != DataType::kFloat32) {
      return Ops::decode16_guarded(wire, wire_type, factor, acc, flat, type, n, flag, count);
    }
    float* out = static_cast<float*>(flat);
    bool finite = true;
    if (wire_type == DataType::kFloat16) {
      finite = decode_half_checked(static_cast<const std::uint16_t*>(wire), out, factor, n);
    } else {
      with_float_type(wire_type, [&](auto zero) {
        using T = decltype(zero);
        const T* in = static_cast<const T*>(wire);
        std::uint32_t bad = 0;
        for (std::size_t i = 0; i < n; ++i) {
          out[i] = to_float(in[i]) * factor;
          bad |= static_cast<std::uint32_t>((std::bit_cast<std::uint32_t>(out[i]) & 0x7F800000u) ==
                                            0x7F800000u);
        }
        finite = bad == 0;
      });
    }
    *flag = finite ? 0 : 1;
    *count += *flag;
    if (!finite) std::fill(out, out + n, 0.0f);
  }

  void sum_ranks(const void* gathered, int ranks, DataType type, std::size_t n,
                 float* out) override {
    with_float_type(type, [&](auto zero) {
      using T = decltype(zero);
      const T* in = static_cast<const T*>(gathered);
      for (std::size_t i = 0; i < n; ++i) {
        float sum = 0.0f;
        for (std::size_t r = 0; r < static_cast<std::size_t>(ranks); ++r) {
          sum += to_float(in[r * n + i]);
        }
        out[i] = sum;
      }
    });
  }

  void select_topk(const float* acc, std::size_t n, std::size_t k, std::int32_t* message,
                   float* residual) override {
    order_.resize(n);
    for (std::size_t i = 0; i < n; ++i) order_[i] = static_cast<std::uint32_t>(i);
    auto before = [acc](std::uint32_t a, std::uint32_t b) {
      const auto ka = magnitude_key(acc[a]), kb = magnitude_key(acc[b]);
      return ka != kb ? ka > kb : a < b;
    };
    if (k < n)
      std::nth_element(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(k),
                       order_.end(), before);
    std::copy(acc, acc + n, residual);
    for (std::size_t j = 0; j < k; ++j) {
      const std::uint32_t i = order_[j];
      message[2 * j] = static_cast<std::int32_t>(i);
      message[2 * j + 1] = std::bit_cast<std::int32_t>(acc[i]);
      residual[i] = 0.0f;
    }
  }
  void select_threshold(const float* acc, std::size_t n, float t, std::int32_t* message,
                        float* residual, std::int32_t* count) override {
    const std::uint32_t bar = magnitude_key(t);
    std::int32_t taken = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (magnitude_key(acc[i]) >= bar) {
        message[2 * taken] = static_cast<std::int32_t>(i);
        message[2 * taken + 1] = std::bit_cast<std::int32_t>(acc[i]);
        ++taken;
        residual[i] = 0.0f;
      } else {
        residual[i] = acc[i];
      }
    }
    *count = taken;
  }
  void scatter_add(const std::int32_t* messages, std::size_t stride_words,
                   const std::vector<std::int32_t>& counts, float* dense, std::size_t n,
                   float scale) override {
    std::fill(dense, dense + n, 0.0f);
    for (std::size_t r = 0; r < counts.size(); ++r) {
      const std::int32_t* m = messages + r * stride_words;
      for (std::int32_t j = 0; j < counts[r]; ++j) {
        const std::int32_t i = m[2 * j];
        if (i < 0 || static_cast<std::size_t>(i) >= n) {
          throw CollectiveError("gradient compression: rank " + std::to_string(r) +
                                " sent an entry for index " + std::to_string(i) +
                                " of a bucket of " + std::to_string(n) +
                                " (do all ranks run the same model and compression?)");
        }
        dense[i] += std::bit_cast<float>(m[2 * j + 1]);
      }
    }
    for (std::size_t i = 0; i < n; ++i) dense[i] *= scale;
  }

  void matmul(const float* a, const float* b, float* c, std::size_t rows, std::size_t inner,
              std::size_t cols, bool transpose_a) override {
    for (std::size_t i = 0; i < rows; ++i) {
      for (std::size_t j = 0; j < cols; ++j) {
        float sum = 0.0f;
        for (std::size_t k = 0; k < inner; ++k) {
          const float av = transpose_a ? a[k * rows + i] : a[i * inner + k];
          sum += av * b[k * cols + j];
        }
        c[i * cols + j] = sum;
      }
    }
  }
  void outer(const float* p, const float* q, float* out, std::size_t rows, std::size_t cols,
             std::size_t r) override {
    for (std::size_t i = 0; i < rows; ++i) {
      for (std::size_t j = 0; j < cols; ++j) {
        float sum = 0.0f;
        for (std::size_t c = 0; c < r; ++c) sum += p[i * r + c] * q[j * r + c];
        out[i * cols + j] = sum;
      }
    }
  }
  void orthogonalize(float* m, std::size_t rows, std::size_t r) override {
    for (std::size_t c = 0; c < r; ++c) {
      float norm2 = 0.0f;
      for (std::size_t i = 0; i < rows; ++i) norm2 += m[i * r + c] * m[i * r + c];
      const float norm = std::sqrt(norm2);
      for (std::size_t i = 0; i < rows; ++i) m[i * r + c] = norm > 0 ? m[i * r + c] / norm : 0.0f;
      for (std::size_t d = c + 1; d < r; ++d) {
        float dot = 0.0f;
        for (std::size_t i = 0; i < rows; ++i) dot += m[i * r + c] * m[i * r + d];
        for (std::size_t i = 0; i < rows; ++i) m[i * r + d] -= dot * m[i * r + c];
      }
    }
  }
  void subtract(const float* a, const float* b, float* out, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) out[i] = a[i] - b[i];
  }
  void scale(float* x, std::size_t n, float factor) override {
    for (std::size_t i = 0; i < n; ++i) x[i] *= factor;
  }
  void flag_nonfinite(const float* x, std::size_t n, std::uint32_t* flag,
                      std::uint32_t* count) override {
    bool found = false;
    for (std::size_t i = 0; i < n; ++i) found |= !std::isfinite(x[i]);
    *flag = found ? 1 : 0;
    *count += *flag;
  }
  void zero_if(const std::uint32_t* flag, float* x, std::size_t n) override {
    if (*flag) std::fill(x, x + n, 0.0f);
  }
  void copy_if(const std::uint32_t* flag, float* to, const float* from, std::size_t n) override {
    if (*flag) copy(to, from, n * sizeof(float));
  }
  void zero_nonfinite(float* x, std::size_t n, std::uint32_t* count) override {
    bool found = false;
    for (std::size_t i = 0; i < n; ++i) {
      if (!std::isfinite(x[i])) {
        x[i] = 0.0f;
        found = true;
      }
    }
    *count += found ? 1 : 0;
  }

 protected:
  void run_all_reduce(void* data, std::size_t count, DataType type, ReduceOp op) override {
    group().all_reduce(data, count, type, op);
  }
  void run_all_gather(const void* input, void* output, std::size_t count, DataType type) override {
    group().all_gather(input, output, count, type);
  }

 private:
  std::vector<std::unique_ptr<std::byte[]>> blocks_;
  std::vector<std::uint32_t> order_;  // select_topk's scratch
  ExchangeThread thread_;             // last: joined before the buffers go
};

}  // namespace

// After F. Giesen's float_to_half_fast3_rtne: the subnormal halves by one float addition (which
// rounds to nearest even) instead of a call to nearbyint, the normal ones as Half::from_float.
std::uint16_t half_bits_from_float(float f) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u)
    return static_cast<std::uint16_t>(sign | (x > 0x7F800000u ? 0x7E00u : 0x7C00u));
  if (x >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // rounds past 65504
  if (x < 0x38800000u) {  // a subnormal half (or zero): align its 10 bits under 0.5's exponent
    const float aligned = std::bit_cast<float>(x) + 0.5f;
    return static_cast<std::uint16_t>(sign | (std::bit_cast<std::uint32_t>(aligned) - 0x3F000000u));
  }
  x += 0xC8000FFFu + ((x >> 13) & 1u);  // rebias 127 -> 15 (mod 2^32), round half to even
  return static_cast<std::uint16_t>(sign | (x >> 13));
}

float float_from_half_bits(std::uint16_t h) {
  std::uint32_t x = static_cast<std::uint32_t>(h & 0x7FFFu) << 13;
  const std::uint32_t exponent = x & 0x0F800000u;
  x += 0x38000000u;  // rebias 15 -> 127
  if (exponent == 0x0F800000u) {
    x += 0x38000000u;          // inf, NaN: to float's top exponent
  } else if (exponent == 0) {  // zero, subnormal: renormalize
    x += 0x00800000u;
    x = std::bit_cast<std::uint32_t>(std::bit_cast<float>(x) - 6.103515625e-05f);  // 2^-14
  }
  return std::bit_cast<float>(x | (static_cast<std::uint32_t>(h & 0x8000u) << 16));
}

namespace {

// out = half(a x scale), residual = a - float(out) / scale, where a is in[i], or in[i] +
// residual[i] when kAddResidual (encode_half, widen_encode_half).
template <bool kAddResidual>
void encode_half_scalar(const float* in, std::uint16_t* out, float scale, float* residual,
                        std::size_t from, std::size_t n) {
  for (std::size_t i = from; i < n; ++i) {
    const float a = kAddResidual ? in[i] + residual[i] : in[i];
    out[i] = half_bits_from_float(a * scale);
    residual[i] = a - float_from_half_bits(out[i]) / scale;
  }
}

void decode_half_scalar(const std::uint16_t* in, float* out, std::size_t from, std::size_t n) {
  for (std::size_t i = from; i < n; ++i) out[i] = float_from_half_bits(in[i]);
}

bool decode_half_checked_scalar(const std::uint16_t* in, float* out, float factor, std::size_t from,
                                std::size_t n) {
  std::uint32_t bad = 0;
  for (std::size_t i = from; i < n; ++i) {
    out[i] = float_from_half_bits(in[i]) * factor;
    bad |= static_cast<std::uint32_t>((std::bit_cast<std::uint32_t>(out[i]) & 0x7F800000u) ==
                                      0x7F800000u);
  }
  return bad == 0;
}

#if defined(__x86_64__)
// F16C (x86-64 CPUs since 2012), 8 values an instruction, in a build for any x86-64: these are
// compiled for it alone and called only where the CPU has it. Its conversions round to nearest
// even as half_bits_from_float does and agree with it and float_from_half_bits on every value
// (compression_test.cc) but a NaN's payload, which the guard zeroes whatever its bits.
template <bool kAddResidual>
__attribute__((target("avx,f16c"))) void encode_half_f16c(const float* in, std::uint16_t* out,
                                                          float scale, float* residual,
                                                          std::size_t n) {
  const __m256 by = _mm256_set1_ps(scale);
  std::size_t i = 0;
  for (; n - i >= 8; i += 8) {
    __m256 a = _mm256_loadu_ps(in + i);
    if constexpr (kAddResidual) a = _mm256_add_ps(a, _mm256_loadu_ps(residual + i));
    const __m128i half = _mm256_cvtps_ph(_mm256_mul_ps(a, by), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), half);
    _mm256_storeu_ps(residual + i, _mm256_sub_ps(a, _mm256_div_ps(_mm256_cvtph_ps(half), by)));
  }
  encode_half_scalar<kAddResidual>(in, out, scale, residual, i, n);
}

__attribute__((target("avx,f16c"))) void decode_half_f16c(const std::uint16_t* in, float* out,
                                                          std::size_t n) {
  std::size_t i = 0;
  for (; n - i >= 8; i += 8) {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(half));
  }
  decode_half_scalar(in, out, i, n);
}

// A value's v - v is 0 while v is finite and NaN from an inf or NaN, which a sum of them keeps.
__attribute__((target("avx,f16c"))) bool decode_half_checked_f16c(const std::uint16_t* in,
                                                                  float* out, float factor,
                                                                  std::size_t n) {
  const __m256 by = _mm256_set1_ps(factor);
  __m256 probe = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; n - i >= 8; i += 8) {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    const __m256 v = _mm256_mul_ps(_mm256_cvtph_ps(half), by);
    _mm256_storeu_ps(out + i, v);
    probe = _mm256_add_ps(probe, _mm256_sub_ps(v, v));
  }
  const bool finite = _mm256_movemask_ps(_mm256_cmp_ps(probe, probe, _CMP_UNORD_Q)) == 0;
  return decode_half_checked_scalar(in, out, factor, i, n) && finite;
}
#endif

template <bool kAddResidual>
void encode_half_any(const float* in, std::uint16_t* out, float scale, float* residual,
                     std::size_t n) {
#if defined(__x86_64__)
  if (half_in_hardware()) return encode_half_f16c<kAddResidual>(in, out, scale, residual, n);
#endif
  encode_half_scalar<kAddResidual>(in, out, scale, residual, 0, n);
}

}  // namespace

bool half_in_hardware() {
#if defined(__x86_64__)
  static const bool f16c = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return f16c;
#else
  return false;
#endif
}

void encode_half(const float* acc, std::uint16_t* out, float scale, float* residual,
                 std::size_t n) {
  encode_half_any<false>(acc, out, scale, residual, n);
}

void widen_encode_half(const float* flat, float* residual, std::uint16_t* out, float scale,
                       std::size_t n) {
  encode_half_any<true>(flat, out, scale, residual, n);
}

void decode_half(const std::uint16_t* in, float* out, std::size_t n) {
#if defined(__x86_64__)
  if (half_in_hardware()) return decode_half_f16c(in, out, n);
#endif
  decode_half_scalar(in, out, 0, n);
}

bool decode_half_checked(const std::uint16_t* in, float* out, float factor, std::size_t n) {
#if defined(__x86_64__)
  if (half_in_hardware()) return decode_half_checked_f16c(in, out, factor, n);
#endif
  return decode_half_checked_scalar(in, out, factor, 0, n);
}

void Ops::decode16_guarded(const void* wire, DataType wire_type, float factor, float* acc,
                           void* flat, DataType type, std::size_t n, std::uint32_t* flag,
                           std::uint32_t* count) {
  decode16(wire, wire_type, acc, n);
  if (factor != 1.0f) scale(acc, n, factor);
  flag_nonfinite(acc, n, flag, count);
  zero_if(flag, acc, n);
  narrow(acc, flat, type, n);
}

void Ops::all_reduce(void* data, std::size_t count, DataType type, ReduceOp op) {
  if (count == 0) return;
  run_all_reduce(data, count, type, op);
  bytes_sent_ += ring_all_reduce_bytes(count * element_size(type), world());
}

void Ops::all_gather(const void* input, void* output, std::size_t count, DataType type) {
  if (count == 0) return;
  run_all_gather(input, output, count, type);
  bytes_sent_ += ring_all_gather_bytes(count * element_size(type), world());
}

void Ops::all_sum(void* input, DataType type, std::size_t count, float* out) {
  const Sum sum = plan_sum(input, type, count);
  run_sum(sum);
  finish_sum(sum, out);
}

Ops::Sum Ops::plan_sum(void* input, DataType type, std::size_t count) {
  Sum sum{input, nullptr, count, type};
  if (count == 0) return sum;
  const std::size_t bytes = count * element_size(type);
  if (bytes <= kGatherBytes && world() <= 2) {
    const std::size_t whole = bytes * static_cast<std::size_t>(world());
    if (whole > gathered_bytes_) {
      gathered_ = allocate(whole);
      gathered_bytes_ = whole;
    }
    sum.gathered = gathered_;
    bytes_sent_ += ring_all_gather_bytes(bytes, world());
  } else {
    bytes_sent_ += ring_all_reduce_bytes(bytes, world());
  }
  return sum;
}

void Ops::run_sum(const Sum& sum) {
  if (sum.count == 0) return;
  if (sum.gathered != nullptr) {
    run_all_gather(sum.input, sum.gathered, sum.count, sum.type);
  } else {
    run_all_reduce(sum.input, sum.count, sum.type, ReduceOp::kSum);
  }
}

void Ops::finish_sum(const Sum& sum, float* out) {
  if (sum.count == 0) return;
  if (sum.gathered != nullptr) {
    sum_ranks(sum.gathered, world(), sum.type, sum.count, out);
    if (sum.type != DataType::kFloat32) {  // rounded as the all-reduce in that type rounds it
      narrow(out, sum.gathered, sum.type, sum.count);
      decode16(sum.gathered, sum.type, out, sum.count);
    }
  } else if (sum.type == DataType::kFloat32) {
    if (static_cast<void*>(out) != sum.input) {
      copy(out, sum.input, sum.count * element_size(sum.type));
    }
  } else {
    decode16(sum.input, sum.type, out, sum.count);
  }
}

std::uint64_t ring_all_reduce_bytes(std::size_t bytes, int world) {
  const auto n = static_cast<std::uint64_t>(world);
  return n <= 1 ? 0 : 2 * (n - 1) * static_cast<std::uint64_t>(bytes) / n;
}

std::uint64_t ring_all_gather_bytes(std::size_t bytes_per_rank, int world) {
  const auto n = static_cast<std::uint64_t>(world);
  return n <= 1 ? 0 : (n - 1) * static_cast<std::uint64_t>(bytes_per_rank);
}

std::unique_ptr<Ops> make_host_ops(ProcessGroup& group) {
  return std::make_unique<HostOps>(group);
}

}  // namespace dist::sdk::detail
