#include "compression/compressor.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <random>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

namespace dist::sdk::detail {
namespace {

// What every lossy exchange has: the residual, and a float buffer for this step's sum.
class Lossy : public BucketCompressor {
 public:
  Lossy(Ops& ops, const BucketLayout& layout)
      : ops_(ops),
        layout_(layout),
        n_(layout.elements),
        residual_(ops.allocate_floats(n_)),
        acc_(ops.allocate_floats(n_)) {}

  void save(std::string& out) const override {
    put_u64(out, n_);
    put_floats(out, ops_, residual_, n_);
    clean_floats(out, n_);  // a checkpoint never carries a poisoned residual
  }
  void load(std::string_view& in, int /*format*/) override {
    if (take_u64(in) != n_) throw std::invalid_argument("a bucket's residual has another size");
    take_floats(in, ops_, residual_, n_);
    ops_.zero_nonfinite(residual_, n_, counts_ + kCleaned);  // one written before the guard
    ops_.zero(flag_, sizeof *flag_);  // no exchange before this one to follow (last_skipped)
  }
  void residual(float* out) const override { ops_.to_host(out, residual_, n_ * sizeof(float)); }
  void set_residual(const float* in) override {
    ops_.from_host(residual_, in, n_ * sizeof(float));
    ops_.zero_nonfinite(residual_, n_, counts_ + kCleaned);
  }
  Events events() const override {
    std::uint32_t counts[2] = {};
    ops_.to_host(counts, counts_, sizeof counts);
    return {counts[kSkipped], counts[kCleaned], dense_exchanges_.load(std::memory_order_relaxed)};
  }

 protected:
  float inverse_world() const { return 1.0f / static_cast<float>(ops_.world()); }

  // The bucket averaged whole, in its own type (as DDP without a hook sends it: a 16-bit bucket
  // in 16 bits), by the ring all-reduce whose cost dense_is_cheaper() weighs (not all_sum's
  // all-gather, which costs (W - 1) n): everything is sent, so the residual empties (a 16-bit
  // bucket's keeps what the cast lost). acc_ must hold the gradients plus the residual
  // (widen_add).
  void exchange_dense(void* flat) {
    if (layout_.type == DataType::kFloat32) {
      ops_.zero(residual_, n_ * sizeof(float));
      ops_.all_reduce(acc_, n_, DataType::kFloat32, ReduceOp::kSum);
      ops_.scale(acc_, n_, inverse_world());
      guard(acc_);
      ops_.narrow(acc_, flat, layout_.type, n_);
    } else {
      // Divided before the sum, as DDP divides: 16-bit partial sums would overflow past
      // 65504 / W otherwise (fp16), and the bucket be skipped for it.
      ops_.encode16(acc_, flat, layout_.type, inverse_world(), residual_, n_);
      ops_.all_reduce(flat, n_, layout_.type, ReduceOp::kSum);
      average16(flat, layout_.type, 1.0f, flat);  // (decoded whole first: in place)
    }
    dense_exchanges_.fetch_add(1, std::memory_order_relaxed);
  }
  // Whether W ranks' sparse messages of `entries` pairs each cost more than a dense all-reduce of
  // the bucket: an all-gather sends (W - 1) x entries x 8 bytes (a float32 value and an index) a
  // rank, a ring all-reduce 2 (W - 1) / W x n x the bucket's element size e, so sparse pays only
  // while entries x W x 4 < n x e (entries x W < n in float32, half that in 16 bits).
  bool dense_is_cheaper(std::size_t entries) const {
    return entries * static_cast<std::size_t>(ops_.world()) * sizeof(float) >=
           n_ * element_size(layout_.type);
  }

  // After the exchange wrote the average into `out`: the inf/NaN guard (compressor.h).
  void guard(float* out) {
    ops_.flag_nonfinite(out, n_, flag_, counts_ + kSkipped);
    ops_.zero_if(flag_, out, n_);
    ops_.zero_if(flag_, residual_, n_);
    reset_if(flag_);
    ops_.zero_nonfinite(residual_, n_, counts_ + kCleaned);
  }
  // The average of a 16-bit wire all-reduced in place (the sum x factor) into flat, guarded as
  // guard() does, in one pass where the Ops can. What the cast lost (the residual) holds an inf
  // or NaN only where this rank's values did, and then the sum does: no look at it of its own.
  void average16(const void* wire, DataType wire_type, float factor, void* flat) {
    ops_.decode16_guarded(wire, wire_type, factor, acc_, flat, layout_.type, n_, flag_,
                          counts_ + kSkipped);
    ops_.zero_if(flag_, residual_, n_);
    reset_if(flag_);
  }
  // When *flag: the compressor's own state back to its start (PowerSGD: Q).
  virtual void reset_if(const std::uint32_t* /*flag*/) {}
  // Whether the guard skipped the last exchange (false before the first and after a load). Reads
  // the Ops' memory: on the device, a wait.
  bool last_skipped() const {
    std::uint32_t flag = 0;
    ops_.to_host(&flag, flag_, sizeof flag);
    return flag != 0;
  }

  // The last `n` floats of `out` with every inf or NaN made 0.
  static void clean_floats(std::string& out, std::size_t n) {
    char* at = out.data() + out.size() - n * sizeof(float);
    for (std::size_t i = 0; i < n; ++i, at += sizeof(float)) {
      float v;
      std::memcpy(&v, at, sizeof v);
      if (!std::isfinite(v)) std::memset(at, 0, sizeof v);
    }
  }

  Ops& ops_;
  BucketLayout layout_;
  std::size_t n_;
  float* residual_;
  float* acc_;  // gradients plus residual

 private:
  static constexpr int kSkipped = 0, kCleaned = 1;
  std::uint32_t* flag_ = static_cast<std::uint32_t*>(ops_.allocate(sizeof(std::uint32_t)));
  std::uint32_t* counts_ = static_cast<std::uint32_t*>(ops_.allocate(2 * sizeof(std::uint32_t)));
  std::atomic<std::uint64_t> dense_exchanges_{0};  // exchange_dense() calls (exchange thread)
};

// fp16 / bf16: the bucket divided by the world size, cast, summed (in float).
//
// fp16 with a dynamic scale (host buffers): the wire carries acc x scale / world. An exchange the
// guard skipped (its average was not finite: a gradient past fp16's 65504, or an inf or NaN)
// halves the scale for the next one, so a gradient too large for fp16 costs one skipped step per
// halving instead of every step (down to kSmallestScale); kGrowthInterval clean exchanges in a
// row double it again, up to 1. Never above 1: what underflows fp16 is not lost but waits in the
// residual (error feedback), so scaling up would buy overflows and nothing else. The scale is part
// of the state. On the device it stays 1: following the last exchange there would make the host
// wait for it.
class Cast16 final : public Lossy {
 public:
  Cast16(Ops& ops, const BucketLayout& layout, DataType wire)
      : Lossy(ops, layout),
        wire_type_(wire),
        dynamic_(wire == DataType::kFloat16 && !ops.group().device_buffers()),
        wire_(ops.allocate(n_ * element_size(wire))) {}

  void exchange(void* flat) override {
    ops_.run_sum(begin(flat));
    finish(flat);
  }
  bool splits() const override { return true; }
  Ops::Sum begin(void* flat) override {
    if (dynamic_) follow_last_exchange();
    ops_.widen_encode16(flat, layout_.type, residual_, acc_, wire_, wire_type_,
                        scale_ * inverse_world(), n_);
    sum_ = ops_.plan_sum(wire_, wire_type_, n_);
    return sum_;
  }
  void finish(void* flat) override {
    if (sum_.gathered == nullptr) {  // all-reduced in the wire's type
      average16(wire_, wire_type_, 1.0f / scale_, flat);
    } else {
      ops_.finish_sum(sum_, acc_);
      if (scale_ != 1.0f) ops_.scale(acc_, n_, 1.0f / scale_);
      guard(acc_);
      ops_.narrow(acc_, flat, layout_.type, n_);
    }
    exchanged_ = true;
  }

  void save(std::string& out) const override {
    Lossy::save(out);
    if (wire_type_ != DataType::kFloat16) return;
    auto [scale, clean] = next_scale();
    put_u64(out, std::bit_cast<std::uint32_t>(scale));
    put_u64(out, clean);
  }
  void load(std::string_view& in, int format) override {
    Lossy::load(in, format);
    exchanged_ = false;
    scale_ = 1.0f;
    clean_ = 0;
    if (wire_type_ != DataType::kFloat16 || format < 2) return;
    const auto scale = std::bit_cast<float>(static_cast<std::uint32_t>(take_u64(in)));
    if (!(scale > 0.0f && scale <= 1.0f)) throw std::invalid_argument("fp16's scale out of (0, 1]");
    const std::uint64_t clean = take_u64(in);
    if (!dynamic_) return;  // the device's scale is 1, whatever a host saved
    scale_ = std::max(scale, kSmallestScale);
    clean_ = clean;
  }

  static constexpr std::uint64_t kGrowthInterval = 1000;
  // Room for a gradient 256 x fp16's largest (1.7e7 a rank after the division by the world); an
  // inf or NaN that no scale would fix (a bad batch) halves the scale too, and a scale far below
  // it would keep small gradients in the residual for thousands of steps.
  static constexpr float kSmallestScale = 0x1.0p-8f;

 private:
  // The scale and the clean exchanges in a row, once the last exchange is taken into account.
  std::pair<float, std::uint64_t> next_scale() const {
    if (!dynamic_ || !exchanged_) return {scale_, clean_};
    if (last_skipped()) return {std::max(scale_ * 0.5f, kSmallestScale), 0};
    // At 1 there is nothing to grow back to, and nothing to count: the state a host saves is
    // then the device's (whose scale stays 1), byte for byte.
    if (scale_ == 1.0f) return {1.0f, 0};
    if (clean_ + 1 < kGrowthInterval) return {scale_, clean_ + 1};
    return {std::min(scale_ * 2.0f, 1.0f), 0};
  }
  void follow_last_exchange() {
    std::tie(scale_, clean_) = next_scale();
    exchanged_ = false;
  }

  DataType wire_type_;
  bool dynamic_;
  void* wire_;
  Ops::Sum sum_;  // begin()'s, for finish()
  float scale_ = 1.0f;
  std::uint64_t clean_ = 0;  // exchanges in a row the guard did not skip, at this scale (< 1)
  bool exchanged_ = false;   // an exchange since the construction or the last load
};

bool all_finite(const std::vector<float>& values) {
  return std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); });
}

// The sparse modes send 32-bit indices.
const BucketLayout& indexable(const BucketLayout& layout) {
  if (layout.elements > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
    throw std::invalid_argument("DDP: a bucket of " + std::to_string(layout.elements) +
                                " elements is too large for sparse compression (32-bit indices): "
                                "lower DdpOptions::bucket_cap_bytes");
  }
  return layout;
}

// topk:RATIO: the k largest entries of each rank, all-gathered as (index, value) pairs; the
// bucket whole where k x world >= n (decided once: neither changes).
class TopK final : public Lossy {
 public:
  TopK(Ops& ops, const BucketLayout& layout, double ratio)
      : Lossy(ops, indexable(layout)),
        k_(n_ == 0
               ? 0
               : std::clamp<std::size_t>(
                     static_cast<std::size_t>(std::ceil(ratio * static_cast<double>(n_))), 1, n_)),
        always_dense_(n_ > 0 && dense_is_cheaper(k_)),
        message_(static_cast<std::int32_t*>(ops.allocate(message_bytes()))),
        gathered_(static_cast<std::int32_t*>(
            ops.allocate(message_bytes() * static_cast<std::size_t>(ops.world())))) {}

  bool always_dense() const override { return always_dense_; }

  void exchange(void* flat) override {
    ops_.widen_add(flat, layout_.type, residual_, acc_, n_);
    if (always_dense_) return exchange_dense(flat);
    ops_.select_topk(acc_, n_, k_, message_, residual_);
    ops_.all_gather(message_, gathered_, 2 * k_, DataType::kInt32);
    const std::vector<std::int32_t> counts(static_cast<std::size_t>(ops_.world()),
                                           static_cast<std::int32_t>(k_));
    ops_.scatter_add(gathered_, 2 * k_, counts, acc_, n_, inverse_world());
    guard(acc_);
    ops_.narrow(acc_, flat, layout_.type, n_);
  }

 private:
  // k (index, value) pairs; none where the bucket always goes whole.
  std::size_t message_bytes() const { return always_dense_ ? 0 : 2 * k_ * sizeof(std::int32_t); }

  std::size_t k_;
  bool always_dense_;
  std::int32_t* message_;
  std::int32_t* gathered_;
};

// threshold:T: every entry at least T in magnitude; the counts first, then the entries, each
// rank's padded to the largest count; the bucket whole at a step where that count x world >= n.
class Threshold final : public Lossy {
 public:
  Threshold(Ops& ops, const BucketLayout& layout, float threshold)
      : Lossy(ops, indexable(layout)),
        threshold_(threshold),
        message_(static_cast<std::int32_t*>(ops.allocate(2 * n_ * sizeof(std::int32_t)))),
        count_(static_cast<std::int32_t*>(ops.allocate(sizeof(std::int32_t)))),
        counts_(static_cast<std::int32_t*>(
            ops.allocate(static_cast<std::size_t>(ops.world()) * sizeof(std::int32_t)))) {}

  void exchange(void* flat) override {
    ops_.widen_add(flat, layout_.type, residual_, acc_, n_);
    ops_.select_threshold(acc_, n_, threshold_, message_, residual_, count_);
    ops_.all_gather(count_, counts_, 1, DataType::kInt32);
    std::vector<std::int32_t> counts(static_cast<std::size_t>(ops_.world()));
    ops_.to_host(counts.data(), counts_, counts.size() * sizeof(std::int32_t));
    const auto most = static_cast<std::size_t>(*std::max_element(counts.begin(), counts.end()));
    if (most > 0 && dense_is_cheaper(most)) return exchange_dense(flat);  // acc_ is untouched
    if (most > 0) {
      ensure_gathered(2 * most * counts.size());
      ops_.all_gather(message_, gathered_, 2 * most, DataType::kInt32);
    }
    ops_.scatter_add(gathered_, 2 * most, counts, acc_, n_, inverse_world());
    guard(acc_);
    ops_.narrow(acc_, flat, layout_.type, n_);
  }

 private:
  // The gathered messages' buffer grows (doubling) to what the counts need.
  void ensure_gathered(std::size_t words) {
    if (words <= gathered_words_) return;
    gathered_words_ = std::max(words, 2 * gathered_words_);
    gathered_ = static_cast<std::int32_t*>(ops_.allocate(gathered_words_ * sizeof(std::int32_t)));
  }

  float threshold_;
  std::int32_t* message_;
  std::int32_t* count_;
  std::int32_t* counts_;
  std::int32_t* gathered_ = nullptr;
  std::size_t gathered_words_ = 0;
};

// powersgd:RANK[:WARMUP], as torch's powerSGD_hook with warm start and error feedback. One
// exchange carries every P and the uncompressed tensors (torch: two), a second every Q. The
// first WARMUP exchanges average the bucket whole (torch's start_powerSGD_iter); their count is
// part of the state, so that every rank of a resumed job compresses from the same step.
class PowerSgd final : public Lossy {
 public:
  PowerSgd(Ops& ops, const BucketLayout& layout, const Compression& c, std::size_t index)
      : Lossy(ops, layout),
        plan_(plan_powersgd(layout, c.rank)),
        seed_(c.seed + 0x9E3779B97F4A7C15ull * (index + 1)),
        warmup_(c.warmup),
        first_message_(ops.allocate_floats(plan_.p_size + plan_.uncompressed_size)),
        q_(ops.allocate_floats(plan_.q_size)),
        out_(ops.allocate_floats(n_)) {}

  void steps_before(std::uint64_t steps) override {
    warmed_ = std::max(warmed_, std::min(steps, warmup_));
  }

  void exchange(void* flat) override {
    ops_.widen_add(flat, layout_.type, residual_, acc_, n_);
    if (warmed_ < warmup_) {
      exchange_dense(flat);
      ++warmed_;  // once done: an exchange a failure interrupted is redone as it was
      return;
    }
    if (!q_ready_) start_q();
    float* p = first_message_;
    float* whole = first_message_ + plan_.p_size;
    for (const auto& m : plan_.matrices) {
      ops_.matmul(acc_ + m.offset, q_ + m.q_offset, p + m.p_offset, m.rows, m.cols, m.rank, false);
    }
    std::size_t at = 0;
    for (const auto& t : plan_.uncompressed) {
      ops_.copy(whole + at, acc_ + t.offset, t.count * sizeof(float));
      at += t.count;
    }
    ops_.all_sum(first_message_, DataType::kFloat32, plan_.p_size + plan_.uncompressed_size,
                 first_message_);
    ops_.scale(whole, plan_.uncompressed_size, inverse_world());
    at = 0;
    for (const auto& t : plan_.uncompressed) {  // their average (their residual stays zero)
      ops_.copy(out_ + t.offset, whole + at, t.count * sizeof(float));
      at += t.count;
    }
    for (const auto& m : plan_.matrices) ops_.orthogonalize(p + m.p_offset, m.rows, m.rank);
    for (const auto& m : plan_.matrices) {  // Q = M^T P
      ops_.matmul(acc_ + m.offset, p + m.p_offset, q_ + m.q_offset, m.cols, m.rows, m.rank, true);
    }
    ops_.all_sum(q_, DataType::kFloat32, plan_.q_size, q_);
    ops_.scale(q_, plan_.q_size, inverse_world());
    for (const auto& m : plan_.matrices) {  // M ~ P Q^T; the rest waits in the residual
      ops_.outer(p + m.p_offset, q_ + m.q_offset, out_ + m.offset, m.rows, m.cols, m.rank);
      ops_.subtract(acc_ + m.offset, out_ + m.offset, residual_ + m.offset, m.rows * m.cols);
    }
    guard(out_);
    ops_.narrow(out_, flat, layout_.type, n_);
  }

  void save(std::string& out) const override {
    Lossy::save(out);
    if (warmup_) put_u64(out, warmed_);  // without a warm-up, the state of powersgd:RANK as ever
    std::vector<float> q(q_ready_ ? plan_.q_size : 0);
    ops_.to_host(q.data(), q_, q.size() * sizeof(float));
    const bool whole = q_ready_ && all_finite(q);  // a poisoned Q is not kept: it starts afresh
    put_u64(out, whole ? plan_.q_size : 0);
    if (whole) out.append(reinterpret_cast<const char*>(q.data()), q.size() * sizeof(float));
  }
  void load(std::string_view& in, int format) override {
    Lossy::load(in, format);
    if (warmup_) warmed_ = std::min(take_u64(in), warmup_);
    const std::uint64_t q = take_u64(in);
    if (q != 0 && q != plan_.q_size) throw std::invalid_argument("PowerSGD's Q has another size");
    q_ready_ = false;  // the first exchange starts Q (and keeps its start for the guard)
    if (q == 0) return;
    std::vector<float> loaded(plan_.q_size);
    take_floats_to_host(in, loaded);
    if (all_finite(loaded)) {
      start_q();
      ops_.from_host(q_, loaded.data(), loaded.size() * sizeof(float));
    }
  }

 private:
  // The first Q: standard normal entries from a generator seeded alike on every rank (Box-Muller
  // over mt19937_64, the same on every platform), then orthogonalized.
  void start_q() {
    std::mt19937_64 generator(seed_);
    auto uniform = [&] {  // in (0, 1]
      return (static_cast<double>(generator() >> 11) + 1.0) * 0x1.0p-53;
    };
    std::vector<float> q(plan_.q_size);
    for (std::size_t i = 0; i < q.size(); i += 2) {
      const double radius = std::sqrt(-2.0 * std::log(uniform()));
      const double angle = 2.0 * std::numbers::pi * uniform();
      q[i] = static_cast<float>(radius * std::cos(angle));
      if (i + 1 < q.size()) q[i + 1] = static_cast<float>(radius * std::sin(angle));
    }
    ops_.from_host(q_, q.data(), q.size() * sizeof(float));
    for (const auto& m : plan_.matrices) ops_.orthogonalize(q_ + m.q_offset, m.cols, m.rank);
    ops_.copy(q_start_, q_, plan_.q_size * sizeof(float));
    q_ready_ = true;
  }
  void reset_if(const std::uint32_t* flag) override {
    ops_.copy_if(flag, q_, q_start_, plan_.q_size);  // every rank alike: the start is shared
  }
  static void take_floats_to_host(std::string_view& in, std::vector<float>& out) {
    if (in.size() < out.size() * sizeof(float)) throw std::invalid_argument("truncated");
    std::memcpy(out.data(), in.data(), out.size() * sizeof(float));
    in.remove_prefix(out.size() * sizeof(float));
  }

  PowerSgdPlan plan_;
  std::uint64_t seed_;
  std::uint64_t warmup_;      // exchanges averaged whole before compressing
  std::uint64_t warmed_ = 0;  // of them done
  float* first_message_;      // every P, then the uncompressed tensors
  float* q_;
  float* q_start_ = ops_.allocate_floats(plan_.q_size);  // the first Q, which a reset returns to
  float* out_;
  bool q_ready_ = false;
};

}  // namespace

PowerSgdPlan plan_powersgd(const BucketLayout& layout, int rank) {
  PowerSgdPlan plan;
  for (const auto& t : layout.tensors) {
    const std::size_t rows = t.rows, cols = rows ? t.count / rows : 0;
    const std::size_t r = std::min({rows, cols, static_cast<std::size_t>(rank)});
    if (rows < 2 || cols < 2 || rows * cols != t.count || (rows + cols) * r * 2 >= rows * cols) {
      plan.uncompressed.push_back(t);
      plan.uncompressed_size += t.count;
      continue;
    }
    plan.matrices.push_back({t.offset, rows, cols, r, plan.p_size, plan.q_size});
    plan.p_size += rows * r;
    plan.q_size += cols * r;
  }
  return plan;
}

bool exchange_splits(const Compression& c) {
  return c.kind == Compression::Kind::kFp16 || c.kind == Compression::Kind::kBf16;  // Cast16
}

std::unique_ptr<BucketCompressor> make_compressor(const Compression& c, Ops& ops,
                                                  const BucketLayout& layout, std::size_t index) {
  switch (c.kind) {
    case Compression::Kind::kFp16:
      return std::make_unique<Cast16>(ops, layout, DataType::kFloat16);
    case Compression::Kind::kBf16:
      return std::make_unique<Cast16>(ops, layout, DataType::kBFloat16);
    case Compression::Kind::kTopK:
      return std::make_unique<TopK>(ops, layout, c.ratio);
    case Compression::Kind::kThreshold:
      return std::make_unique<Threshold>(ops, layout, c.threshold);
    case Compression::Kind::kPowerSgd:
      return std::make_unique<PowerSgd>(ops, layout, c, index);
    case Compression::Kind::kNone:
      break;
  }
  throw std::logic_error("make_compressor: compression 'none' has no compressor");
}

void put_u64(std::string& out, std::uint64_t v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

std::uint64_t take_u64(std::string_view& in) {
  std::uint64_t v = 0;
  if (in.size() < sizeof v) throw std::invalid_argument("truncated");
  std::memcpy(&v, in.data(), sizeof v);
  in.remove_prefix(sizeof v);
  return v;
}

void put_floats(std::string& out, Ops& ops, const float* buffer, std::size_t n) {
  const std::size_t at = out.size();
  out.resize(at + n * sizeof(float));
  ops.to_host(out.data() + at, buffer, n * sizeof(float));
}

void take_floats(std::string_view& in, Ops& ops, float* buffer, std::size_t n) {
  if (in.size() < n * sizeof(float)) throw std::invalid_argument("truncated");
  ops.from_host(buffer, in.data(), n * sizeof(float));
  in.remove_prefix(n * sizeof(float));
}

}  // namespace dist::sdk::detail
