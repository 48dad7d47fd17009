#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "mlp_kernels.h"
#include "mlp_math.h"

namespace ddp_train::kernels {
namespace {

constexpr int kThreads = 128;

using math::Shape;

int blocks(int n) {
  return (n + kThreads - 1) / kThreads;
}

__device__ int index() {
  return static_cast<int>(blockIdx.x) * kThreads + static_cast<int>(threadIdx.x);
}

__global__ void hidden_kernel(const float* x, const float* w1, const float* b1, float* h, Shape s) {
  const int i = index();
  if (i < s.rows * s.hidden) h[i] = math::hidden_unit(x, w1, b1, s, i);
}

__global__ void logit_kernel(const float* h, const float* w2, const float* b2, float* logits,
                             Shape s) {
  const int i = index();
  if (i < s.rows * s.classes) logits[i] = math::logit(h, w2, b2, s, i);
}

__global__ void softmax_kernel(float* logits, const int* labels, float* row_loss, Shape s) {
  const int r = index();
  if (r < s.rows) row_loss[r] = math::softmax_cross_entropy_row(logits, labels, s, r);
}

__global__ void mean_loss_kernel(const float* row_loss, float* mean_loss, int rows) {
  if (index() == 0) *mean_loss = math::mean_loss(row_loss, rows);
}

__global__ void output_grad_kernel(const float* dlogits, const float* h, float* dw2, float* db2,
                                   Shape s) {
  const int i = index();
  if (i < s.classes * s.hidden) dw2[i] = math::grad_w2(dlogits, h, s, i);
  if (i < s.classes) db2[i] = math::grad_b2(dlogits, s, i);
}

__global__ void hidden_delta_kernel(const float* dlogits, const float* w2, const float* h,
                                    float* dh, Shape s) {
  const int i = index();
  if (i < s.rows * s.hidden) dh[i] = math::grad_hidden(dlogits, w2, h, s, i);
}

__global__ void hidden_grad_kernel(const float* dh, const float* x, float* dw1, float* db1,
                                   Shape s) {
  const int i = index();
  if (i < s.hidden * s.inputs) dw1[i] = math::grad_w1(dh, x, s, i);
  if (i < s.hidden) db1[i] = math::grad_b1(dh, s, i);
}

__global__ void sgd_kernel(float* p, float* v, const float* g, float lr, float momentum, int n) {
  const int i = index();
  if (i < n) math::sgd(p, v, g, lr, momentum, i);
}

Shape shape(const DeviceMlpView& m, int rows) {
  return {rows, m.inputs, m.hidden, m.classes};
}

}  // namespace

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("launching ") + what + ": " + cudaGetErrorString(e));
  }
}

void forward(const DeviceMlpView& m, int rows, Stream stream) {
  const Shape s = shape(m, rows);
  hidden_kernel<<<blocks(rows * m.hidden), kThreads, 0, stream>>>(m.x, m.w1, m.b1, m.h, s);
  check_launch("the hidden layer");
  logit_kernel<<<blocks(rows * m.classes), kThreads, 0, stream>>>(m.h, m.w2, m.b2, m.logits, s);
  check_launch("the output layer");
}

void output_gradients(const DeviceMlpView& m, int rows, Stream stream) {
  const Shape s = shape(m, rows);
  softmax_kernel<<<blocks(rows), kThreads, 0, stream>>>(m.logits, m.labels, m.row_loss, s);
  check_launch("the softmax");
  mean_loss_kernel<<<1, kThreads, 0, stream>>>(m.row_loss, m.mean_loss, rows);
  check_launch("the mean loss");
  output_grad_kernel<<<blocks(m.classes * m.hidden), kThreads, 0, stream>>>(m.logits, m.h, m.dw2,
                                                                            m.db2, s);
  check_launch("the output layer's gradients");
}

void hidden_gradients(const DeviceMlpView& m, int rows, Stream stream) {
  const Shape s = shape(m, rows);
  hidden_delta_kernel<<<blocks(rows * m.hidden), kThreads, 0, stream>>>(m.logits, m.w2, m.h, m.dh,
                                                                        s);
  check_launch("the hidden layer's deltas");
  hidden_grad_kernel<<<blocks(m.hidden * m.inputs), kThreads, 0, stream>>>(m.dh, m.x, m.dw1, m.db1,
                                                                           s);
  check_launch("the hidden layer's gradients");
}

void sgd_step(const DeviceMlpView& m, float lr, float momentum, Stream stream) {
  const struct {
    float *p, *v, *g;
    int n;
  } tensors[] = {{m.w1, m.v_w1, m.dw1, m.hidden * m.inputs},
                 {m.b1, m.v_b1, m.db1, m.hidden},
                 {m.w2, m.v_w2, m.dw2, m.classes * m.hidden},
                 {m.b2, m.v_b2, m.db2, m.classes}};
  for (const auto& t : tensors) {
    sgd_kernel<<<blocks(t.n), kThreads, 0, stream>>>(t.p, t.v, t.g, lr, momentum, t.n);
    check_launch("the SGD step");
  }
}

}  // namespace ddp_train::kernels
