// The GPU model's arithmetic (mlp_math.h: what each CUDA thread of mlp_kernels.cu computes), run
// here on the host: its gradients against central finite differences of its loss, its loss
// against a double-precision softmax, the order the elements are computed in changing nothing,
// and the SGD step.
#include "mlp_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace ddp_train::math {
namespace {

struct Net {
  Shape s{5, 7, 6, 4};
  std::vector<float> x, w1, b1, w2, b2;
  std::vector<int> labels;

  explicit Net(unsigned seed) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> u(-0.8f, 0.8f);
    auto fill = [&](std::vector<float>& v, int n) {
      v.resize(static_cast<std::size_t>(n));
      for (auto& e : v) e = u(g);
    };
    fill(x, s.rows * s.inputs);
    fill(w1, s.hidden * s.inputs);
    fill(b1, s.hidden);
    fill(w2, s.classes * s.hidden);
    fill(b2, s.classes);
    for (int r = 0; r < s.rows; ++r) labels.push_back(static_cast<int>(g() % 4));
  }

  struct Pass {
    std::vector<float> h, logits, row_loss, dh;
    float loss = 0;
  };
  // Each element as one CUDA thread computes it; `reverse` visits them last to first.
  Pass forward(bool reverse = false) const {
    Pass p;
    p.h.resize(static_cast<std::size_t>(s.rows * s.hidden));
    p.logits.resize(static_cast<std::size_t>(s.rows * s.classes));
    p.row_loss.resize(static_cast<std::size_t>(s.rows));
    each(s.rows * s.hidden, reverse,
         [&](int i) { p.h[i] = hidden_unit(x.data(), w1.data(), b1.data(), s, i); });
    each(s.rows * s.classes, reverse,
         [&](int i) { p.logits[i] = logit(p.h.data(), w2.data(), b2.data(), s, i); });
    each(s.rows, reverse, [&](int r) {
      p.row_loss[r] = softmax_cross_entropy_row(p.logits.data(), labels.data(), s, r);
    });
    p.loss = mean_loss(p.row_loss.data(), s.rows);
    return p;
  }
  struct Grads {
    std::vector<float> w1, b1, w2, b2;
  };
  Grads backward(Pass& p, bool reverse = false) const {
    Grads g;
    g.w2.resize(w2.size());
    g.b2.resize(b2.size());
    g.w1.resize(w1.size());
    g.b1.resize(b1.size());
    p.dh.resize(p.h.size());
    each(s.classes * s.hidden, reverse,
         [&](int i) { g.w2[i] = grad_w2(p.logits.data(), p.h.data(), s, i); });
    each(s.classes, reverse, [&](int c) { g.b2[c] = grad_b2(p.logits.data(), s, c); });
    each(s.rows * s.hidden, reverse,
         [&](int i) { p.dh[i] = grad_hidden(p.logits.data(), w2.data(), p.h.data(), s, i); });
    each(s.hidden * s.inputs, reverse,
         [&](int i) { g.w1[i] = grad_w1(p.dh.data(), x.data(), s, i); });
    each(s.hidden, reverse, [&](int j) { g.b1[j] = grad_b1(p.dh.data(), s, j); });
    return g;
  }

  template <typename F>
  static void each(int n, bool reverse, F&& f) {
    for (int k = 0; k < n; ++k) f(static_cast<std::size_t>(reverse ? n - 1 - k : k));
  }
};

TEST(MlpMath, GradientsMatchFiniteDifferencesOfTheLoss) {
  for (unsigned seed : {1u, 2u, 3u}) {
    Net net(seed);
    auto pass = net.forward();
    const auto grads = net.backward(pass);
    const struct {
      const char* name;
      std::vector<float>* values;
      const std::vector<float>* analytic;
    } tensors[] = {{"w1", &net.w1, &grads.w1},
                   {"b1", &net.b1, &grads.b1},
                   {"w2", &net.w2, &grads.w2},
                   {"b2", &net.b2, &grads.b2}};
    constexpr float kStep = 1e-3f;
    for (const auto& t : tensors) {
      for (std::size_t i = 0; i < t.values->size(); ++i) {
        const float saved = (*t.values)[i];
        (*t.values)[i] = saved + kStep;
        const float up = net.forward().loss;
        (*t.values)[i] = saved - kStep;
        const float down = net.forward().loss;
        (*t.values)[i] = saved;
        const float numeric = (up - down) / (2 * kStep);
        EXPECT_NEAR((*t.analytic)[i], numeric, 2e-3f + 0.02f * std::fabs(numeric))
            << t.name << "[" << i << "], seed " << seed;
      }
    }
  }
}

TEST(MlpMath, TheLossIsTheMeanCrossEntropyOfTheSoftmax) {
  const Net net(7);
  const auto pass = net.forward();
  double expected = 0;
  for (int r = 0; r < net.s.rows; ++r) {
    std::vector<double> logits(static_cast<std::size_t>(net.s.classes));
    for (int c = 0; c < net.s.classes; ++c) {
      double z = net.b2[static_cast<std::size_t>(c)];
      for (int j = 0; j < net.s.hidden; ++j) {
        z += double(pass.h[static_cast<std::size_t>(r * net.s.hidden + j)]) *
             net.w2[static_cast<std::size_t>(c * net.s.hidden + j)];
      }
      logits[static_cast<std::size_t>(c)] = z;
    }
    double sum = 0;
    for (double z : logits) sum += std::exp(z);
    expected -=
        std::log(std::exp(logits[static_cast<std::size_t>(net.labels[std::size_t(r)])]) / sum);
  }
  EXPECT_NEAR(pass.loss, expected / net.s.rows, 1e-5);
}

// One thread per element and no shared sums: the order the elements are computed in (a GPU's
// schedule) cannot change a bit of the result.
TEST(MlpMath, TheOrderOfTheElementsChangesNoBit) {
  const Net net(11);
  auto forward = net.forward(), reverse = net.forward(true);
  const auto a = net.backward(forward), b = net.backward(reverse, true);
  EXPECT_EQ(forward.loss, reverse.loss);
  EXPECT_EQ(a.w1, b.w1);
  EXPECT_EQ(a.b1, b.b1);
  EXPECT_EQ(a.w2, b.w2);
  EXPECT_EQ(a.b2, b.b2);
}

TEST(MlpMath, SgdIsTorchsMomentumStep) {
  std::vector<float> p{1.0f, -2.0f}, v{0.5f, 0.0f};
  const std::vector<float> g{0.25f, 1.0f};
  for (int i = 0; i < 2; ++i) sgd(p.data(), v.data(), g.data(), 0.1f, 0.9f, i);
  EXPECT_FLOAT_EQ(v[0], 0.9f * 0.5f + 0.25f);
  EXPECT_FLOAT_EQ(p[0], 1.0f - 0.1f * (0.9f * 0.5f + 0.25f));
  EXPECT_FLOAT_EQ(v[1], 1.0f);
  EXPECT_FLOAT_EQ(p[1], -2.0f - 0.1f);
}

}  // namespace
}  // namespace ddp_train::math
