// The SDK's side of the agent's heartbeats, hang and straggler detection, against what the agent
// does: a progress slot made as the agent makes it (a memfd, the magic, its number in
// DIST_HEARTBEAT_FD) passed to a real worker process (progress_probe.cc); beats, steps, a real
// Gloo group's collectives, and the stack dump a real signal asks for.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "progress_slot.h"

extern char** environ;

namespace dist::sdk {
namespace {

namespace contract = worker_contract;
namespace slot = contract::heartbeat_slot;

// A slot as the agent makes one, and the probe (progress_probe.cc) run against it: a fresh
// process each time, as a worker is.
class ProgressSlot : public ::testing::Test {
 protected:
  void SetUp() override {
    fd_ = ::memfd_create("test-progress", 0);  // inherited by the probe
    ASSERT_GE(fd_, 0);
    ASSERT_EQ(::ftruncate(fd_, slot::kBytes), 0);
    void* at = ::mmap(nullptr, slot::kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    ASSERT_NE(at, MAP_FAILED);
    slot_ = new (at) slot::Slot{};
    slot_->magic = slot::kMagic;
    stacks_ = "/tmp/dist-sdk-stacks-" + std::to_string(::getpid());
    ::unlink(stacks_.c_str());
  }
  void TearDown() override {
    ::munmap(slot_, slot::kBytes);
    ::close(fd_);
    ::unlink(stacks_.c_str());
  }

  // The probe's exit code (128 + signal when one ended it), with the slot's descriptor in
  // DIST_HEARTBEAT_FD (or `slot_fd` instead) and `env` added.
  int probe(std::vector<std::string> args, std::vector<std::string> env = {},
            std::optional<int> slot_fd = std::nullopt) {
    args.insert(args.begin(), PROGRESS_PROBE);
    for (char** e = environ; *e; ++e) {
      const std::string_view entry(*e);
      if (!entry.starts_with(std::string(slot::kFdVariable) + "=") &&
          !entry.starts_with(std::string(contract::kStackSignalVariable) + "=") &&
          !entry.starts_with(std::string(contract::kStackFileVariable) + "=")) {
        env.emplace_back(entry);
      }
    }
    env.push_back(std::string(slot::kFdVariable) + "=" + std::to_string(slot_fd.value_or(fd_)));
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    for (auto& e : env) envp.push_back(e.data());
    argv.push_back(nullptr);
    envp.push_back(nullptr);
    pid_t pid = -1;
    if (::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), envp.data()) != 0) return -1;
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  std::string stacks() const {
    std::ifstream in(stacks_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  int fd_ = -1;
  slot::Slot* slot_ = nullptr;
  std::string stacks_;
};

TEST_F(ProgressSlot, BeatsLandInTheSlotTheAgentPassed) {
  const std::uint64_t before = detail::monotonic_ns();
  // 0: found, and the descriptor is not passed on to programs the worker runs.
  EXPECT_EQ(probe({"beats", "3"}), 0);
  EXPECT_GE(slot_->last_beat_ns.load(), before);
  EXPECT_EQ(slot_->beats.load(), 3u);
  EXPECT_EQ(slot_->steps.load(), 0u) << "a beat is not a step";
}

// Steps are not heartbeats: the health check and --worker-heartbeat-timeout read beats only (a
// long evaluation without steps is no silence), the hang detector both.
TEST_F(ProgressSlot, StepsAreCountedAndStamped) {
  const std::uint64_t before = detail::monotonic_ns();
  EXPECT_EQ(probe({"steps", "5"}), 0);
  EXPECT_EQ(slot_->steps.load(), 5u);
  EXPECT_GE(slot_->last_step_ns.load(), before);
  EXPECT_EQ(slot_->beats.load(), 0u);
  EXPECT_EQ(slot_->last_beat_ns.load(), 0u);
}

TEST_F(ProgressSlot, ADescriptorThatIsNotASlotTurnsProgressOff) {
  const int null_fd = ::open("/dev/null", O_RDONLY);  // what a reused descriptor number may be
  EXPECT_EQ(probe({"off"}, {}, null_fd), 0);
  ::close(null_fd);
  EXPECT_EQ(probe({"off"}, {}, 1000), 0) << "a closed descriptor";
  EXPECT_EQ(slot_->steps.load(), 0u);
  EXPECT_EQ(slot_->beats.load(), 0u);
}

// What the agent reads of a rank waiting for a late peer in a real Gloo all-reduce, and that it
// clears once the collective completes.
TEST_F(ProgressSlot, APendingCollectiveShowsItsKindUntilItCompletes) {
  EXPECT_EQ(probe({"pending"}), 0);
  EXPECT_EQ(slot_->collectives_issued.load(), 2u);
  EXPECT_EQ(slot_->collectives_done.load(), 2u);
  EXPECT_EQ(slot_->pending_since_ns.load(), 0u) << "nothing is pending once both completed";
  EXPECT_EQ(slot_->pending_op.load(), static_cast<std::uint32_t>(slot::Collective::kNone));
}

// A rank building its group waits for every rank of it: its slot says since when (the agents
// publish it as waiting, so that a node whose workers are all held stopped is waited on), and
// says no more once the group is built.
TEST_F(ProgressSlot, ARankBuildingItsGroupIsInItsSetUpUntilTheGroupIsBuilt) {
  EXPECT_EQ(probe({"setup"}), 0);
  EXPECT_EQ(slot_->setup_since_ns.load(), 0u);
  EXPECT_EQ(slot_->pending_since_ns.load(), 0u);
}

// DDP's straggler measure (the slot's work_ns): a step's own work, from the end of the last step
// (after_step) to where it may wait for its peers (synchronize), not the optimizer between. The
// probe's steps sleep 20 ms before synchronize() and 60 ms after it: 5 measured steps of 6 (the
// first starts before anything is measured) are 100 ms of work, and would be at least 400 with
// the optimizer's time (a sleep never ends early); the slack between is for a loaded machine's
// late wake-ups.
TEST_F(ProgressSlot, DdpCountsAStepsOwnWorkAndNotItsOptimizerAsWork) {
  EXPECT_EQ(probe({"ddp-work", "6"}), 0);
  EXPECT_EQ(slot_->steps.load(), 6u);
  const double work_ms = static_cast<double>(slot_->work_ns.load()) / 1e6;
  EXPECT_GE(work_ms, 100.0);
  EXPECT_LT(work_ms, 390.0) << "the optimizer's time was counted as the step's work";
}

// The agent's stack-dump signal: the worker says so in its slot (the feature, its pid), and on the
// signal appends where it is (its steps, its pending collective) and a backtrace to its file.
TEST_F(ProgressSlot, OnTheStackSignalAWorkerWritesWhereItIs) {
  const int signal = SIGRTMIN + 2;
  EXPECT_EQ(probe({"dump", std::to_string(signal)},
                  {std::string(contract::kStackSignalVariable) + "=" + std::to_string(signal),
                   std::string(contract::kStackFileVariable) + "=" + stacks_}),
            0);
  EXPECT_NE(slot_->features.load() & slot::kStacksOnSignal, 0u);
  EXPECT_GT(slot_->dump_pid.load(), 0u);
  const std::string text = stacks();
  EXPECT_NE(text.find("dist::sdk stack of pid " + std::to_string(slot_->dump_pid.load())),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("steps 2, collectives 0 of 1 done, waiting in broadcast #1 for "),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(")[0x"), std::string::npos) << "no backtrace frames in: " << text;
}

TEST_F(ProgressSlot, WithoutTheAgentsSignalNoHandlerIsInstalled) {
  EXPECT_EQ(probe({"no-dump"}), 0);
  EXPECT_EQ(slot_->features.load() & slot::kStacksOnSignal, 0u);
  EXPECT_EQ(slot_->dump_pid.load(), 0u);
}

}  // namespace
}  // namespace dist::sdk
