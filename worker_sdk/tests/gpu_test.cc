// The NCCL backend on a real GPU, world size 1 (recent NCCL refuses two ranks on one device):
// collectives ordered after the kernels that produce their input on the caller's stream, callers'
// streams ordered after collectives, DDP over device buffers without blocking the host, and a
// collective that never completes ending in an abort (exit or exception) instead of a hang.
//
// Ordering is shown with a gate (gpu_kernels.h): a kernel that spins until the host opens it,
// so "must wait" is checked while the gate is closed, whatever the machine's timing. Without a
// GPU every test skips, saying so.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "dist/rendezvous/server.h"
#include "dist/sdk/ddp.h"
#include "dist/sdk/process_group.h"
#include "gpu_kernels.h"

extern char** environ;

namespace dist::sdk {
namespace {

using namespace std::chrono_literals;
using testing::Gate;

// How long what waits behind a closed gate must stay incomplete.
constexpr auto kHold = 300ms;
constexpr auto kPollPeriod = 1ms;
constexpr std::size_t kCount = 1 << 20;
constexpr float kProduced = 7.0f;
// The child of the abort tests: its mode, and its exit code once the exception it expects came.
constexpr const char* kChildModeVariable = "DIST_GPU_TEST_CHILD";
constexpr int kChildThrewAsExpected = 42;
constexpr auto kChildTimeout = 60s;

bool have_gpu() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
}

#define SKIP_WITHOUT_GPU()                                                                  \
  if (!have_gpu())                                                                          \
  GTEST_SKIP() << "no CUDA device on this machine: the GPU tests run on a GPU host (world " \
                  "size 1 on one GPU)"

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

struct DeviceBuffer {
  float* data = nullptr;
  explicit DeviceBuffer(std::size_t count) {
    void* memory = nullptr;
    if (cudaMalloc(&memory, count * sizeof(float)) != cudaSuccess) {
      throw std::runtime_error("cudaMalloc");
    }
    cudaMemset(memory, 0, count * sizeof(float));
    cudaDeviceSynchronize();
    data = static_cast<float*>(memory);
  }
  ~DeviceBuffer() { cudaFree(data); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::vector<float> host(std::size_t count) const {
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

class OneGpu : public ::testing::Test {
 protected:
  std::unique_ptr<ProcessGroup> group(NcclOptions options = {}) {
    rendezvous::ClientOptions client;
    client.port = store_.port();
    options.device = 0;
    return make_nccl_group(rendezvous::StoreClient::connect(client), 0, 1, 0, options);
  }

 private:
  rendezvous::StoreServerThread store_;
};

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
    DeviceBuffer in(kCount), out(kCount);
    Stream producer;
    Gate gate;
    gate.hold(producer.s);
    testing::fill(in.data, kCount, kProduced, producer.s);
    Work work = c.issue(*g, in.data, out.data, producer.s);
    EXPECT_FALSE(happens_within_hold([&] { return work.ready(); }))
        << "the collective completed before the kernel producing its input ran";
    gate.open();
    work.wait();
    const auto result = (c.in_place ? in : out).host(kCount);
    EXPECT_EQ(result.front(), kProduced) << "stale input";
    EXPECT_EQ(result.back(), kProduced) << "stale input";
  }
}

TEST_F(OneGpu, WaitOnOrdersTheCallersLaterWorkAfterTheCollective) {
  SKIP_WITHOUT_GPU();
  auto g = group();
  DeviceBuffer in(kCount), copy(kCount);
  Stream producer, consumer;
  Gate gate;
  gate.hold(producer.s);
  testing::fill(in.data, kCount, kProduced, producer.s);
  Work work = g->all_reduce_async(in.data, kCount, DataType::kFloat32, ReduceOp::kSum, producer.s);
  work.wait_on(consumer.s);
  check(cudaMemcpyAsync(copy.data, in.data, kCount * sizeof(float), cudaMemcpyDeviceToDevice,
                        consumer.s));
  cudaEvent_t copied = nullptr;
  check(cudaEventCreate(&copied));
  check(cudaEventRecord(copied, consumer.s));
  EXPECT_FALSE(happens_within_hold([&] { return cudaEventQuery(copied) == cudaSuccess; }))
      << "the consumer's copy ran before the collective";
  gate.open();
  check(cudaStreamSynchronize(consumer.s));
  EXPECT_EQ(copy.host(kCount)[kCount / 2], kProduced);
  cudaEventDestroy(copied);
}

TEST_F(OneGpu, SynchronousCollectivesReturnOnlyOnceTheResultIsThere) {
  SKIP_WITHOUT_GPU();
  auto g = group();
  DeviceBuffer data(kCount);
  Stream producer;
  Gate gate;
  gate.hold(producer.s);
  testing::fill(data.data, kCount, kProduced, producer.s);
  auto call = std::async(std::launch::async, [&] {
    g->all_reduce(data.data, kCount, DataType::kFloat32, ReduceOp::kSum, producer.s);
  });
  EXPECT_FALSE(happens_within_hold([&] { return call.wait_for(0s) == std::future_status::ready; }))
      << "all_reduce returned before its input was produced";
  gate.open();
  call.get();
  EXPECT_EQ(data.host(kCount)[0], kProduced);
  g->barrier();
}

TEST_F(OneGpu, DdpOverDeviceBuffersFollowsTheBackwardStreamWithoutBlockingTheHost) {
  SKIP_WITHOUT_GPU();
  auto g = group();
  constexpr std::size_t kWeights = 1000, kBiases = 10;
  DeviceBuffer w(kWeights), dw(kWeights), b(kBiases), db(kBiases);
  Stream backward;
  testing::fill(w.data, kWeights, 1.0f, backward.s);
  testing::fill(b.data, kBiases, 2.0f, backward.s);
  DdpOptions options;
  options.first_bucket_cap_bytes = kBiases * sizeof(float);  // two buckets: b, then w
  options.stream = backward.s;
  DistributedDataParallel ddp(*g,
                              {{"w", {w.data, kWeights}, {dw.data, kWeights}},
                               {"b", {b.data, kBiases}, {db.data, kBiases}}},
                              options);
  ASSERT_EQ(ddp.bucket_layout(), (std::vector<std::vector<std::size_t>>{{1}, {0}}));

  Gate gate;  // the backward pass: gradients appear once the gate opens
  gate.hold(backward.s);
  testing::fill(db.data, kBiases, -1.0f, backward.s);
  ddp.grad_ready(1);
  testing::fill(dw.data, kWeights, 2.5f, backward.s);
  ddp.grad_ready(0);
  auto sync = std::async(std::launch::async, [&] { ddp.synchronize(); });
  EXPECT_TRUE(happens_within_hold([&] { return sync.wait_for(0s) == std::future_status::ready; }))
      << "synchronize() blocked the host on the backward pass";
  gate.open();
  sync.get();
  check(cudaStreamSynchronize(backward.s));
  EXPECT_EQ(dw.host(kWeights)[kWeights - 1], 2.5f);  // the average over one rank
  EXPECT_EQ(db.host(kBiases)[0], -1.0f);
  EXPECT_EQ(w.host(kWeights)[0], 1.0f);  // rank 0's parameters, broadcast
  EXPECT_EQ(b.host(kBiases)[0], 2.0f);
}

// The abort paths run in a child process (this binary, one disabled test): after an abort the
// CUDA context is not trusted for more tests.
struct ChildResult {
  int exit_code = -1;
  std::string stderr_text;
};

ChildResult run_child(const std::string& mode) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) throw std::runtime_error("pipe");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  env.push_back(std::string(kChildModeVariable) + "=" + mode);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe", filter = "--gtest_filter=OneGpuChild.DISABLED_OpTimeout",
              disabled = "--gtest_also_run_disabled_tests";
  char* argv[] = {self.data(), filter.data(), disabled.data(), nullptr};
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, self.c_str(), &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  if (spawned != 0) {
    ::close(pipe_fds[0]);
    throw std::runtime_error("posix_spawn");
  }
  ChildResult result;
  // Reads until the child closes stderr (it exits), with a deadline after which it is killed.
  auto reader = std::async(std::launch::async, [fd = pipe_fds[0]] {
    std::string text;
    char buffer[4096];
    for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;)
      text.append(buffer, std::size_t(n));
    ::close(fd);
    return text;
  });
  if (reader.wait_for(kChildTimeout) != std::future_status::ready) ::kill(pid, SIGKILL);
  result.stderr_text = reader.get();
  int status = 0;
  ::waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

TEST_F(OneGpu, ACollectivePastOpTimeoutAbortsAndExitsForTheAgentToRestart) {
  SKIP_WITHOUT_GPU();
  const ChildResult child = run_child("exit");
  EXPECT_EQ(child.exit_code, NcclOptions{}.exit_code_on_abort) << child.stderr_text;
  EXPECT_NE(child.stderr_text.find("timed out"), std::string::npos) << child.stderr_text;
  EXPECT_NE(child.stderr_text.find("aborting the communicator"), std::string::npos)
      << child.stderr_text;
}

TEST_F(OneGpu, ACollectivePastOpTimeoutAbortsAndThrowsWhenAskedTo) {
  SKIP_WITHOUT_GPU();
  const ChildResult child = run_child("throw");
  EXPECT_EQ(child.exit_code, kChildThrewAsExpected) << child.stderr_text;
  EXPECT_NE(child.stderr_text.find("timed out"), std::string::npos) << child.stderr_text;
}

// Run only as the child of the two tests above: a collective behind a gate that never opens.
class OneGpuChild : public OneGpu {};
TEST_F(OneGpuChild, DISABLED_OpTimeout) {
  const char* mode = std::getenv(kChildModeVariable);
  if (!mode) GTEST_SKIP() << "runs as the child of the abort tests";
  NcclOptions options;
  options.op_timeout = kHold;
  options.on_failure =
      std::string(mode) == "throw" ? NcclFailure::kThrow : NcclFailure::kExitProcess;
  auto g = group(options);
  DeviceBuffer data(kCount);
  Stream producer;
  Gate gate;
  gate.hold(producer.s);
  Work work =
      g->all_reduce_async(data.data, kCount, DataType::kFloat32, ReduceOp::kSum, producer.s);
  try {
    work.wait();  // kExitProcess: the watchdog ends the process in here
    std::fprintf(stderr, "the collective completed behind a closed gate\n");
  } catch (const CollectiveError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::fflush(stderr);
    try {
      g->all_reduce(data.data, 1, DataType::kFloat32, ReduceOp::kSum, producer.s);
    } catch (const CollectiveError&) {  // a failed group refuses later collectives too
      std::_Exit(kChildThrewAsExpected);
    }
  }
  std::_Exit(1);
}

}  // namespace
}  // namespace dist::sdk
