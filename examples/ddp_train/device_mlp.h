// ddp_train's model on a CUDA device (--backend nccl): the host model's parameters and momenta
// uploaded once, the forward and backward passes as kernels on one stream (mlp_kernels.h), DDP
// over the device gradients on the NCCL group, SGD on the device. The host model stays the
// source of truth for checkpoints, accuracy and the weights' digest: download() brings the
// device's values back into it.
#pragma once

#include <memory>
#include <vector>

#include "dist/sdk/ddp.h"
#include "dist/sdk/process_group.h"

namespace ddp_train {

// The model's tensors as the host keeps them (ddp_train.cc's Mlp).
struct HostTensors {
  std::vector<float>*w1, *b1, *w2, *b2, *v_w1, *v_b1, *v_w2, *v_b2;
};

class DeviceMlp {
 public:
  virtual ~DeviceMlp() = default;
  // Parameters and gradients in device memory, in the host model's registration order.
  virtual std::vector<dist::sdk::Parameter> parameters() = 0;
  // DDP's options: the stream the backward pass writes gradients on.
  virtual dist::sdk::DdpOptions ddp_options() const = 0;
  // Forward and backward over `rows` rows of x (row-major, `inputs` wide) and their labels, each
  // layer's gradients announced to DDP as soon as they are enqueued (the last layer first).
  // Returns the batch's mean loss.
  virtual float backward(const float* x, const int* labels, std::size_t rows,
                         dist::sdk::DistributedDataParallel& ddp) = 0;
  virtual void sgd_step(float lr, float momentum) = 0;
  // The mean of `value` over the group's ranks (an all-reduce through device memory).
  virtual float average(dist::sdk::ProcessGroup& group, float value) = 0;
  virtual void upload(const HostTensors& host) = 0;
  virtual void download(const HostTensors& host) = 0;
};

// On CUDA device `device`, for batches of at most `max_rows` rows. Throws std::runtime_error in
// a build without CUDA or when the device refuses.
std::unique_ptr<DeviceMlp> make_device_mlp(int device, int inputs, int hidden, int classes,
                                           std::size_t max_rows);

}  // namespace ddp_train
