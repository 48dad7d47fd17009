// The NCCL backend on a real GPU. One GPU, so world size 1 unless NCCL allows two ranks on it
// (NCCL_MULTI_RANK_GPU_ENABLE, 2.30 and later). At world size 1 NCCL moves no byte for an
// in-place sum or a broadcast, so the checks here read what only NCCL can have written:
// out-of-place results (all-gather, reduce-scatter with sum and avg, every data type) over an
// output that held something else, with a guard past the output that must stay untouched.
//
// Ordering is shown with a gate (gpu_kernels.h): a kernel that spins until the host opens it, so
// "must wait" is checked while the gate is closed, whatever the machine's timing. Every group is
// warmed up (each collective once) before a gate closes: loading a kernel lazily may need the
// device to be idle, which a closed gate never is. Failure paths (aborts, refused collectives,
// initializations that cannot finish) run in child processes: after an abort the CUDA context is
// not trusted for more tests. Without a GPU every test skips, saying so.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "dist/contract/worker_contract.h"
#include "dist/sdk/ddp.h"
#include "dist/sdk/process_group.h"
#include "dist/store/server.h"
#include "gpu_kernels.h"

namespace dist::sdk {
namespace {

using namespace std::chrono_literals;
using testing::Gate;

// How long what waits behind a closed gate must stay incomplete.
constexpr auto kHold = 300ms;
constexpr auto kPollPeriod = 1ms;
constexpr std::size_t kCount = 1 << 20;
constexpr float kProduced = 7.0f;
// A child test's exit code once everything it checks held; and when what it needs is missing.
constexpr int kChildPassed = 42;
constexpr int kChildCannotRun = 77;
constexpr auto kChildTimeout = 90s;
constexpr const char* kChildModeVariable = "DIST_GPU_TEST_CHILD";

bool have_gpu() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
}

#define SKIP_WITHOUT_GPU()                                                                  \
  if (!have_gpu())                                                                          \
  GTEST_SKIP() << "no CUDA device on this machine: the GPU tests run on a GPU host (world " \
                  "size 1 on one GPU)"

// In a child test: what the parent set, or skip (the child tests run only as children).
std::string child_mode() {
  const char* mode = std::getenv(kChildModeVariable);
  return mode ? mode : "";
}
#define ONLY_AS_A_CHILD() \
  if (child_mode().empty()) GTEST_SKIP() << "runs as the child of a OneGpu test"

void check(cudaError_t e) {
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
}

// True when `done` turns true within kHold.
bool happens_within_hold(const std::function<bool()>& done) {
  const auto until = std::chrono::steady_clock::now() + kHold;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(kPollPeriod);
  }
  return done();
}

// True when `done` turns true within `limit` (for what must happen, eventually).
bool happens_within(std::chrono::milliseconds limit, const std::function<bool()>& done) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(kPollPeriod);
  }
  return true;
}

// Device memory, zeroed; bytes in and out through the host.
struct DeviceBuffer {
  void* data = nullptr;
  std::size_t bytes = 0;
  explicit DeviceBuffer(std::size_t size) : bytes(size) {
    if (cudaMalloc(&data, bytes) != cudaSuccess) throw std::runtime_error("cudaMalloc");
    cudaMemset(data, 0, bytes);
    cudaDeviceSynchronize();
  }
  ~DeviceBuffer() { cudaFree(data); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* floats() const { return static_cast<float*>(data); }
  std::vector<unsigned char> read() const {
    std::vector<unsigned char> out(bytes);
    cudaMemcpy(out.data(), data, bytes, cudaMemcpyDeviceToHost);
    return out;
  }
  // Synchronizes the device after the copy: a copy from pageable memory may return before its
  // DMA is done, and the group's stream does not wait for the legacy stream's DMA by itself.
  void write(const std::vector<unsigned char>& in) const {
    cudaMemcpy(data, in.data(), std::min(bytes, in.size()), cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
  }
  std::vector<float> host_floats(std::size_t count) const {
    std::vector<float> out(count);
    cudaMemcpy(out.data(), data, count * sizeof(float), cudaMemcpyDeviceToHost);
    return out;
  }
};

struct Stream {
  CudaStream s = nullptr;
  Stream() { cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); }
  ~Stream() { cudaStreamDestroy(s); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

// Each collective once, and the test kernels once, before any gate closes.
void warm_up(ProcessGroup& g) {
  DeviceBuffer a(4096), b(4096 * static_cast<std::size_t>(g.size()));
  testing::fill(a.floats(), 16, 1.0f, nullptr);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    g.all_reduce(a.data, 16, DataType::kFloat32, op);
    g.reduce_scatter(b.data, a.data, 16, DataType::kFloat32, op);
  }
  g.broadcast(a.data, 16, DataType::kFloat32, 0);
  g.all_gather(a.data, b.data, 16, DataType::kFloat32);
  g.barrier();
  cudaDeviceSynchronize();
}

// A group of one on device 0, warmed up unless its op_timeout is too short for a first call (the
// children that use one run with CUDA_MODULE_LOADING=EAGER instead).
std::unique_ptr<ProcessGroup> one_rank_group(std::uint16_t port, NcclOptions options = {}) {
  store::ClientOptions client;
  client.port = port;
  options.device = 0;
  if (options.init_timeout == NcclOptions{}.init_timeout) options.init_timeout = 60s;
  auto g = make_nccl_group(store::StoreClient::connect(client), 0, 1, 0, options);
  if (options.op_timeout >= 10s) warm_up(*g);
  return g;
}

class OneGpu : public ::testing::Test {
 protected:
  std::unique_ptr<ProcessGroup> group(NcclOptions options = {}) {
    return one_rank_group(store_.port(), std::move(options));
  }
  // Runs the disabled test OneGpuChild.DISABLED_<name> as a child process (mode: what it reads
  // from DIST_GPU_TEST_CHILD) and checks that it passed; skips when it says it cannot run.
  testing::ChildResult child(const std::string& name, const std::string& mode,
                             std::vector<std::pair<std::string, std::string>> env = {}) {
    env.emplace_back(kChildModeVariable, mode);
    env.emplace_back("CUDA_MODULE_LOADING", "EAGER");
    testing::Child process("OneGpuChild.DISABLED_" + name, env);
    return process.finish(kChildTimeout);
  }

 private:
  store::StoreServerThread store_;
};

// The child tests: each runs in a process of its own (OneGpu::child).
class OneGpuChild : public OneGpu {};

struct OrderingCase {
  const char* name;
  bool in_place;
  std::function<Work(ProcessGroup&, float* in, float* out, CudaStream)> issue;
};

TEST_F(OneGpu, EveryCollectiveWaitsForTheProducerOnTheCallersStream) {
  SKIP_WITHOUT_GPU();
  const std::vector<OrderingCase> cases = {
      {"all_reduce", true,
       [](ProcessGroup& g, float* in, float*, CudaStream s) {
         return g.all_reduce_async(in, kCount, DataType::kFloat32, ReduceOp::kSum, s);
       }},
      {"broadcast", true,
       [](ProcessGroup& g, float* in, float*, CudaStream s) {
         return g.broadcast_async(in, kCount, DataType::kFloat32, 0, s);
       }},
      {"all_gather", false,
       [](ProcessGroup& g, float* in, float* out, CudaStream s) {
         return g.all_gather_async(in, out, kCount, DataType::kFloat32, s);
       }},
      {"reduce_scatter", false,
       [](ProcessGroup& g, float* in, float* out, CudaStream s) {
         return g.reduce_scatter_async(in, out, kCount, DataType::kFloat32, ReduceOp::kMax, s);
       }},
  };
  auto g = group();
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    DeviceBuffer in(kCount * sizeof(float)), out(kCount * sizeof(float));
    Stream producer;
    testing::fill(out.floats(), kCount, -1.0f, producer.s);  // what NCCL must overwrite
    Gate gate;
    gate.hold(producer.s);
    testing::fill(in.floats(), kCount, kProduced, producer.s);
    Work work = c.issue(*g, in.floats(), out.floats(), producer.s);
    EXPECT_FALSE(happens_within_hold([&] { return work.ready(); }))
        << "the collective completed before the kernel producing its input ran";
    gate.open();
    work.wait();
    const auto result = (c.in_place ? in : out).host_floats(kCount);
    EXPECT_EQ(result.front(), kProduced) << "stale input, or no output";
    EXPECT_EQ(result.back(), kProduced) << "stale input, or no output";
  }
}

std::string hex_bytes(const std::vector<unsigned char>& bytes, std::size_t count) {
  std::string out;
  char digits[4];
  for (std::size_t i = 0; i < std::min(count, bytes.size()); ++i) {
    std::snprintf(digits, sizeof digits, "%02x", bytes[i]);
    out += digits;
  }
  return out;
}

// Bytes NCCL must have copied, per data type: out-of-place all-gather and reduce-scatter (sum and
// avg) into an output that held 0xAB, with a guard past it that must still hold 0xAB. Avg over
// one rank is a copy: NCCL's own one-rank avg kernel drops the tail of 1,000,003 doubles (see
// nccl_op in nccl_group.cc), which this test found.
TEST_F(OneGpu, OutOfPlaceResultsAreNcclsWorkInEveryDataType) {
  SKIP_WITHOUT_GPU();
  auto g = group();
  constexpr std::size_t kElements = 1000003;  // not a multiple of anything NCCL likes
  constexpr std::size_t kGuard = 4096;
  const DataType types[] = {DataType::kFloat32,  DataType::kFloat64, DataType::kFloat16,
                            DataType::kBFloat16, DataType::kInt8,    DataType::kUInt8,
                            DataType::kInt32,    DataType::kInt64};
  for (const DataType type : types) {
    SCOPED_TRACE("data type " + std::to_string(static_cast<int>(type)));
    const std::size_t bytes = kElements * element_size(type);
    // Small positive integers in every type's encoding: exact after a sum or avg over one rank.
    std::vector<unsigned char> input(bytes);
    for (std::size_t i = 0; i < kElements; ++i) {
      const double v = double(1 + i % 100);
      unsigned char* e = input.data() + i * element_size(type);
      switch (type) {
        case DataType::kFloat32:
          *reinterpret_cast<float*>(e) = float(v);
          break;
        case DataType::kFloat64:
          *reinterpret_cast<double*>(e) = v;
          break;
        case DataType::kFloat16: {
          const Half h = Half::from_float(float(v));
          std::memcpy(e, &h, 2);
          break;
        }
        case DataType::kBFloat16: {
          const BFloat16 h = BFloat16::from_float(float(v));
          std::memcpy(e, &h, 2);
          break;
        }
        case DataType::kInt8:
          *reinterpret_cast<std::int8_t*>(e) = std::int8_t(v);
          break;
        case DataType::kUInt8:
          *e = static_cast<unsigned char>(v);
          break;
        case DataType::kInt32:
          *reinterpret_cast<std::int32_t*>(e) = std::int32_t(v);
          break;
        case DataType::kInt64:
          *reinterpret_cast<std::int64_t*>(e) = std::int64_t(v);
          break;
      }
    }
    DeviceBuffer in(bytes), out(bytes + kGuard);
    in.write(input);
    const std::vector<unsigned char> poison(bytes + kGuard, 0xAB);
    const auto expect_copied = [&](const char* what) {
      const auto got = out.read();
      const auto [want, was] = std::mismatch(input.begin(), input.end(), got.begin());
      EXPECT_TRUE(want == input.end())
          << what << ": the output is not the input: byte " << (want - input.begin()) << " is "
          << int(*was) << ", not " << int(*want) << " (element "
          << (want - input.begin()) / std::ptrdiff_t(element_size(type)) << " of " << kElements
          << "; first 4 elements' bytes: " << hex_bytes(got, 4 * element_size(type)) << " for "
          << hex_bytes(input, 4 * element_size(type)) << ")";
      EXPECT_TRUE(std::all_of(got.begin() + std::ptrdiff_t(bytes), got.end(),
                              [](unsigned char b) { return b == 0xAB; }))
          << what << ": written past the output (count or shape)";
    };
    out.write(poison);
    g->all_gather(in.data, out.data, kElements, type);  // output: size() * count
    expect_copied("all_gather");
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      out.write(poison);
      g->reduce_scatter(in.data, out.data, kElements, type, op);  // input: size() * count
      expect_copied(op == ReduceOp::kSum ? "reduce_scatter sum" : "reduce_scatter avg");
    }
  }
}

// Host buffers (a std::vector's loss to average, a step the ranks agree on) go through the group's
// device memory: NCCL's kernels would fault on a host address. At one rank an in-place
// all-reduce moves nothing, so the out-of-place all-gather and reduce-scatter are the proof (NCCL
// copies every byte), host to host and between host and device memory.
TEST_F(OneGpu, HostBuffersGoThroughDeviceMemory) {
  SKIP_WITHOUT_GPU();
  auto g = group();
  std::vector<float> values(1000);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = float(i) * 0.5f;
  std::vector<float> gathered(values.size(), -1.0f), scattered(values.size(), -1.0f);
  g->all_gather(std::span<const float>(values), std::span<float>(gathered));
  EXPECT_EQ(gathered, values) << "all_gather, host to host";
  g->reduce_scatter(std::span<const float>(values), std::span<float>(scattered));
  EXPECT_EQ(scattered, values) << "reduce_scatter, host to host";
  std::vector<std::int64_t> step{41};
  g->all_reduce(std::span<std::int64_t>(step), ReduceOp::kMax);
  g->broadcast(std::span<std::int64_t>(step), 0);
  EXPECT_EQ(step[0], 41);
  DeviceBuffer device(values.size() * sizeof(float));
  std::vector<unsigned char> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  device.write(bytes);
  std::fill(gathered.begin(), gathered.end(), -1.0f);
  g->all_gather(device.data, gathered.data(), values.size(), DataType::kFloat32);
  EXPECT_EQ(gathered, values) << "all_gather, device to host";
  device.write(std::vector<unsigned char>(bytes.size(), 0));
  g->all_gather(values.data(), device.data, values.size(), DataType::kFloat32);
  EXPECT_EQ(device.read(), bytes) << "all_gather, host to device";
}

// The consumer copies the all-gather's output: it sees the produced values only when it ran after
// the collective (before, it would copy the -1 the output held).
TEST_F(OneGpu, WaitOnOrdersTheCallersLaterWorkAfterTheCollective) {
  SKIP_WITHOUT_GPU();
  auto g = group();
  DeviceBuffer in(kCount * sizeof(float)), out(kCount * sizeof(float)),
      copy(kCount * sizeof(float));
  Stream producer, consumer;
  testing::fill(out.floats(), kCount, -1.0f, producer.s);
  Gate gate;
  gate.hold(producer.s);
  testing::fill(in.floats(), kCount, kProduced, producer.s);
  Work work = g->all_gather_async(in.data, out.data, kCount, DataType::kFloat32, producer.s);
  work.wait_on(consumer.s);
  check(cudaMemcpyAsync(copy.data, out.data, kCount * sizeof(float), cudaMemcpyDeviceToDevice,
                        consumer.s));
  cudaEvent_t copied = nullptr;
  check(cudaEventCreate(&copied));
  check(cudaEventRecord(copied, consumer.s));
  EXPECT_FALSE(happens_within_hold([&] { return cudaEventQuery(copied) == cudaSuccess; }))
      << "the consumer's copy ran before the collective";
  gate.open();
  check(cudaStreamSynchronize(consumer.s));
  EXPECT_EQ(copy.host_floats(kCount)[kCount / 2], kProduced);
  cudaEventDestroy(copied);
}

TEST_F(OneGpu, SynchronousCollectivesReturnOnlyOnceTheResultIsThere) {
  SKIP_WITHOUT_GPU();
  auto g = group();
  DeviceBuffer in(kCount * sizeof(float)), out(kCount * sizeof(float));
  Stream producer;
  testing::fill(out.floats(), kCount, -1.0f, producer.s);
  Gate gate;
  gate.hold(producer.s);
  testing::fill(in.floats(), kCount, kProduced, producer.s);
  auto call = std::async(std::launch::async, [&] {
    g->reduce_scatter(in.data, out.data, kCount, DataType::kFloat32, ReduceOp::kAvg, producer.s);
  });
  EXPECT_FALSE(happens_within_hold([&] { return call.wait_for(0s) == std::future_status::ready; }))
      << "reduce_scatter returned before its input was produced";
  gate.open();
  call.get();
  EXPECT_EQ(out.host_floats(kCount)[kCount - 1], kProduced);  // read right after it returned
  g->barrier();
}

// wait() returns soon after the collective's event fired: it polls the event itself, never waits
// for the watchdog (whose period is 100 ms). The latency is printed; bench/nccl_compare.py
// measures it against torch.
TEST_F(OneGpu, WaitReturnsSoonAfterTheCollectiveCompletes) {
  SKIP_WITHOUT_GPU();
  auto g = group();
  DeviceBuffer in(64), out(64);
  Stream producer;
  std::vector<double> latencies;
  for (int i = 0; i < 21; ++i) {
    Gate gate;
    gate.hold(producer.s);
    Work work = g->all_gather_async(in.data, out.data, 8, DataType::kFloat32, producer.s);
    auto waited = std::async(std::launch::async, [&] {
      work.wait();
      return std::chrono::steady_clock::now();
    });
    std::this_thread::sleep_for(2ms);  // let the waiter start waiting (not an ordering)
    const auto opened = std::chrono::steady_clock::now();
    gate.open();
    latencies.push_back(std::chrono::duration<double, std::micro>(waited.get() - opened).count());
  }
  std::nth_element(latencies.begin(), latencies.begin() + 10, latencies.end());
  const double median = latencies[10];
  std::printf(
      "wait() returned a median %.1f us after the gate opened (gate kernel, all_gather, "
      "event, poll)\n",
      median);
  EXPECT_LT(median, 20000.0) << "wait() seems to wait for the watchdog's period";
}

TEST_F(OneGpu, DdpOverDeviceBuffersFollowsTheBackwardStreamWithoutBlockingTheHost) {
  SKIP_WITHOUT_GPU();
  auto g = group();
  constexpr std::size_t kWeights = 1000, kBiases = 10;
  DeviceBuffer w(kWeights * 4), dw(kWeights * 4), b(kBiases * 4), db(kBiases * 4);
  Stream backward;
  testing::fill(w.floats(), kWeights, 1.0f, backward.s);
  testing::fill(b.floats(), kBiases, 2.0f, backward.s);
  DdpOptions options;
  options.first_bucket_cap_bytes = kBiases * sizeof(float);  // two buckets: b, then w
  options.stream = backward.s;
  DistributedDataParallel ddp(*g,
                              {{"w", {w.floats(), kWeights}, {dw.floats(), kWeights}},
                               {"b", {b.floats(), kBiases}, {db.floats(), kBiases}}},
                              options);
  ASSERT_EQ(ddp.bucket_layout(), (std::vector<std::vector<std::size_t>>{{1}, {0}}));

  Gate gate;  // the backward pass: gradients appear once the gate opens
  gate.hold(backward.s);
  testing::fill(db.floats(), kBiases, -1.0f, backward.s);
  ddp.grad_ready(1);
  testing::fill(dw.floats(), kWeights, 2.5f, backward.s);
  ddp.grad_ready(0);
  // Gradients overwritten after they were marked ready: the bucket copied them at grad_ready (in
  // stream order), and synchronize() writes the reduced bucket back over this.
  testing::fill(dw.floats(), kWeights, 99.0f, backward.s);
  auto sync = std::async(std::launch::async, [&] { ddp.synchronize(); });
  EXPECT_TRUE(happens_within_hold([&] { return sync.wait_for(0s) == std::future_status::ready; }))
      << "synchronize() blocked the host on the backward pass";
  gate.open();
  sync.get();
  check(cudaStreamSynchronize(backward.s));
  EXPECT_EQ(dw.host_floats(kWeights)[kWeights - 1], 2.5f);  // the average over one rank
  EXPECT_EQ(db.host_floats(kBiases)[0], -1.0f);
  EXPECT_EQ(w.host_floats(kWeights)[0], 1.0f);  // rank 0's parameters, broadcast
  EXPECT_EQ(b.host_floats(kBiases)[0], 2.0f);
}

// DDP's straggler measure over device buffers (the slot's work_ns, what dist-launch compares
// across the job): the GPU's time for a step's own work, from after_step() to synchronize() on
// the backward stream, not the host's (which only launches: microseconds) and not the optimizer's
// kernels between synchronize() and after_step(). The child's steps run a 30 ms kernel before
// synchronize() and a 60 ms one after it: 5 measured steps of 6 are 150 ms of work, and would be
// 450 with the optimizer's time.
TEST_F(OneGpu, DdpOverDeviceBuffersCountsTheGpusTimeForAStepsOwnWork) {
  SKIP_WITHOUT_GPU();
  namespace slot = worker_contract::heartbeat_slot;
  const int fd = ::memfd_create("dist-gpu-test-slot", 0);  // inherited by the child
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, slot::kBytes), 0);
  void* at = ::mmap(nullptr, slot::kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(at, MAP_FAILED);
  auto* s = new (at) slot::Slot{};
  s->magic = slot::kMagic;
  const auto child_run = child("StepWork", "step-work", {{slot::kFdVariable, std::to_string(fd)}});
  const std::uint64_t steps = s->steps.load();
  const double work_ms = static_cast<double>(s->work_ns.load()) / 1e6;
  ::munmap(at, slot::kBytes);
  ::close(fd);
  ASSERT_EQ(child_run.exit_code, kChildPassed) << child_run.output;
  std::printf("%llu steps, %.1f ms of work counted\n", static_cast<unsigned long long>(steps),
              work_ms);
  EXPECT_EQ(steps, 7u);
  EXPECT_GE(work_ms, 5 * 30 * 0.95) << "the host's time, not the GPU's";
  EXPECT_LT(work_ms, 5 * 30 + 5 * 60 * 0.5) << "the optimizer's kernels were counted as work";
}
TEST_F(OneGpuChild, DISABLED_StepWork) {
  ONLY_AS_A_CHILD();
  using std::chrono::nanoseconds;
  constexpr int kSteps = 6;
  constexpr auto kCompute = nanoseconds(30ms).count(), kOptimizer = nanoseconds(60ms).count();
  auto g = group();
  DeviceBuffer w(64 * sizeof(float)), dw(64 * sizeof(float));
  Stream backward;
  DdpOptions options;
  options.stream = backward.s;
  DistributedDataParallel ddp(*g, {{"w", {w.floats(), 64}, {dw.floats(), 64}}}, options);
  for (int i = 0; i < kSteps; ++i) {
    testing::busy(backward.s, kCompute);  // forward and backward
    ddp.grad_ready(0);
    ddp.synchronize();
    testing::busy(backward.s, kOptimizer);  // the optimizer
    ddp.after_step();
  }
  check(cudaStreamSynchronize(backward.s));
  // Reads what the stream has passed: the last step's events (and counts a seventh step).
  ddp.after_step();
  std::fflush(stdout);
  std::_Exit(::testing::Test::HasFailure() ? 1 : kChildPassed);
}

TEST_F(OneGpu, KeepAliveHoldsTheBuffersUntilTheCollectiveCompleted) {
  SKIP_WITHOUT_GPU();
  auto g = group();
  Stream producer;
  auto released = std::make_shared<std::atomic<bool>>(false);
  // Allocated before the gate holds the device: DeviceBuffer's constructor synchronizes it.
  auto buffers = std::shared_ptr<DeviceBuffer>(new DeviceBuffer(2 * kCount * sizeof(float)),
                                               [released](DeviceBuffer* b) {
                                                 delete b;
                                                 released->store(true);
                                               });
  Gate gate;
  gate.hold(producer.s);
  {
    float* in = buffers->floats();
    Work work = g->all_gather_async(in, in + kCount, kCount, DataType::kFloat32, producer.s);
    work.keep_alive(std::move(buffers));
  }  // the Work and the caller's reference are gone; the collective waits behind the gate
  EXPECT_FALSE(happens_within_hold([&] { return released->load(); }))
      << "the buffers were freed while NCCL had still to use them";
  gate.open();
  EXPECT_TRUE(happens_within(10s, [&] { return released->load(); }))
      << "the buffers were never released";
}

// ---- Failure paths, each in a child process ----

TEST_F(OneGpu, ACollectiveNcclRefusesIsThrownAndTheGroupLivesOn) {
  SKIP_WITHOUT_GPU();
  // NCCL checks pointers only under NCCL_CHECK_POINTERS, read once per process: a null buffer is
  // then an ncclInvalidArgument when the collective is issued.
  const auto child_run = child("RefusedCollective", "refused", {{"NCCL_CHECK_POINTERS", "1"}});
  EXPECT_EQ(child_run.exit_code, kChildPassed) << child_run.output;
  EXPECT_NE(child_run.output.find("was refused by NCCL"), std::string::npos) << child_run.output;
  EXPECT_EQ(child_run.output.find("aborting the communicator"), std::string::npos)
      << child_run.output;
}
TEST_F(OneGpuChild, DISABLED_RefusedCollective) {
  ONLY_AS_A_CHILD();
  auto g = group();
  try {  // no buffer at all: NCCL_CHECK_POINTERS makes NCCL refuse it before any kernel
    g->all_reduce(nullptr, 1024, DataType::kFloat32, ReduceOp::kSum);
    std::fprintf(stderr, "NCCL accepted a collective on a null buffer\n");
    std::_Exit(1);
  } catch (const CollectiveError& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
  DeviceBuffer in(64), out(64);
  testing::fill(in.floats(), 16, kProduced, nullptr);
  g->all_gather(in.data, out.data, 16, DataType::kFloat32);  // the group still works
  std::_Exit(out.host_floats(16)[15] == kProduced ? kChildPassed : 1);
}

// A collective behind a gate that stays closed past the group's op_timeout: its wait() must
// throw (the watchdog aborted the communicator). The gate is opened once the failure is seen, so
// the abort (which frees memory, and so waits for the device) can return. Exits the child when
// the collective completes instead. The caller keeps the gate, for as long as it did before.
void fail_by_op_timeout(ProcessGroup& g, const DeviceBuffer& data, const Stream& producer,
                        Gate& gate) {
  gate.hold(producer.s);
  Work work = g.all_reduce_async(data.data, kCount, DataType::kFloat32, ReduceOp::kAvg, producer.s);
  try {
    work.wait();
    std::fprintf(stderr, "the collective completed behind a closed gate\n");
    std::_Exit(1);
  } catch (const CollectiveError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::fflush(stderr);
  }
  gate.open();
}

// A collective behind a gate that does not open before op_timeout: the watchdog aborts. Once
// the waiter saw the failure it opens the gate, so the abort (which frees memory, and so waits
// for the device) returns.
TEST_F(OneGpu, ACollectivePastOpTimeoutAbortsAndExitsForTheAgentToRestart) {
  SKIP_WITHOUT_GPU();
  const auto child_run = child("OpTimeout", "exit");
  EXPECT_EQ(child_run.exit_code, NcclOptions{}.exit_code_on_abort) << child_run.output;
  EXPECT_NE(child_run.output.find("timed out"), std::string::npos) << child_run.output;
  EXPECT_NE(child_run.output.find("aborting the communicator"), std::string::npos)
      << child_run.output;
  EXPECT_EQ(child_run.output.find("did not return"), std::string::npos) << child_run.output;
}
TEST_F(OneGpu, ACollectivePastOpTimeoutAbortsAndThrowsWhenAskedTo) {
  SKIP_WITHOUT_GPU();
  const auto child_run = child("OpTimeout", "throw");
  EXPECT_EQ(child_run.exit_code, kChildPassed) << child_run.output;
  EXPECT_NE(child_run.output.find("timed out"), std::string::npos) << child_run.output;
  EXPECT_EQ(child_run.output.find("did not return"), std::string::npos) << child_run.output;
}
TEST_F(OneGpuChild, DISABLED_OpTimeout) {
  ONLY_AS_A_CHILD();
  NcclOptions options;
  options.op_timeout = 1s;
  options.on_failure = child_mode() == "throw" ? NcclFailure::kThrow : NcclFailure::kExitProcess;
  auto g = group(options);
  DeviceBuffer data(kCount * sizeof(float));
  Stream producer;
  Gate gate;
  fail_by_op_timeout(*g, data, producer, gate);
  if (options.on_failure == NcclFailure::kExitProcess) {
    std::this_thread::sleep_for(60s);  // the watchdog exits the process once the abort returned
    std::_Exit(1);
  }
  try {
    g->all_reduce(data.data, 1, DataType::kFloat32, ReduceOp::kSum, producer.s);
  } catch (const CollectiveError&) {  // a failed group refuses later collectives too
    g.reset();                        // and its destructor returns
    std::_Exit(kChildPassed);
  }
  std::_Exit(1);
}

// What an in-place survivor does on its GPU (recovery.h): its group is aborted (here by
// op_timeout, as a dead peer's collective would be), and the same process, on the same device and
// CUDA context, builds the next generation's group and runs collectives in it. The values read
// are ones only NCCL can have written (an out-of-place all-gather over zeros).
TEST_F(OneGpu, AfterAnAbortTheSameProcessBuildsTheNextGenerationsGroup) {
  SKIP_WITHOUT_GPU();
  const auto child_run = child("NextGeneration", "throw");
  EXPECT_EQ(child_run.exit_code, kChildPassed) << child_run.output;
  EXPECT_NE(child_run.output.find("timed out"), std::string::npos) << child_run.output;
  EXPECT_NE(child_run.output.find("the next generation's group gathered"), std::string::npos)
      << child_run.output;
}
TEST_F(OneGpuChild, DISABLED_NextGeneration) {
  ONLY_AS_A_CHILD();
  NcclOptions options;
  options.op_timeout = 1s;
  options.on_failure = NcclFailure::kThrow;
  options.key_prefix = "test/generation/1";
  auto g = group(options);
  DeviceBuffer data(kCount * sizeof(float));
  Stream producer;
  Gate gate;
  fail_by_op_timeout(*g, data, producer, gate);
  const auto aborted = std::chrono::steady_clock::now();
  g.reset();
  NcclOptions next;
  next.on_failure = NcclFailure::kThrow;
  next.key_prefix = "test/generation/2";
  auto g2 = group(next);  // warmed up: every collective once
  DeviceBuffer in(16 * sizeof(float)), out(16 * sizeof(float));
  testing::fill(in.floats(), 16, kProduced, producer.s);
  g2->all_gather(in.data, out.data, 16, DataType::kFloat32, producer.s);
  check(cudaStreamSynchronize(producer.s));
  const auto gathered = out.host_floats(16);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - aborted).count();
  const bool right =
      std::all_of(gathered.begin(), gathered.end(), [](float v) { return v == kProduced; });
  std::fprintf(stderr, "the next generation's group gathered %s, %.2f s after the abort\n",
               right ? "the right values" : "WRONG values", seconds);
  std::fflush(stderr);
  std::_Exit(right ? kChildPassed : 1);
}

// NCCL's own kernels in flight when the watchdog aborts: a queue of large avg all-reduces (each a
// kernel reading and writing 512 MiB) far longer than op_timeout. The group fails, the abort
// returns, every later call throws.
TEST_F(OneGpu, AnAbortWhileNcclKernelsRunEndsTheGroupWithoutAHang) {
  SKIP_WITHOUT_GPU();
  const auto child_run = child("AbortWithKernelsInFlight", "throw");
  EXPECT_EQ(child_run.exit_code, kChildPassed) << child_run.output;
  EXPECT_NE(child_run.output.find("timed out"), std::string::npos) << child_run.output;
  EXPECT_EQ(child_run.output.find("did not return"), std::string::npos) << child_run.output;
}
TEST_F(OneGpuChild, DISABLED_AbortWithKernelsInFlight) {
  ONLY_AS_A_CHILD();
  NcclOptions options;
  options.op_timeout = 50ms;
  options.on_failure = NcclFailure::kThrow;
  auto g = group(options);
  // Work for the device on one rank: an out-of-place all-gather is a 512 MiB device copy (an
  // in-place sum or average over one rank is nothing at all), so the queue of 4000 takes seconds.
  constexpr std::size_t kBig = (512u << 20) / sizeof(float);
  DeviceBuffer data(kBig * sizeof(float)), gathered(kBig * sizeof(float));
  Stream stream;
  std::vector<Work> works;
  const auto start = std::chrono::steady_clock::now();
  try {
    for (int i = 0; i < 4000; ++i) {
      works.push_back(
          g->all_gather_async(data.data, gathered.data, kBig, DataType::kFloat32, stream.s));
    }
  } catch (const CollectiveError& e) {  // the group failed while this thread was still issuing
    std::fprintf(stderr, "issuing stopped: %s\n", e.what());
  }
  std::fprintf(stderr, "%zu collectives issued\n", works.size());
  bool failed = false;
  try {
    works.back().wait();
  } catch (const CollectiveError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    failed = true;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "failure seen after %.2f s\n", seconds);
  if (!failed) {
    std::fprintf(stderr, "the whole queue completed within op_timeout's detection: no abort\n");
    std::_Exit(1);
  }
  std::fflush(stderr);
  g.reset();  // returns: the abort is over (or was given up, which the parent sees)
  std::_Exit(kChildPassed);
}

// An initialization that waits for a rank that never comes: rank 1 meets rank 0 on the store (the
// keys process_group.h documents) and reads the unique id, but never calls NCCL. Non-blocking,
// it is aborted at init_timeout; blocking, it is given up (NCCL cannot abort it) and the process
// must exit.
TEST_F(OneGpu, AnInitializationWaitingForAMissingRankEndsAtInitTimeout) {
  SKIP_WITHOUT_GPU();
  for (const std::string mode : {"nonblocking", "blocking"}) {
    SCOPED_TRACE(mode);
    const auto child_run = child("InitWithoutPeer", mode);
    EXPECT_EQ(child_run.exit_code, kChildPassed) << child_run.output;
    EXPECT_NE(child_run.output.find("timed out after 3000 ms (init_timeout)"), std::string::npos)
        << child_run.output;
  }
}
TEST_F(OneGpuChild, DISABLED_InitWithoutPeer) {
  ONLY_AS_A_CHILD();
  store::StoreServerThread store;
  store::ClientOptions client;
  client.port = store.port();
  NcclOptions options;
  options.device = 0;
  options.init_timeout = 3s;
  options.blocking = child_mode() == "blocking";
  options.key_prefix = "test/init_without_peer";
  std::thread peer([&] {  // rank 1 as far as the store goes
    auto c = store::StoreClient::connect(client);
    const std::string key = options.key_prefix + "/0";
    if (c.add(key + "/arrived", 1) == 2) c.set(key + "/all_arrived", "1");
    c.get(key + "/unique_id", 30s);
  });
  const auto start = std::chrono::steady_clock::now();
  try {
    auto g = make_nccl_group(store::StoreClient::connect(client), 0, 2, 0, options);
    std::fprintf(stderr, "a group of 2 formed with one rank\n");
    std::_Exit(1);
  } catch (const CollectiveError& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
  peer.join();
  const auto waited = std::chrono::steady_clock::now() - start;
  std::fprintf(stderr, "gave up after %.2f s\n", std::chrono::duration<double>(waited).count());
  std::fflush(stderr);
  std::_Exit(waited < 30s ? kChildPassed : 1);  // _Exit: a blocking init is still in NCCL
}

// Two ranks on the one GPU, where NCCL allows it (2.30 and later, NCCL_MULTI_RANK_GPU_ENABLE=1):
// values only a real exchange gives, then the hang only a peer can cause (rank 0 in a collective
// rank 1 never issues, NCCL's kernel waiting for it) ended by op_timeout's abort, and a group
// destroyed with that collective running, aborted at once instead of drained.
TEST_F(OneGpu, TwoRanksOnOneGpuExchangeAndAbortAHungCollective) {
  SKIP_WITHOUT_GPU();
  const auto child_run = child("TwoRanks", "two", {{"NCCL_MULTI_RANK_GPU_ENABLE", "1"}});
  if (child_run.exit_code == kChildCannotRun) GTEST_SKIP() << child_run.output;
  EXPECT_EQ(child_run.exit_code, kChildPassed) << child_run.output;
  EXPECT_NE(child_run.output.find("timed out"), std::string::npos) << child_run.output;
  EXPECT_NE(child_run.output.find("still running: the communicator was aborted"), std::string::npos)
      << child_run.output;
  EXPECT_EQ(child_run.output.find("did not return"), std::string::npos) << child_run.output;
}

// Rank `rank` of two, on device 0: the collectives and their values, then (rank 0 only) the
// hung collective; each rank a thread of this child.
void two_ranks_on_one_gpu(std::uint16_t port, int rank, std::promise<void>* hang_seen) {
  store::ClientOptions client;
  client.port = port;
  NcclOptions options;
  options.device = 0;
  options.init_timeout = 60s;
  options.op_timeout = 5s;  // the first collectives connect the pair
  options.on_failure = NcclFailure::kThrow;
  options.key_prefix = "test/two";
  auto g = make_nccl_group(store::StoreClient::connect(client), rank, 2, 0, options);
  DeviceBuffer data(4 * 1024), gathered(8 * 1024);
  testing::fill(data.floats(), 1024, float(rank + 1), nullptr);
  g->all_reduce(data.data, 1024, DataType::kFloat32, ReduceOp::kSum);
  if (data.host_floats(1024)[1023] != 3.0f) throw std::runtime_error("sum is not 3");
  testing::fill(data.floats(), 1024, float(rank + 1), nullptr);
  g->all_reduce(data.data, 1024, DataType::kFloat32, ReduceOp::kAvg);
  if (data.host_floats(1024)[0] != 1.5f) throw std::runtime_error("avg is not 1.5");
  testing::fill(data.floats(), 1024, float(rank + 1), nullptr);
  g->all_gather(data.data, gathered.data, 1024, DataType::kFloat32);
  const auto all = gathered.host_floats(2048);
  if (all[0] != 1.0f || all[2047] != 2.0f) throw std::runtime_error("all_gather blocks misplaced");
  testing::fill(gathered.floats(), 2048, float(rank + 1), nullptr);
  g->reduce_scatter(gathered.data, data.data, 1024, DataType::kFloat32, ReduceOp::kSum);
  if (data.host_floats(1024)[7] != 3.0f) throw std::runtime_error("reduce_scatter is not 3");
  g->barrier();
  if (rank == 1) {
    hang_seen->get_future().wait();  // never joins rank 0's last collective
    return;                          // an idle, healthy group: finalized
  }
  Work hung = g->all_reduce_async(data.data, 1024, DataType::kFloat32, ReduceOp::kSum);
  try {
    hung.wait();
    throw std::runtime_error("a collective completed without its peer");
  } catch (const CollectiveError& e) {
    std::fprintf(stderr, "rank 0: %s\n", e.what());
  }
  hang_seen->set_value();
}

// A child of two ranks on device 0 exits kChildCannotRun, saying why, where NCCL refuses that.
void exit_unless_two_ranks_fit_one_gpu() {
  const std::string version = nccl_version();
  const int major = std::stoi(version), minor = std::stoi(version.substr(version.find('.') + 1));
  if (major < 2 || (major == 2 && minor < 30)) {
    std::fprintf(stderr, "NCCL %s refuses two ranks on one GPU (2.30 allows it)\n",
                 version.c_str());
    std::_Exit(kChildCannotRun);
  }
}

TEST_F(OneGpuChild, DISABLED_TwoRanks) {
  ONLY_AS_A_CHILD();
  exit_unless_two_ranks_fit_one_gpu();
  store::StoreServerThread store;
  std::promise<void> hang_seen;
  std::string errors;
  std::mutex mutex;
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      try {
        two_ranks_on_one_gpu(store.port(), r, &hang_seen);
      } catch (const std::exception& e) {
        std::lock_guard lock(mutex);
        errors += "rank " + std::to_string(r) + ": " + e.what() + "\n";
        if (r == 0) {
          try {
            hang_seen.set_value();  // rank 1 must not wait for a hang rank 0 never reached
          } catch (const std::future_error&) {
          }
        }
      }
    });
  }
  for (auto& t : ranks) t.join();
  if (!errors.empty()) {
    std::fprintf(stderr, "%s", errors.c_str());
    std::_Exit(1);
  }
  // A fresh pair: rank 0's collective waits for rank 1, and rank 0's group is destroyed under it.
  std::promise<void> destroyed;
  std::thread peer([&] {
    store::ClientOptions client;
    client.port = store.port();
    NcclOptions options;
    options.device = 0;
    options.key_prefix = "test/destroy";
    options.on_failure = NcclFailure::kThrow;
    auto g = make_nccl_group(store::StoreClient::connect(client), 1, 2, 0, options);
    destroyed.get_future().wait();  // issues nothing: rank 0's all-gather waits for it
  });
  store::ClientOptions client;
  client.port = store.port();
  NcclOptions options;
  options.device = 0;
  options.key_prefix = "test/destroy";
  options.on_failure = NcclFailure::kThrow;
  auto g = make_nccl_group(store::StoreClient::connect(client), 0, 2, 0, options);
  DeviceBuffer data(4096);
  Work pending = g->all_gather_async(data.data, data.data, 1, DataType::kFloat32);  // in place
  const auto start = std::chrono::steady_clock::now();
  g.reset();
  const double destroy =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  destroyed.set_value();
  peer.join();
  std::fprintf(stderr, "destroyed with a collective running in %.2f s\n", destroy);
  bool threw = false;
  try {
    pending.wait();
  } catch (const CollectiveError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    threw = true;
  }
  std::fflush(stderr);
  std::_Exit(threw && destroy < 15.0 ? kChildPassed : 1);
}

// Two ranks whose collective waits for a peer that stays silent: it would wait out op_timeout.
NcclOptions silent_peer_options(const std::string& prefix) {
  NcclOptions options;
  options.device = 0;
  options.init_timeout = 60s;
  options.op_timeout = 120s;  // what the collective would wait without the abort
  options.key_prefix = prefix;
  options.on_failure = NcclFailure::kExitProcess;
  return options;
}

// Rank 0 of `g`: an all-reduce rank 1 never joins, aborted from another thread, must throw at once
// with the abort's reason, and a later collective must throw too. Says how long it took.
bool an_abort_ends_a_collective_of_rank_0(ProcessGroup& g) {
  DeviceBuffer data(4096);
  Work pending = g.all_reduce_async(data.data, 1024, DataType::kFloat32, ReduceOp::kSum);
  const auto start = std::chrono::steady_clock::now();
  std::thread aborter([&] { g.abort("its peer went silent (test)"); });
  bool threw = false;
  try {
    pending.wait();
  } catch (const CollectiveError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    threw = true;
  }
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  aborter.join();
  bool later_threw = false;
  try {
    g.barrier();
  } catch (const CollectiveError&) {
    later_threw = true;
  }
  std::fprintf(stderr, "aborted in %.2f s\n", took);
  std::fflush(stderr);
  return threw && later_threw && took < 30.0;
}

// ProcessGroup::abort from another thread (the in-place watcher's way out of a collective whose
// peer went silent): rank 0's all-reduce waits for rank 1, which issues nothing; the abort ends it
// at once with the abort's reason, long before op_timeout, even though on_failure says to exit
// (an abort the caller asked for throws: the caller rebuilds the group).
TEST_F(OneGpu, AnAbortFromAnotherThreadEndsACollectiveWaitingForASilentPeer) {
  SKIP_WITHOUT_GPU();
  const auto child_run = child("AbortSilentPeer", "two", {{"NCCL_MULTI_RANK_GPU_ENABLE", "1"}});
  if (child_run.exit_code == kChildCannotRun) GTEST_SKIP() << child_run.output;
  EXPECT_EQ(child_run.exit_code, kChildPassed) << child_run.output;
  EXPECT_NE(child_run.output.find("was aborted: its peer went silent (test)"), std::string::npos)
      << child_run.output;
}
TEST_F(OneGpuChild, DISABLED_AbortSilentPeer) {
  ONLY_AS_A_CHILD();
  exit_unless_two_ranks_fit_one_gpu();
  store::StoreServerThread store;
  std::promise<void> done;
  std::thread peer([&] {
    store::ClientOptions client;
    client.port = store.port();
    auto g =
        make_nccl_group(store::StoreClient::connect(client), 1, 2, 0, silent_peer_options("t/a"));
    done.get_future().wait();  // issues nothing
    g->abort("the test is over");
  });
  store::ClientOptions client;
  client.port = store.port();
  auto g =
      make_nccl_group(store::StoreClient::connect(client), 0, 2, 0, silent_peer_options("t/a"));
  const bool passed = an_abort_ends_a_collective_of_rank_0(*g);
  done.set_value();
  peer.join();
  std::_Exit(passed ? kChildPassed : 1);
}

// The same with each rank a process of its own that NCCL takes for a host of its own
// (NCCL_HOSTID): NCCL before 2.30 refuses two ranks of one host on one GPU but connects these, with
// its socket transport over loopback, as it would two hosts. Rank 1 stays silent (it issues
// nothing, its connections open) until rank 0, whose all-reduce waits for it, has aborted.
TEST_F(OneGpu, AnAbortEndsACollectiveWaitingForASilentPeerProcess) {
  SKIP_WITHOUT_GPU();
  store::StoreServerThread store;
  const auto env = [&](int rank) {
    return std::vector<std::pair<std::string, std::string>>{
        {kChildModeVariable, "two-processes"},
        {"CUDA_MODULE_LOADING", "EAGER"},
        {"DIST_GPU_TEST_RANK", std::to_string(rank)},
        {"DIST_GPU_TEST_STORE_PORT", std::to_string(store.port())},
        {"NCCL_HOSTID", "dist-gpu-test-rank-" + std::to_string(rank)},
        {"NCCL_SOCKET_IFNAME", "lo"}};
  };
  testing::Child rank0("OneGpuChild.DISABLED_SilentPeerProcess", env(0));
  testing::Child rank1("OneGpuChild.DISABLED_SilentPeerProcess", env(1));
  const auto first = rank0.finish(kChildTimeout);
  const auto second = rank1.finish(kChildTimeout);
  EXPECT_EQ(first.exit_code, kChildPassed) << first.output << "\n--- rank 1:\n" << second.output;
  EXPECT_EQ(second.exit_code, kChildPassed) << second.output;
  EXPECT_NE(first.output.find("was aborted: its peer went silent (test)"), std::string::npos)
      << first.output;
}
TEST_F(OneGpuChild, DISABLED_SilentPeerProcess) {
  ONLY_AS_A_CHILD();
  const int rank = std::stoi(std::getenv("DIST_GPU_TEST_RANK"));
  store::ClientOptions client;
  client.port = static_cast<std::uint16_t>(std::stoi(std::getenv("DIST_GPU_TEST_STORE_PORT")));
  auto coordination = store::StoreClient::connect(client);
  auto g = make_nccl_group(store::StoreClient::connect(client), rank, 2, 0,
                           silent_peer_options("t/processes"));
  DeviceBuffer data(4096);
  g->all_reduce(data.data, 1024, DataType::kFloat32, ReduceOp::kSum);  // connects the pair
  if (rank == 1) {
    coordination.wait({"t/processes/done"}, std::chrono::milliseconds(kChildTimeout));
    std::_Exit(kChildPassed);  // its group left to the driver: the peer has aborted its own
  }
  const bool passed = an_abort_ends_a_collective_of_rank_0(*g);
  coordination.set("t/processes/done", "1");
  std::_Exit(passed ? kChildPassed : 1);
}

}  // namespace
}  // namespace dist::sdk
