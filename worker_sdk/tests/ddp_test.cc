// DDP against single-process training: the gradients DDP leaves on every rank equal the gradients
// of the full batch computed in one process.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <thread>

#include "dist/sdk/ddp.h"
#include "dist/store/server.h"
#include "ranks.h"

namespace dist::sdk {
namespace {

using namespace std::chrono_literals;

using testing::on_ranks;

// A linear model y = W x + b with 3 parameter blocks, mean squared error, gradients by hand.
struct Linear {
  static constexpr std::size_t kIn = 6, kOut = 3;
  std::vector<float> w = std::vector<float>(kIn * kOut), b = std::vector<float>(kOut),
                     extra = std::vector<float>(5);  // a parameter with gradient 2 * extra
  std::vector<float> dw = std::vector<float>(kIn * kOut), db = std::vector<float>(kOut),
                     dextra = std::vector<float>(5);

  void init(unsigned seed) {
    std::mt19937 g(seed);
    std::normal_distribution<float> n;
    for (auto* v : {&w, &b, &extra}) {
      for (auto& x : *v) x = n(g);
    }
  }
  std::vector<Parameter> parameters() {
    return {{"w", w, dw}, {"b", b, db}, {"extra", extra, dextra}};
  }
  // Gradient of the mean loss over samples [begin, end) of the data set, added to the grads.
  void backward(const std::vector<float>& x, const std::vector<float>& y, std::size_t begin,
                std::size_t end) {
    const float scale = 2.0f / static_cast<float>(end - begin);
    for (std::size_t s = begin; s < end; ++s) {
      for (std::size_t o = 0; o < kOut; ++o) {
        float out = b[o];
        for (std::size_t i = 0; i < kIn; ++i) out += w[o * kIn + i] * x[s * kIn + i];
        const float err = scale * (out - y[s * kOut + o]) / kOut;
        db[o] += err;
        for (std::size_t i = 0; i < kIn; ++i) dw[o * kIn + i] += err * x[s * kIn + i];
      }
    }
    for (std::size_t i = 0; i < extra.size(); ++i) dextra[i] += 2 * extra[i];
  }
  void zero_grad() {
    for (auto* g : {&dw, &db, &dextra}) std::fill(g->begin(), g->end(), 0.0f);
  }
};

struct Data {
  std::vector<float> x, y;
  explicit Data(std::size_t n) : x(n * Linear::kIn), y(n * Linear::kOut) {
    std::mt19937 g(99);
    std::normal_distribution<float> d;
    for (auto& v : x) v = d(g);
    for (auto& v : y) v = d(g);
  }
};

TEST(Ddp, GradientsEqualFullBatchGradientsOfOneProcess) {
  constexpr int kWorld = 4;
  constexpr std::size_t kBatch = 64;  // global batch, 16 per rank
  const Data data(kBatch);
  Linear reference;
  reference.init(1);
  reference.backward(data.x, data.y, 0, kBatch);

  on_ranks(kWorld, [&](ProcessGroup& g) {
    Linear model;
    model.init(100 + static_cast<unsigned>(g.rank()));  // DDP must replace these with rank 0's...
    if (g.rank() == 0) model.init(1);                   // ...which are the reference's
    DdpOptions options;
    options.first_bucket_cap_bytes = 16;  // several buckets even for this small model
    options.bucket_cap_bytes = 64;
    DistributedDataParallel ddp(g, model.parameters(), options);
    EXPECT_EQ(model.w, reference.w) << "parameters broadcast from rank 0";

    const std::size_t per_rank = kBatch / kWorld;
    const std::size_t begin = per_rank * static_cast<std::size_t>(g.rank());
    model.backward(data.x, data.y, begin, begin + per_rank);
    // Gradients become ready in a rank-dependent order: buckets are still reduced in order.
    std::vector<std::size_t> order{2, 1, 0};
    if (g.rank() % 2) std::reverse(order.begin(), order.end());
    for (std::size_t i : order) ddp.grad_ready(i);
    ddp.synchronize();

    for (std::size_t i = 0; i < model.dw.size(); ++i) {
      ASSERT_NEAR(model.dw[i], reference.dw[i], 1e-5) << "dw[" << i << "]";
    }
    for (std::size_t i = 0; i < model.db.size(); ++i)
      ASSERT_NEAR(model.db[i], reference.db[i], 1e-5);
    for (std::size_t i = 0; i < model.dextra.size(); ++i) {
      ASSERT_NEAR(model.dextra[i], reference.dextra[i], 1e-5);
    }
  });
}

TEST(Ddp, BucketsFollowReverseRegistrationOrderAndTheCaps) {
  on_ranks(1, [](ProcessGroup& g) {
    Linear model;  // parameters of 18, 3 and 5 floats: 72, 12 and 20 bytes
    DdpOptions options;
    options.first_bucket_cap_bytes = 20;  // "extra" (20 bytes) alone
    options.bucket_cap_bytes = 100;       // then "b" and "w" together (84 bytes)
    DistributedDataParallel ddp(g, model.parameters(), options);
    EXPECT_EQ(ddp.bucket_layout(), (std::vector<std::vector<std::size_t>>{{2}, {1, 0}}));
    DistributedDataParallel defaults(g, model.parameters());
    EXPECT_EQ(defaults.bucket_layout(), (std::vector<std::vector<std::size_t>>{{2, 1, 0}}));
  });
}

TEST(Ddp, NoSyncAccumulatesLocallyAndTheNextSyncAveragesTheSum) {
  constexpr int kWorld = 2;
  const Data data(32);
  Linear reference;
  reference.init(1);
  reference.backward(data.x, data.y, 0, 8);    // micro-batch 1 of rank 0
  reference.backward(data.x, data.y, 16, 24);  // micro-batch 1 of rank 1
  reference.backward(data.x, data.y, 8, 16);   // micro-batch 2 of rank 0
  reference.backward(data.x, data.y, 24, 32);  // micro-batch 2 of rank 1
  for (auto* grad : {&reference.dw, &reference.db, &reference.dextra}) {
    for (auto& v : *grad) v /= kWorld;  // DDP averages over ranks
  }
  on_ranks(kWorld, [&](ProcessGroup& g) {
    Linear model;
    model.init(1);
    DistributedDataParallel ddp(g, model.parameters());
    const std::size_t base = 16 * static_cast<std::size_t>(g.rank());
    {
      auto guard = ddp.no_sync();
      model.backward(data.x, data.y, base, base + 8);
      for (std::size_t i = 0; i < 3; ++i) ddp.grad_ready(i);  // ignored: no communication
      ddp.synchronize();
    }
    model.backward(data.x, data.y, base + 8, base + 16);
    ddp.synchronize();
    for (std::size_t i = 0; i < model.dw.size(); ++i)
      ASSERT_NEAR(model.dw[i], reference.dw[i], 1e-5);
  });
}

TEST(Ddp, MarkingAParameterTwiceIsAnError) {
  on_ranks(1, [](ProcessGroup& g) {
    Linear model;
    DistributedDataParallel ddp(g, model.parameters());
    ddp.grad_ready(0);
    EXPECT_THROW(ddp.grad_ready(0), std::logic_error);
    ddp.synchronize();
  });
}

TEST(Ddp, DifferentModelsOnDifferentRanksAreRejected) {
  store::StoreServerThread store;
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      store::ClientOptions options;
      options.port = store.port();
      auto group = make_gloo_group(store::StoreClient::connect(options), rank, 2);
      std::vector<float> v(rank == 0 ? 4 : 5), g(v.size());
      try {
        DistributedDataParallel ddp(*group, {{"p", v, g}});
      } catch (const std::runtime_error& e) {
        errors[static_cast<std::size_t>(rank)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    EXPECT_NE(e.find("rank 1 has different parameters"), std::string::npos) << e;
}

}  // namespace
}  // namespace dist::sdk
