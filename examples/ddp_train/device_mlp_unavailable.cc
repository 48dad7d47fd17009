// ddp_train built without nvcc: --backend nccl says so.
#include <stdexcept>

#include "device_mlp.h"

namespace ddp_train {

std::unique_ptr<DeviceMlp> make_device_mlp(int, int, int, int, std::size_t) {
  throw std::runtime_error(
      "this ddp_train has no GPU path: it was built without the CUDA compiler (configure where "
      "nvcc works, with DIST_WITH_NCCL=ON)");
}

}  // namespace ddp_train
