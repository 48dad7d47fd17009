// Where a run's directory is made: the user's --log-dir; else $TMPDIR when set; else, for a run
// that writes no logs into it, /dev/shm when it is a writable tmpfs; else the system's temporary
// directory. And what finish() does with a temporary one.
#include "workers/run_directory.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "scoped_variable.h"

namespace dist::agent {
namespace {

namespace fs = std::filesystem;
using testing::ScopedVariable;

class RunDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/run-directory-test-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    scratch_ = pattern;
  }
  void TearDown() override { fs::remove_all(scratch_); }

  fs::path scratch_;
};

// No temporary directory chosen in any of the variables temp_directory_path() reads.
struct NoTemporaryDirectoryChosen {
  ScopedVariable tmpdir{"TMPDIR", std::nullopt}, tmp{"TMP", std::nullopt},
      temp{"TEMP", std::nullopt}, tempdir{"TEMPDIR", std::nullopt};
};

TEST_F(RunDirectoryTest, WithoutTmpdirOrLogsItIsMadeInSharedMemoryAndRemovedAtTheEnd) {
  NoTemporaryDirectoryChosen none;
  RunDirectory dir(JobConfig{}, OutputConfig{}, "host");
  const fs::path memory = shared_memory_directory();
  EXPECT_EQ(dir.path().parent_path(), memory.empty() ? fs::temp_directory_path() : memory);
  EXPECT_TRUE(dir.temporary());
  EXPECT_TRUE(fs::is_directory(dir.path()));
  EXPECT_EQ(dir.attempt(2, 3), dir.path() / "attempt_2" / "3");
  EXPECT_EQ(dir.finish(false), "");
  EXPECT_FALSE(fs::exists(dir.path()));
}

// A run id with a '/' (or "..") names a directory inside --log-dir, not a path out of it.
TEST_F(RunDirectoryTest, ARunIdIsADirectorysNameInTheLogDirNeverAPath) {
  const fs::path log_dir = scratch_ / "logs";
  for (const char* id : {"../escaped", "a/b", "/abs", ".."}) {
    SCOPED_TRACE(id);
    JobConfig job;
    job.run_id = id;
    OutputConfig output;
    output.log_dir = log_dir.string();
    RunDirectory dir(job, output, "host");
    EXPECT_EQ(dir.path().parent_path(), log_dir);
    EXPECT_TRUE(fs::is_directory(dir.path()));
  }
  const auto count = [](const fs::path& dir) {
    return std::distance(fs::directory_iterator(dir), fs::directory_iterator());
  };
  EXPECT_EQ(count(scratch_), 1);  // logs/, nothing beside it
  EXPECT_EQ(count(log_dir), 4);
}

TEST_F(RunDirectoryTest, ATemporaryDirectoryChosenInAnyOfItsVariablesIsHonoured) {
  for (const char* name : {"TMPDIR", "TMP", "TEMP", "TEMPDIR"}) {
    SCOPED_TRACE(name);
    NoTemporaryDirectoryChosen none;
    ScopedVariable chosen(name, scratch_.string());
    RunDirectory dir(JobConfig{}, OutputConfig{}, "host");
    EXPECT_EQ(dir.path().parent_path(), scratch_);
    dir.finish(false);
  }
}

TEST_F(RunDirectoryTest, ARunThatWritesLogsKeepsThemOutOfMemory) {
  NoTemporaryDirectoryChosen none;
  LaunchConfig tee;
  tee.tee.stdout_stream = true;
  LaunchConfig filtered;
  filtered.duplicate_stderr_filters = {"loss"};
  for (const LaunchConfig* config : {&tee, &filtered}) {
    RunDirectory dir(*config, *config, "host");
    EXPECT_EQ(dir.path().parent_path(), fs::temp_directory_path());
    dir.finish(false);
  }
}

TEST_F(RunDirectoryTest, AKeptDirectoryIsSaidAndAnElasticNodeHasItsOwn) {
  ScopedVariable tmpdir("TMPDIR", scratch_.string());
  LaunchConfig elastic;
  elastic.elastic = true;
  RunDirectory dir(elastic, elastic, "node-a");
  EXPECT_EQ(dir.path().parent_path().parent_path(), scratch_);
  EXPECT_TRUE(dir.path().filename().string().starts_with("node_node-a_"));
  fs::create_directories(dir.attempt(0, 0));
  std::ofstream(dir.attempt(0, 0) / "error.json") << "{}";
  std::ofstream(dir.attempt(0, 0) / "stacks.txt");  // empty: not kept
  fs::create_directories(dir.attempt(0, 1));        // empty: not kept
  const std::string said = dir.finish(true);
  EXPECT_NE(said.find("kept in " + dir.path().parent_path().string()), std::string::npos) << said;
  EXPECT_TRUE(fs::is_regular_file(dir.attempt(0, 0) / "error.json"));
  EXPECT_FALSE(fs::exists(dir.attempt(0, 0) / "stacks.txt"));
  EXPECT_FALSE(fs::exists(dir.attempt(0, 1)));
}

// A run to keep with nothing in it but empty files and folders is not kept (nor said): in
// /dev/shm such directories used to pile up, one per failed job.
TEST_F(RunDirectoryTest, AKeptDirectoryWithNothingInItIsRemoved) {
  ScopedVariable tmpdir("TMPDIR", scratch_.string());
  LaunchConfig config;
  RunDirectory dir(config, config, "host");
  fs::create_directories(dir.attempt(0, 0));
  std::ofstream(dir.attempt(0, 0) / "stacks.txt");
  EXPECT_EQ(dir.finish(true), "");
  EXPECT_FALSE(fs::exists(dir.path()));
}

TEST_F(RunDirectoryTest, LogDirGetsARunOfItsOwnThatIsNeverRemoved) {
  LaunchConfig config;
  config.log_dir = (scratch_ / "logs").string();
  config.run_id = "job7";
  RunDirectory dir(config, config, "host");
  EXPECT_EQ(dir.path().parent_path(), scratch_ / "logs");
  EXPECT_TRUE(dir.path().filename().string().starts_with("job7_"));
  EXPECT_FALSE(dir.temporary());
  EXPECT_EQ(dir.finish(false), "");
  EXPECT_TRUE(fs::is_directory(dir.path()));
}

// What workers leave in a temporary run directory goes with it: files, empty and full
// directories, links; a link is removed, never followed out of the directory.
TEST_F(RunDirectoryTest, FinishRemovesEverythingInsideAndFollowsNoLink) {
  ScopedVariable tmpdir{"TMPDIR", scratch_.string()};
  const fs::path outside = scratch_ / "outside";
  fs::create_directories(outside / "kept");
  std::ofstream(outside / "kept" / "file") << "x";
  RunDirectory dir(JobConfig{}, OutputConfig{}, "host");
  const fs::path attempt = dir.attempt(0, 0).parent_path();
  fs::create_directories(dir.attempt(0, 0));
  fs::create_directories(dir.attempt(0, 1) / "deeper" / "still");
  std::ofstream(dir.attempt(0, 1) / "error.json") << "{}";
  std::ofstream(dir.attempt(0, 1) / "deeper" / "still" / "log") << "line";
  fs::create_directory_symlink(outside, attempt / "link-to-outside");
  fs::create_symlink(outside / "kept" / "file", attempt / "link-to-file");
  EXPECT_EQ(dir.finish(false), "");
  EXPECT_FALSE(fs::exists(dir.path()));
  EXPECT_TRUE(fs::exists(outside / "kept" / "file")) << "a link was followed out of the run";
}

// A deep tree (a worker's own nesting) is removed whole: 700 levels, each of which held a 16 KiB
// buffer on the stack before remove_tree kept it on the heap (11 MiB: past the 8 MiB stack).
TEST_F(RunDirectoryTest, FinishRemovesADeepTree) {
  ScopedVariable tmpdir{"TMPDIR", scratch_.string()};
  RunDirectory dir(JobConfig{}, OutputConfig{}, "host");
  fs::path deep = dir.attempt(0, 0);
  for (int level = 0; level < 700; ++level) deep /= "d";
  fs::create_directories(deep);
  std::ofstream(deep / "log") << "line";
  EXPECT_EQ(dir.finish(false), "");
  EXPECT_FALSE(fs::exists(dir.path()));
}

}  // namespace
}  // namespace dist::agent
