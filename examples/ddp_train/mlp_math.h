// The MLP's arithmetic on the GPU (--backend nccl), one output element per call, each summed in a
// fixed order: no atomics, no reduction trees whose shape depends on the launch, so a run is
// bit-reproducible (a crash and restart ends with the weights of an uninterrupted run). The same
// functions run on the host in mlp_math_test.cc, against finite differences of the loss.
//
// Layouts are row-major: x [rows][inputs], w1 [hidden][inputs], w2 [classes][hidden],
// h [rows][hidden], logits [rows][classes].
#pragma once

#include <math.h>  // expf, logf (CUDA's own on the device)

#if defined(__CUDACC__)
#define DDP_TRAIN_HD __host__ __device__
#else
#define DDP_TRAIN_HD
#endif

namespace ddp_train::math {

struct Shape {
  int rows, inputs, hidden, classes;
};

// h[i], i = r * hidden + j: relu(b1[j] + sum_k x[r][k] w1[j][k]).
DDP_TRAIN_HD inline float hidden_unit(const float* x, const float* w1, const float* b1, Shape s,
                                      int i) {
  const int r = i / s.hidden, j = i % s.hidden;
  float sum = b1[j];
  for (int k = 0; k < s.inputs; ++k) sum += x[r * s.inputs + k] * w1[j * s.inputs + k];
  return sum > 0.0f ? sum : 0.0f;
}

// logits[i], i = r * classes + c: b2[c] + sum_j h[r][j] w2[c][j].
DDP_TRAIN_HD inline float logit(const float* h, const float* w2, const float* b2, Shape s, int i) {
  const int r = i / s.classes, c = i % s.classes;
  float sum = b2[c];
  for (int j = 0; j < s.hidden; ++j) sum += h[r * s.hidden + j] * w2[c * s.hidden + j];
  return sum;
}

// Row r of the softmax cross-entropy: turns logits[r] into d loss / d logits for the batch's mean
// loss, and returns the row's loss, -log(max(p[label], 1e-12)).
DDP_TRAIN_HD inline float softmax_cross_entropy_row(float* logits, const int* labels, Shape s,
                                                    int r) {
  float* row = logits + r * s.classes;
  float max = row[0];
  for (int c = 1; c < s.classes; ++c) max = row[c] > max ? row[c] : max;
  float sum = 0.0f;
  for (int c = 0; c < s.classes; ++c) {
    row[c] = expf(row[c] - max);
    sum += row[c];
  }
  const int label = labels[r];
  const float n = static_cast<float>(s.rows);
  float loss = 0.0f;
  for (int c = 0; c < s.classes; ++c) {
    const float p = row[c] / sum;
    if (c == label) loss = -logf(p > 1e-12f ? p : 1e-12f);
    row[c] = (p - (c == label ? 1.0f : 0.0f)) / n;
  }
  return loss;
}

// dw2[i], i = c * hidden + j: sum_r dlogits[r][c] h[r][j].
DDP_TRAIN_HD inline float grad_w2(const float* dlogits, const float* h, Shape s, int i) {
  const int c = i / s.hidden, j = i % s.hidden;
  float sum = 0.0f;
  for (int r = 0; r < s.rows; ++r) sum += dlogits[r * s.classes + c] * h[r * s.hidden + j];
  return sum;
}

// db2[c]: sum_r dlogits[r][c].
DDP_TRAIN_HD inline float grad_b2(const float* dlogits, Shape s, int c) {
  float sum = 0.0f;
  for (int r = 0; r < s.rows; ++r) sum += dlogits[r * s.classes + c];
  return sum;
}

// dh[i], i = r * hidden + j: (sum_c dlogits[r][c] w2[c][j]) where h[r][j] > 0, else 0.
DDP_TRAIN_HD inline float grad_hidden(const float* dlogits, const float* w2, const float* h,
                                      Shape s, int i) {
  const int r = i / s.hidden, j = i % s.hidden;
  if (!(h[i] > 0.0f)) return 0.0f;
  float sum = 0.0f;
  for (int c = 0; c < s.classes; ++c) sum += dlogits[r * s.classes + c] * w2[c * s.hidden + j];
  return sum;
}

// dw1[i], i = j * inputs + k: sum_r dh[r][j] x[r][k].
DDP_TRAIN_HD inline float grad_w1(const float* dh, const float* x, Shape s, int i) {
  const int j = i / s.inputs, k = i % s.inputs;
  float sum = 0.0f;
  for (int r = 0; r < s.rows; ++r) sum += dh[r * s.hidden + j] * x[r * s.inputs + k];
  return sum;
}

// db1[j]: sum_r dh[r][j].
DDP_TRAIN_HD inline float grad_b1(const float* dh, Shape s, int j) {
  float sum = 0.0f;
  for (int r = 0; r < s.rows; ++r) sum += dh[r * s.hidden + j];
  return sum;
}

// The batch's mean loss from its rows' losses, in row order.
DDP_TRAIN_HD inline float mean_loss(const float* row_losses, int rows) {
  float sum = 0.0f;
  for (int r = 0; r < rows; ++r) sum += row_losses[r];
  return sum / static_cast<float>(rows);
}

// PyTorch's SGD with momentum: v = m v + g; p -= lr v.
DDP_TRAIN_HD inline void sgd(float* p, float* v, const float* g, float lr, float momentum, int i) {
  v[i] = momentum * v[i] + g[i];
  p[i] -= lr * v[i];
}

}  // namespace ddp_train::math
