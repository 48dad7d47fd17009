// dist::sdk::save_snapshot / load_snapshot on a real directory (as the agent's shared-memory one),
// format 2 (docs/SNAPSHOTS.md): round trips, the two newest kept and the oldest file's memory
// reused (never while a load maps it), the memory bound and the eviction of ranks this node no
// longer runs, torn saves and rewrites never loaded, identity (per global rank, job and world size;
// any rank's with kReplicated), freshness by when a snapshot was saved, the step every rank has,
// and the same files as Python's dist_launch.snapshot (both ways, when python3 with numpy is here).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "dist/sdk/snapshot.h"

namespace dist::sdk {
namespace {

namespace fs = std::filesystem;

constexpr const char* kIdentityVariables[] = {"RANK",
                                              "WORLD_SIZE",
                                              "LOCAL_RANK",
                                              "TORCHELASTIC_RUN_ID",
                                              "TORCHELASTIC_RESTART_COUNT",
                                              "DIST_LAUNCH_SNAPSHOT_RUN"};

class SnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("dist-snapshot-test-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    ::setenv("DIST_LAUNCH_SNAPSHOT_DIR", root_.c_str(), 1);
    ::setenv("DIST_LAUNCH_SNAPSHOT_MEMORY", "1000000000", 1);
    ::unsetenv("DIST_LAUNCH_SNAPSHOT_PERSIST_DIR");
    for (const char* name : kIdentityVariables) ::unsetenv(name);
    ::setenv("TORCHELASTIC_RUN_ID", "job-a", 1);
    ::setenv("DIST_LAUNCH_SNAPSHOT_RUN", "host-1-1234", 1);
    as(0, 1);
  }
  void TearDown() override {
    fs::remove_all(root_);
    ::unsetenv("DIST_LAUNCH_SNAPSHOT_DIR");
    ::unsetenv("DIST_LAUNCH_SNAPSHOT_MEMORY");
    ::unsetenv("DIST_LAUNCH_SNAPSHOT_PERSIST_DIR");
    for (const char* name : kIdentityVariables) ::unsetenv(name);
  }
  // This process as the worker of global rank `rank` of `world_size` (local rank `local_rank`).
  static void as(int rank, int world_size, int local_rank = -1) {
    ::setenv("RANK", std::to_string(rank).c_str(), 1);
    ::setenv("WORLD_SIZE", std::to_string(world_size).c_str(), 1);
    ::setenv("LOCAL_RANK", std::to_string(local_rank < 0 ? rank : local_rank).c_str(), 1);
  }
  static Checkpoint make(std::uint64_t step, std::size_t n = 1000, float value = -0.5f) {
    Checkpoint c;
    c.step = step;
    c.tensors["w"] = std::vector<float>(n, static_cast<float>(step));
    c.tensors["optim/m"] = std::vector<float>(n / 2, value);
    return c;
  }
  fs::path rank_dir(int rank = 0) const { return root_ / ("rank_" + std::to_string(rank)); }
  static std::string name(std::uint64_t step) {
    std::string digits = std::to_string(step);
    return "step_" + std::string(20 - digits.size(), '0') + digits + ".snap";
  }
  static std::string slurp(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  // Writes `bytes` over the file's bytes at `offset`, in place (as a writer rewriting it).
  static void overwrite(const fs::path& path, std::size_t offset, const std::string& bytes) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(f.good()) << path;
  }
  static bool has_temporaries(const fs::path& dir) {
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.path().filename().string().starts_with(".tmp.")) return true;
    }
    return false;
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
  // A step saved again reuses its own file, and the other one stays.
  struct stat before {};
  ASSERT_EQ(::stat((rank_dir() / name(20)).c_str(), &before), 0);
  ASSERT_TRUE(save_snapshot(make(20, 1000, 4.0f)));
  struct stat after {};
  ASSERT_EQ(::stat((rank_dir() / name(20)).c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);
  EXPECT_EQ(snapshot_steps(), (std::vector<std::uint64_t>{30, 20})) << "oldest saved first";
  EXPECT_EQ(load_snapshot()->tensors, make(20, 1000, 4.0f).tensors) << "the newest save";
}

TEST_F(SnapshotTest, TheHeaderNamesTheWritersIdentity) {
  ::setenv("TORCHELASTIC_RESTART_COUNT", "3", 1);
  as(5, 8, 1);
  ASSERT_TRUE(save_snapshot(make(12, 10)));
  const std::string file = slurp(rank_dir(5) / name(12));
  ASSERT_GT(file.size(), 40u);
  EXPECT_EQ(file.substr(0, 8), "DLSNAP02");
  std::uint64_t header_len = 0, total = 0, footer_id = 0;
  std::memcpy(&header_len, file.data() + 8, 8);
  std::memcpy(&total, file.data() + file.size() - 16, 8);
  std::memcpy(&footer_id, file.data() + file.size() - 8, 8);
  EXPECT_EQ(file.substr(file.size() - 24, 8), "DLSNAPOK");
  EXPECT_EQ(total, file.size());
  const auto header = nlohmann::json::parse(file.substr(16, header_len));
  EXPECT_EQ(header.at("format"), 2);
  EXPECT_EQ(header.at("job"), "job-a");
  EXPECT_EQ(header.at("run"), "host-1-1234");
  EXPECT_EQ(header.at("rank"), 5);
  EXPECT_EQ(header.at("world_size"), 8);
  EXPECT_EQ(header.at("local_rank"), 1);
  EXPECT_EQ(header.at("generation"), 3);
  EXPECT_EQ(header.at("step"), 12);
  EXPECT_EQ(header.at("writer"), "c++");
  EXPECT_EQ(header.at("size"), file.size());
  EXPECT_NE(footer_id, 0u);
  EXPECT_EQ(header.at("save_id").get<std::uint64_t>(), footer_id);
  const auto saved_at = header.at("saved_at").get<std::int64_t>();
  const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  EXPECT_LE(saved_at, now);
  EXPECT_GT(saved_at, now - std::int64_t{60'000'000'000}) << "Unix nanoseconds";
  for (const auto& t : header.at("tensors")) EXPECT_EQ(t.at("offset").get<int>() % 64, 0);
  ASSERT_TRUE(save_snapshot(make(13, 10)));
  const std::string next = slurp(rank_dir(5) / name(13));
  std::uint64_t next_id = 0;
  std::memcpy(&next_id, next.data() + next.size() - 8, 8);
  EXPECT_NE(next_id, footer_id) << "each save its own save_id";
}

TEST_F(SnapshotTest, WithoutAnAgentNothingIsSaved) {
  ::unsetenv("DIST_LAUNCH_SNAPSHOT_DIR");
  EXPECT_FALSE(snapshots_enabled());
  EXPECT_FALSE(save_snapshot(make(1)));
  EXPECT_FALSE(load_snapshot());
  EXPECT_TRUE(snapshot_steps().empty());
}

TEST_F(SnapshotTest, PastTheMemoryBoundASaveFailsWithTheNumbers) {
  ::setenv("DIST_LAUNCH_SNAPSHOT_MEMORY", "100000", 1);
  ASSERT_TRUE(save_snapshot(make(1, 10000)));  // 60 KB
  try {
    save_snapshot(make(2, 10000));
    FAIL() << "no SnapshotMemoryError";
  } catch (const SnapshotMemoryError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 0 (local rank 0) at step 2"), std::string::npos) << what;
    EXPECT_NE(what.find("--snapshot-memory"), std::string::npos) << what;
  }
  EXPECT_EQ(snapshot_steps(), std::vector<std::uint64_t>{1});
  EXPECT_FALSE(has_temporaries(rank_dir())) << "the refused save left a temporary file";
}

TEST_F(SnapshotTest, OverTheBoundTheSnapshotsOfRanksThisNodeNoLongerRunsGoFirst) {
  // 150 KB: two 60 KB snapshots of rank 1 and one of rank 0 do not fit.
  ::setenv("DIST_LAUNCH_SNAPSHOT_MEMORY", "150000", 1);
  as(1, 2);
  ASSERT_TRUE(save_snapshot(make(10, 10000)));
  ASSERT_TRUE(save_snapshot(make(20, 10000)));
  as(0, 2);
  // Without .ranks the agent says nothing of which ranks it runs: nothing is evicted.
  EXPECT_THROW(save_snapshot(make(30, 10000)), SnapshotMemoryError);
  // Both ranks still run here: rank 1's snapshots stay, the save fails.
  std::ofstream(root_ / ".ranks") << "0\n1\n";
  try {
    save_snapshot(make(30, 10000));
    FAIL() << "no SnapshotMemoryError";
  } catch (const SnapshotMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 (local rank 0) at step 30"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(fs::exists(rank_dir(1) / name(10)));
  EXPECT_TRUE(fs::exists(rank_dir(1) / name(20)));
  EXPECT_FALSE(has_temporaries(rank_dir(0)));
  // This node runs rank 0 only now (an elastic job that reshaped): rank 1's oldest save goes.
  std::ofstream(root_ / ".ranks") << "0\n";
  ASSERT_TRUE(save_snapshot(make(30, 10000)));
  EXPECT_FALSE(fs::exists(rank_dir(1) / name(10))) << "the oldest saved is evicted first";
  EXPECT_TRUE(fs::exists(rank_dir(1) / name(20))) << "only as much as the save needs";
  EXPECT_EQ(load_snapshot()->step, 30u);
  // The next save needs rank 1's other one too; this rank's own are never evicted.
  ASSERT_TRUE(save_snapshot(make(40, 10000)));
  EXPECT_FALSE(fs::exists(rank_dir(1) / name(20)));
  EXPECT_EQ(snapshot_steps(), (std::vector<std::uint64_t>{30, 40}));
  // Nothing of another rank is left to evict: past the bound the save fails.
  EXPECT_THROW(save_snapshot(make(50, 30000)), SnapshotMemoryError);
  EXPECT_EQ(snapshot_steps(), (std::vector<std::uint64_t>{30, 40}));
}

TEST_F(SnapshotTest, ATornSaveIsNeverLoadedAndIsSweptAway) {
  ASSERT_TRUE(save_snapshot(make(10)));
  // What a worker killed mid-save leaves: its temporary file, named after a dead process.
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const fs::path torn = rank_dir() / (".tmp." + name(20) + "." + std::to_string(dead));
  std::ofstream(torn) << "DLSNAP02 and then nothing";
  const auto back = load_snapshot();
  ASSERT_TRUE(back);
  EXPECT_EQ(back->step, 10u);
  // A file with a complete name but no footer (a damaged copy) is skipped too.
  std::ofstream(rank_dir() / name(15)) << "DLSNAP02";
  EXPECT_EQ(load_snapshot()->step, 10u);
  EXPECT_FALSE(load_snapshot(15));
  EXPECT_EQ(snapshot_steps(), std::vector<std::uint64_t>{10});
  fs::remove(rank_dir() / name(15));
  ASSERT_TRUE(save_snapshot(make(30)));
  EXPECT_FALSE(fs::exists(torn)) << "swept by the next save";
}

// A reader that opened a snapshot just before its writer recycled it reads, front to back, either
// the old save whole or a mix: the writer's order (old footer zeroed, data, header, footer) makes
// every mix show either a zeroed footer or a header and a footer of two saves. Both, made here
// deterministically, are refused.
TEST_F(SnapshotTest, ASnapshotBeingRewrittenIsNeverLoaded) {
  ASSERT_TRUE(save_snapshot(make(10)));
  ASSERT_TRUE(save_snapshot(make(20)));
  const fs::path path = rank_dir() / name(20);
  const std::string file = slurp(path);
  std::uint64_t header_len = 0;
  std::memcpy(&header_len, file.data() + 8, 8);
  const auto header = nlohmann::json::parse(file.substr(16, header_len));
  const auto offset = header.at("tensors").at(0).at("offset").get<std::size_t>();

  // The writer mid-rewrite: part of the data and the new header written, the footer not yet.
  overwrite(path, offset, std::string(64, '\x7f'));
  const std::string id = std::to_string(header.at("save_id").get<std::uint64_t>());
  const auto at = file.find("\"save_id\":" + id);
  ASSERT_NE(at, std::string::npos);
  std::string other = id;
  other.back() = other.back() == '1' ? '2' : '1';  // another save's id, as long
  overwrite(path, at + 10, other);
  EXPECT_FALSE(load_snapshot(20)) << "the header's save_id is not the footer's";
  EXPECT_EQ(load_snapshot()->step, 10u);
  EXPECT_EQ(load_snapshot()->tensors, make(10).tensors);

  // The writer's first move: the old footer zeroed (the header and data still the old save's).
  const fs::path older = rank_dir() / name(10);
  const auto size = fs::file_size(older);
  overwrite(older, size - 24, std::string(24, '\0'));
  EXPECT_FALSE(load_snapshot(10)) << "a zeroed footer";
  EXPECT_FALSE(load_snapshot());
  EXPECT_TRUE(snapshot_steps().empty());
}

// The same under a real writer: a child process saving as fast as it can (steps saved again and
// recycled, sizes changing), this process loading meanwhile. Every load is one save, whole.
TEST_F(SnapshotTest, AReaderNeverSeesASaveBeingWritten) {
  const auto save_number = [](int i) {
    Checkpoint c;
    c.step = static_cast<std::uint64_t>(i % 3 + 1);
    const std::size_t n = 100000 + static_cast<std::size_t>(i % 7) * 70000;
    c.tensors["w"] = std::vector<float>(n, static_cast<float>(i));
    c.tensors["optim/m"] = std::vector<float>(n / 2, static_cast<float>(i));
    return c;
  };
  ASSERT_TRUE(save_snapshot(save_number(0)));
  const pid_t writer = ::fork();
  if (writer == 0) {
    int status = 0;
    try {
      for (int i = 1; i < 400; ++i) save_snapshot(save_number(i));
    } catch (...) {
      status = 1;
    }
    ::_exit(status);
  }
  int loads = 0;
  int child = 0;
  while (::waitpid(writer, &child, WNOHANG) == 0) {
    const auto s = load_snapshot();
    if (!s) continue;
    ++loads;
    const int i = static_cast<int>(s->tensors.at("w").at(0));
    ASSERT_EQ(s->tensors, save_number(i).tensors) << "load " << loads << " mixed saves";
    ASSERT_EQ(s->step, save_number(i).step);
  }
  ASSERT_TRUE(WIFEXITED(child));
  EXPECT_EQ(WEXITSTATUS(child), 0) << "the writer failed";
  EXPECT_GT(loads, 0);
}

TEST_F(SnapshotTest, LoadsTheNewestStepEveryRankHas) {
  as(1, 2);
  ASSERT_TRUE(save_snapshot(make(10)));  // rank 1 died before its step-20 save completed
  as(0, 2);
  ASSERT_TRUE(save_snapshot(make(10)));
  ASSERT_TRUE(save_snapshot(make(20)));
  EXPECT_EQ(load_snapshot()->step, 10u) << "replicas resume together";
  EXPECT_EQ(load_snapshot(20)->step, 20u);
  EXPECT_EQ(snapshot_steps(), (std::vector<std::uint64_t>{10, 20}));
}

// --virtual-local-rank: two workers on one node with the same LOCAL_RANK, of different ranks.
TEST_F(SnapshotTest, WorkersOfOneLocalRankButTwoRanksNeverLoadEachOthersState) {
  as(0, 2, 0);
  ASSERT_TRUE(save_snapshot(make(10, 100, 1.0f)));
  as(1, 2, 0);
  EXPECT_FALSE(load_snapshot()) << "rank 0's state is not rank 1's";
  EXPECT_TRUE(snapshot_steps().empty());
  ASSERT_TRUE(save_snapshot(make(20, 100, 2.0f)));
  EXPECT_TRUE(fs::exists(rank_dir(0) / name(10)));
  EXPECT_TRUE(fs::exists(rank_dir(1) / name(20)));
  EXPECT_EQ(load_snapshot()->tensors, make(20, 100, 2.0f).tensors);
  EXPECT_FALSE(load_snapshot(10));
  as(0, 2, 0);
  EXPECT_EQ(load_snapshot()->tensors, make(10, 100, 1.0f).tensors);
  EXPECT_FALSE(load_snapshot(20));
  EXPECT_EQ(snapshot_steps(), std::vector<std::uint64_t>{10});
  // Rank 1's save copied into rank 0's folder is still rank 1's.
  fs::copy_file(rank_dir(1) / name(20), rank_dir(0) / name(20));
  EXPECT_FALSE(load_snapshot(20));
  EXPECT_EQ(load_snapshot()->step, 10u);
  EXPECT_EQ(snapshot_steps(), std::vector<std::uint64_t>{10});
}

TEST_F(SnapshotTest, AnotherJobsFileInThisRanksFolderIsNeverReturned) {
  ::setenv("TORCHELASTIC_RUN_ID", "job-b", 1);
  ASSERT_TRUE(save_snapshot(make(50)));
  const fs::path foreign = root_ / "foreign.snap";
  fs::rename(rank_dir() / name(50), foreign);
  ::unsetenv("TORCHELASTIC_RUN_ID");  // "none"
  ASSERT_TRUE(save_snapshot(make(40)));
  fs::copy_file(foreign, rank_dir() / name(40), fs::copy_options::overwrite_existing);
  EXPECT_FALSE(load_snapshot()) << "job-b's file under this job's step name";
  ::setenv("TORCHELASTIC_RUN_ID", "job-a", 1);
  ASSERT_TRUE(save_snapshot(make(10)));
  fs::copy_file(foreign, rank_dir() / name(50));  // copied in: the newest saved, the highest step
  EXPECT_EQ(load_snapshot()->step, 10u);
  EXPECT_FALSE(load_snapshot(50));
  EXPECT_EQ(snapshot_steps(), std::vector<std::uint64_t>{10});
  EXPECT_EQ(load_snapshot(std::nullopt, SnapshotScope::kReplicated)->step, 10u)
      << "not with kReplicated either";
  ::setenv("TORCHELASTIC_RUN_ID", "job-b", 1);
  EXPECT_EQ(load_snapshot()->step, 50u) << "its own job's";
}

TEST_F(SnapshotTest, AnotherWorldSizesFileIsReturnedOnlyWhenReplicated) {
  as(0, 4);
  ASSERT_TRUE(save_snapshot(make(20)));
  as(3, 4);
  ASSERT_TRUE(save_snapshot(make(30)));
  // The job reshaped to two workers: rank 0 of 2 is not rank 0 of 4.
  as(0, 2);
  EXPECT_FALSE(load_snapshot());
  EXPECT_FALSE(load_snapshot(20));
  EXPECT_TRUE(snapshot_steps().empty());
  const auto replicated = load_snapshot(std::nullopt, SnapshotScope::kReplicated);
  ASSERT_TRUE(replicated);
  EXPECT_EQ(replicated->step, 30u) << "any rank's newest save of this job";
  EXPECT_EQ(replicated->tensors, make(30).tensors);
  EXPECT_EQ(load_snapshot(20, SnapshotScope::kReplicated)->step, 20u);
  // A rank that was not there before resumes from whichever rank's state is here.
  as(1, 2);
  EXPECT_FALSE(load_snapshot());
  EXPECT_EQ(load_snapshot(std::nullopt, SnapshotScope::kReplicated)->step, 30u);
  ::setenv("TORCHELASTIC_RUN_ID", "job-b", 1);
  EXPECT_FALSE(load_snapshot(std::nullopt, SnapshotScope::kReplicated)) << "its job's only";
}

TEST_F(SnapshotTest, TheNewestSaveWinsNotTheHighestStep) {
  ASSERT_TRUE(save_snapshot(make(5000)));  // an earlier run's, under the same job id
  ASSERT_TRUE(save_snapshot(make(110)));   // this run's, which started afresh
  EXPECT_EQ(load_snapshot()->step, 110u);
  EXPECT_EQ(snapshot_steps(), (std::vector<std::uint64_t>{5000, 110}));
  EXPECT_EQ(load_snapshot(5000)->step, 5000u);
  // The same on disk: the earlier run's copy in --snapshot-dir, this run's in shared memory.
  const fs::path persisted = root_ / "persisted";
  fs::create_directories(persisted / "rank_0");
  fs::rename(rank_dir() / name(5000), persisted / "rank_0" / name(5000));
  ::setenv("DIST_LAUNCH_SNAPSHOT_PERSIST_DIR", persisted.c_str(), 1);
  EXPECT_EQ(load_snapshot()->step, 110u);
  EXPECT_EQ(load_snapshot(5000)->step, 5000u);
}

TEST_F(SnapshotTest, ReadsTheCopiesInTheSnapshotDirAfterANodeRestart) {
  const fs::path persisted = root_ / "persisted";
  ASSERT_TRUE(save_snapshot(make(40)));
  fs::create_directories(persisted / "rank_0");
  fs::copy_file(rank_dir() / name(40), persisted / "rank_0" / name(40));
  const fs::path fresh = root_ / "fresh-shm";  // the restarted agent's empty shared memory
  fs::create_directories(fresh);
  ::setenv("DIST_LAUNCH_SNAPSHOT_DIR", fresh.c_str(), 1);
  ::setenv("DIST_LAUNCH_SNAPSHOT_PERSIST_DIR", persisted.c_str(), 1);
  const auto back = load_snapshot();
  ASSERT_TRUE(back);
  EXPECT_EQ(back->step, 40u);
  EXPECT_EQ(snapshot_steps(), std::vector<std::uint64_t>{40});
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

// A mapped load (Python's load(mmap=True)) holds its file's shared flock while its tensors live:
// a save never rewrites that file under them. It leaves the rank's saves as .held.<name>,
// unchanged, and goes at a save once nothing maps it.
TEST_F(SnapshotTest, AFileALoadMapsIsNeverRewrittenAndGoesOnceUnmapped) {
  ASSERT_TRUE(save_snapshot(make(10)));
  ASSERT_TRUE(save_snapshot(make(20)));
  const fs::path mapped = rank_dir() / name(10);
  const std::string contents = slurp(mapped);
  const int reader = ::open(mapped.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  ASSERT_EQ(::flock(reader, LOCK_SH | LOCK_NB), 0);

  ASSERT_TRUE(save_snapshot(make(30)));  // would have recycled step 10's file
  const fs::path held = rank_dir() / (".held." + name(10));
  ASSERT_TRUE(fs::exists(held));
  EXPECT_EQ(slurp(held), contents) << "a mapped file changed under its reader";
  EXPECT_EQ(snapshot_steps(), (std::vector<std::uint64_t>{20, 30})) << "held is not a save";
  EXPECT_EQ(load_snapshot()->tensors, make(30).tensors);
  ASSERT_TRUE(save_snapshot(make(40)));  // still mapped: held stays
  EXPECT_TRUE(fs::exists(held));

  ::close(reader);  // the tensors dropped: the mapping, and its flock, go
  ASSERT_TRUE(save_snapshot(make(50)));
  EXPECT_FALSE(fs::exists(held)) << "a held file no load maps is removed by the next save";
  EXPECT_EQ(snapshot_steps(), (std::vector<std::uint64_t>{40, 50}));
  EXPECT_EQ(load_snapshot()->tensors, make(50).tensors);
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

// Tensors of any type and shape (Checkpoint::typed) round-trip, and cross to Python and back
// with their types and shapes: what torch and numpy workers save is no longer an error here.
TEST_F(SnapshotTest, TypedTensorsOfAnyTypeAndShapeRoundTripAndCrossToPython) {
  Checkpoint c = make(3, 4);
  std::vector<unsigned char> ids(6 * sizeof(std::int64_t));
  for (std::int64_t i = 0; i < 6; ++i) {
    const std::int64_t v = i * 1000000007LL;
    std::memcpy(ids.data() + i * 8, &v, 8);
  }
  c.typed["ids"] = {"int64", {2, 3}, ids};
  c.typed["half"] = {"float16", {2}, {0x00, 0x3c, 0x00, 0xc0}};  // 1.0, -2.0
  c.typed["grid"] = {"float32", {2, 2}, std::vector<unsigned char>(16, 0)};
  ASSERT_TRUE(save_snapshot(c));
  auto back = load_snapshot();
  ASSERT_TRUE(back);
  EXPECT_EQ(back->tensors.at("w"), c.tensors.at("w"));
  for (const auto& [name, t] : c.typed) {
    ASSERT_TRUE(back->typed.contains(name)) << name;
    EXPECT_EQ(back->typed.at(name).dtype, t.dtype) << name;
    EXPECT_EQ(back->typed.at(name).shape, t.shape) << name;
    EXPECT_EQ(back->typed.at(name).bytes, t.bytes) << name;
  }
  const int read = run_python(
      "import numpy as np\n"
      "from dist_launch import snapshot\n"
      "step, obj = snapshot.load()\n"
      "assert obj[\"ids\"].dtype == np.int64 and obj[\"ids\"].shape == (2, 3), obj\n"
      "assert obj[\"ids\"][1, 2] == 5 * 1000000007, obj\n"
      "assert obj[\"half\"].tolist() == [1.0, -2.0], obj\n"
      "assert snapshot.save(4, {\"mask\": np.array([[True, False]]), "
      "\"counts\": np.arange(6, dtype=np.int32).reshape(3, 2), \"w\": np.ones(2, np.float32)})\n");
  if (read == 77) GTEST_SKIP() << "python3 with numpy is not here";
  ASSERT_EQ(read, 0);
  back = load_snapshot();
  ASSERT_TRUE(back);
  EXPECT_EQ(back->step, 4u);
  EXPECT_EQ(back->tensors.at("w"), std::vector<float>(2, 1.0f));
  EXPECT_EQ(back->typed.at("mask").dtype, "bool");
  EXPECT_EQ(back->typed.at("mask").shape, (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(back->typed.at("mask").bytes, (std::vector<unsigned char>{1, 0}));
  EXPECT_EQ(back->typed.at("counts").dtype, "int32");
  EXPECT_EQ(back->typed.at("counts").shape, (std::vector<std::int64_t>{3, 2}));
  std::int32_t last = 0;
  std::memcpy(&last, back->typed.at("counts").bytes.data() + 5 * 4, 4);
  EXPECT_EQ(last, 5);
}

TEST_F(SnapshotTest, ATypedTensorWhoseBytesAreNotItsShapesIsRefusedWithTheNumbers) {
  Checkpoint c = make(1, 4);
  c.typed["bad"] = {"int64", {2, 2}, std::vector<unsigned char>(24)};
  try {
    save_snapshot(c);
    FAIL() << "saved";
  } catch (const SnapshotError& e) {
    EXPECT_NE(std::string(e.what()).find("'bad': 24 bytes, but its shape of int64 needs 32"),
              std::string::npos)
        << e.what();
  }
  c.typed["bad"] = {"float8", {1}, {0}};
  EXPECT_THROW(save_snapshot(c), SnapshotError);
  EXPECT_FALSE(load_snapshot()) << "nothing was saved";
}

// Python keeps the identity too: rank 1 does not load rank 0's save, another job's is skipped.
TEST_F(SnapshotTest, PythonLoadsOnlyThisRanksAndJobsSnapshots) {
  ASSERT_TRUE(save_snapshot(make(7, 10)));
  const int read = run_python(
      "import os\n"
      "from dist_launch import snapshot\n"
      "assert snapshot.load() is not None\n"
      "os.environ[\"RANK\"] = \"1\"; os.environ[\"LOCAL_RANK\"] = \"0\"\n"
      "assert snapshot.load() is None\n"
      "os.environ[\"RANK\"] = \"0\"; os.environ[\"TORCHELASTIC_RUN_ID\"] = \"job-b\"\n"
      "assert snapshot.load() is None\n");
  if (read == 77) GTEST_SKIP() << "python3 with numpy is not here";
  EXPECT_EQ(read, 0);
}

}  // namespace
}  // namespace dist::sdk
