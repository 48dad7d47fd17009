#include "device_mlp.h"

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "mlp_kernels.h"

namespace ddp_train {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("ddp_train on the GPU: ") + what + ": " +
                             cudaGetErrorString(e));
  }
}

class CudaMlp final : public DeviceMlp {
 public:
  CudaMlp(int device, int inputs, int hidden, int classes, std::size_t max_rows)
      : device_(device), max_rows_(max_rows) {
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    m_.inputs = inputs;
    m_.hidden = hidden;
    m_.classes = classes;
    const std::size_t rows = max_rows;
    const auto h = static_cast<std::size_t>(hidden), in = static_cast<std::size_t>(inputs),
               c = static_cast<std::size_t>(classes);
    for (float** p : {&m_.w1, &m_.dw1, &m_.v_w1}) *p = allocate<float>(h * in);
    for (float** p : {&m_.b1, &m_.db1, &m_.v_b1}) *p = allocate<float>(h);
    for (float** p : {&m_.w2, &m_.dw2, &m_.v_w2}) *p = allocate<float>(c * h);
    for (float** p : {&m_.b2, &m_.db2, &m_.v_b2}) *p = allocate<float>(c);
    m_.x = allocate<float>(rows * in);
    m_.labels = allocate<int>(rows);
    m_.h = allocate<float>(rows * h);
    m_.logits = allocate<float>(rows * c);
    m_.dh = allocate<float>(rows * h);
    m_.row_loss = allocate<float>(rows);
    m_.mean_loss = allocate<float>(1);
    average_ = allocate<float>(1);
  }
  ~CudaMlp() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    for (void* p : blocks_) cudaFree(p);
    cudaStreamDestroy(stream_);
  }
  CudaMlp(const CudaMlp&) = delete;
  CudaMlp& operator=(const CudaMlp&) = delete;

  std::vector<dist::sdk::Parameter> parameters() override {
    const auto h = static_cast<std::size_t>(m_.hidden), in = static_cast<std::size_t>(m_.inputs),
               c = static_cast<std::size_t>(m_.classes);
    return {{"w1", {m_.w1, h * in}, {m_.dw1, h * in}, {h, in}},  // shapes: PowerSGD's matrices
            {"b1", {m_.b1, h}, {m_.db1, h}},
            {"w2", {m_.w2, c * h}, {m_.dw2, c * h}, {c, h}},
            {"b2", {m_.b2, c}, {m_.db2, c}}};
  }
  dist::sdk::DdpOptions ddp_options() const override {
    dist::sdk::DdpOptions options;
    options.stream = stream_;
    return options;
  }

  float backward(const float* x, const int* labels, std::size_t rows,
                 dist::sdk::DistributedDataParallel& ddp) override {
    if (rows == 0 || rows > max_rows_) {
      throw std::invalid_argument("a batch of " + std::to_string(rows) + " rows (at most " +
                                  std::to_string(max_rows_) + ")");
    }
    const int n = static_cast<int>(rows);
    check(cudaMemcpyAsync(m_.x, x, rows * static_cast<std::size_t>(m_.inputs) * sizeof(float),
                          cudaMemcpyHostToDevice, stream_),
          "copying the batch");
    check(cudaMemcpyAsync(m_.labels, labels, rows * sizeof(int), cudaMemcpyHostToDevice, stream_),
          "copying the labels");
    kernels::forward(m_, n, stream_);
    kernels::output_gradients(m_, n, stream_);
    ddp.grad_ready(3);  // b2
    ddp.grad_ready(2);  // w2
    kernels::hidden_gradients(m_, n, stream_);
    ddp.grad_ready(1);  // b1
    ddp.grad_ready(0);  // w1
    float loss = 0;
    check(cudaMemcpyAsync(&loss, m_.mean_loss, sizeof loss, cudaMemcpyDeviceToHost, stream_),
          "reading the loss");
    check(cudaStreamSynchronize(stream_), "the backward pass");
    return loss;
  }

  void sgd_step(float lr, float momentum) override { kernels::sgd_step(m_, lr, momentum, stream_); }

  float average(dist::sdk::ProcessGroup& group, float value) override {
    check(cudaMemcpyAsync(average_, &value, sizeof value, cudaMemcpyHostToDevice, stream_),
          "copying a value to average");
    group.all_reduce(average_, 1, dist::sdk::DataType::kFloat32, dist::sdk::ReduceOp::kAvg,
                     stream_);
    check(cudaMemcpyAsync(&value, average_, sizeof value, cudaMemcpyDeviceToHost, stream_),
          "reading the average");
    check(cudaStreamSynchronize(stream_), "averaging");
    return value;
  }

  void upload(const HostTensors& t) override {
    for (const auto& [to, from] : pairs(t)) {
      check(cudaMemcpyAsync(to, from->data(), from->size() * sizeof(float), cudaMemcpyHostToDevice,
                            stream_),
            "uploading the model");
    }
    check(cudaStreamSynchronize(stream_), "uploading the model");
  }
  void download(const HostTensors& t) override {
    for (const auto& [from, to] : pairs(t)) {
      check(cudaMemcpyAsync(to->data(), from, to->size() * sizeof(float), cudaMemcpyDeviceToHost,
                            stream_),
            "downloading the model");
    }
    check(cudaStreamSynchronize(stream_), "downloading the model");
  }

 private:
  template <typename T>
  T* allocate(std::size_t count) {
    void* p = nullptr;
    check(cudaMalloc(&p, count * sizeof(T)), "cudaMalloc");
    blocks_.push_back(p);
    check(cudaMemset(p, 0, count * sizeof(T)), "cudaMemset");
    return static_cast<T*>(p);
  }
  std::vector<std::pair<float*, std::vector<float>*>> pairs(const HostTensors& t) const {
    return {{m_.w1, t.w1},     {m_.b1, t.b1},     {m_.w2, t.w2},     {m_.b2, t.b2},
            {m_.v_w1, t.v_w1}, {m_.v_b1, t.v_b1}, {m_.v_w2, t.v_w2}, {m_.v_b2, t.v_b2}};
  }

  int device_;
  std::size_t max_rows_;
  cudaStream_t stream_ = nullptr;
  kernels::DeviceMlpView m_{};
  float* average_ = nullptr;
  std::vector<void*> blocks_;
};

}  // namespace

std::unique_ptr<DeviceMlp> make_device_mlp(int device, int inputs, int hidden, int classes,
                                           std::size_t max_rows) {
  return std::make_unique<CudaMlp>(device, inputs, hidden, classes, max_rows);
}

}  // namespace ddp_train
