// DDP's gradient compression and sync strategies, ranks as threads of a real Gloo group: each
// mode's result against a reference computed here (fp16/bf16 rounding, top-k selection, PowerSGD
// against a direct low-rank computation in double precision), error feedback over steps, a
// restart from state() ending bit-identical to an uninterrupted run, and mixed-dtype models.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <chrono>
#include <cmath>
#include <functional>
#include <future>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <tuple>

#include "compression/compressor.h"
#include "dist/sdk/compression.h"
#include "dist/sdk/ddp.h"
#include "ranks.h"

namespace dist::sdk {
namespace {

using namespace std::chrono_literals;
using testing::on_ranks;

constexpr int kWorld = 2;

std::vector<float> random_values(std::size_t n, unsigned seed, float spread = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, spread);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

void fill(std::vector<float>& into, const std::vector<float>& values) {
  ASSERT_EQ(into.size(), values.size());
  std::copy(values.begin(), values.end(), into.begin());
}

DdpOptions with(const std::string& compression, const std::string& sync = "every-step") {
  DdpOptions o;
  o.compression = Compression::parse(compression);
  o.sync = SyncStrategy::parse(sync);
  return o;
}

// Gradients of two parameters for (rank, step), the same whichever thread computes them.
struct Grads {
  static constexpr std::size_t kRows = 16, kCols = 12, kBias = 12;
  static std::vector<float> w(int rank, int step) {
    return random_values(kRows * kCols, static_cast<unsigned>(100 * step + rank));
  }
  static std::vector<float> b(int rank, int step) {
    return random_values(kBias, static_cast<unsigned>(100 * step + rank + 50));
  }
};

// One bucket [b, w] (reverse registration order) of this parameter pair; returns each step's
// averaged gradients of rank `rank_of_interest` as the bucket's flat [b..., w...].
// The gradients are those of steps first, first + 1, ...; `stats` (when given) gets rank 0's.
std::vector<std::vector<float>> run_steps(const std::string& compression, int steps, int first = 0,
                                          CommunicationStats* stats = nullptr) {
  std::vector<std::vector<float>> results(static_cast<std::size_t>(steps));
  std::mutex mutex;
  on_ranks(kWorld, [&](ProcessGroup& g) {
    std::vector<float> w(Grads::kRows * Grads::kCols), b(Grads::kBias), dw(w.size()), db(b.size());
    DistributedDataParallel ddp(g, {{"w", w, dw, {Grads::kRows, Grads::kCols}}, {"b", b, db}},
                                with(compression));
    for (int s = 0; s < steps; ++s) {
      fill(dw, Grads::w(g.rank(), first + s));  // in place: DDP holds the buffers
      fill(db, Grads::b(g.rank(), first + s));
      ddp.grad_ready(1);
      ddp.grad_ready(0);
      ddp.synchronize();
      std::vector<float> flat = db;
      flat.insert(flat.end(), dw.begin(), dw.end());
      std::lock_guard lock(mutex);
      auto& expected = results[static_cast<std::size_t>(s)];
      if (expected.empty()) {
        expected = flat;
      } else {
        EXPECT_EQ(expected, flat) << "ranks disagree at step " << s;
      }
    }
    if (stats && g.rank() == 0) *stats = ddp.stats();
  });
  return results;
}

// Every rank's gradients for one step as the bucket's flat [b, w], plus the residuals.
std::vector<std::vector<float>> bucket_grads(int step) {
  std::vector<std::vector<float>> all;
  for (int r = 0; r < kWorld; ++r) {
    auto flat = Grads::b(r, step);
    const auto w = Grads::w(r, step);
    flat.insert(flat.end(), w.begin(), w.end());
    all.push_back(flat);
  }
  return all;
}

TEST(Compression, FastConversionsAreBitIdenticalToHalfAndBFloat16) {
  for (std::uint32_t h = 0; h <= 0xFFFFu; ++h) {
    const Half half{static_cast<std::uint16_t>(h)};
    const float a = half.to_float(), b = detail::float_from_half_bits(half.bits);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(a), std::bit_cast<std::uint32_t>(b)) << std::hex << h;
  }
  // Every 997th float bit pattern (all exponents, both signs), and the rounding edges.
  std::vector<std::uint32_t> patterns{0x38800000u, 0x387FFFFFu, 0x477FEFFFu, 0x477FF000u,
                                      0x33000000u, 0x33000001u, 0x7F800000u, 0x7FC00000u};
  for (std::uint64_t x = 0; x <= 0xFFFFFFFFull; x += 997) {
    patterns.push_back(static_cast<std::uint32_t>(x));
  }
  patterns.push_back(0x7F800001u);  // a signalling NaN: bf16 keeps it quiet
  patterns.push_back(0xFFFFFFFFu);
  for (const std::uint32_t x : patterns) {
    const float f = std::bit_cast<float>(x);
    ASSERT_EQ(detail::half_bits_from_float(f), Half::from_float(f).bits) << std::hex << x;
    ASSERT_EQ(detail::bf16_bits_from_float(f), BFloat16::from_float(f).bits) << std::hex << x;
  }
}

TEST(Compression, TheBucketLoopsGiveTheHalfConversionsValues) {
  // encode_half and decode_half (in hardware where the CPU converts) against the conversions
  // above, value by value: every half, and every 997th float pattern with the rounding edges, in
  // buckets whose lengths are no multiple of the 8 a hardware step takes.
  std::vector<std::uint16_t> halves;
  for (std::uint32_t h = 0; h <= 0xFFFFu; ++h) halves.push_back(static_cast<std::uint16_t>(h));
  halves.push_back(0x3C00u);  // 65537 of them
  std::vector<float> decoded(halves.size());
  detail::decode_half(halves.data(), decoded.data(), halves.size());
  for (std::size_t i = 0; i < halves.size(); ++i) {
    const float expected = detail::float_from_half_bits(halves[i]);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(decoded[i])) << std::hex << halves[i];
    } else {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(decoded[i]), std::bit_cast<std::uint32_t>(expected))
          << std::hex << halves[i];
    }
  }
  std::vector<float> acc{std::bit_cast<float>(0x38800000u),
                         std::bit_cast<float>(0x387FFFFFu),
                         std::bit_cast<float>(0x477FEFFFu),
                         std::bit_cast<float>(0x477FF000u),
                         std::bit_cast<float>(0x33000001u),
                         -0.0f,
                         65519.0f,
                         65520.0f};
  for (std::uint64_t x = 0; x <= 0xFFFFFFFFull; x += 997) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(x));
    if (!std::isnan(f)) acc.push_back(f);
  }
  acc.push_back(1.0f);  // no multiple of 8
  for (const float scale : {1.0f, 0.25f}) {
    std::vector<std::uint16_t> wire(acc.size());
    std::vector<float> residual(acc.size());
    detail::encode_half(acc.data(), wire.data(), scale, residual.data(), acc.size());
    // The fused pass, from a gradient and a residual whose sum is about acc (half and the rest).
    std::vector<float> flat(acc.size()), kept(acc.size());
    std::vector<std::uint16_t> fused(acc.size());
    for (std::size_t i = 0; i < acc.size(); ++i) {
      flat[i] = acc[i] * 0.5f;
      kept[i] = acc[i] - flat[i];
    }
    std::vector<float> sum(acc.size());
    for (std::size_t i = 0; i < acc.size(); ++i) sum[i] = flat[i] + kept[i];
    detail::widen_encode_half(flat.data(), kept.data(), fused.data(), scale, acc.size());
    for (std::size_t i = 0; i < acc.size(); ++i) {
      const std::uint16_t half = detail::half_bits_from_float(acc[i] * scale);
      ASSERT_EQ(wire[i], half) << std::hex << std::bit_cast<std::uint32_t>(acc[i]);
      const std::uint16_t fused_half = detail::half_bits_from_float(sum[i] * scale);
      ASSERT_EQ(fused[i], fused_half) << std::hex << std::bit_cast<std::uint32_t>(acc[i]);
      const float rest = acc[i] - detail::float_from_half_bits(half) / scale;
      const float fused_rest = sum[i] - detail::float_from_half_bits(fused_half) / scale;
      if (std::isnan(rest) || std::isnan(fused_rest)) continue;  // inf - inf
      ASSERT_EQ(std::bit_cast<std::uint32_t>(residual[i]), std::bit_cast<std::uint32_t>(rest))
          << std::hex << std::bit_cast<std::uint32_t>(acc[i]);
      ASSERT_EQ(std::bit_cast<std::uint32_t>(kept[i]), std::bit_cast<std::uint32_t>(fused_rest))
          << std::hex << std::bit_cast<std::uint32_t>(acc[i]);
    }
  }
  // decode_half_checked: decoding and scaling in one pass, every value as the two, and whether
  // every one is finite, an inf or NaN in the hardware steps or in the tail.
  for (const float factor : {1.0f, 4.0f}) {
    std::vector<std::uint16_t> finite;
    for (const auto h : halves) {
      if (!std::isnan(detail::float_from_half_bits(h)) &&
          !std::isinf(detail::float_from_half_bits(h) * factor)) {
        finite.push_back(h);
      }
    }
    std::vector<float> out(finite.size());
    ASSERT_TRUE(detail::decode_half_checked(finite.data(), out.data(), factor, finite.size()));
    for (std::size_t i = 0; i < finite.size(); ++i) {
      const float expected = detail::float_from_half_bits(finite[i]) * factor;
      ASSERT_EQ(std::bit_cast<std::uint32_t>(out[i]), std::bit_cast<std::uint32_t>(expected))
          << std::hex << finite[i];
    }
    for (const std::uint16_t bad : {std::uint16_t{0x7C00u}, std::uint16_t{0xFE00u}}) {
      for (const std::size_t at : {std::size_t{3}, finite.size() - 1}) {
        std::vector<std::uint16_t> poisoned = finite;
        poisoned[at] = bad;
        EXPECT_FALSE(
            detail::decode_half_checked(poisoned.data(), out.data(), factor, poisoned.size()))
            << std::hex << bad << " at " << std::dec << at;
      }
    }
  }
  std::cout << "half conversions in hardware: " << (detail::half_in_hardware() ? "yes" : "no")
            << "\n";
}

TEST(CompressionSpec, ParsesAndPrintsEveryMode) {
  for (const char* spec :
       {"none", "fp16", "bf16", "topk:0.01", "threshold:0.001", "powersgd:2", "powersgd:2:1000"}) {
    EXPECT_EQ(Compression::parse(spec).to_string(), spec);
  }
  EXPECT_EQ(Compression::parse("topk:0.25").ratio, 0.25);
  EXPECT_EQ(Compression::parse("powersgd:4").rank, 4);
  EXPECT_EQ(Compression::parse("powersgd:4").warmup, 0u);
  EXPECT_EQ(Compression::parse("powersgd:4:250").rank, 4);
  EXPECT_EQ(Compression::parse("powersgd:4:250").warmup, 250u);
  for (const char* spec : {"every-step", "partial:4", "local-sgd:8"}) {
    EXPECT_EQ(SyncStrategy::parse(spec).to_string(), spec);
  }
  EXPECT_EQ(SyncStrategy::parse("local-sgd:8").period, 8);
  EXPECT_EQ(SyncStrategy::parse("partial:3").chunks, 3);
}

TEST(CompressionSpec, BadSpecsAreOneLineErrorsNamingTheSpec) {
  const std::pair<const char*, const char*> bad[] = {
      {"topk", "RATIO must be"},
      {"topk:0", "RATIO must be"},
      {"topk:1.5", "RATIO must be"},
      {"topk:abc", "RATIO must be"},
      {"threshold:-1", "T must be"},
      {"threshold:nan", "T must be"},
      {"powersgd:0", "RANK must be"},
      {"powersgd:2.5", "RANK must be"},
      {"powersgd::9", "RANK must be"},
      {"powersgd:2:0", "WARMUP must be"},
      {"powersgd:2:", "WARMUP must be"},
      {"powersgd:2:-4", "WARMUP must be"},
      {"powersgd:2:1e3", "WARMUP must be"},
      {"powersgd:2:5:1", "WARMUP must be"},
      {"fp16:3", "takes no value"},
      {"zip", "unknown compression"},
      {"", "unknown compression"},
  };
  for (const auto& [spec, why] : bad) {
    try {
      Compression::parse(spec);
      ADD_FAILURE() << "accepted '" << spec << "'";
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string("'") + spec + "'"), std::string::npos) << what;
      EXPECT_NE(what.find(why), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
  for (const char* spec : {"partial", "partial:0", "local-sgd:-2", "local-sgd:x", "sometimes"}) {
    EXPECT_THROW(SyncStrategy::parse(spec), std::invalid_argument) << spec;
  }
}

// fp16 and bf16: each rank sends T(acc / 2); the sum is T's (a small bucket: an all-gather, its
// sum rounded as the all-reduce of a large one rounds it); the residual keeps
// acc - float(sent) * 2 for the next step.
template <typename T>
void check_cast(const std::string& spec) {
  constexpr int kSteps = 3;
  const auto got = run_steps(spec, kSteps);
  std::vector<std::vector<float>> residual(kWorld);
  for (int s = 0; s < kSteps; ++s) {
    const auto grads = bucket_grads(s);
    const std::size_t n = grads[0].size();
    std::vector<float> expected(n);
    for (std::size_t i = 0; i < n; ++i) {
      float sum = 0.0f;
      std::vector<T> sent(kWorld);
      for (int r = 0; r < kWorld; ++r) {
        auto& res = residual[static_cast<std::size_t>(r)];
        res.resize(n, 0.0f);
        const float acc = grads[static_cast<std::size_t>(r)][i] + res[i];
        sent[static_cast<std::size_t>(r)] = T::from_float(acc * 0.5f);
        res[i] = acc - sent[static_cast<std::size_t>(r)].to_float() / 0.5f;
      }
      sum = sent[0].to_float() + sent[1].to_float();
      expected[i] = T::from_float(sum).to_float();
    }
    ASSERT_EQ(got[static_cast<std::size_t>(s)], expected) << spec << " step " << s;
  }
}

TEST(Compression, Fp16IsTheRoundedAverageWithTheResidualCarriedOver) {
  check_cast<Half>("fp16");
}
TEST(Compression, Bf16IsTheRoundedAverageWithTheResidualCarriedOver) {
  check_cast<BFloat16>("bf16");
}

// A gradient past fp16's range at every step (up to 1e6: 5e5 a rank after the division by the
// world, where fp16 ends at 65504): the scale halves at each skipped exchange until the average
// fits, the sum in fp16 too (1 / 16: four skips), then every step is applied, the average within
// fp16's precision.
// Without the scale every step was skipped for good. A state saved at that scale resumes it (the
// next step bit-identical to the uninterrupted one's, and not skipped); a state of the format
// before the scale (DDPSTAT1) loads with the scale at 1.
TEST(Compression, Fp16ScalesDownUntilAGradientPastItsRangeFitsAndKeepsTheScaleInItsState) {
  constexpr std::size_t kN = 64;
  auto grad = [](int rank, std::size_t i) {
    const float base = rank == 0 ? 1e6f : 9e5f;
    return base * (0.5f + 0.5f * static_cast<float>(i) / (kN - 1));
  };
  std::mutex mutex;
  std::map<int, std::vector<float>> last, resumed;
  std::map<int, std::uint64_t> skipped, skipped_after_resume;
  on_ranks(kWorld, [&](ProcessGroup& g) {
    std::vector<float> v(kN), dv(kN), v2(kN), dv2(kN);
    DistributedDataParallel ddp(g, {{"v", v, dv}}, with("fp16"));
    auto step = [&](DistributedDataParallel& d, std::vector<float>& grads) {
      for (std::size_t i = 0; i < kN; ++i) grads[i] = grad(g.rank(), i);
      d.synchronize();
    };
    for (int s = 0; s < 6; ++s) step(ddp, dv);
    DistributedDataParallel again(g, {{"v", v2, dv2}}, with("fp16"));
    again.load_state(ddp.state());
    step(ddp, dv);
    step(again, dv2);

    std::string state = DistributedDataParallel(g, {{"v", v2, dv2}}, with("fp16")).state();
    ASSERT_EQ(state.substr(0, 8), "DDPSTAT2");
    state[7] = '1';
    state.resize(state.size() - 16);  // the fp16 bucket's scale and count
    DistributedDataParallel old(g, {{"v", v2, dv2}}, with("fp16"));
    EXPECT_NO_THROW(old.load_state(state));
    state.resize(state.size() - 1);
    EXPECT_THROW(old.load_state(state), std::invalid_argument);

    std::lock_guard lock(mutex);
    last[g.rank()] = dv;
    resumed[g.rank()] = dv2;
    skipped[g.rank()] = ddp.stats().nonfinite_skipped;
    skipped_after_resume[g.rank()] = again.stats().nonfinite_skipped;
  });
  EXPECT_EQ(skipped, (std::map<int, std::uint64_t>{{0, 4}, {1, 4}}));
  EXPECT_EQ(skipped_after_resume, (std::map<int, std::uint64_t>{{0, 0}, {1, 0}}));
  EXPECT_EQ(last[0], last[1]);
  EXPECT_EQ(resumed[0], last[0]) << "the resumed step is the uninterrupted one";
  for (std::size_t i = 0; i < kN; ++i) {
    const double mean = (double{grad(0, i)} + grad(1, i)) / 2;
    EXPECT_NEAR(last[0][i], mean, 2e-3 * mean) << i;
  }
}

void check_fp16_of_three_ranks(std::size_t n);

// Three ranks, a small bucket (2 KB of fp16 a rank, where two ranks all-gather) and 80 KB: Gloo's
// ring all-reduce in float16 (partial sums rounded to half), so the result is within a few half
// ulps of the mean, and half float32's bytes (an all-gather would send (W - 1) n).
TEST(Compression, Fp16OfThreeRanksUsesTheRingAllReduceAndSendsHalfFloat32sBytes) {
  for (const std::size_t n : {std::size_t{1000}, std::size_t{40000}}) {
    SCOPED_TRACE(n);
    check_fp16_of_three_ranks(n);
  }
}

void check_fp16_of_three_ranks(std::size_t kN) {
  constexpr int kRanks = 3;
  std::mutex mutex;
  std::vector<std::vector<float>> results;
  on_ranks(kRanks, [&](ProcessGroup& g) {
    std::vector<float> v(kN), dv = random_values(kN, 70 + static_cast<unsigned>(g.rank()));
    DistributedDataParallel ddp(g, {{"v", v, dv}}, with("fp16"));
    ddp.synchronize();
    EXPECT_EQ(ddp.stats().bytes_sent, 2 * (kRanks - 1) * kN * 2 / kRanks);
    std::lock_guard lock(mutex);
    results.push_back(dv);
  });
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
  std::vector<std::vector<float>> grads;
  for (int r = 0; r < kRanks; ++r)
    grads.push_back(random_values(kN, 70 + static_cast<unsigned>(r)));
  for (std::size_t i = 0; i < kN; ++i) {
    const double mean = (double{grads[0][i]} + grads[1][i] + grads[2][i]) / kRanks;
    EXPECT_NEAR(results[0][i], mean, 4e-3 * std::max(1.0, std::fabs(mean))) << i;
  }
}

// A bucket past all_sum's gather size is all-reduced in its 16-bit type and decoded, scaled and
// checked for inf and NaN in one pass (Ops::decode16_guarded): one rank's inf or NaN there, or a
// value past fp16's range, zeroes the bucket's average on every rank and is counted, and the next
// step's average is the clean one (nothing of it stayed in a residual).
TEST(Compression, AnInfOrNanInALargeBucketIsSkippedOnEveryRankAndLeavesNothingBehind) {
  constexpr std::size_t kN = 40000;  // past kGatherBytes in either 16-bit type
  for (const char* mode : {"fp16", "bf16"}) {
    for (const float bad :
         {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(), 3e5f}) {
      if (bad == 3e5f && std::string(mode) == "bf16") continue;  // in bf16's range
      SCOPED_TRACE(std::string(mode) + " " + std::to_string(bad));
      on_ranks(2, [&](ProcessGroup& g) {
        std::vector<float> v(kN), dv = random_values(kN, 80 + static_cast<unsigned>(g.rank()));
        if (g.rank() == 1) dv[kN - 3] = bad;  // in the hardware loops' scalar tail, and
        if (g.rank() == 1) dv[5] = bad;       // in its vector part
        DistributedDataParallel ddp(g, {{"v", v, dv}}, with(mode));
        ddp.synchronize();
        for (const float x : dv) ASSERT_EQ(x, 0.0f) << "the step's average is skipped";
        EXPECT_EQ(ddp.stats().nonfinite_skipped, 1u);
        const auto next = random_values(kN, 90 + static_cast<unsigned>(g.rank()));
        std::copy(next.begin(), next.end(), dv.begin());  // (the DDP holds dv's memory)
        ddp.synchronize();
        const auto a = random_values(kN, 90), b = random_values(kN, 91);
        for (std::size_t i = 0; i < kN; ++i) {
          ASSERT_TRUE(std::isfinite(dv[i])) << i;
          const double mean = (double{a[i]} + b[i]) / 2;
          ASSERT_NEAR(dv[i], mean, 1e-2 * std::max(1.0, std::fabs(mean))) << i;
        }
        EXPECT_EQ(ddp.stats().nonfinite_skipped, 1u);
        EXPECT_EQ(ddp.stats().nonfinite_cleaned, 0u);
      });
    }
  }
}

// The k = ceil(ratio n) entries of each rank largest in magnitude (ties: lower index), summed
// over ranks in rank order and halved; the rest stays in the residual.
std::vector<std::vector<float>> sparse_reference(
    int steps, const std::function<std::vector<std::size_t>(const std::vector<float>&)>& pick) {
  std::vector<std::vector<float>> out;
  std::vector<std::vector<float>> residual(kWorld);
  for (int s = 0; s < steps; ++s) {
    const auto grads = bucket_grads(s);
    const std::size_t n = grads[0].size();
    std::vector<float> dense(n, 0.0f);
    for (int r = 0; r < kWorld; ++r) {
      auto& res = residual[static_cast<std::size_t>(r)];
      res.resize(n, 0.0f);
      std::vector<float> acc(n);
      for (std::size_t i = 0; i < n; ++i) acc[i] = grads[static_cast<std::size_t>(r)][i] + res[i];
      res = acc;
      for (std::size_t i : pick(acc)) {
        dense[i] += acc[i];
        res[i] = 0.0f;
      }
    }
    for (auto& v : dense) v *= 0.5f;
    out.push_back(dense);
  }
  return out;
}

TEST(Compression, TopKSendsTheLargestEntriesOfEachRank) {
  constexpr int kSteps = 4;
  const auto got = run_steps("topk:0.05", kSteps);
  const auto expected = sparse_reference(kSteps, [](const std::vector<float>& acc) {
    std::vector<std::size_t> order(acc.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return std::fabs(acc[a]) > std::fabs(acc[b]);
    });
    order.resize(static_cast<std::size_t>(std::ceil(0.05 * static_cast<double>(acc.size()))));
    return order;
  });
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_EQ(got[static_cast<std::size_t>(s)], expected[static_cast<std::size_t>(s)]) << s;
  }
}

TEST(Compression, ThresholdSendsTheEntriesAboveIt) {
  constexpr int kSteps = 4;
  constexpr float kT = 1.8f;
  const auto got = run_steps("threshold:1.8", kSteps);
  const auto expected = sparse_reference(kSteps, [](const std::vector<float>& acc) {
    std::vector<std::size_t> picked;
    for (std::size_t i = 0; i < acc.size(); ++i) {
      if (std::fabs(acc[i]) >= kT) picked.push_back(i);
    }
    return picked;
  });
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_EQ(got[static_cast<std::size_t>(s)], expected[static_cast<std::size_t>(s)]) << s;
  }
}

TEST(Compression, TopKBreaksTiesByTheLowerIndex) {
  on_ranks(1, [](ProcessGroup& g) {
    std::vector<float> v(8), grad{0.5f, -2.0f, 2.0f, 1.0f, -2.0f, 2.0f, 0.1f, 0.0f};
    DistributedDataParallel ddp(g, {{"v", v, grad}}, with("topk:0.25"));  // k = 2
    ddp.synchronize();
    EXPECT_EQ(grad, (std::vector<float>{0, -2.0f, 2.0f, 0, 0, 0, 0, 0}));
    // The ties left behind come first next time (their residual is 2 + the new gradient).
    grad.assign(8, 0.0f);
    ddp.synchronize();
    EXPECT_EQ(grad, (std::vector<float>{0, 0, 0, 0, -2.0f, 2.0f, 0, 0}));
  });
}

// Double-precision Gram-Schmidt of the columns of m (rows x r).
void orthonormalize(std::vector<double>& m, std::size_t rows, std::size_t r) {
  for (std::size_t c = 0; c < r; ++c) {
    double norm = 0;
    for (std::size_t i = 0; i < rows; ++i) norm += m[i * r + c] * m[i * r + c];
    norm = std::sqrt(norm);
    for (std::size_t i = 0; i < rows; ++i) m[i * r + c] /= norm;
    for (std::size_t d = c + 1; d < r; ++d) {
      double dot = 0;
      for (std::size_t i = 0; i < rows; ++i) dot += m[i * r + c] * m[i * r + d];
      for (std::size_t i = 0; i < rows; ++i) m[i * r + d] -= dot * m[i * r + c];
    }
  }
}

// P P^T M for the orthonormalized columns P of x (rows x r): the projection of M (rows x cols)
// onto their span, whatever basis of it x holds.
std::vector<double> project(std::vector<double> x, const std::vector<double>& m, std::size_t rows,
                            std::size_t cols, std::size_t r) {
  orthonormalize(x, rows, r);
  std::vector<double> out(rows * cols, 0);
  for (std::size_t c = 0; c < r; ++c) {
    for (std::size_t j = 0; j < cols; ++j) {
      double pm = 0;  // (P^T M)[c][j]
      for (std::size_t i = 0; i < rows; ++i) pm += x[i * r + c] * m[i * cols + j];
      for (std::size_t i = 0; i < rows; ++i) out[i * cols + j] += x[i * r + c] * pm;
    }
  }
  return out;
}

// a (rows x inner, or inner x rows transposed) times b (inner x cols).
std::vector<double> times(const std::vector<double>& a, const std::vector<double>& b,
                          std::size_t rows, std::size_t inner, std::size_t cols, bool transpose) {
  std::vector<double> c(rows * cols, 0);
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t k = 0; k < inner; ++k) {
      const double av = transpose ? a[k * rows + i] : a[i * inner + k];
      for (std::size_t j = 0; j < cols; ++j) c[i * cols + j] += av * b[k * cols + j];
    }
  }
  return c;
}

// PowerSGD against the direct computation, in double precision: M = the ranks' mean of gradient
// plus residual, P = orth(M Q) with Q = M_prev^T P_prev of the step before (warm start), the
// result P P^T M; the bias (one-dimensional) averaged exactly; residual = own M - result. Q's
// random start is the SDK's: the first step is checked as a projection of M onto a rank-2 span
// (taken from the result), and that span then carries the warm start of the steps after it.
TEST(Compression, PowerSgdMatchesADirectLowRankComputation) {
  constexpr int kSteps = 4;
  constexpr std::size_t kRank = 2, kRows = Grads::kRows, kCols = Grads::kCols, kBias = Grads::kBias;
  const auto got = run_steps("powersgd:2", kSteps);
  std::vector<std::vector<double>> residual(kWorld, std::vector<double>(kRows * kCols, 0));
  std::vector<double> q;  // cols x rank: a basis-free stand-in for the SDK's warm-start Q
  for (int s = 0; s < kSteps; ++s) {
    const auto grads = bucket_grads(s);
    const auto& out = got[static_cast<std::size_t>(s)];
    for (std::size_t i = 0; i < kBias; ++i) {
      EXPECT_FLOAT_EQ(out[i], (grads[0][i] + grads[1][i]) / 2) << "bias " << i << " step " << s;
    }
    std::vector<double> m(kRows * kCols, 0), result(out.begin() + kBias, out.end());
    for (int r = 0; r < kWorld; ++r) {
      for (std::size_t i = 0; i < m.size(); ++i) {
        m[i] += (grads[static_cast<std::size_t>(r)][kBias + i] +
                 residual[static_cast<std::size_t>(r)][i]) /
                kWorld;
      }
    }
    std::vector<double> p;  // rows x rank, spanning what the SDK's P spans
    if (s == 0) {
      std::vector<double> probe(kCols * kRank);
      for (std::size_t i = 0; i < probe.size(); ++i)
        probe[i] = std::sin(1.0 + static_cast<double>(i));
      p = times(result, probe, kRows, kCols, kRank, false);
    } else {
      p = times(m, q, kRows, kCols, kRank, false);  // M Q
    }
    const auto expected = project(p, m, kRows, kCols, kRank);
    double scale = 0;
    for (double v : m) scale = std::max(scale, std::fabs(v));
    for (std::size_t i = 0; i < expected.size(); ++i) {
      ASSERT_NEAR(result[i], expected[i], 1e-5 * scale) << "step " << s << " entry " << i;
    }
    orthonormalize(p, kRows, kRank);
    q = times(m, p, kCols, kRows, kRank, true);  // M^T P
    for (int r = 0; r < kWorld; ++r) {
      auto& res = residual[static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < res.size(); ++i) {
        res[i] = grads[static_cast<std::size_t>(r)][kBias + i] + res[i] - expected[i];
      }
    }
  }
}

// powersgd:2:3: the first three steps are the exact average (as without compression), and from
// the fourth PowerSGD starts afresh (its residual empty, Q at its start): the steps after the
// warm-up are those of a powersgd:2 run whose gradients begin at step 3.
TEST(Compression, PowerSgdWarmUpAveragesWholeThenCompressesFromAFreshStart) {
  constexpr int kWarmUp = 3, kSteps = 6;
  CommunicationStats stats, plain_stats;
  const auto got = run_steps("powersgd:2:3", kSteps, 0, &stats);
  const auto exact = run_steps("none", kWarmUp, 0, &plain_stats);
  const auto after = run_steps("powersgd:2", kSteps - kWarmUp, kWarmUp);
  for (int s = 0; s < kWarmUp; ++s) {
    EXPECT_EQ(got[static_cast<std::size_t>(s)], exact[static_cast<std::size_t>(s)]) << s;
  }
  for (int s = kWarmUp; s < kSteps; ++s) {
    EXPECT_EQ(got[static_cast<std::size_t>(s)], after[static_cast<std::size_t>(s - kWarmUp)]) << s;
    EXPECT_NE(got[static_cast<std::size_t>(s)], run_steps("none", 1, s)[0]) << "compressed " << s;
  }
  EXPECT_EQ(stats.dense_exchanges, static_cast<std::uint64_t>(kWarmUp));
  const std::uint64_t compressed = (16 * 2 + 12) * 4 + (12 * 2) * 4;  // P and the bias, then Q
  EXPECT_EQ(stats.bytes_sent, kWarmUp * plain_stats.bytes_per_step() + 3 * compressed);
}

// Top-k with k x world >= the bucket's size would send more than a dense all-reduce: the bucket is
// averaged whole (exactly, its residual empty), said once on rank 0, counted; a ratio below it
// stays sparse and says nothing.
TEST(Compression, TopKThatWouldSendMoreThanDenseAveragesWholeAndSaysSo) {
  constexpr int kSteps = 3;
  const auto exact = run_steps("none", kSteps);
  CommunicationStats dense_stats, sparse_stats, plain_stats;
  run_steps("none", 1, 0, &plain_stats);
  ::testing::internal::CaptureStderr();
  const auto dense = run_steps("topk:0.5", kSteps, 0, &dense_stats);  // k = 102 of 204, 2 ranks
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(dense, exact) << "averaged whole; nothing carried in a residual";
  EXPECT_EQ(dense_stats.dense_exchanges, static_cast<std::uint64_t>(kSteps));
  EXPECT_EQ(dense_stats.bytes_per_step(), plain_stats.bytes_per_step());
  EXPECT_NE(said.find("topk:0.5 would send more than a dense all-reduce in a world of 2"),
            std::string::npos)
      << said;
  EXPECT_EQ(said.find("would send more", said.find("would send more") + 1), std::string::npos)
      << "said once: " << said;

  ::testing::internal::CaptureStderr();
  const auto sparse = run_steps("topk:0.45", kSteps, 0, &sparse_stats);  // k = 92: 184 < 204
  EXPECT_EQ(::testing::internal::GetCapturedStderr().find("would send more"), std::string::npos);
  EXPECT_NE(sparse, exact);
  EXPECT_EQ(sparse_stats.dense_exchanges, 0u);
  EXPECT_LT(sparse_stats.bytes_per_step(), plain_stats.bytes_per_step());
}

// Threshold decides at each step from the largest count: a step where most entries pass is
// averaged whole (residual emptied), a step where few do is sparse (the rest kept), and what stays
// below the threshold stays in the residual.
TEST(Compression, ThresholdAveragesWholeAtAStepWhereSparseWouldSendMore) {
  constexpr std::size_t kN = 100;
  std::mutex mutex;
  std::vector<std::vector<float>> results[2];
  std::vector<CommunicationStats> stats(kWorld);
  on_ranks(kWorld, [&](ProcessGroup& g) {
    const float own = static_cast<float>(g.rank() + 1);  // 1 and 2
    std::vector<float> v(kN), grad(kN);
    DistributedDataParallel ddp(g, {{"v", v, grad}}, with("threshold:0.5"));
    std::vector<std::vector<float>> mine;
    // Step 0: 60 entries pass (60 x 2 ranks >= 100): dense, the exact average of everything,
    // the 0.4s under the threshold included (none of them left in the residual).
    std::fill(grad.begin(), grad.end(), 0.4f);
    std::fill(grad.begin(), grad.begin() + 60, own);
    ddp.synchronize();
    mine.push_back(grad);
    // Step 1: three entries pass (3 x 2 < 100): sparse. The 0.2s wait in the residual (had step 0
    // left its 0.4s there, they would pass now: 0.6).
    std::fill(grad.begin(), grad.end(), 0.2f);
    grad[7] = grad[70] = grad[93] = 5.0f * own;
    ddp.synchronize();
    mine.push_back(grad);
    // Step 2: nothing new; the residual (0.2, under 0.5) is not sent.
    std::fill(grad.begin(), grad.end(), 0.0f);
    ddp.synchronize();
    mine.push_back(grad);
    stats[static_cast<std::size_t>(g.rank())] = ddp.stats();
    std::lock_guard lock(mutex);
    results[g.rank()] = mine;
  });
  EXPECT_EQ(results[0], results[1]);
  std::vector<float> dense(kN, 0.4f);
  std::fill(dense.begin(), dense.begin() + 60, 1.5f);
  EXPECT_EQ(results[0].at(0), dense);
  std::vector<float> sparse(kN, 0.0f);
  sparse[7] = sparse[70] = sparse[93] = 7.5f;
  EXPECT_EQ(results[0].at(1), sparse) << "step 0 left no residual; the small entries wait";
  EXPECT_EQ(results[0].at(2), std::vector<float>(kN, 0.0f));
  EXPECT_EQ(stats[0].dense_exchanges, 1u);
  EXPECT_EQ(stats[1].dense_exchanges, 1u);
}

// A mean gradient of rank 2 is what rank-2 PowerSGD reproduces exactly, from any start.
TEST(Compression, PowerSgdReproducesALowRankMean) {
  constexpr std::size_t kRows = 10, kCols = 9;
  std::vector<float> expected(kRows * kCols);
  std::mutex mutex;
  std::vector<std::vector<float>> results;
  on_ranks(kWorld, [&](ProcessGroup& g) {
    // Rank r sends 2 u_r v_r^T: rank one each, the mean u_0 v_0^T + u_1 v_1^T of rank two.
    const auto u = random_values(kRows, 7 + static_cast<unsigned>(g.rank()));
    const auto v = random_values(kCols, 17 + static_cast<unsigned>(g.rank()));
    std::vector<float> w(kRows * kCols), dw(w.size());
    for (std::size_t i = 0; i < kRows; ++i) {
      for (std::size_t j = 0; j < kCols; ++j) dw[i * kCols + j] = 2 * u[i] * v[j];
    }
    DistributedDataParallel ddp(g, {{"w", w, dw, {kRows, kCols}}}, with("powersgd:2"));
    ddp.synchronize();
    std::lock_guard lock(mutex);
    results.push_back(dw);
  });
  for (std::size_t i = 0; i < kRows; ++i) {
    for (std::size_t j = 0; j < kCols; ++j) {
      double mean = 0;
      for (int r = 0; r < kWorld; ++r) {
        const auto u = random_values(kRows, 7 + static_cast<unsigned>(r));
        const auto v = random_values(kCols, 17 + static_cast<unsigned>(r));
        mean += u[i] * v[j];
      }
      ASSERT_NEAR(results.at(0)[i * kCols + j], mean, 1e-4) << i << ", " << j;
    }
  }
  EXPECT_EQ(results.at(0), results.at(1));
}

// Local SGD and partial: gradients stay local; after_step() averages every parameter each K-th
// step, or one slice of each bucket per step.
TEST(Compression, LocalSgdAveragesEveryKStepsAndPartialOneSlicePerStep) {
  constexpr std::size_t kN = 8;
  for (const std::string sync : {"local-sgd:3", "partial:4"}) {
    SCOPED_TRACE(sync);
    std::mutex mutex;
    std::map<int, std::vector<std::vector<float>>> trajectory;  // rank -> values after each step
    on_ranks(kWorld, [&](ProcessGroup& g) {
      std::vector<float> v(kN, 1.0f), grad(kN);
      DistributedDataParallel ddp(g, {{"v", v, grad}}, with("none", sync));
      for (int s = 0; s < 6; ++s) {
        for (std::size_t i = 0; i < kN; ++i)
          grad[i] = static_cast<float>((g.rank() + 1) * (s + 1) + i);
        const auto before = grad;
        ddp.grad_ready(0);
        ddp.synchronize();
        EXPECT_EQ(grad, before) << "gradients stay local";
        for (std::size_t i = 0; i < kN; ++i) v[i] -= 0.5f * grad[i];
        ddp.after_step();
        std::lock_guard lock(mutex);
        trajectory[g.rank()].push_back(v);
      }
    });
    // Replay both ranks here: local steps, then the averaging the strategy does.
    std::vector<std::vector<float>> v(kWorld, std::vector<float>(kN, 1.0f));
    for (int s = 0; s < 6; ++s) {
      for (int r = 0; r < kWorld; ++r) {
        for (std::size_t i = 0; i < kN; ++i) {
          v[static_cast<std::size_t>(r)][i] -= 0.5f * static_cast<float>((r + 1) * (s + 1) + i);
        }
      }
      std::size_t begin = 0, end = 0;
      if (sync == "local-sgd:3") {
        end = (s + 1) % 3 == 0 ? kN : 0;
      } else {
        begin = 2 * static_cast<std::size_t>(s % 4), end = begin + 2;
      }
      for (std::size_t i = begin; i < end; ++i) {
        const float mean = (v[0][i] + v[1][i]) / 2;
        v[0][i] = v[1][i] = mean;
      }
      for (int r = 0; r < kWorld; ++r) {
        EXPECT_EQ(trajectory[r].at(static_cast<std::size_t>(s)), v[static_cast<std::size_t>(r)])
            << "rank " << r << " step " << s;
      }
    }
  }
}

// Bytes per step, by the ring formulas, for a bucket of 16 x 12 + 12 = 204 floats on 2 ranks.
TEST(Compression, BytesSentFollowTheRingFormulas) {
  const std::pair<const char*, std::uint64_t> expected[] = {
      {"none", 204 * 4},
      {"fp16", 204 * 2},
      {"bf16", 204 * 2},
      {"topk:0.05", 11 * 8},  // ceil(0.05 x 204) entries of (index, value), all-gathered
      {"powersgd:2", (16 * 2 + 12) * 4 + (12 * 2) * 4},  // P and the bias, then Q
  };
  for (const auto& [spec, bytes] : expected) {
    on_ranks(kWorld, [&](ProcessGroup& g) {
      std::vector<float> w(16 * 12), b(12), dw(w.size(), 1.0f), db(b.size(), 1.0f);
      DistributedDataParallel ddp(g, {{"w", w, dw, {16, 12}}, {"b", b, db}}, with(spec));
      for (int s = 0; s < 3; ++s) ddp.synchronize();
      EXPECT_EQ(ddp.stats().steps, 3u);
      EXPECT_EQ(ddp.stats().bytes_per_step(), bytes) << spec;
    });
  }
}

// Beside the formulas, what the group's sockets sent (Gloo's TCP payload): never less than the
// formula's bytes, which are the payload itself, and more only by Gloo's framing (a header per
// message, and the notices of its unbound buffers: here about 0.5 KB a step); each mode's measure
// below uncompressed.
TEST(Compression, TransportBytesAreMeasuredBesideTheFormulas) {
  constexpr int kSteps = 3;
  std::map<std::string, std::uint64_t> measured;
  for (const char* spec : {"none", "fp16", "topk:0.05", "powersgd:2"}) {
    std::mutex mutex;
    on_ranks(kWorld, [&](ProcessGroup& g) {
      std::vector<float> w(16 * 12), b(12), dw(w.size(), 1.0f), db(b.size(), 1.0f);
      DistributedDataParallel ddp(g, {{"w", w, dw, {16, 12}}, {"b", b, db}}, with(spec));
      for (int s = 0; s < kSteps; ++s) ddp.synchronize();
      const CommunicationStats stats = ddp.stats();
      ASSERT_TRUE(stats.transport_bytes_sent.has_value()) << spec << ": Gloo over TCP counts";
      const std::uint64_t per_step = *stats.transport_bytes_per_step();
      EXPECT_GE(per_step, stats.bytes_per_step()) << spec;
      EXPECT_LE(per_step, stats.bytes_per_step() + 1024) << spec << ": framing only";
      std::lock_guard lock(mutex);
      if (g.rank() == 0) measured[spec] = per_step;
    });
  }
  for (const char* spec : {"fp16", "topk:0.05", "powersgd:2"}) {
    EXPECT_LT(measured[spec], measured["none"]) << spec;
  }
  for (const auto& [spec, bytes] : measured)
    std::printf("%s: %llu B a step\n", spec.c_str(), static_cast<unsigned long long>(bytes));
}

// The exchange of a ready bucket runs without its rank calling synchronize(): rank 1 marks its
// gradients ready and waits for rank 0 to finish synchronize() before calling its own.
TEST(Compression, EveryModeExchangesWhileTheCallerGoesOn) {
  for (const char* spec : {"none", "fp16", "topk:0.1", "threshold:1.5", "powersgd:1"}) {
    SCOPED_TRACE(spec);
    std::promise<void> rank0_done;
    auto done = rank0_done.get_future().share();
    on_ranks(kWorld, [&](ProcessGroup& g) {
      std::vector<float> w(8 * 8), dw = random_values(64, 3), b(8), db(8, 1.0f);
      DistributedDataParallel ddp(g, {{"w", w, dw, {8, 8}}, {"b", b, db}}, with(spec));
      ddp.grad_ready(1);
      ddp.grad_ready(0);
      if (g.rank() == 0) {
        ddp.synchronize();
        rank0_done.set_value();
      } else {
        EXPECT_EQ(done.wait_for(30s), std::future_status::ready)
            << "rank 0's synchronize() waited for rank 1's";
        ddp.synchronize();
      }
    });
  }
}

// A small regression model trained with SGD and momentum, through DDP: what a restart test needs.
struct Regression {
  static constexpr std::size_t kIn = 12, kOut = 8, kBatch = 4;
  std::vector<float> w = random_values(kIn * kOut, 5, 0.3f), b = std::vector<float>(kOut, 0.0f);
  std::vector<float> dw = std::vector<float>(kIn * kOut), db = std::vector<float>(kOut);
  std::vector<float> vw = std::vector<float>(kIn * kOut), vb = std::vector<float>(kOut);

  // Called on each rank's gradients before they are handed to DDP (the inf/NaN tests' injection).
  std::function<void(int rank, int step, std::vector<float>& dw)> poison;

  std::vector<Parameter> parameters() { return {{"w", w, dw, {kOut, kIn}}, {"b", b, db}}; }
  // What the model learns: a fixed linear map of x, plus noise.
  static std::vector<float> targets(const std::vector<float>& x, std::size_t batch, unsigned seed) {
    static const auto teacher = random_values(kIn * kOut, 77, 0.5f);
    auto y = random_values(batch * kOut, seed, 0.1f);
    for (std::size_t s = 0; s < batch; ++s) {
      for (std::size_t o = 0; o < kOut; ++o) {
        for (std::size_t i = 0; i < kIn; ++i)
          y[s * kOut + o] += teacher[o * kIn + i] * x[s * kIn + i];
      }
    }
    return y;
  }
  // The mean squared error on a batch no step trains on.
  double held_out_loss() const {
    const auto x = random_values(64 * kIn, 424242);
    const auto y = targets(x, 64, 434343);
    double total = 0;
    for (std::size_t s = 0; s < 64; ++s) {
      for (std::size_t o = 0; o < kOut; ++o) {
        double out = b[o];
        for (std::size_t i = 0; i < kIn; ++i) out += w[o * kIn + i] * x[s * kIn + i];
        total += (out - y[s * kOut + o]) * (out - y[s * kOut + o]);
      }
    }
    return total / (64 * kOut);
  }
  void step(DistributedDataParallel& ddp, int rank, int step) {
    const auto x = random_values(kBatch * kIn, static_cast<unsigned>(1000 * step + rank));
    const auto y = targets(x, kBatch, static_cast<unsigned>(1000 * step + rank + 500));
    std::fill(dw.begin(), dw.end(), 0.0f);
    std::fill(db.begin(), db.end(), 0.0f);
    for (std::size_t s = 0; s < kBatch; ++s) {
      for (std::size_t o = 0; o < kOut; ++o) {
        float out = b[o];
        for (std::size_t i = 0; i < kIn; ++i) out += w[o * kIn + i] * x[s * kIn + i];
        const float err = (out - y[s * kOut + o]) / kBatch;
        db[o] += err;
        for (std::size_t i = 0; i < kIn; ++i) dw[o * kIn + i] += err * x[s * kIn + i];
      }
    }
    if (poison) poison(rank, step, dw);
    ddp.grad_ready(1);
    ddp.grad_ready(0);
    ddp.synchronize();
    for (auto [p, g, v] : {std::tuple{&w, &dw, &vw}, std::tuple{&b, &db, &vb}}) {
      for (std::size_t i = 0; i < p->size(); ++i) {
        (*v)[i] = 0.9f * (*v)[i] + (*g)[i];
        (*p)[i] -= 0.05f * (*v)[i];
      }
    }
    ddp.after_step();
  }
};

struct Saved {
  std::string ddp_state;
  Regression model;
  CommunicationStats stats;
};

// Trains steps [from, to) on every rank, from `saved` (per rank) if given; returns each rank's
// model and DDP state at the end.
std::vector<Saved> train(const DdpOptions& options, int from, int to,
                         const std::vector<Saved>* saved, bool load_state) {
  std::vector<Saved> out(kWorld);
  on_ranks(kWorld, [&](ProcessGroup& g) {
    const auto rank = static_cast<std::size_t>(g.rank());
    Regression& model = out[rank].model;
    DistributedDataParallel ddp(g, model.parameters(), options);
    if (saved) {  // a restart: this rank's own model and, unless told not to, its DDP state
      const Regression& before = (*saved)[rank].model;
      model.w = before.w, model.b = before.b, model.vw = before.vw, model.vb = before.vb;
      if (load_state) ddp.load_state((*saved)[rank].ddp_state);
    }
    for (int s = from; s < to; ++s) model.step(ddp, g.rank(), s);
    out[rank].ddp_state = ddp.state();
    out[rank].stats = ddp.stats();
  });
  return out;
}

class Restart : public ::testing::TestWithParam<std::pair<const char*, const char*>> {};

TEST_P(Restart, FromStateEndsBitIdenticalToAnUninterruptedRun) {
  const auto [compression, sync] = GetParam();
  const DdpOptions options = with(compression, sync);
  constexpr int kSteps = 12, kCut = 7;
  const auto whole = train(options, 0, kSteps, nullptr, false);
  const auto first = train(options, 0, kCut, nullptr, false);
  const auto resumed = train(options, kCut, kSteps, &first, true);
  for (std::size_t r = 0; r < kWorld; ++r) {
    EXPECT_EQ(resumed[r].model.w, whole[r].model.w) << "rank " << r;
    EXPECT_EQ(resumed[r].model.b, whole[r].model.b) << "rank " << r;
    EXPECT_EQ(resumed[r].ddp_state, whole[r].ddp_state) << "rank " << r;
  }
  // Without the state (residuals, Q, the step counter) the run ends elsewhere: it matters.
  const auto forgetful = train(options, kCut, kSteps, &first, false);
  EXPECT_NE(forgetful[0].model.w, whole[0].model.w);
  // A sparse mode's state is tested only where it stays sparse (no residual when averaged whole).
  EXPECT_LT(whole[0].stats.dense_exchanges, static_cast<std::uint64_t>(kSteps)) << "compressed";
}

INSTANTIATE_TEST_SUITE_P(
    EveryStatefulMode, Restart,
    ::testing::Values(std::pair{"fp16", "every-step"}, std::pair{"bf16", "every-step"},
                      std::pair{"topk:0.1", "every-step"}, std::pair{"threshold:0.6", "every-step"},
                      std::pair{"powersgd:1", "every-step"},
                      std::pair{"powersgd:1:4", "every-step"},   // cut after the warm-up
                      std::pair{"powersgd:1:10", "every-step"},  // cut inside it
                      std::pair{"none", "local-sgd:3"}, std::pair{"none", "partial:3"}),
    [](const auto& info) {
      std::string name = std::string(info.param.first) + "_" + info.param.second;
      for (char& c : name) {
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

// One rank's gradient holds an inf or a NaN at one step (an overflow, a bad batch): every lossy
// mode ends with finite replicas identical on every rank, close to the clean run, its state
// clean; the event is counted. (Before the guard: fp16's residual became -inf then NaN for good,
// PowerSGD's Q NaN for good.)
class NonFinite : public ::testing::TestWithParam<std::tuple<const char*, float>> {};

TEST_P(NonFinite, AGradientsInfOrNanNeverPoisonsTheRun) {
  const auto [compression, bad] = GetParam();
  constexpr int kSteps = 40, kPoisonedStep = 6;
  const DdpOptions options = with(compression);
  std::vector<Regression> clean(kWorld), hit(kWorld);
  std::vector<CommunicationStats> stats(kWorld);
  std::vector<std::string> states(kWorld);
  for (auto* models : {&clean, &hit}) {
    on_ranks(kWorld, [&](ProcessGroup& g) {
      Regression& model = (*models)[static_cast<std::size_t>(g.rank())];
      if (models == &hit) {
        model.poison = [bad = bad](int rank, int step, std::vector<float>& dw) {
          if (rank == 1 && step == kPoisonedStep) dw[5] = bad;
        };
      }
      DistributedDataParallel ddp(g, model.parameters(), options);
      for (int s = 0; s < kSteps; ++s) model.step(ddp, g.rank(), s);
      if (models == &hit) {
        stats[static_cast<std::size_t>(g.rank())] = ddp.stats();
        states[static_cast<std::size_t>(g.rank())] = ddp.state();
      }
    });
  }
  for (std::size_t r = 0; r < kWorld; ++r) {
    for (float v : hit[r].w) ASSERT_TRUE(std::isfinite(v)) << "rank " << r << "'s weights";
    for (float v : hit[r].vw) ASSERT_TRUE(std::isfinite(v)) << "rank " << r << "'s momentum";
    EXPECT_EQ(hit[r].w, hit[0].w) << "replicas differ: rank " << r;
    EXPECT_EQ(hit[r].b, hit[0].b) << "replicas differ: rank " << r;
  }
  const double loss = hit[0].held_out_loss(), reference = clean[0].held_out_loss();
  const double initial = Regression().held_out_loss();
  EXPECT_LE(loss, reference + 0.05 * (initial - reference))
      << "learnt as much as the clean run, within 5%: held-out loss " << loss << ", clean "
      << reference << ", initial " << initial;
  EXPECT_GE(stats[1].nonfinite_skipped + stats[1].nonfinite_cleaned, 1u) << "counted";
  EXPECT_EQ(stats[0].nonfinite_skipped, stats[1].nonfinite_skipped) << "every rank skips alike";
  // The state a checkpoint keeps holds no inf or NaN: resumed, the run goes on finite.
  on_ranks(kWorld, [&](ProcessGroup& g) {
    Regression model = hit[static_cast<std::size_t>(g.rank())];
    model.poison = nullptr;
    DistributedDataParallel ddp(g, model.parameters(), options);
    ddp.load_state(states[static_cast<std::size_t>(g.rank())]);
    for (int s = kSteps; s < kSteps + 5; ++s) model.step(ddp, g.rank(), s);
    for (float v : model.w) ASSERT_TRUE(std::isfinite(v));
    EXPECT_EQ(ddp.stats().nonfinite_cleaned, 0u) << "the saved residual was clean";
  });
}

// A finite gradient past fp16's range (65504 once divided by the world size): inf on the wire.
INSTANTIATE_TEST_SUITE_P(Fp16Overflow, NonFinite,
                         ::testing::Values(std::tuple{"fp16", 1e30f}, std::tuple{"fp16", 3e5f}),
                         [](const auto& info) {
                           return std::get<1>(info.param) > 1e6f ? "huge" : "past_fp16";
                         });

INSTANTIATE_TEST_SUITE_P(
    EveryLossyMode, NonFinite,
    // topk:0.6 (63 x 2 >= 104) and PowerSGD's warm-up go through the dense exchange.
    ::testing::Combine(::testing::Values("fp16", "bf16", "topk:0.1", "threshold:0.6", "powersgd:2",
                                         "topk:0.6", "powersgd:2:8"),
                       ::testing::Values(std::numeric_limits<float>::quiet_NaN(),
                                         std::numeric_limits<float>::infinity())),
    [](const auto& info) {
      const float bad = std::get<1>(info.param);
      std::string name = std::string(std::get<0>(info.param)) + "_" +
                         (std::isnan(bad)   ? "nan"
                          : std::isinf(bad) ? "inf"
                                            : "huge");
      for (char& c : name) {
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

// PowerSGD compresses only what it knows as a matrix: without shapes it sends every bucket whole,
// and says so (once, on rank 0) instead of silently sending as much as no compression.
TEST(Compression, PowerSgdThatCompressesNothingSaysSo) {
  for (const bool shaped : {false, true}) {
    ::testing::internal::CaptureStderr();
    on_ranks(kWorld, [&](ProcessGroup& g) {
      std::vector<float> w(32 * 32), dw(w.size()), b(32), db(b.size());
      std::vector<Parameter> parameters{{"w", w, dw}, {"b", b, db}};
      if (shaped) parameters[0].shape = {32, 32};
      DistributedDataParallel ddp(g, parameters, with("powersgd:2"));
    });
    const std::string said = ::testing::internal::GetCapturedStderr();
    if (shaped) {
      EXPECT_EQ(said.find("compresses nothing"), std::string::npos) << said;
    } else {
      EXPECT_NE(said.find("powersgd:2 compresses nothing here: no parameter has a shape of two or "
                          "more dimensions (give Parameter::shape"),
                std::string::npos)
          << said;
    }
  }
}

TEST(Compression, AStateOfAnotherModeOrWorldIsRefusedSayingWhy) {
  std::string fp16_state, single_rank_state;
  on_ranks(1, [&](ProcessGroup& g) {
    std::vector<float> v(16), dv(16, 1.0f);
    DistributedDataParallel ddp(g, {{"v", v, dv}}, with("fp16"));
    ddp.synchronize();
    single_rank_state = ddp.state();
  });
  on_ranks(kWorld, [&](ProcessGroup& g) {
    std::vector<float> v(16), dv(16, 1.0f);
    DistributedDataParallel topk(g, {{"v", v, dv}}, with("topk:0.5"));
    try {
      topk.load_state(single_rank_state);
      ADD_FAILURE() << "loaded an fp16 state into topk";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("compression 'fp16'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("'topk:0.5'"), std::string::npos) << e.what();
    }
    DistributedDataParallel fp16(g, {{"v", v, dv}}, with("fp16"));
    try {
      fp16.load_state(single_rank_state);
      ADD_FAILURE() << "loaded a state of a world of 1 into a world of 2";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("world of 1"), std::string::npos) << e.what();
    }
    EXPECT_THROW(fp16.load_state("garbage"), std::invalid_argument);
    const std::string state = fp16.state();
    EXPECT_THROW(fp16.load_state(state.substr(0, state.size() - 3)), std::invalid_argument);
    fp16.load_state(state);  // its own state loads
  });
}

TEST(Compression, AnUncompressedStateLoadsInAnotherWorldSize) {
  // Nothing of it is a rank's own: a job resumed (or regrouped in place) in a smaller or larger
  // world takes it.
  std::string state;
  on_ranks(1, [&](ProcessGroup& g) {
    std::vector<float> v(16), dv(16, 1.0f);
    DistributedDataParallel ddp(g, {{"v", v, dv}}, with("none"));
    ddp.synchronize();
    state = ddp.state();
  });
  on_ranks(kWorld, [&](ProcessGroup& g) {
    std::vector<float> v(16), dv(16, 1.0f);
    DistributedDataParallel ddp(g, {{"v", v, dv}}, with("none"));
    EXPECT_NO_THROW(ddp.load_state(state));
  });
}

TEST(Compression, CompressionWithALocalStrategyIsRefused) {
  on_ranks(1, [](ProcessGroup& g) {
    std::vector<float> v(4), dv(4);
    try {
      DistributedDataParallel ddp(g, {{"v", v, dv}}, with("fp16", "local-sgd:4"));
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("use one or the other"), std::string::npos) << e.what();
    }
  });
}

TEST(Compression, RanksWithDifferentCompressionAreRejected) {
  std::mutex mutex;
  std::vector<std::string> errors;
  on_ranks(kWorld, [&](ProcessGroup& g) {
    std::vector<float> v(4), dv(4);
    try {
      DistributedDataParallel ddp(g, {{"v", v, dv}}, with(g.rank() == 0 ? "fp16" : "bf16"));
    } catch (const std::runtime_error& e) {
      std::lock_guard lock(mutex);
      errors.push_back(e.what());
    }
  });
  ASSERT_EQ(errors.size(), 2u);
  for (const auto& e : errors) EXPECT_NE(e.find("rank 1 has different"), std::string::npos) << e;
}

// A model of float32, bfloat16 and float16 parameters: buckets split by element type; plain
// all-reduce averages each in its own type (Gloo: 16-bit sums in float, rounded), and the lossy
// modes work on every type.
TEST(MixedDtype, BucketsByTypeAndEachAveragedInItsType) {
  constexpr std::size_t kN = 24;
  std::mutex mutex;
  on_ranks(kWorld, [&](ProcessGroup& g) {
    std::vector<float> w(kN * 4), dw = random_values(kN * 4, 11 + static_cast<unsigned>(g.rank()));
    std::vector<BFloat16> e(kN), de(kN);
    std::vector<Half> b(kN), db(kN);
    const auto de_f = random_values(kN, 21 + static_cast<unsigned>(g.rank()));
    const auto db_f = random_values(kN, 31 + static_cast<unsigned>(g.rank()));
    for (std::size_t i = 0; i < kN; ++i) de[i] = BFloat16::from_float(de_f[i]);
    for (std::size_t i = 0; i < kN; ++i) db[i] = Half::from_float(db_f[i]);
    DistributedDataParallel ddp(g, {{"w", w, dw, {kN, 4}}, {"e", e, de}, {"b", b, db}});
    EXPECT_EQ(ddp.bucket_layout(), (std::vector<std::vector<std::size_t>>{{2}, {1}, {0}}));
    ddp.synchronize();
    std::lock_guard lock(mutex);
    for (std::size_t i = 0; i < kN; ++i) {
      auto value = [&](int r, unsigned seed, bool bf16) {
        const float f = random_values(kN, seed + static_cast<unsigned>(r))[i];
        return bf16 ? BFloat16::from_float(f).to_float() : Half::from_float(f).to_float();
      };
      const float e_sum = BFloat16::from_float(value(0, 21, true) + value(1, 21, true)).to_float();
      EXPECT_EQ(de[i].bits, BFloat16::from_float(e_sum / 2).bits) << i;
      const float b_sum = Half::from_float(value(0, 31, false) + value(1, 31, false)).to_float();
      EXPECT_EQ(db[i].bits, Half::from_float(b_sum / 2).bits) << i;
    }
  });
}

TEST(MixedDtype, EveryCompressionTrainsAMixedModelWithIdenticalReplicas) {
  constexpr std::size_t kRows = 12, kCols = 10;
  for (const char* spec : {"fp16", "bf16", "topk:0.2", "threshold:1.5", "powersgd:2"}) {
    SCOPED_TRACE(spec);
    std::mutex mutex;
    std::vector<std::vector<float>> finals;
    on_ranks(kWorld, [&](ProcessGroup& g) {
      std::vector<float> w(kRows * kCols, 0.5f), dw(w.size());
      std::vector<BFloat16> u(kRows * kCols), du(u.size());
      std::vector<Half> b(kCols), db(kCols);
      DistributedDataParallel ddp(
          g, {{"w", w, dw, {kRows, kCols}}, {"u", u, du, {kRows, kCols}}, {"b", b, db}},
          with(spec));
      for (int s = 0; s < 5; ++s) {
        const auto gw = random_values(w.size(), static_cast<unsigned>(10 * s + g.rank()));
        fill(dw, gw);
        for (std::size_t i = 0; i < u.size(); ++i) du[i] = BFloat16::from_float(-gw[i]);
        for (std::size_t i = 0; i < b.size(); ++i) db[i] = Half::from_float(gw[i] * 0.5f);
        ddp.grad_ready(2), ddp.grad_ready(1), ddp.grad_ready(0);
        ddp.synchronize();
        for (std::size_t i = 0; i < w.size(); ++i) w[i] -= 0.1f * dw[i];
        for (std::size_t i = 0; i < u.size(); ++i) {
          u[i] = BFloat16::from_float(u[i].to_float() - 0.1f * du[i].to_float());
        }
        for (std::size_t i = 0; i < b.size(); ++i) {
          b[i] = Half::from_float(b[i].to_float() - 0.1f * db[i].to_float());
        }
      }
      std::vector<float> all = w;
      for (auto v : u) all.push_back(v.to_float());
      for (auto v : b) all.push_back(v.to_float());
      std::lock_guard lock(mutex);
      finals.push_back(all);
    });
    ASSERT_EQ(finals.size(), 2u);
    EXPECT_EQ(finals[0], finals[1]);
    EXPECT_NE(finals[0][0], 0.5f) << "the model moved";
  }
}

}  // namespace
}  // namespace dist::sdk
