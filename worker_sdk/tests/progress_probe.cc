// A worker as the SDK's progress tests need one: a fresh process (the SDK maps its slot once per
// process, so a forked child of a test that already looked would inherit the answer), given the
// slot's descriptor and the variables by the test, doing one thing:
//   beats N        heartbeat() N times; exit 0 when the slot was found and is close-on-exec now
//   steps N        step() N times; exit 0 when the slot was found
//   off            heartbeat() and step() without a usable slot; exit 0 when both said it was off
//   pending        two ranks of a Gloo group (threads): rank 1 joins rank 0's all-reduce only once
//                  the slot shows it pending as an all-reduce; exit: the number of failures
//   setup          two ranks of a Gloo group built with join_group (threads): rank 1 joins only
//                  once the slot shows rank 0 waiting in the group's set-up; exit: the number of
//                  failures (the slot shows no set-up once both are in)
//   ddp-work N     N steps of DDP over a Gloo group of one: a step's own work (forward and
//                  backward) sleeps kComputeMs, its optimizer kOptimizerMs; exit 0 when all ran
//   dump SIGNAL    install the stack dump, 2 steps, a broadcast issued, then SIGNAL to itself
//   no-dump        install the stack dump without the agent's variables; exit 0 when no handler
#include <fcntl.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dist/sdk/ddp.h"
#include "dist/sdk/heartbeat.h"
#include "dist/sdk/init.h"
#include "dist/sdk/process_group.h"
#include "dist/sdk/progress.h"
#include "dist/store/server.h"
#include "progress_slot.h"

namespace {

using namespace dist;
namespace slot = worker_contract::heartbeat_slot;

// Ranks 0 and 1 of a group on threads of this process, over a store of its own: `rank(r, port)`
// each; the failures (a rank's exception is one, said).
int two_ranks(const std::function<void(int, std::uint16_t, std::atomic<int>&)>& rank) {
  store::StoreServerThread store;
  std::atomic<int> failures{0};
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      try {
        rank(r, store.port(), failures);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        ++failures;
      }
    });
  }
  for (auto& t : ranks) t.join();
  return failures.load();
}

int pending() {
  sdk::detail::Slot* s = sdk::detail::progress_slot();
  if (!s) return 100;
  return two_ranks([s](int rank, std::uint16_t port, std::atomic<int>& failures) {
    store::ClientOptions client;
    client.port = port;
    auto group = sdk::make_gloo_group(store::StoreClient::connect(client), rank, 2, {});
    float value = 1.0f;
    if (rank == 1) {
      while (s->pending_since_ns.load() == 0) std::this_thread::yield();
      if (s->pending_op.load() != static_cast<std::uint32_t>(slot::Collective::kAllReduce)) {
        ++failures;
      }
    }
    group->all_reduce(&value, 1, sdk::DataType::kFloat32, sdk::ReduceOp::kSum);
    if (value != 2.0f) ++failures;
  });
}

int setup() {
  sdk::detail::Slot* s = sdk::detail::progress_slot();
  if (!s) return 100;
  const int failures = two_ranks([s](int rank, std::uint16_t port, std::atomic<int>& failed) {
    sdk::WorkerEnv env;
    env.rank = rank;
    env.world_size = 2;
    env.master_port = port;
    if (rank == 1) {
      while (s->setup_since_ns.load() == 0) std::this_thread::yield();
    }
    auto group = sdk::join_group(env, sdk::Backend::kGloo, std::chrono::seconds(60));
    float value = 1.0f;
    group->all_reduce(&value, 1, sdk::DataType::kFloat32, sdk::ReduceOp::kSum);
    if (value != 2.0f) ++failed;
  });
  return failures + (s->setup_since_ns.load() != 0 ? 1 : 0);
}

// What progress_test.cc expects of `ddp-work`.
constexpr int kComputeMs = 20;
constexpr int kOptimizerMs = 60;

int ddp_work(int steps) {
  store::StoreServerThread store;
  store::ClientOptions client;
  client.port = store.port();
  auto group = sdk::make_gloo_group(store::StoreClient::connect(client), 0, 1, {});
  std::vector<float> weights(16, 1.0f), grads(16, 0.0f);
  sdk::DistributedDataParallel ddp(*group, {{"w", weights, grads}});
  for (int i = 0; i < steps; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(kComputeMs));  // forward, backward
    ddp.grad_ready(0);
    ddp.synchronize();
    std::this_thread::sleep_for(std::chrono::milliseconds(kOptimizerMs));  // the optimizer
    ddp.after_step();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  const int n = argc > 2 ? std::atoi(argv[2]) : 0;
  if (what == "beats" || what == "steps") {
    if (!sdk::progress_enabled()) return 1;
    for (int i = 0; i < n; ++i) what == "beats" ? sdk::heartbeat() : sdk::step();
    const int fd = std::atoi(std::getenv(slot::kFdVariable));
    return (::fcntl(fd, F_GETFD) & FD_CLOEXEC) ? 0 : 2;
  }
  if (what == "off") {
    sdk::heartbeat();
    sdk::step();
    return sdk::heartbeat_enabled() || sdk::progress_enabled() ? 1 : 0;
  }
  if (what == "pending") return pending();
  if (what == "setup") return setup();
  if (what == "ddp-work") return ddp_work(n);
  if (what == "dump") {
    sdk::detail::install_stack_dump();
    sdk::step();
    sdk::step();
    sdk::detail::collective_issued(slot::Collective::kBroadcast);
    return ::raise(n) == 0 ? 0 : 1;
  }
  if (what == "no-dump") {
    sdk::detail::install_stack_dump();
    struct sigaction now {};
    ::sigaction(SIGRTMIN + 2, nullptr, &now);
    return now.sa_handler == SIG_DFL ? 0 : 1;
  }
  std::fprintf(stderr, "progress_probe: unknown action '%s'\n", what.c_str());
  return 64;
}
