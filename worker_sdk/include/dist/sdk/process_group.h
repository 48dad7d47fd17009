// A process group: the ranks of a job and the collectives between them, behind one interface with
// a Gloo (CPU) backend and an NCCL (GPU) backend.
//
// Collectives run in the order they were issued, so every rank runs them in the same order
// whether they were called synchronously or not: asynchronous ones on the group's communication
// thread, synchronous ones after everything issued before them has completed.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "dist/rendezvous/client.h"

namespace dist::sdk {

enum class ReduceOp { kSum, kAvg, kMin, kMax };
enum class DataType { kFloat32, kFloat64, kFloat16, kInt32, kInt64 };

// IEEE half precision, stored as its 16 bits (arithmetic happens in float).
struct Half {
  std::uint16_t bits = 0;
  static Half from_float(float f);
  float to_float() const;
};

template <typename T>
constexpr DataType data_type_of() {
  if constexpr (std::is_same_v<T, float>)
    return DataType::kFloat32;
  else if constexpr (std::is_same_v<T, double>)
    return DataType::kFloat64;
  else if constexpr (std::is_same_v<T, Half>)
    return DataType::kFloat16;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return DataType::kInt32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return DataType::kInt64;
  else
    static_assert(sizeof(T) == 0, "unsupported element type");
}

// A collective failed or timed out: the group is unusable and the worker should exit non-zero so
// the agent restarts the group.
class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The handle of an asynchronous collective.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_future<void> done) : done_(std::move(done)) {}
  void wait() const { done_.get(); }  // rethrows the collective's CollectiveError
  bool ready() const {
    return done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }

 private:
  std::shared_future<void> done_;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;

  // In place on `count` elements of `data`.
  virtual Work all_reduce_async(void* data, std::size_t count, DataType type, ReduceOp op) = 0;
  virtual Work broadcast_async(void* data, std::size_t count, DataType type, int root) = 0;
  // `output` holds size() * count elements, rank r's input at r * count.
  virtual Work all_gather_async(const void* input, void* output, std::size_t count,
                                DataType type) = 0;
  // `input` holds size() * count elements; rank r receives the reduction of block r in `output`.
  virtual Work reduce_scatter_async(const void* input, void* output, std::size_t count,
                                    DataType type, ReduceOp op) = 0;
  virtual Work barrier_async() = 0;

  // Synchronous collectives. By default the asynchronous one followed by wait(); a backend may run
  // them on the calling thread when nothing is pending, which saves two thread hand-offs.
  virtual void all_reduce(void* data, std::size_t count, DataType type, ReduceOp op) {
    all_reduce_async(data, count, type, op).wait();
  }
  virtual void broadcast(void* data, std::size_t count, DataType type, int root) {
    broadcast_async(data, count, type, root).wait();
  }
  virtual void all_gather(const void* input, void* output, std::size_t count, DataType type) {
    all_gather_async(input, output, count, type).wait();
  }
  virtual void reduce_scatter(const void* input, void* output, std::size_t count, DataType type,
                              ReduceOp op) {
    reduce_scatter_async(input, output, count, type, op).wait();
  }
  virtual void barrier() { barrier_async().wait(); }

  // Typed, synchronous conveniences.
  template <typename T>
  void all_reduce(std::span<T> data, ReduceOp op = ReduceOp::kSum) {
    all_reduce(data.data(), data.size(), data_type_of<T>(), op);
  }
  template <typename T>
  void broadcast(std::span<T> data, int root) {
    broadcast(data.data(), data.size(), data_type_of<T>(), root);
  }
  template <typename T>
  void all_gather(std::span<const T> input, std::span<T> output) {
    check_gather_sizes(input.size(), output.size());
    all_gather(input.data(), output.data(), input.size(), data_type_of<T>());
  }
  template <typename T>
  void reduce_scatter(std::span<const T> input, std::span<T> output, ReduceOp op = ReduceOp::kSum) {
    check_gather_sizes(output.size(), input.size());
    reduce_scatter(input.data(), output.data(), output.size(), data_type_of<T>(), op);
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
};

// Builds a Gloo group of `size` ranks: every rank passes its own store client (the group keeps it).
std::unique_ptr<ProcessGroup> make_gloo_group(rendezvous::StoreClient store, int rank, int size,
                                              GlooOptions options = {});

struct NcclOptions {
  int device = -1;  // CUDA device; -1: LOCAL_RANK's (one device per local rank)
  std::chrono::milliseconds init_timeout{std::chrono::minutes(5)};
  std::chrono::milliseconds op_timeout{std::chrono::minutes(10)};  // then abort and exit
  std::string key_prefix = "sdk/nccl";
  int exit_code_on_abort = 75;  // the worker exits with this after an abort, so the agent restarts
};

// True when this build has the NCCL backend (CUDA and NCCL were found at configure time).
bool nccl_available();

// Builds an NCCL group over GPUs. Buffers passed to its collectives are device pointers.
// Rank 0's ncclUniqueId travels through the store; initialization is non-blocking with a
// deadline; a watchdog thread checks every operation's progress and the communicator's async
// error, and on a failure or timeout aborts the communicator and exits the process with
// exit_code_on_abort. Throws CollectiveError when the backend is missing or a GPU is not usable.
std::unique_ptr<ProcessGroup> make_nccl_group(rendezvous::StoreClient store, int rank, int size,
                                              int local_rank, NcclOptions options = {});

// The unique-id exchange on its own (it needs no GPU): rank 0 creates the id and publishes it under
// `key`, the others wait for it. Returns the 128 bytes every rank must pass to NCCL.
std::string exchange_nccl_unique_id(rendezvous::StoreClient& store, int rank,
                                    const std::string& key, std::chrono::milliseconds timeout);

}  // namespace dist::sdk
