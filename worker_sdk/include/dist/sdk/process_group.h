// A process group: the ranks of a job and the collectives between them, behind one interface with
// a Gloo (CPU) backend and an NCCL (GPU) backend.
//
// Collectives run in the order they were issued, so every rank runs them in the same order
// whether they were called synchronously or not: asynchronous ones on the group's communication
// thread, synchronous ones after everything issued before them has completed.
//
// GPU backends take device buffers and a CUDA stream: a collective starts after everything the
// caller enqueued on that stream before the call (the kernels that produce its input), runs on the
// group's own stream, and Work::wait_on() orders the caller's later work after it. Host backends
// ignore the stream.
//
// Buffers must stay valid until their collective completed: after Work::wait(), or once
// Work::ready() says so. A caller that cannot promise it (a buffer freed on its own stream, a
// stream-ordered pool) hands its owner to Work::keep_alive(), which holds it until then.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "dist/store/client.h"

struct CUstream_st;

namespace dist::sdk {

// A CUDA stream: cudaStream_t, named without CUDA's headers. nullptr is CUDA's legacy default
// stream; a program compiled with --default-stream per-thread passes cudaStreamPerThread.
using CudaStream = ::CUstream_st*;

enum class ReduceOp { kSum, kAvg, kMin, kMax };
enum class DataType { kFloat32, kFloat64, kFloat16, kBFloat16, kInt8, kUInt8, kInt32, kInt64 };

// Bytes per element of `type`.
std::size_t element_size(DataType type);

// IEEE half precision, stored as its 16 bits (arithmetic happens in float).
struct Half {
  std::uint16_t bits = 0;
  static Half from_float(float f);
  float to_float() const;
};

// bfloat16 (the upper 16 bits of a float32), stored as its bits; from_float rounds to nearest even.
struct BFloat16 {
  std::uint16_t bits = 0;
  static BFloat16 from_float(float f);
  float to_float() const;
};

// The 16-bit floats, whose arithmetic happens in float.
template <typename T>
inline constexpr bool is_16bit_float_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

template <typename T>
constexpr DataType data_type_of() {
  if constexpr (std::is_same_v<T, float>)
    return DataType::kFloat32;
  else if constexpr (std::is_same_v<T, double>)
    return DataType::kFloat64;
  else if constexpr (std::is_same_v<T, Half>)
    return DataType::kFloat16;
  else if constexpr (std::is_same_v<T, BFloat16>)
    return DataType::kBFloat16;
  else if constexpr (std::is_same_v<T, std::int8_t>)
    return DataType::kInt8;
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    return DataType::kUInt8;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return DataType::kInt32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return DataType::kInt64;
  else
    static_assert(sizeof(T) == 0, "unsupported element type");
}

// A collective failed or timed out, or could not be issued. The message says which collective, on
// which rank, and why (for a peer that died: which peer, when the backend can tell). A failed
// group is unusable: exit non-zero so the agent restarts it. A collective refused before it started
// (NCCL's invalid argument or usage) leaves the group usable.
class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A group's set-up given up because the group it was building is no longer wanted
// (GlooOptions::superseded: an in-place job's agent counted a later generation of it).
class GroupSuperseded : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

// The handle of an asynchronous collective.
class Work {
 public:
  // How a backend completes its collectives; Work shares it with the backend.
  class State {
   public:
    virtual ~State() = default;
    virtual void wait() = 0;
    virtual bool ready() = 0;
    virtual void wait_on(CudaStream stream) = 0;
    // Holds `owner` at least until the collective completed (see Work::keep_alive).
    virtual void keep_alive(std::shared_ptr<const void> owner) = 0;
  };

  Work() = default;                              // nothing to wait for
  explicit Work(std::shared_future<void> done);  // completed by a host thread
  explicit Work(std::shared_ptr<State> state) : state_(std::move(state)) {}

  // Blocks until the collective completed (then the host and every stream see its result);
  // rethrows its CollectiveError.
  void wait() const;
  bool ready() const;
  // GPU backends: work enqueued on `stream` after this call waits for the collective; the host
  // does not. Host backends: wait(). Throws CollectiveError once the group has failed.
  void wait_on(CudaStream stream) const;
  // Keeps `owner` (the buffers' owner: a shared_ptr whose deleter frees them) alive until the
  // collective completed, even when this Work is dropped before: the group holds it, and releases
  // it once the collective's completion was seen (never while NCCL may still read or write them).
  void keep_alive(std::shared_ptr<const void> owner) const;

 private:
  std::shared_ptr<State> state_;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;
  // True when collectives take device pointers (NCCL), false for host memory (Gloo).
  virtual bool device_buffers() const = 0;
  // The CUDA device of a GPU backend's buffers and streams; -1 for host backends.
  virtual int cuda_device() const { return -1; }
  // What this rank's connections to its peers have sent so far, as the transport counts it
  // (Gloo: the TCP payload bytes of its sockets, framing and retransmissions included); nullopt
  // where the backend cannot tell (NCCL: NVLink, shared memory and its own sockets are its own;
  // Gloo with more than two ranks in one process, whose connections it cannot tell apart).
  virtual std::optional<std::uint64_t> transport_bytes_sent() const { return std::nullopt; }

  // Ends, from any thread, the collectives in flight and every later one with CollectiveError
  // naming `why`: for a peer that went silent without closing its connections (a lost or
  // partitioned host), which a collective would otherwise wait for until its timeout. The group is
  // unusable afterwards: make a new one. Gloo shuts its connections down (its loop fails what
  // waits on them); NCCL aborts the communicator. False where the backend cannot.
  virtual bool abort(const std::string& why) {
    (void)why;
    return false;
  }

  // Every collective takes `stream` last: see the top of this file. Its default binds to this
  // class's declaration, so call through ProcessGroup.

  // In place on `count` elements of `data`.
  virtual Work all_reduce_async(void* data, std::size_t count, DataType type, ReduceOp op,
                                CudaStream stream = nullptr) = 0;
  virtual Work broadcast_async(void* data, std::size_t count, DataType type, int root,
                               CudaStream stream = nullptr) = 0;
  // `output` holds size() * count elements, rank r's input at r * count.
  virtual Work all_gather_async(const void* input, void* output, std::size_t count, DataType type,
                                CudaStream stream = nullptr) = 0;
  // `input` holds size() * count elements; rank r receives the reduction of block r in `output`.
  virtual Work reduce_scatter_async(const void* input, void* output, std::size_t count,
                                    DataType type, ReduceOp op, CudaStream stream = nullptr) = 0;
  // GPU backends: after what was enqueued on the legacy default stream.
  virtual Work barrier_async() = 0;

  // Synchronous collectives: return once the result is complete. By default the asynchronous one
  // followed by wait(); a backend may run them on the calling thread when nothing is pending,
  // which saves two thread hand-offs.
  virtual void all_reduce(void* data, std::size_t count, DataType type, ReduceOp op,
                          CudaStream stream = nullptr) {
    all_reduce_async(data, count, type, op, stream).wait();
  }
  virtual void broadcast(void* data, std::size_t count, DataType type, int root,
                         CudaStream stream = nullptr) {
    broadcast_async(data, count, type, root, stream).wait();
  }
  virtual void all_gather(const void* input, void* output, std::size_t count, DataType type,
                          CudaStream stream = nullptr) {
    all_gather_async(input, output, count, type, stream).wait();
  }
  virtual void reduce_scatter(const void* input, void* output, std::size_t count, DataType type,
                              ReduceOp op, CudaStream stream = nullptr) {
    reduce_scatter_async(input, output, count, type, op, stream).wait();
  }
  virtual void barrier() { barrier_async().wait(); }

  // Typed, synchronous conveniences.
  template <typename T>
  void all_reduce(std::span<T> data, ReduceOp op = ReduceOp::kSum, CudaStream stream = nullptr) {
    all_reduce(data.data(), data.size(), data_type_of<T>(), op, stream);
  }
  template <typename T>
  void broadcast(std::span<T> data, int root, CudaStream stream = nullptr) {
    broadcast(data.data(), data.size(), data_type_of<T>(), root, stream);
  }
  template <typename T>
  void all_gather(std::span<const T> input, std::span<T> output, CudaStream stream = nullptr) {
    check_gather_sizes(input.size(), output.size());
    all_gather(input.data(), output.data(), input.size(), data_type_of<T>(), stream);
  }
  template <typename T>
  void reduce_scatter(std::span<const T> input, std::span<T> output, ReduceOp op = ReduceOp::kSum,
                      CudaStream stream = nullptr) {
    check_gather_sizes(output.size(), input.size());
    reduce_scatter(input.data(), output.data(), output.size(), data_type_of<T>(), op, stream);
  }

 protected:
  void check_gather_sizes(std::size_t per_rank, std::size_t whole) const;
};

struct GlooOptions {
  // Address this rank listens on for Gloo's connections (the other ranks connect to it). Empty:
  // the address of GLOO_SOCKET_IFNAME's interface when set, else DIST_LOCAL_ADDR (dist-launch's
  // --local-addr) unless it is a loopback address while `route_to` is not, else the local address
  // of the route to `route_to` (MASTER_ADDR: a name, IPv4 or IPv6). Never a silent loopback
  // fallback: make_gloo_group throws CollectiveError saying what to set.
  std::string local_address;
  std::string route_to = "127.0.0.1";
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // connecting and each collective
  std::string key_prefix = "sdk/gloo";  // store keys of this group (add the restart attempt)
  // Asked between the slices (kSupersededPoll) of each wait of the set-up for the other ranks,
  // and each kSupersededPoll on a thread of the set-up's own while Gloo connects its mesh: true
  // ends it with GroupSuperseded (a peer died in it, and a later group replaces it), the mesh's
  // sockets shut down. None: each wait is one, up to `timeout` (a pair's connection, five times).
  std::function<bool()> superseded;
  static constexpr std::chrono::milliseconds kSupersededPoll{100};
};

// Builds a Gloo group of `size` ranks: every rank passes its own store client (the group keeps it).
std::unique_ptr<ProcessGroup> make_gloo_group(store::StoreClient store, int rank, int size,
                                              GlooOptions options = {});

// What an NCCL group does once it failed: an asynchronous NCCL error (a peer that died, a network
// error), a collective past op_timeout. Either way the communicator is aborted first, so no
// collective and no restart hangs on it. A collective NCCL refuses when it is issued (an invalid
// argument or usage) is not a failure of the group: it throws CollectiveError to its caller only.
enum class NcclFailure {
  kExitProcess,  // exit with exit_code_on_abort at once, so the agent restarts the group
  kThrow,        // pending and later collectives throw CollectiveError; rebuild the group
};

struct NcclOptions {
  // CUDA device; -1: LOCAL_RANK's, or the only visible one (dist-launch --devices and
  // --virtual-local-rank give each worker its own device).
  int device = -1;
  // Every rank reaching the group, then NCCL's initialization; each bounded by this.
  std::chrono::milliseconds init_timeout{std::chrono::minutes(5)};
  std::chrono::milliseconds op_timeout{std::chrono::minutes(10)};  // then abort
  // Store keys of this group: <key_prefix>/<n>/arrived (a counter every rank adds 1 to),
  // .../all_arrived and .../unique_id (rank 0's), n counting the NCCL groups this rank built on
  // the same key_prefix before (as torch counts its communicators), so a second group, or a group
  // rebuilt in the same process, never reads a previous one's unique id.
  std::string key_prefix = "sdk/nccl";
  NcclFailure on_failure = NcclFailure::kExitProcess;
  int exit_code_on_abort = 75;  // the worker exits with this after an abort, so the agent restarts
  // A blocking communicator (NCCL's and torch's default): collectives return once enqueued. False:
  // NCCL's non-blocking mode, every call polled until it leaves ncclInProgress (torch's
  // TORCH_NCCL_USE_COMM_NONBLOCKING=1, which dist::sdk::init() honours). Either way the watchdog
  // can abort the communicator while a call is stuck in NCCL; only a non-blocking one can also be
  // aborted while it initializes (a blocking initialization past init_timeout throws, leaving
  // NCCL's call behind on a thread of its own: exit then).
  bool blocking = true;
  // The watchdog's own watchdog: when the watchdog thread makes no progress for this long (a CUDA
  // or NCCL call stuck in the driver), the process prints why and exits with exit_code_on_abort,
  // whatever on_failure says (torch's TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC). Zero: not watched.
  std::chrono::milliseconds watchdog_stall_timeout{std::chrono::minutes(8)};
  // NCCL's bootstrap interface, as for Gloo: unless NCCL_SOCKET_IFNAME (or NCCL_COMM_ID) is set,
  // the group sets NCCL_SOCKET_IFNAME to the interface of the address GlooOptions would choose from
  // these (local_address, GLOO_SOCKET_IFNAME, DIST_LOCAL_ADDR, the route to route_to), before
  // NCCL's first call in this process: a host with several interfaces (docker0) never
  // advertises one the other hosts cannot reach.
  std::string local_address;
  std::string route_to = "127.0.0.1";
};

// True when this build has the NCCL backend (CUDA and NCCL were found at configure time).
bool nccl_available();

// The NCCL this process loaded and the one it was built with, as "2.30.7 (built with 2.28.9)";
// "none" in a build without the backend. Needs no GPU. Every NCCL group logs it when rank 0
// creates it, and every NCCL error message carries it.
std::string nccl_version();

// Builds an NCCL group over GPUs. Buffers passed to its collectives are device pointers on
// cuda_device(), which becomes the calling thread's current device (as torch.cuda.set_device);
// the group touches memory and streams only under its own device, on any thread. Every rank
// meets on the store first (CollectiveError naming how many came within init_timeout), then rank
// 0's ncclUniqueId travels through it, and NCCL initializes within init_timeout. Collectives wait
// for the caller's stream (an event), run on the group's stream, and complete through CUDA
// events: Work::wait() synchronizes on the collective's event. A watchdog thread checks deadlines
// and the communicator's asynchronous error and applies on_failure. Destroying the group with
// collectives still running aborts the communicator (their Work then throws); an idle, healthy
// one is finalized. Throws CollectiveError when the backend is missing or a GPU is not usable.
std::unique_ptr<ProcessGroup> make_nccl_group(store::StoreClient store, int rank, int size,
                                              int local_rank, NcclOptions options = {});

// The unique-id exchange on its own (it needs no GPU): rank 0 creates the id and publishes it under
// `key`, the others wait for it. Returns the 128 bytes every rank must pass to NCCL.
std::string exchange_nccl_unique_id(store::StoreClient& store, int rank, const std::string& key,
                                    std::chrono::milliseconds timeout);

}  // namespace dist::sdk
