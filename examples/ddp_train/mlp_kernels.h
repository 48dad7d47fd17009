// The device MLP's kernels (mlp_kernels.cu, compiled by nvcc as C++17), callable from host C++:
// each launches one thread per output element of an mlp_math.h function, on `stream`.
#pragma once

struct CUstream_st;

namespace ddp_train::kernels {

using Stream = ::CUstream_st*;  // cudaStream_t

// Device pointers of the model, its gradients, momenta and the batch's scratch.
struct DeviceMlpView {
  int inputs, hidden, classes;
  float *w1, *b1, *w2, *b2;
  float *dw1, *db1, *dw2, *db2;
  float *v_w1, *v_b1, *v_w2, *v_b2;
  float* x;          // [max rows][inputs]
  int* labels;       // [max rows]
  float* h;          // [max rows][hidden]
  float* logits;     // [max rows][classes], then d loss / d logits
  float* dh;         // [max rows][hidden]
  float* row_loss;   // [max rows]
  float* mean_loss;  // one float
};

// h, then logits, for `rows` rows of x.
void forward(const DeviceMlpView& m, int rows, Stream stream);
// The output layer's gradients (dw2, db2) and the mean loss, from the forward's logits.
void output_gradients(const DeviceMlpView& m, int rows, Stream stream);
// The hidden layer's gradients (dw1, db1).
void hidden_gradients(const DeviceMlpView& m, int rows, Stream stream);
// SGD with momentum on every parameter.
void sgd_step(const DeviceMlpView& m, float lr, float momentum, Stream stream);

// Throws std::runtime_error naming the launch when CUDA reports an error for it.
void check_launch(const char* what);

}  // namespace ddp_train::kernels
