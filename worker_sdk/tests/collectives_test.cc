// Collectives with every rank as a thread of this process, each with its own store client, against
// a real store server: the same code paths as separate processes, fast and deterministic.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <thread>
#include <vector>

#include "dist/sdk/process_group.h"
#include "dist/store/server.h"
#include "ranks.h"

namespace dist::sdk {
namespace {

using namespace std::chrono_literals;

using testing::on_ranks;

template <typename T>
T value(double v) {
  if constexpr (is_16bit_float_v<T>) {
    return T::from_float(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}
template <typename T>
double as_double(T v) {
  if constexpr (is_16bit_float_v<T>) {
    return v.to_float();
  } else {
    return static_cast<double>(v);
  }
}

// Element i of rank r holds r + 1 + i % 7 (small integers: exact in every type, the 16-bit floats
// and int8 included).
template <typename T>
void check_all_reduce(int size, ReduceOp op) {
  constexpr std::size_t kCount = 1000;
  on_ranks(size, [&](ProcessGroup& g) {
    std::vector<T> data(kCount);
    for (std::size_t i = 0; i < kCount; ++i) data[i] = value<T>(g.rank() + 1 + double(i % 7));
    g.all_reduce(std::span<T>(data), op);
    for (std::size_t i = 0; i < kCount; ++i) {
      const double base = double(i % 7);
      double expected = 0;
      switch (op) {
        case ReduceOp::kSum:
          expected = size * base + size * (size + 1) / 2.0;
          break;
        case ReduceOp::kAvg:
          expected = (size * base + size * (size + 1) / 2.0) / size;
          if constexpr (std::is_integral_v<T>) expected = std::floor(expected);
          break;
        case ReduceOp::kMin:
          expected = base + 1;
          break;
        case ReduceOp::kMax:
          expected = base + size;
          break;
      }
      ASSERT_NEAR(as_double(data[i]), expected, 1e-3) << "element " << i;
    }
  });
}

class AllReduce : public ::testing::TestWithParam<std::tuple<int, ReduceOp>> {};

TEST_P(AllReduce, EveryTypeGivesTheExactResult) {
  const auto [size, op] = GetParam();
  SCOPED_TRACE("float");
  check_all_reduce<float>(size, op);
  SCOPED_TRACE("double");
  check_all_reduce<double>(size, op);
  SCOPED_TRACE("half");
  check_all_reduce<Half>(size, op);
  SCOPED_TRACE("bfloat16");
  check_all_reduce<BFloat16>(size, op);
  SCOPED_TRACE("int8");
  check_all_reduce<std::int8_t>(size, op);
  SCOPED_TRACE("uint8");
  check_all_reduce<std::uint8_t>(size, op);
  SCOPED_TRACE("int32");
  check_all_reduce<std::int32_t>(size, op);
  SCOPED_TRACE("int64");
  check_all_reduce<std::int64_t>(size, op);
}

INSTANTIATE_TEST_SUITE_P(GroupSizesAndOps, AllReduce,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(ReduceOp::kSum, ReduceOp::kAvg,
                                                              ReduceOp::kMin, ReduceOp::kMax)));

TEST(Collectives, BroadcastFromEveryRoot) {
  on_ranks(3, [](ProcessGroup& g) {
    for (int root = 0; root < g.size(); ++root) {
      std::vector<double> data(257, g.rank() == root ? 1.5 * (root + 1) : -1.0);
      g.broadcast(std::span<double>(data), root);
      for (double v : data) ASSERT_EQ(v, 1.5 * (root + 1));
    }
  });
}

TEST(Collectives, AllGatherPlacesEachRanksBlockAtItsRank) {
  on_ranks(4, [](ProcessGroup& g) {
    std::vector<std::int64_t> mine(5, 100 * g.rank());
    std::vector<std::int64_t> all(5 * 4);
    g.all_gather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
    for (int r = 0; r < 4; ++r) {
      for (int i = 0; i < 5; ++i) ASSERT_EQ(all[static_cast<std::size_t>(r * 5 + i)], 100 * r);
    }
  });
}

TEST(Collectives, ReduceScatterGivesEachRankItsReducedBlock) {
  on_ranks(3, [](ProcessGroup& g) {
    std::vector<float> input(3 * 4);
    for (std::size_t i = 0; i < input.size(); ++i) input[i] = float(i) + float(g.rank());
    std::vector<float> block(4);
    g.reduce_scatter(std::span<const float>(input), std::span<float>(block), ReduceOp::kSum);
    for (std::size_t i = 0; i < 4; ++i) {
      const float index = float(4 * g.rank()) + float(i);
      ASSERT_EQ(block[i], 3 * index + (0 + 1 + 2));
    }
  });
}

TEST(Collectives, AsyncOperationsCompleteInIssueOrder) {
  on_ranks(2, [](ProcessGroup& g) {
    std::vector<std::vector<float>> buffers(8, std::vector<float>(10000, float(g.rank() + 1)));
    std::vector<Work> work;
    for (auto& b : buffers)
      work.push_back(g.all_reduce_async(b.data(), b.size(), DataType::kFloat32, ReduceOp::kSum));
    g.barrier();  // issued after them, so it completes after them
    for (auto& w : work) EXPECT_TRUE(w.ready());
    for (auto& w : work) w.wait();
    for (auto& b : buffers) ASSERT_EQ(b.front(), 3.0f);
  });
}

TEST(Collectives, MismatchedBufferSizesAreRejectedBeforeCommunicating) {
  on_ranks(2, [](ProcessGroup& g) {
    std::vector<float> in(3), out(5);
    EXPECT_THROW(g.all_gather(std::span<const float>(in), std::span<float>(out)),
                 std::invalid_argument);
    std::vector<float> b(1);
    EXPECT_THROW(g.broadcast(std::span<float>(b), 7), std::invalid_argument);
    g.barrier();
  });
}

TEST(Collectives, APeerThatNeverArrivesIsACollectiveErrorNotAHang) {
  store::StoreServerThread store;
  store::ClientOptions options;
  options.port = store.port();
  GlooOptions gloo;
  gloo.timeout = 500ms;
  const auto start = std::chrono::steady_clock::now();
  try {
    make_gloo_group(store::StoreClient::connect(options), 0, 2, gloo);
    FAIL() << "a group of 2 cannot form with 1 rank";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 of 2"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

TEST(Half, RoundTripsAndRoundsToNearestEven) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 0.000061035156f, 1.0009765625f, 3.14159f}) {
    const float back = Half::from_float(f).to_float();
    EXPECT_NEAR(back, f, std::abs(f) * 1e-3f + 1e-7f) << f;
  }
  EXPECT_EQ(Half::from_float(1.0f).bits, 0x3C00);
  EXPECT_EQ(Half::from_float(-2.0f).bits, 0xC000);
  EXPECT_EQ(Half::from_float(65504.0f).bits, 0x7BFF);
  EXPECT_EQ(Half::from_float(1e6f).bits, 0x7C00);                    // overflow to infinity
  EXPECT_EQ(Half::from_float(1.00048828125f).bits, 0x3C00);          // tie, rounds to even
  EXPECT_EQ(Half::from_float(5.960464477539063e-08f).bits, 0x0001);  // smallest subnormal
}

TEST(BFloat16, IsTheUpperHalfOfAFloatRoundedToNearestEven) {
  for (float f : {0.0f, 1.0f, -2.5f, 3.0e38f, 1.0e-38f, 3.14159f}) {
    const float back = BFloat16::from_float(f).to_float();
    EXPECT_NEAR(back, f, std::abs(f) * 4e-3f) << f;
  }
  EXPECT_EQ(BFloat16::from_float(1.0f).bits, 0x3F80);
  EXPECT_EQ(BFloat16::from_float(-2.0f).bits, 0xC000);
  EXPECT_EQ(BFloat16::from_float(1.00390625f).bits, 0x3F80);  // tie (1 + 2^-8), rounds to even
  EXPECT_EQ(BFloat16::from_float(1.01171875f).bits, 0x3F82);  // tie (1 + 3 * 2^-8), to even
  EXPECT_EQ(BFloat16::from_float(1.0f + 1.0f / 128 + 1.0f / 1024).bits, 0x3F81);  // nearest
  EXPECT_TRUE(std::isnan(BFloat16::from_float(std::nanf("")).to_float()));
  EXPECT_EQ(element_size(DataType::kBFloat16), 2u);
  EXPECT_EQ(element_size(DataType::kUInt8), 1u);
  EXPECT_EQ(element_size(DataType::kInt64), 8u);
}

}  // namespace
}  // namespace dist::sdk
