// The NCCL backend (built when CUDA and NCCL are found; see cmake/DistNccl.cmake).
//
// Ordering follows PyTorch's ProcessGroupNCCL: a collective records an event on the caller's
// stream, the group's stream waits for it, NCCL runs there, and an event recorded after it is the
// collective's completion. Work::wait() synchronizes on that event (no thread hand-off, no
// polling); Work::wait_on() makes another stream wait for it. The watchdog thread only retires
// completed events, enforces op_timeout and reads the communicator's asynchronous error.
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "dist/sdk/process_group.h"

#if DIST_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace dist::sdk {

#if DIST_HAVE_NCCL

namespace {

// How often the watchdog reads the communicator's asynchronous error (a dead peer is noticed
// within this) and checks deadlines. Completion does not wait for it.
constexpr auto kWatchdogPeriod = std::chrono::milliseconds(100);
// Polling of a non-blocking communicator while it initializes or finalizes.
constexpr auto kCommPollPeriod = std::chrono::microseconds(50);
// Polling of the last collectives while the group is destroyed.
constexpr auto kDrainPollPeriod = std::chrono::milliseconds(1);
// How long the destructor lets NCCL finalize a healthy communicator before aborting it.
constexpr auto kFinalizeTimeout = std::chrono::seconds(10);
// How long an abort may take before the group goes on without it (some NCCL versions hang in
// ncclCommAbort): an exit must happen, and a failed group must not block its callers.
constexpr auto kAbortTimeout = std::chrono::seconds(10);
// Waits for a collective's event or enqueueing poll (so that a failure ends them): spinning, as
// CUDA's own synchronization does, for up to kWaitSpin, then sleeping kWaitSleep between polls.
constexpr auto kWaitSpin = std::chrono::milliseconds(10);
constexpr auto kWaitSleep = std::chrono::microseconds(100);

ncclDataType_t nccl_type(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kInt8:
      return ncclInt8;
    case DataType::kUInt8:
      return ncclUint8;
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

// The pause between two polls: a yield while the wait is short (small collectives complete in
// microseconds), a sleep once it is long (a slow peer must not cost a core).
class Backoff {
 public:
  void pause() {
    if (std::chrono::steady_clock::now() < spin_until_) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kWaitSleep);
    }
  }

 private:
  std::chrono::steady_clock::time_point spin_until_ = std::chrono::steady_clock::now() + kWaitSpin;
};

// Makes the group's device current for a scope and gives the caller's back.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
      cudaSetDevice(device);
    } else {
      previous_ = -1;
    }
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// Whether the group failed, and why: shared by the group and every Work it handed out, which may
// outlive it. The reason is written once, before the flag.
class Health {
 public:
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // The first failure wins; returns false when one was recorded before.
  bool fail(std::string reason) {
    std::lock_guard lock(mutex_);
    if (failed()) return false;
    reason_ = std::move(reason);
    failed_.store(true, std::memory_order_release);
    return true;
  }
  void check() const {
    if (failed()) throw CollectiveError(reason_);
  }

 private:
  std::mutex mutex_;
  std::string reason_;
  std::atomic<bool> failed_{false};
};

// Completion events, reused: creating and destroying one per collective costs more than a small
// collective's launch.
class EventPool {
 public:
  ~EventPool() {
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  cudaEvent_t take() {
    {
      std::lock_guard lock(mutex_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    return e;
  }
  void give_back(cudaEvent_t e) {
    std::lock_guard lock(mutex_);
    free_.push_back(e);
  }

 private:
  std::mutex mutex_;
  std::vector<cudaEvent_t> free_;
};

// One collective: done once its event, recorded on the group's stream after it, has fired.
class NcclWork final : public Work::State {
 public:
  NcclWork(std::shared_ptr<Health> health, std::shared_ptr<EventPool> events)
      : health_(std::move(health)), events_(std::move(events)), done_(events_->take()) {}
  ~NcclWork() override { events_->give_back(done_); }
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;

  cudaEvent_t event() const { return done_; }

  // Not cudaEventSynchronize: a collective queued behind a kernel that never ends would hold
  // it past the group's failure. An aborted communicator ends its kernels, so the event may fire
  // after an abort too: the health check tells a result from an abort.
  void wait() override {
    Backoff backoff;
    cudaError_t e;
    while ((e = cudaEventQuery(done_)) == cudaErrorNotReady) {
      health_->check();
      backoff.pause();
    }
    health_->check();
    check_cuda(e, "waiting for an NCCL collective");
  }
  bool ready() override {
    const cudaError_t e = cudaEventQuery(done_);
    if (e == cudaErrorNotReady) return false;
    health_->check();
    check_cuda(e, "querying an NCCL collective");
    return true;
  }
  void wait_on(CudaStream stream) override {
    health_->check();
    check_cuda(cudaStreamWaitEvent(stream, done_, 0), "cudaStreamWaitEvent");
  }

 private:
  std::shared_ptr<Health> health_;
  std::shared_ptr<EventPool> events_;
  cudaEvent_t done_;
};

class NcclProcessGroup : public ProcessGroup {
 public:
  NcclProcessGroup(ncclComm_t comm, int device, int rank, int size, NcclOptions options)
      : comm_(comm), device_(device), rank_(rank), size_(size), options_(std::move(options)) {
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaEventCreateWithFlags(&caller_ready_, cudaEventDisableTiming), "cudaEventCreate");
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclProcessGroup() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    watchdog_.join();  // returns once every collective completed, or the group failed
    {
      std::lock_guard comm(comm_mutex_);
      if (!health_->failed()) finalize_or_abort();
    }
    DeviceGuard guard(device_);
    if (barrier_buffer_) cudaFree(barrier_buffer_);
    cudaEventDestroy(caller_ready_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  bool device_buffers() const override { return true; }

  Work all_reduce_async(void* data, std::size_t count, DataType type, ReduceOp op,
                        CudaStream stream) override {
    return issue("all_reduce", stream, [&](cudaStream_t s) {
      return ncclAllReduce(data, data, count, nccl_type(type), nccl_op(op), comm_, s);
    });
  }
  Work broadcast_async(void* data, std::size_t count, DataType type, int root,
                       CudaStream stream) override {
    if (root < 0 || root >= size_) {
      throw std::invalid_argument("broadcast root " + std::to_string(root) +
                                  " is not a rank of a group of " + std::to_string(size_));
    }
    return issue("broadcast", stream, [&](cudaStream_t s) {
      return ncclBroadcast(data, data, count, nccl_type(type), root, comm_, s);
    });
  }
  Work all_gather_async(const void* input, void* output, std::size_t count, DataType type,
                        CudaStream stream) override {
    return issue("all_gather", stream, [&](cudaStream_t s) {
      return ncclAllGather(input, output, count, nccl_type(type), comm_, s);
    });
  }
  Work reduce_scatter_async(const void* input, void* output, std::size_t count, DataType type,
                            ReduceOp op, CudaStream stream) override {
    return issue("reduce_scatter", stream, [&](cudaStream_t s) {
      return ncclReduceScatter(input, output, count, nccl_type(type), nccl_op(op), comm_, s);
    });
  }
  Work barrier_async() override {
    if (!barrier_buffer_) {
      DeviceGuard guard(device_);
      check_cuda(cudaMalloc(&barrier_buffer_, sizeof(float)), "cudaMalloc (barrier)");
      check_cuda(cudaMemset(barrier_buffer_, 0, sizeof(float)), "cudaMemset (barrier)");
    }
    return all_reduce_async(barrier_buffer_, 1, DataType::kFloat32, ReduceOp::kSum, nullptr);
  }

 private:
  struct Pending {
    const char* name;
    std::shared_ptr<NcclWork> work;
    std::chrono::steady_clock::time_point deadline;
  };

  // Orders the collective after `caller`, launches it on the group's stream and records its
  // completion event there.
  template <typename Launch>
  Work issue(const char* name, CudaStream caller, Launch&& launch) {
    health_->check();  // before the lock: a failing group may still hold it, aborting
    std::lock_guard comm(comm_mutex_);
    health_->check();
    DeviceGuard guard(device_);
    check_cuda(cudaEventRecord(caller_ready_, caller), "cudaEventRecord (caller's stream)");
    check_cuda(cudaStreamWaitEvent(stream_, caller_ready_, 0), "cudaStreamWaitEvent");
    const auto deadline = std::chrono::steady_clock::now() + options_.op_timeout;
    ncclResult_t r = launch(stream_);
    // A non-blocking communicator may still be enqueueing: the kernel is on the stream only once
    // the communicator leaves ncclInProgress, and the completion event must follow it.
    Backoff backoff;
    while (r == ncclInProgress) {
      if (std::chrono::steady_clock::now() > deadline) {
        throw CollectiveError(fail_locked(name, "not enqueued within op_timeout (" +
                                                    std::to_string(options_.op_timeout.count()) +
                                                    " ms)"));
      }
      backoff.pause();
      ncclCommGetAsyncError(comm_, &r);
    }
    if (r != ncclSuccess) throw CollectiveError(fail_locked(name, ncclGetErrorString(r)));
    auto work = std::make_shared<NcclWork>(health_, events_);
    check_cuda(cudaEventRecord(work->event(), stream_), "cudaEventRecord (NCCL stream)");
    {
      std::lock_guard lock(mutex_);
      pending_.push_back({name, work, deadline});
    }
    return Work(std::move(work));
  }

  // Retires completed collectives; on an asynchronous NCCL error or a collective past its
  // deadline, fails the group.
  void watch() {
    cudaSetDevice(device_);
    while (true) {
      const char* op = "the communicator";
      std::string why;
      bool drained = false;
      {
        std::unique_lock lock(mutex_);
        if (stopping_) {
          wake_.wait_for(lock, kDrainPollPeriod);
        } else {
          wake_.wait_for(lock, kWatchdogPeriod, [this] { return stopping_; });
        }
        cudaError_t state = cudaSuccess;
        while (!pending_.empty() &&
               (state = cudaEventQuery(pending_.front().work->event())) == cudaSuccess) {
          pending_.pop_front();
        }
        if (!pending_.empty()) {
          op = pending_.front().name;
          if (state != cudaErrorNotReady) {
            why = std::string("CUDA error: ") + cudaGetErrorString(state);
          } else if (std::chrono::steady_clock::now() > pending_.front().deadline) {
            why = "timed out after " + std::to_string(options_.op_timeout.count()) +
                  " ms (op_timeout; a peer that stopped issuing collectives?)";
          }
        }
        drained = stopping_ && pending_.empty();
      }
      std::lock_guard comm(comm_mutex_);
      if (health_->failed()) return;
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        why = std::string("asynchronous NCCL error: ") + ncclGetErrorString(async) +
              (async == ncclRemoteError ? " (a peer failed or exited)" : "");
      }
      if (!why.empty()) {
        fail_locked(op, why);
        return;
      }
      if (drained) return;
    }
  }

  // Aborts the communicator, which ends its running kernels, then applies on_failure: exits, or
  // returns the message every later wait() and collective throws. The caller holds comm_mutex_.
  std::string fail_locked(const char* op, const std::string& why) {
    const std::string message = std::string(op) + " on rank " + std::to_string(rank_) + " of " +
                                std::to_string(size_) + " (nccl, device " +
                                std::to_string(device_) + ") failed: " + why;
    if (options_.on_failure == NcclFailure::kExitProcess) {
      std::fprintf(stderr,
                   "dist-sdk: %s; aborting the communicator and exiting with %d so the agent "
                   "restarts the group\n",
                   message.c_str(), options_.exit_code_on_abort);
      std::fflush(stderr);
      abort_communicator();
      std::_Exit(options_.exit_code_on_abort);
    }
    const std::string reported = message +
                                 "; the communicator was aborted: rebuild the group, or exit "
                                 "non-zero so the agent restarts it";
    health_->fail(reported);  // before the abort: waiters its kernels release must see it
    abort_communicator();
    {
      std::lock_guard lock(mutex_);
      pending_.clear();
    }
    return reported;
  }

  // A healthy communicator is finalized (its last collectives flushed) and destroyed; one that
  // does not finalize in time is aborted instead of hanging the worker's exit.
  void finalize_or_abort() {
    ncclResult_t r = ncclCommFinalize(comm_);
    const auto deadline = std::chrono::steady_clock::now() + kFinalizeTimeout;
    while (r == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(kCommPollPeriod);
      ncclCommGetAsyncError(comm_, &r);
    }
    if (r == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      abort_communicator();
    }
  }

  // ncclCommAbort on a thread of its own, waited for at most kAbortTimeout.
  void abort_communicator() {
    auto aborted = std::make_shared<std::promise<void>>();
    std::future<void> done = aborted->get_future();
    std::thread([comm = comm_, aborted] {
      ncclCommAbort(comm);
      aborted->set_value();
    }).detach();
    if (done.wait_for(kAbortTimeout) != std::future_status::ready) {
      std::fprintf(
          stderr,
          "dist-sdk: ncclCommAbort did not return within %lld ms on rank %d; going on "
          "without it\n",
          static_cast<long long>(
              std::chrono::duration_cast<std::chrono::milliseconds>(kAbortTimeout).count()),
          rank_);
    }
  }

  ncclComm_t comm_;
  int device_, rank_, size_;
  NcclOptions options_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t caller_ready_ = nullptr;  // re-recorded by each collective (under comm_mutex_)
  void* barrier_buffer_ = nullptr;
  std::shared_ptr<Health> health_ = std::make_shared<Health>();
  std::shared_ptr<EventPool> events_ = std::make_shared<EventPool>();
  std::mutex comm_mutex_;  // every use of comm_; taken before mutex_
  std::mutex mutex_;       // pending_ and stopping_
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
  // With one visible device (dist-launch --devices or --virtual-local-rank) it is this rank's.
  const int device = options.device >= 0 ? options.device : devices == 1 ? 0 : local_rank;
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
    std::this_thread::sleep_for(kCommPollPeriod);
  }
  if (r != ncclSuccess && r != ncclInProgress) {
    throw CollectiveError(std::string("ncclCommInitRankConfig: ") + ncclGetErrorString(r));
  }
  try {
    return std::make_unique<NcclProcessGroup>(comm, device, rank, size, std::move(options));
  } catch (...) {
    ncclCommAbort(comm);
    throw;
  }
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
      "this build has no NCCL backend: configure with -DDIST_WITH_NCCL=ON on a machine with the "
      "CUDA toolkit and NCCL (CUDAToolkit_ROOT or CUDA_HOME, NCCL_ROOT)");
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
