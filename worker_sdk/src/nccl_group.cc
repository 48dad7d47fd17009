// The NCCL backend (built when CUDA and NCCL are found; see cmake/DistNccl.cmake).
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "dist/sdk/process_group.h"

#if DIST_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace dist::sdk {

#if DIST_HAVE_NCCL

namespace {

constexpr auto kWatchdogPeriod = std::chrono::milliseconds(100);

ncclDataType_t nccl_type(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

void check_cuda(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) {
    throw CollectiveError(what + ": " + cudaGetErrorString(e));
  }
}

class NcclProcessGroup : public ProcessGroup {
 public:
  NcclProcessGroup(ncclComm_t comm, cudaStream_t stream, int device, int rank, int size,
                   NcclOptions options)
      : comm_(comm),
        stream_(stream),
        device_(device),
        rank_(rank),
        size_(size),
        options_(options),
        watchdog_([this] { watch(); }) {}

  ~NcclProcessGroup() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    watchdog_.join();
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }

  Work all_reduce_async(void* data, std::size_t count, DataType type, ReduceOp op) override {
    return enqueue("all_reduce",
                   ncclAllReduce(data, data, count, nccl_type(type), nccl_op(op), comm_, stream_));
  }
  Work broadcast_async(void* data, std::size_t count, DataType type, int root) override {
    return enqueue("broadcast",
                   ncclBroadcast(data, data, count, nccl_type(type), root, comm_, stream_));
  }
  Work all_gather_async(const void* input, void* output, std::size_t count,
                        DataType type) override {
    return enqueue("all_gather",
                   ncclAllGather(input, output, count, nccl_type(type), comm_, stream_));
  }
  Work reduce_scatter_async(const void* input, void* output, std::size_t count, DataType type,
                            ReduceOp op) override {
    return enqueue("reduce_scatter", ncclReduceScatter(input, output, count, nccl_type(type),
                                                       nccl_op(op), comm_, stream_));
  }
  Work barrier_async() override {
    if (!barrier_buffer_) check_cuda(cudaMalloc(&barrier_buffer_, sizeof(float)), "cudaMalloc");
    return all_reduce_async(barrier_buffer_, 1, DataType::kFloat32, ReduceOp::kSum);
  }

 private:
  struct Pending {
    std::string name;
    cudaEvent_t event;
    std::chrono::steady_clock::time_point deadline;
    std::shared_ptr<std::promise<void>> done;
  };

  Work enqueue(const char* name, ncclResult_t launched) {
    auto done = std::make_shared<std::promise<void>>();
    Work work(done->get_future().share());
    if (launched != ncclSuccess && launched != ncclInProgress) {
      done->set_exception(std::make_exception_ptr(
          CollectiveError(std::string(name) + " could not be issued on rank " +
                          std::to_string(rank_) + " (nccl): " + ncclGetErrorString(launched))));
      return work;
    }
    cudaEvent_t event;
    check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(event, stream_), "cudaEventRecord");
    {
      std::lock_guard lock(mutex_);
      pending_.push_back(
          {name, event, std::chrono::steady_clock::now() + options_.op_timeout, std::move(done)});
    }
    wake_.notify_one();
    return work;
  }

  // Completes operations whose event fired; on an asynchronous NCCL error or an operation past
  // its deadline, aborts the communicator and ends the process so the agent restarts the group.
  void watch() {
    cudaSetDevice(device_);
    std::unique_lock lock(mutex_);
    while (!stopping_ || !pending_.empty()) {
      wake_.wait_for(lock, kWatchdogPeriod);
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      while (!pending_.empty()) {
        Pending& p = pending_.front();
        const cudaError_t state = cudaEventQuery(p.event);
        if (state == cudaSuccess) {
          cudaEventDestroy(p.event);
          p.done->set_value();
          pending_.pop_front();
          continue;
        }
        const bool late = std::chrono::steady_clock::now() > p.deadline;
        if ((async != ncclSuccess && async != ncclInProgress) || late ||
            (state != cudaErrorNotReady)) {
          abort_and_exit(p.name, late ? "timed out after " +
                                            std::to_string(options_.op_timeout.count()) + " ms"
                                      : std::string(ncclGetErrorString(async)));
        }
        break;
      }
      if (stopping_ && pending_.empty()) return;
    }
  }

  [[noreturn]] void abort_and_exit(const std::string& op, const std::string& why) {
    std::fprintf(stderr,
                 "dist-sdk: %s on rank %d (nccl) failed: %s; aborting the communicator and exiting "
                 "with %d so the agent restarts the group\n",
                 op.c_str(), rank_, why.c_str(), options_.exit_code_on_abort);
    std::fflush(stderr);
    ncclCommAbort(comm_);
    std::_Exit(options_.exit_code_on_abort);
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  int device_, rank_, size_;
  NcclOptions options_;
  void* barrier_buffer_ = nullptr;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Pending> pending_;
  bool stopping_ = false;
  std::thread watchdog_;  // last: started once everything above exists
};

}  // namespace

bool nccl_available() {
  return true;
}

std::unique_ptr<ProcessGroup> make_nccl_group(rendezvous::StoreClient store, int rank, int size,
                                              int local_rank, NcclOptions options) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    throw CollectiveError("NCCL group on rank " + std::to_string(rank) +
                          ": no usable CUDA device on this host");
  }
  const int device = options.device >= 0 ? options.device : local_rank;
  if (device >= devices) {
    throw CollectiveError("rank " + std::to_string(rank) + " wants CUDA device " +
                          std::to_string(device) + " but this host has " + std::to_string(devices) +
                          " (--nproc-per-node above the GPU count?)");
  }
  check_cuda(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  const std::string id_bytes =
      exchange_nccl_unique_id(store, rank, options.key_prefix + "/unique_id", options.init_timeout);
  ncclUniqueId id;
  std::memcpy(&id, id_bytes.data(), sizeof id);

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // initialization must be abortable at a deadline
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  const auto deadline = std::chrono::steady_clock::now() + options.init_timeout;
  while (r == ncclInProgress || (r == ncclSuccess && comm != nullptr)) {
    ncclResult_t state = ncclInProgress;
    ncclCommGetAsyncError(comm, &state);
    if (state == ncclSuccess) break;
    if (state != ncclInProgress || std::chrono::steady_clock::now() > deadline) {
      ncclCommAbort(comm);
      throw CollectiveError("NCCL initialization of rank " + std::to_string(rank) + " of " +
                            std::to_string(size) + " failed: " +
                            (state != ncclInProgress ? ncclGetErrorString(state)
                                                     : "timed out waiting for the other ranks"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (r != ncclSuccess && r != ncclInProgress) {
    throw CollectiveError(std::string("ncclCommInitRankConfig: ") + ncclGetErrorString(r));
  }
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  return std::make_unique<NcclProcessGroup>(comm, stream, device, rank, size, options);
}

std::string exchange_nccl_unique_id(rendezvous::StoreClient& store, int rank,
                                    const std::string& key, std::chrono::milliseconds timeout) {
  if (rank == 0) {
    ncclUniqueId id;
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      throw CollectiveError(std::string("ncclGetUniqueId: ") + ncclGetErrorString(r));
    }
    std::string bytes(reinterpret_cast<const char*>(&id), sizeof id);
    store.set(key, bytes);
    return bytes;
  }
  std::string bytes = store.get(key, timeout);
  if (bytes.size() != NCCL_UNIQUE_ID_BYTES) {
    throw CollectiveError("the NCCL unique id under '" + key + "' has " +
                          std::to_string(bytes.size()) + " bytes, not " +
                          std::to_string(NCCL_UNIQUE_ID_BYTES));
  }
  return bytes;
}

#else  // no NCCL in this build

bool nccl_available() {
  return false;
}

namespace {
[[noreturn]] void no_nccl() {
  throw CollectiveError(
      "this build has no NCCL backend: configure with -DDIST_WITH_NCCL=ON on a machine with CUDA "
      "and NCCL (found under CUDA_HOME or /usr/local/cuda)");
}
}  // namespace

std::unique_ptr<ProcessGroup> make_nccl_group(rendezvous::StoreClient, int, int, int, NcclOptions) {
  no_nccl();
}
std::string exchange_nccl_unique_id(rendezvous::StoreClient&, int, const std::string&,
                                    std::chrono::milliseconds) {
  no_nccl();
}

#endif

}  // namespace dist::sdk
