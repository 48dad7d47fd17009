// The NCCL backend (built when CUDA and NCCL are found; see cmake/DistNccl.cmake).
//
// Ordering follows PyTorch's ProcessGroupNCCL: a collective records an event on the caller's
// stream, the group's stream waits for it, NCCL runs there, and an event recorded after it is the
// collective's completion. Work::wait() synchronizes on that event (no thread hand-off);
// Work::wait_on() makes another stream wait for it.
//
// Failures, as ProcessGroupNCCL handles them: NCCL refusing a collective when it is issued is the
// caller's error, thrown to the caller (the communicator is intact); the watchdog thread, which
// retires completed events, enforces op_timeout and reads the communicator's asynchronous error,
// is the only one to fail the group, aborting the communicator. A monitor thread watches the
// watchdog. Locks: callers serialize their NCCL calls on enqueue_mutex_, which nothing else takes,
// so an NCCL call stuck inside NCCL never keeps the watchdog from aborting it (NCCL lets
// ncclCommAbort run beside it); state_mutex_ only covers NCCL's quick queries, so none of them runs
// on a communicator being aborted.
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "dist/sdk/process_group.h"
#include "nccl_bootstrap.h"
#include "progress_slot.h"

#if DIST_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "cuda_device.h"
#include "stall_monitor.h"
#endif

namespace dist::sdk {

#if DIST_HAVE_NCCL

namespace {

using detail::DeviceGuard;
using Clock = std::chrono::steady_clock;

// How often the watchdog reads the communicator's asynchronous error (a dead peer is noticed
// within this) and checks deadlines. Completion does not wait for it; releasing what
// Work::keep_alive() holds does.
constexpr auto kWatchdogPeriod = std::chrono::milliseconds(100);
// Polling of a non-blocking communicator while it initializes or finalizes.
constexpr auto kCommPollPeriod = std::chrono::microseconds(50);
// How long the destructor lets NCCL finalize an idle, healthy communicator before aborting it.
constexpr auto kFinalizeTimeout = std::chrono::seconds(10);
// How long an abort may take before the group goes on without it (some NCCL versions hang in
// ncclCommAbort): an exit must happen, and a failed group must not block its callers.
constexpr auto kAbortTimeout = std::chrono::seconds(10);
// How long an abort lets a caller finish an NCCL call it is in (see abort_communicator).
constexpr auto kEnqueueGrace = std::chrono::seconds(2);
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
  throw std::invalid_argument("no NCCL type for DataType " + std::to_string(static_cast<int>(t)));
}

// `group_size` ranks reduce with `op`. An average over one rank is the value itself: NCCL's
// one-rank path for ncclAvg (a pre-multiply kernel, src/device/onerank.cu) splits the elements
// into up to 32 blocks of alignUp(count / blocks, 16 / element size) and drops the tail when that
// rounds down, for example the last 3 of 1,000,003 doubles (seen on an H100 with NCCL 2.28.9:
// worker_sdk/tests/gpu_test.cc, OutOfPlaceResultsAreNcclsWorkInEveryDataType). ncclSum is a copy.
ncclRedOp_t nccl_op(ReduceOp op, int group_size) {
  if (op == ReduceOp::kAvg && group_size == 1) return ncclSum;
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
  throw std::invalid_argument("no NCCL op for ReduceOp " + std::to_string(static_cast<int>(op)));
}

void check_cuda(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) {
    throw CollectiveError(what + ": " + cudaGetErrorString(e));
  }
}

// ncclGetVersion's code as text (2.9 and later: major * 10000 + minor * 100 + patch).
std::string version_text(int code) {
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? code % 10000 / 100 : code % 1000 / 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

std::string loaded_nccl() {
  int code = 0;
  return ncclGetVersion(&code) == ncclSuccess ? version_text(code) : "unknown";
}

// NCCL's last warning in this process (its own words: which peer, which transport), or "".
std::string nccl_last_error(ncclComm_t comm) {
  const char* text = ncclGetLastError(comm);
  return text && *text ? std::string(" (NCCL: ") + text + ")" : "";
}

// The pause between two polls: a yield while the wait is short (small collectives complete in
// microseconds), a sleep once it is long (a slow peer must not cost a core).
class Backoff {
 public:
  void pause() {
    if (Clock::now() < spin_until_) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kWaitSleep);
    }
  }

 private:
  Clock::time_point spin_until_ = Clock::now() + kWaitSpin;
};

// ncclCommAbort on a thread of its own (under the group's device: NCCL restores the thread's
// previous one, and a fresh thread's is 0), waited for at most kAbortTimeout: some NCCL versions
// hang in it, and an exit must happen. False when it did not return in time.
bool abort_bounded(ncclComm_t comm, int device, int rank) {
  auto aborted = std::make_shared<std::promise<void>>();
  std::future<void> done = aborted->get_future();
  std::thread([comm, device, aborted] {
    cudaSetDevice(device);
    ncclCommAbort(comm);
    aborted->set_value();
  }).detach();
  if (done.wait_for(kAbortTimeout) == std::future_status::ready) return true;
  std::fprintf(stderr,
               "dist-sdk: ncclCommAbort did not return within %lld ms on rank %d; going on "
               "without it\n",
               static_cast<long long>(
                   std::chrono::duration_cast<std::chrono::milliseconds>(kAbortTimeout).count()),
               rank);
  return false;
}

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
  explicit EventPool(int device) : device_(device) {}
  ~EventPool() {
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  cudaEvent_t take() {
    {
      std::lock_guard lock(mutex_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    DeviceGuard guard(device_);
    cudaEvent_t e = nullptr;
    check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    return e;
  }
  void give_back(cudaEvent_t e) {
    std::lock_guard lock(mutex_);
    free_.push_back(e);
  }
  int device() const { return device_; }

 private:
  const int device_;
  std::mutex mutex_;
  std::vector<cudaEvent_t> free_;
};

// One collective: done once its event, recorded on the group's stream after it, has fired. What
// keep_alive() was given is held until the watchdog saw that (retire()).
class NcclWork final : public Work::State {
 public:
  NcclWork(std::shared_ptr<Health> health, std::shared_ptr<EventPool> events)
      : health_(std::move(health)), events_(std::move(events)), done_(events_->take()) {}
  ~NcclWork() override { events_->give_back(done_); }
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;

  cudaEvent_t event() const { return done_; }
  cudaError_t query() const { return cudaEventQuery(done_); }

  // Not cudaEventSynchronize: a collective queued behind a kernel that never ends would hold
  // it past the group's failure. An aborted communicator ends its kernels, so the event may fire
  // after an abort too: the health check tells a result from an abort.
  void wait() override {
    DeviceGuard guard(events_->device());
    Backoff backoff;
    cudaError_t e;
    while ((e = query()) == cudaErrorNotReady) {
      health_->check();
      backoff.pause();
    }
    health_->check();
    check_cuda(e, "waiting for an NCCL collective");
  }
  bool ready() override {
    DeviceGuard guard(events_->device());
    const cudaError_t e = query();
    if (e == cudaErrorNotReady) {
      health_->check();  // a failed group's collective is never "not ready yet"
      return false;
    }
    health_->check();
    check_cuda(e, "querying an NCCL collective");
    return true;
  }
  void wait_on(CudaStream stream) override {
    health_->check();
    check_cuda(cudaStreamWaitEvent(stream, done_, 0), "cudaStreamWaitEvent");
  }
  void keep_alive(std::shared_ptr<const void> owner) override {
    std::lock_guard lock(mutex_);
    owners_.push_back(std::move(owner));
  }
  // The collective completed (or its communicator's abort returned): NCCL is done with the
  // buffers.
  void retire() {
    std::vector<std::shared_ptr<const void>> owners;
    std::lock_guard lock(mutex_);
    owners.swap(owners_);
  }

 private:
  std::shared_ptr<Health> health_;
  std::shared_ptr<EventPool> events_;
  cudaEvent_t done_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<const void>> owners_;
};

class NcclProcessGroup : public ProcessGroup {
 public:
  NcclProcessGroup(ncclComm_t comm, int device, int rank, int size, NcclOptions options)
      : comm_(comm),
        device_(device),
        rank_(rank),
        size_(size),
        options_(std::move(options)),
        nccl_(loaded_nccl()),
        events_(std::make_shared<EventPool>(device)) {
    DeviceGuard guard(device_);
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaEventCreateWithFlags(&caller_ready_, cudaEventDisableTiming), "cudaEventCreate");
    monitor_ = std::make_unique<detail::StallMonitor>(
        options_.watchdog_stall_timeout,
        [this](std::chrono::milliseconds silent) { watchdog_stalled(silent); });
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclProcessGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  bool device_buffers() const override { return true; }
  // ncclCommAbort (bounded), whatever on_failure says: the caller asked, and rebuilds the group.
  bool abort(const std::string& why) override {
    if (!health_->failed()) {
      fail_and_abort(describe("the communicator") + " was aborted: " + why +
                     "; rebuild the group, or exit non-zero so the agent restarts it");
    }
    return true;
  }
  int cuda_device() const override { return device_; }

  Work all_reduce_async(void* data, std::size_t count, DataType type, ReduceOp op,
                        CudaStream stream) override {
    const auto t = nccl_type(type);
    const auto o = nccl_op(op, size_);
    const std::size_t bytes = count * element_size(type);
    return issue_from("all_reduce", stream, data, bytes, data, bytes,
                      [&](const void* in, void* out, cudaStream_t s) {
                        return ncclAllReduce(in, out, count, t, o, comm_, s);
                      });
  }
  Work broadcast_async(void* data, std::size_t count, DataType type, int root,
                       CudaStream stream) override {
    if (root < 0 || root >= size_) {
      throw std::invalid_argument("broadcast root " + std::to_string(root) +
                                  " is not a rank of a group of " + std::to_string(size_));
    }
    const auto t = nccl_type(type);
    const std::size_t bytes = count * element_size(type);
    return issue_from("broadcast", stream, data, bytes, data, bytes,
                      [&](const void* in, void* out, cudaStream_t s) {
                        return ncclBroadcast(in, out, count, t, root, comm_, s);
                      });
  }
  Work all_gather_async(const void* input, void* output, std::size_t count, DataType type,
                        CudaStream stream) override {
    const auto t = nccl_type(type);
    const std::size_t bytes = count * element_size(type);
    return issue_from("all_gather", stream, input, bytes, output, bytes * std::size_t(size_),
                      [&](const void* in, void* out, cudaStream_t s) {
                        return ncclAllGather(in, out, count, t, comm_, s);
                      });
  }
  Work reduce_scatter_async(const void* input, void* output, std::size_t count, DataType type,
                            ReduceOp op, CudaStream stream) override {
    const auto t = nccl_type(type);
    const auto o = nccl_op(op, size_);
    const std::size_t bytes = count * element_size(type);
    return issue_from("reduce_scatter", stream, input, bytes * std::size_t(size_), output, bytes,
                      [&](const void* in, void* out, cudaStream_t s) {
                        return ncclReduceScatter(in, out, count, t, o, comm_, s);
                      });
  }
  Work barrier_async() override {
    {
      std::lock_guard enqueue(enqueue_mutex_);
      if (!barrier_buffer_) {
        DeviceGuard guard(device_);
        check_cuda(cudaMalloc(&barrier_buffer_, sizeof(float)), "cudaMalloc (barrier)");
        check_cuda(cudaMemset(barrier_buffer_, 0, sizeof(float)), "cudaMemset (barrier)");
      }
    }
    return all_reduce_async(barrier_buffer_, 1, DataType::kFloat32, ReduceOp::kSum, nullptr);
  }

 private:
  struct Pending {
    const char* name;
    std::shared_ptr<NcclWork> work;
    Clock::time_point deadline;
    std::uint64_t sequence = 0;  // in the worker's progress slot (progress_slot.h)
  };

  // "all_reduce on rank 0 of 2 (nccl 2.30.7, device 0)".
  std::string describe(const char* op) const {
    return std::string(op) + " on rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
           " (nccl " + nccl_ + ", device " + std::to_string(device_) + ")";
  }

  // A collective whose buffers are device memory is issued as it is. Host memory (a loss to
  // average in a std::vector, a step the ranks agree on) is an illegal address to NCCL's
  // kernels: such a buffer goes through device memory of the group's (copied in, the
  // collective, copied back) and the call returns complete, as a host collective of Gloo's does.
  // For the small values such calls carry; gradients belong in device memory.
  template <typename Launch>
  Work issue_from(const char* name, CudaStream caller, const void* input, std::size_t input_bytes,
                  void* output, std::size_t output_bytes, Launch&& launch) {
    const bool host_in = input_bytes > 0 && !device_memory(input);
    const bool host_out = output_bytes > 0 && !device_memory(output);
    if (!host_in && !host_out) {
      return issue(name, caller, [&](cudaStream_t s) { return launch(input, output, s); });
    }
    const bool in_place = input == output;
    std::lock_guard staging(staging_mutex_);
    DeviceGuard guard(device_);
    // What the caller's stream still has to write into host memory (an asynchronous copy into
    // pinned memory) first; then everything is ordered on the legacy default stream, where the
    // copy in runs and after which issue() orders the collective.
    if (caller)
      check_cuda(cudaStreamSynchronize(caller), "cudaStreamSynchronize (caller's stream)");
    char* space =
        reserve_staging((host_in ? input_bytes : 0) + (host_out && !in_place ? output_bytes : 0));
    const void* device_in = host_in ? space : input;
    void* device_out = !host_out ? output : in_place ? space : space + (host_in ? input_bytes : 0);
    if (host_in) {
      check_cuda(cudaMemcpy(space, input, input_bytes, cudaMemcpyHostToDevice),
                 "cudaMemcpy (a host buffer into the NCCL group's device memory)");
    }
    Work work =
        issue(name, nullptr, [&](cudaStream_t s) { return launch(device_in, device_out, s); });
    work.wait();
    if (host_out) {
      check_cuda(cudaMemcpy(output, device_out, output_bytes, cudaMemcpyDeviceToHost),
                 "cudaMemcpy (the NCCL group's device memory back into a host buffer)");
    }
    return Work();
  }

  // Whether NCCL's kernels can address `p`: device or managed memory.
  static bool device_memory(const void* p) {
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
      cudaGetLastError();  // an unknown pointer is ordinary host memory
      return false;
    }
    return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
  }

  // At least `bytes` of device memory for host buffers' collectives (under staging_mutex_; the
  // last staged collective has completed or its communicator was aborted, which ends kernels).
  char* reserve_staging(std::size_t bytes) {
    if (bytes > staging_bytes_) {
      if (staging_) check_cuda(cudaFree(staging_), "cudaFree (staging)");
      staging_ = nullptr;
      staging_bytes_ = 0;
      check_cuda(cudaMalloc(&staging_, bytes), "cudaMalloc (staging for host buffers)");
      staging_bytes_ = bytes;
    }
    return static_cast<char*>(staging_);
  }

  // Orders the collective after `caller`, launches it on the group's stream and records its
  // completion event there. NCCL refusing it is thrown to the caller; the group stays usable.
  template <typename Launch>
  Work issue(const char* name, CudaStream caller, Launch&& launch) {
    health_->check();  // before the lock: a failing group may still hold it, aborting
    std::lock_guard enqueue(enqueue_mutex_);
    health_->check();
    DeviceGuard guard(device_);
    check_cuda(cudaEventRecord(caller_ready_, caller), "cudaEventRecord (caller's stream)");
    check_cuda(cudaStreamWaitEvent(stream_, caller_ready_, 0), "cudaStreamWaitEvent");
    auto work = std::make_shared<NcclWork>(health_, events_);  // before NCCL: nothing may throw
    const auto deadline = Clock::now() + options_.op_timeout;  // between launch and record
    {
      std::lock_guard state(state_mutex_);
      if (aborting_) {
        health_->check();
        throw CollectiveError(describe(name) + ": the communicator is being aborted");
      }
      ++in_nccl_;  // an abort lets this call leave NCCL first (see abort_communicator)
    }
    const ncclResult_t r = launch(stream_);
    --in_nccl_;
    if (r == ncclInProgress) {
      wait_enqueued(name, deadline);  // non-blocking: throws once the communicator failed
    } else if (r != ncclSuccess) {
      throw CollectiveError(
          describe(name) + " was refused by NCCL: " + ncclGetErrorString(r) +
          nccl_last_error(comm_) +
          (options_.blocking ? "; nothing ran and the group is intact (check the arguments)"
                             : "; a non-blocking communicator keeps the error: the group fails"));
    }
    check_cuda(cudaEventRecord(work->event(), stream_), "cudaEventRecord (NCCL stream)");
    {
      std::lock_guard lock(mutex_);
      pending_.push_back(
          {name, work, deadline, detail::collective_issued(detail::collective_kind(name))});
    }
    return Work(std::move(work));
  }

  // A non-blocking communicator still enqueueing: the kernel is on the stream only once the
  // communicator leaves ncclInProgress, and the completion event must follow it.
  void wait_enqueued(const char* name, Clock::time_point deadline) {
    Backoff backoff;
    for (ncclResult_t r = ncclInProgress; r != ncclSuccess;) {
      if (r != ncclInProgress) {
        throw CollectiveError(fail(name, std::string("asynchronous NCCL error while enqueuing: ") +
                                             ncclGetErrorString(r) + nccl_last_error(comm_)));
      }
      if (Clock::now() > deadline) {
        throw CollectiveError(fail(name, "not enqueued within op_timeout (" +
                                             std::to_string(options_.op_timeout.count()) + " ms)"));
      }
      backoff.pause();
      const auto state = async_error();
      if (!state) {  // another thread failed the group and is aborting the communicator
        health_->check();
        throw CollectiveError(describe(name) + ": the communicator is being aborted");
      }
      r = *state;
    }
  }

  // The communicator's asynchronous error; none once it is being aborted (then nothing may
  // touch it). Quick: NCCL only reads a field.
  std::optional<ncclResult_t> async_error() {
    std::lock_guard state(state_mutex_);
    if (aborting_) return std::nullopt;
    ncclResult_t r = ncclSuccess;
    ncclCommGetAsyncError(comm_, &r);
    return r;
  }

  void watch();
  void retire_completed(const char*& op, Clock::time_point& deadline, cudaError_t& state);
  std::string fail(const char* op, const std::string& why);
  void fail_and_abort(const std::string& reported);
  void watchdog_stalled(std::chrono::milliseconds silent);
  std::size_t still_running();
  void finalize_or_abort();
  void abort_communicator();

  ncclComm_t comm_;
  const int device_, rank_, size_;
  const NcclOptions options_;
  const std::string nccl_;  // the loaded NCCL's version, for messages
  std::shared_ptr<Health> health_ = std::make_shared<Health>();
  std::shared_ptr<EventPool> events_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t caller_ready_ = nullptr;  // re-recorded by each collective (under enqueue_mutex_)
  void* barrier_buffer_ = nullptr;      // created under enqueue_mutex_
  std::mutex staging_mutex_;            // one host buffer's collective at a time
  void* staging_ = nullptr;             // device memory for host buffers (issue_from)
  std::size_t staging_bytes_ = 0;
  std::mutex enqueue_mutex_;  // callers' NCCL calls; never taken by the watchdog
  std::mutex state_mutex_;    // aborting_, and NCCL's quick queries on comm_
  bool aborting_ = false;
  std::atomic<int> in_nccl_{0};      // callers inside an NCCL enqueue call
  std::atomic<int> abort_state_{0};  // 0 none, 1 started, 2 returned, 3 given up on
  std::mutex mutex_;                 // pending_, stopping_, graveyard_
  std::condition_variable wake_;
  std::deque<Pending> pending_;
  std::vector<std::shared_ptr<NcclWork>> graveyard_;  // failed collectives, until the abort returns
  bool stopping_ = false;
  std::unique_ptr<detail::StallMonitor> monitor_;
  std::thread watchdog_;  // last: started once everything above exists
};

// Retires completed collectives from the front (their events queried outside mutex_: a CUDA call
// stuck in the driver must not block callers), leaving op/deadline/state on the first one running.
void NcclProcessGroup::retire_completed(const char*& op, Clock::time_point& deadline,
                                        cudaError_t& state) {
  while (true) {
    std::shared_ptr<NcclWork> front;
    {
      std::lock_guard lock(mutex_);
      if (pending_.empty()) return;
      front = pending_.front().work;
      op = pending_.front().name;
      deadline = pending_.front().deadline;
    }
    state = front->query();
    if (state != cudaSuccess) return;
    {
      std::lock_guard lock(mutex_);
      if (!pending_.empty() && pending_.front().work == front) {
        detail::collective_completed(pending_.front().sequence);
        pending_.pop_front();
      }
    }
    front->retire();
    op = nullptr;
  }
}

// Retires completed collectives; on an asynchronous NCCL error, a CUDA error or a collective
// past its deadline, fails the group. Stops at once when the group is destroyed (no drain).
void NcclProcessGroup::watch() {
  cudaSetDevice(device_);  // this thread's only device: the group's, which has a context
  while (true) {
    monitor_->beat();
    {
      std::unique_lock lock(mutex_);
      wake_.wait_for(lock, kWatchdogPeriod, [this] { return stopping_; });
      if (stopping_) return;
    }
    if (health_->failed()) return;  // a caller failed it (a non-blocking enqueue): aborted
    const char* op = nullptr;
    Clock::time_point deadline;
    cudaError_t state = cudaSuccess;
    retire_completed(op, deadline, state);
    std::string why;
    if (op) {
      // The process is exiting (a group left to static destruction): nothing to watch or abort,
      // and no restart for a job that finished.
      if (state == cudaErrorCudartUnloading) return;
      if (state != cudaErrorNotReady) {
        why = std::string("CUDA error: ") + cudaGetErrorString(state);
      } else if (Clock::now() > deadline) {
        why = "timed out after " + std::to_string(options_.op_timeout.count()) +
              " ms (op_timeout; a peer that stopped issuing collectives, or died: within a node "
              "NCCL reports no error for a dead peer)";
      }
    }
    if (why.empty()) {
      const ncclResult_t async = async_error().value_or(ncclInProgress);
      if (async != ncclSuccess && async != ncclInProgress) {
        why = std::string("asynchronous NCCL error: ") + ncclGetErrorString(async) +
              (async == ncclRemoteError ? " (a peer failed or exited)" : "") +
              nccl_last_error(comm_);
      }
    }
    if (!why.empty()) {
      fail(op ? op : "the communicator", why);
      return;
    }
  }
}

// Marks the group failed, aborts the communicator (which ends its running kernels), then applies
// on_failure: exits, or returns the message every later wait() and collective throws.
std::string NcclProcessGroup::fail(const char* op, const std::string& why) {
  const std::string message = describe(op) + " failed: " + why;
  if (options_.on_failure == NcclFailure::kExitProcess) {
    health_->fail(message + "; the process is exiting");
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
  fail_and_abort(reported);
  return reported;
}

// The group failed with `reported` (every later wait() and collective throws it), the
// communicator aborted (its running kernels end), the pending collectives let go of.
void NcclProcessGroup::fail_and_abort(const std::string& reported) {
  health_->fail(reported);  // before the abort: waiters its kernels release must see it
  abort_communicator();
  std::lock_guard lock(mutex_);
  for (auto& p : pending_) {
    if (abort_state_.load() == 2) {
      p.work->retire();
    } else {
      graveyard_.push_back(p.work);  // NCCL may still use their buffers: never release them
    }
  }
  pending_.clear();
}

void NcclProcessGroup::watchdog_stalled(std::chrono::milliseconds silent) {
  std::fprintf(stderr,
               "dist-sdk: the NCCL watchdog of rank %d (device %d) made no progress for %lld ms "
               "(watchdog_stall_timeout: a CUDA or NCCL call stuck in the driver); nothing can "
               "detect a hang any more: exiting with %d so the agent restarts the group\n",
               rank_, device_, static_cast<long long>(silent.count()), options_.exit_code_on_abort);
  std::fflush(stderr);
  std::_Exit(options_.exit_code_on_abort);
}

// How many collectives have not completed; retires the others. SIZE_MAX when CUDA is unloading.
std::size_t NcclProcessGroup::still_running() {
  std::lock_guard lock(mutex_);
  std::size_t running = 0;
  for (auto& p : pending_) {
    const cudaError_t e = p.work->query();
    if (e == cudaErrorCudartUnloading) return SIZE_MAX;
    if (e == cudaSuccess) {
      p.work->retire();
    } else {
      ++running;
    }
  }
  return running;
}

NcclProcessGroup::~NcclProcessGroup() {
  monitor_.reset();
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  watchdog_.join();
  // A group destroyed at exit (a static one) after CUDA began unloading: NCCL and CUDA calls may
  // crash or hang now, and the driver frees everything anyway.
  if (cudaStreamQuery(stream_) == cudaErrorCudartUnloading) return;
  DeviceGuard guard(device_);
  const std::size_t running = health_->failed() ? 0 : still_running();
  if (running == SIZE_MAX) return;  // the process is exiting: leave everything to the driver
  if (abort_state_.load() == 0) {
    if (running == 0) {
      finalize_or_abort();
    } else {
      // Never drain: collectives that have not completed wait on a peer that is behind or dead,
      // for up to op_timeout. Abort them; their Work throws this.
      const std::string why = describe("the group") + " was destroyed with " +
                              std::to_string(running) +
                              " collective(s) still running: the communicator was aborted";
      health_->fail(why);
      std::fprintf(stderr, "dist-sdk: %s\n", why.c_str());
      abort_communicator();
    }
  }
  if (abort_state_.load() == 3) return;  // NCCL may still use them: leak rather than block
  {
    std::lock_guard lock(mutex_);
    for (auto& p : pending_) p.work->retire();
    for (auto& w : graveyard_) w->retire();
  }
  if (barrier_buffer_) cudaFree(barrier_buffer_);
  if (staging_) cudaFree(staging_);
  cudaEventDestroy(caller_ready_);
  cudaStreamDestroy(stream_);
}

// An idle, healthy communicator is finalized (what it sent flushed) and destroyed; one that does
// not finalize in time is aborted (non-blocking), or left behind (blocking: a finalize in progress
// cannot be aborted), instead of hanging the worker's exit.
void NcclProcessGroup::finalize_or_abort() {
  if (options_.blocking) {
    auto finished = std::make_shared<std::promise<void>>();
    std::future<void> done = finished->get_future();
    std::thread([comm = comm_, device = device_, finished] {
      cudaSetDevice(device);
      if (ncclCommFinalize(comm) == ncclSuccess) {
        ncclCommDestroy(comm);
      } else {
        ncclCommAbort(comm);
      }
      finished->set_value();
    }).detach();
    const bool returned = done.wait_for(kFinalizeTimeout) == std::future_status::ready;
    if (!returned) {
      std::fprintf(stderr,
                   "dist-sdk: ncclCommFinalize did not return within %lld s on rank %d; "
                   "going on without it\n",
                   static_cast<long long>(kFinalizeTimeout.count()), rank_);
    }
    abort_state_.store(returned ? 2 : 3);  // gone, as after an abort; or NCCL still has it
    return;
  }
  ncclResult_t r = ncclCommFinalize(comm_);
  const auto deadline = Clock::now() + kFinalizeTimeout;
  while (r == ncclInProgress && Clock::now() < deadline) {
    std::this_thread::sleep_for(kCommPollPeriod);
    ncclCommGetAsyncError(comm_, &r);
  }
  if (r == ncclSuccess) {
    ncclCommDestroy(comm_);
    abort_state_.store(2);  // gone, as after an abort
  } else {
    abort_communicator();
  }
}

// Aborts the communicator once. No NCCL call starts on it any more; a caller still inside an
// enqueue (a launch queue that was full) gets kEnqueueGrace to leave before the abort frees the
// communicator under it; one that does not leave is stuck in NCCL, and only the abort can free it.
void NcclProcessGroup::abort_communicator() {
  int none = 0;
  if (!abort_state_.compare_exchange_strong(none, 1)) return;
  {
    std::lock_guard state(state_mutex_);
    aborting_ = true;  // from here on no NCCL call starts on comm_
  }
  const auto grace = Clock::now() + kEnqueueGrace;
  while (in_nccl_.load() > 0 && Clock::now() < grace) std::this_thread::sleep_for(kCommPollPeriod);
  abort_state_.store(abort_bounded(comm_, device_, rank_) ? 2 : 3);
}

std::string init_failure(int rank, int size, const std::string& why) {
  return "NCCL initialization of rank " + std::to_string(rank) + " of " + std::to_string(size) +
         " (nccl " + loaded_nccl() + ") failed: " + why;
}

// Non-blocking initialization, polled: abortable at its deadline.
ncclComm_t init_nonblocking(const ncclUniqueId& id, int rank, int size, int device,
                            std::chrono::milliseconds timeout) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  const auto deadline = Clock::now() + timeout;
  while (comm != nullptr && (r == ncclInProgress || r == ncclSuccess)) {
    ncclResult_t state = ncclInProgress;
    ncclCommGetAsyncError(comm, &state);
    if (state == ncclSuccess) return comm;
    if (state != ncclInProgress || Clock::now() > deadline) {
      const std::string why = state != ncclInProgress
                                  ? ncclGetErrorString(state) + nccl_last_error(comm)
                                  : "timed out after " + std::to_string(timeout.count()) +
                                        " ms (init_timeout) waiting for the other ranks";
      abort_bounded(comm, device, rank);
      throw CollectiveError(init_failure(rank, size, why));
    }
    std::this_thread::sleep_for(kCommPollPeriod);
  }
  const std::string why = ncclGetErrorString(r) + nccl_last_error(comm);
  if (comm) abort_bounded(comm, device, rank);
  throw CollectiveError(init_failure(rank, size, why));
}

// Blocking initialization on a thread of its own, waited for until the deadline. NCCL cannot abort
// a blocking communicator while it initializes: past the deadline the call is left behind.
ncclComm_t init_blocking(const ncclUniqueId& id, int rank, int size, int device,
                         std::chrono::milliseconds timeout) {
  struct Call {
    ncclComm_t comm = nullptr;
    ncclResult_t result = ncclInProgress;
  };
  auto call = std::make_shared<Call>();
  auto finished = std::make_shared<std::promise<void>>();
  std::future<void> done = finished->get_future();
  std::thread([call, finished, id, rank, size, device] {
    cudaSetDevice(device);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    call->result = ncclCommInitRankConfig(&call->comm, size, id, rank, &config);
    finished->set_value();
  }).detach();
  if (done.wait_for(timeout) != std::future_status::ready) {
    throw CollectiveError(init_failure(
        rank, size,
        "timed out after " + std::to_string(timeout.count()) +
            " ms (init_timeout) waiting for the other ranks; a blocking communicator cannot be "
            "aborted while it initializes: exit this process (NcclOptions::blocking = false "
            "makes initialization abortable)"));
  }
  if (call->result != ncclSuccess) {
    const std::string why = ncclGetErrorString(call->result) + nccl_last_error(call->comm);
    if (call->comm) abort_bounded(call->comm, device, rank);
    throw CollectiveError(init_failure(rank, size, why));
  }
  return call->comm;
}

int choose_device(int rank, int local_rank, const NcclOptions& options) {
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
  return device;
}

void log_creation(const std::string& key, int size, int device, const NcclOptions& options,
                  const std::string& interface) {
  cudaDeviceProp properties{};
  cudaGetDeviceProperties(&properties, device);
  char bus[32] = "?";
  cudaDeviceGetPCIBusId(bus, sizeof bus, device);
  std::fprintf(stderr,
               "dist-sdk: NCCL group '%s' of %d rank(s): NCCL %s, %s communicator, rank 0 on "
               "device %d (%s, %s)%s%s\n",
               key.c_str(), size, nccl_version().c_str(),
               options.blocking ? "blocking" : "non-blocking", device, properties.name, bus,
               interface.empty() ? "" : ", NCCL_SOCKET_IFNAME==", interface.c_str());
  std::fflush(stderr);
}

}  // namespace

bool nccl_available() {
  return true;
}

std::string nccl_version() {
  return loaded_nccl() + " (built with " + version_text(NCCL_VERSION_CODE) + ")";
}

std::unique_ptr<ProcessGroup> make_nccl_group(store::StoreClient store, int rank, int size,
                                              int local_rank, NcclOptions options) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw std::invalid_argument("rank " + std::to_string(rank) + " is not in a group of " +
                                std::to_string(size));
  }
  const int device = choose_device(rank, local_rank, options);
  check_cuda(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  detail::note_collective_timeout(options.op_timeout);
  // Before NCCL's first call in this process, which reads it.
  const std::string interface = detail::set_nccl_socket_interface(options);
  const std::string key = detail::nccl_communicator_key(options.key_prefix, rank);
  detail::meet_on_store(store, key, rank, size, options.init_timeout);
  const std::string id_bytes =
      exchange_nccl_unique_id(store, rank, key + "/unique_id", options.init_timeout);
  ncclUniqueId id;
  std::memcpy(&id, id_bytes.data(), sizeof id);
  ncclComm_t comm = options.blocking
                        ? init_blocking(id, rank, size, device, options.init_timeout)
                        : init_nonblocking(id, rank, size, device, options.init_timeout);
  if (rank == 0) log_creation(key, size, device, options, interface);
  try {
    return std::make_unique<NcclProcessGroup>(comm, device, rank, size, std::move(options));
  } catch (...) {
    abort_bounded(comm, device, rank);
    throw;
  }
}

std::string exchange_nccl_unique_id(store::StoreClient& store, int rank, const std::string& key,
                                    std::chrono::milliseconds timeout) {
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

std::string nccl_version() {
  return "none";
}

namespace {
[[noreturn]] void no_nccl() {
  throw CollectiveError(
      "this build has no NCCL backend: configure with -DDIST_WITH_NCCL=ON on a machine with the "
      "CUDA toolkit and NCCL (CUDAToolkit_ROOT or CUDA_HOME, NCCL_ROOT)");
}
}  // namespace

std::unique_ptr<ProcessGroup> make_nccl_group(store::StoreClient, int, int, int, NcclOptions) {
  no_nccl();
}
std::string exchange_nccl_unique_id(store::StoreClient&, int, const std::string&,
                                    std::chrono::milliseconds) {
  no_nccl();
}

#endif

}  // namespace dist::sdk
