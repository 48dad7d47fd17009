// dist::sdk::save_snapshot / load_snapshot on a real directory (as the agent's shared-memory one):
// round trips, the two newest kept and the oldest file's memory reused, the memory bound, torn
// saves never loaded, the step every local rank has, and the same files as Python's
// dist_launch.snapshot (both ways, when python3 with numpy is here).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "dist/sdk/snapshot.h"

namespace dist::sdk {
namespace {

namespace fs = std::filesystem;

class SnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("dist-snapshot-test-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    ::setenv("DIST_LAUNCH_SNAPSHOT_DIR", root_.c_str(), 1);
    ::setenv("DIST_LAUNCH_SNAPSHOT_MEMORY", "1000000000", 1);
    ::unsetenv("DIST_LAUNCH_SNAPSHOT_PERSIST_DIR");
    ::setenv("LOCAL_RANK", "0", 1);
  }
  void TearDown() override {
    fs::remove_all(root_);
    ::unsetenv("DIST_LAUNCH_SNAPSHOT_DIR");
    ::unsetenv("DIST_LAUNCH_SNAPSHOT_MEMORY");
    ::unsetenv("LOCAL_RANK");
  }
  static Checkpoint make(std::uint64_t step, std::size_t n = 1000) {
    Checkpoint c;
    c.step = step;
    c.tensors["w"] = std::vector<float>(n, static_cast<float>(step));
    c.tensors["optim/m"] = std::vector<float>(n / 2, -0.5f);
    return c;
  }
  fs::path rank_dir(int rank = 0) const { return root_ / ("local_rank_" + std::to_string(rank)); }
  static std::string name(std::uint64_t step) {
    std::string digits = std::to_string(step);
    return "step_" + std::string(20 - digits.size(), '0') + digits + ".snap";
  }
  fs::path root_;
};

TEST_F(SnapshotTest, RoundTripsAndKeepsTheTwoNewest) {
  ASSERT_TRUE(snapshots_enabled());
  EXPECT_FALSE(load_snapshot());
  ASSERT_TRUE(save_snapshot(make(10)));
  ASSERT_TRUE(save_snapshot(make(20)));
  struct stat first {};
  ASSERT_EQ(::stat((rank_dir() / name(10)).c_str(), &first), 0);
  ASSERT_TRUE(save_snapshot(make(30)));
  EXPECT_EQ(snapshot_steps(), (std::vector<std::uint64_t>{20, 30}));
  struct stat third {};
  ASSERT_EQ(::stat((rank_dir() / name(30)).c_str(), &third), 0);
  EXPECT_EQ(first.st_ino, third.st_ino) << "the oldest snapshot's file (memory) is reused";
  const auto back = load_snapshot();
  ASSERT_TRUE(back);
  EXPECT_EQ(back->step, 30u);
  EXPECT_EQ(back->tensors, make(30).tensors);
  const auto older = load_snapshot(20);
  ASSERT_TRUE(older);
  EXPECT_EQ(older->tensors, make(20).tensors);
}

TEST_F(SnapshotTest, WithoutAnAgentNothingIsSaved) {
  ::unsetenv("DIST_LAUNCH_SNAPSHOT_DIR");
  EXPECT_FALSE(snapshots_enabled());
  EXPECT_FALSE(save_snapshot(make(1)));
  EXPECT_FALSE(load_snapshot());
}

TEST_F(SnapshotTest, PastTheMemoryBoundASaveFailsWithTheNumbers) {
  ::setenv("DIST_LAUNCH_SNAPSHOT_MEMORY", "100000", 1);
  ASSERT_TRUE(save_snapshot(make(1, 10000)));  // 60 KB
  try {
    save_snapshot(make(2, 10000));
    FAIL() << "no SnapshotMemoryError";
  } catch (const SnapshotMemoryError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("local rank 0 at step 2"), std::string::npos) << what;
    EXPECT_NE(what.find("--snapshot-memory"), std::string::npos) << what;
  }
  EXPECT_EQ(snapshot_steps(), std::vector<std::uint64_t>{1});
  for (const auto& entry : fs::directory_iterator(rank_dir())) {
    EXPECT_FALSE(entry.path().filename().string().starts_with(".tmp."))
        << "the refused save left " << entry.path();
  }
}

TEST_F(SnapshotTest, ATornSaveIsNeverLoadedAndIsSweptAway) {
  ASSERT_TRUE(save_snapshot(make(10)));
  // What a worker killed mid-save leaves: its temporary file, named after a dead process.
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const fs::path torn = rank_dir() / (".tmp." + name(20) + "." + std::to_string(dead));
  std::ofstream(torn) << "DLSNAP01 and then nothing";
  const auto back = load_snapshot();
  ASSERT_TRUE(back);
  EXPECT_EQ(back->step, 10u);
  // A file with a complete name but no footer (a damaged copy) is skipped too.
  std::ofstream(rank_dir() / name(15)) << "DLSNAP01";
  EXPECT_EQ(load_snapshot()->step, 10u);
  fs::remove(rank_dir() / name(15));
  ASSERT_TRUE(save_snapshot(make(30)));
  EXPECT_FALSE(fs::exists(torn)) << "swept by the next save";
}

TEST_F(SnapshotTest, LoadsTheNewestStepEveryLocalRankHas) {
  ::setenv("LOCAL_RANK", "1", 1);
  ASSERT_TRUE(save_snapshot(make(10)));  // rank 1 died before its step-20 save completed
  ::setenv("LOCAL_RANK", "0", 1);
  ASSERT_TRUE(save_snapshot(make(10)));
  ASSERT_TRUE(save_snapshot(make(20)));
  EXPECT_EQ(load_snapshot()->step, 10u) << "replicas resume together";
  EXPECT_EQ(load_snapshot(20)->step, 20u);
}

TEST_F(SnapshotTest, ReadsTheCopiesInTheSnapshotDirAfterANodeRestart) {
  const fs::path persisted = root_ / "persisted";
  ASSERT_TRUE(save_snapshot(make(40)));
  fs::create_directories(persisted / "local_rank_0");
  fs::copy_file(rank_dir() / name(40), persisted / "local_rank_0" / name(40));
  const fs::path fresh = root_ / "fresh-shm";  // the restarted agent's empty shared memory
  fs::create_directories(fresh);
  ::setenv("DIST_LAUNCH_SNAPSHOT_DIR", fresh.c_str(), 1);
  ::setenv("DIST_LAUNCH_SNAPSHOT_PERSIST_DIR", persisted.c_str(), 1);
  const auto back = load_snapshot();
  ASSERT_TRUE(back);
  EXPECT_EQ(back->step, 40u);
}

// python3 with numpy, and the repository's dist_launch package: 77 when absent.
int run_python(const std::string& code) {
  const std::string python_dir = std::string(DIST_SOURCE_DIR) + "/python";
  const std::string command = "PYTHONPATH=" + python_dir +
                              " python3 -c 'import numpy' 2>/dev/null || exit 77; " +
                              "PYTHONPATH=" + python_dir + " python3 -c '" + code + "'";
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST_F(SnapshotTest, PythonReadsWhatCppWroteAndTheOtherWayRound) {
  ASSERT_TRUE(save_snapshot(make(7, 10)));
  const int read = run_python(
      "from dist_launch import snapshot\n"
      "step, obj = snapshot.load()\n"
      "assert step == 7, step\n"
      "assert obj[\"w\"].tolist() == [7.0] * 10, obj\n"
      "assert obj[\"optim/m\"].tolist() == [-0.5] * 5, obj\n"
      "import numpy as np\n"
      "assert snapshot.save(8, {\"w\": np.full(3, 2.5, dtype=np.float32), \"n\": 1})\n");
  if (read == 77) GTEST_SKIP() << "python3 with numpy is not here";
  ASSERT_EQ(read, 0);
  const auto back = load_snapshot();
  ASSERT_TRUE(back);
  EXPECT_EQ(back->step, 8u);
  EXPECT_EQ(back->tensors.at("w"), std::vector<float>(3, 2.5f));
}

}  // namespace
}  // namespace dist::sdk
