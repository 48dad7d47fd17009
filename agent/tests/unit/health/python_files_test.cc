// The workers' Python files (health/python_hook.h): written once into the user's cache, found
// there by the next launch, never half-written, in the run directory when there is no cache.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "health/python_hook.h"
#include "scoped_variable.h"

namespace dist::agent {
namespace {

namespace fs = std::filesystem;
using testing::ScopedVariable;

class PythonFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/python-files-test-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    root_ = pattern;
    run_dir_ = root_ / "run";
    fs::create_directories(run_dir_);
  }
  void TearDown() override { fs::remove_all(root_); }

  static std::string read(const fs::path& file) {
    std::ifstream in(file);
    return {std::istreambuf_iterator<char>(in), {}};
  }

  fs::path root_;
  fs::path run_dir_;
};

TEST_F(PythonFilesTest, AreWrittenOnceIntoTheCacheAndFoundThereByTheNextLaunch) {
  ScopedVariable cache("XDG_CACHE_HOME", (root_ / "cache").string());
  const PythonFiles first = python_files(run_dir_, true);
  EXPECT_EQ(first.hook.parent_path().parent_path(), root_ / "cache" / "dist-launch");
  EXPECT_EQ(first.hook.filename(), "hook");
  EXPECT_EQ(first.package, first.hook.parent_path() / "package");
  EXPECT_NE(read(first.hook / "sitecustomize.py").find("_dist_launch_progress.install()"),
            std::string::npos);
  EXPECT_GT(fs::file_size(first.hook / "_dist_launch_progress.py"), 1000U);
  for (const char* file : {"__init__.py", "snapshot.py", "elastic.py"}) {
    EXPECT_GT(fs::file_size(first.package / "dist_launch" / file), 1000U) << file;
  }
  EXPECT_TRUE(fs::is_empty(run_dir_)) << "nothing written into the run directory";

  struct stat before {};
  ASSERT_EQ(::stat((first.hook / "sitecustomize.py").c_str(), &before), 0);
  const PythonFiles second = python_files(run_dir_, true);
  EXPECT_EQ(second.hook, first.hook);
  struct stat after {};
  ASSERT_EQ(::stat((second.hook / "sitecustomize.py").c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino) << "the next launch rewrote the file";
  EXPECT_EQ(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);

  std::vector<fs::path> entries;
  for (const auto& e : fs::directory_iterator(root_ / "cache" / "dist-launch")) {
    entries.push_back(e.path());
  }
  EXPECT_EQ(entries, std::vector<fs::path>{first.hook.parent_path()}) << "no temporary left";
}

TEST_F(PythonFilesTest, WithoutTheHookOnlyThePackageIsOnTheirPath) {
  ScopedVariable cache("XDG_CACHE_HOME", (root_ / "cache").string());
  const PythonFiles files = python_files(run_dir_, false);
  EXPECT_TRUE(files.hook.empty());
  EXPECT_TRUE(fs::exists(files.package / "dist_launch" / "__init__.py"));
}

TEST_F(PythonFilesTest, ACopyMissingAFileOrCutShortIsReplacedWhole) {
  ScopedVariable cache("XDG_CACHE_HOME", (root_ / "cache").string());
  const PythonFiles first = python_files(run_dir_, true);
  fs::remove(first.package / "dist_launch" / "elastic.py");
  std::ofstream(first.hook / "_dist_launch_progress.py", std::ios::trunc) << "cut";
  const PythonFiles again = python_files(run_dir_, true);
  EXPECT_EQ(again.hook, first.hook);
  EXPECT_GT(fs::file_size(again.package / "dist_launch" / "elastic.py"), 1000U);
  EXPECT_GT(fs::file_size(again.hook / "_dist_launch_progress.py"), 1000U);
}

TEST_F(PythonFilesTest, ATemporaryAnHourOldIsSweptWhenTheNextCopyIsWritten) {
  ScopedVariable cache("XDG_CACHE_HOME", (root_ / "cache").string());
  const fs::path root = root_ / "cache" / "dist-launch";
  fs::create_directories(root / ".writing-killed" / "hook");
  fs::create_directories(root / ".writing-running");
  fs::last_write_time(root / ".writing-killed",
                      fs::file_time_type::clock::now() - std::chrono::hours(2));
  python_files(run_dir_, true);
  EXPECT_FALSE(fs::exists(root / ".writing-killed")) << "left by a launch killed while writing";
  EXPECT_TRUE(fs::exists(root / ".writing-running")) << "maybe another launch's, being written";
}

TEST_F(PythonFilesTest, LaunchesStartingTogetherEachSeeEveryFile) {
  ScopedVariable cache("XDG_CACHE_HOME", (root_ / "cache").string());
  std::vector<PythonFiles> seen(6);
  std::vector<std::thread> launches;
  for (auto& files : seen) {
    launches.emplace_back([&files, this] { files = python_files(run_dir_, true); });
  }
  for (auto& t : launches) t.join();
  for (const auto& files : seen) {
    EXPECT_EQ(files.hook, seen.front().hook);
    EXPECT_GT(fs::file_size(files.hook / "_dist_launch_progress.py"), 1000U);
    EXPECT_GT(fs::file_size(files.package / "dist_launch" / "elastic.py"), 1000U);
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(root_ / "cache" / "dist-launch"),
                          fs::directory_iterator{}),
            1)
      << "the losers' temporaries are removed";
}

TEST_F(PythonFilesTest, GoIntoTheRunDirectoryWithoutAHomeOrWithACacheThatCannotBeWritten) {
  {
    ScopedVariable xdg("XDG_CACHE_HOME", std::nullopt);
    ScopedVariable home("HOME", std::nullopt);
    const PythonFiles files = python_files(run_dir_, true);
    EXPECT_EQ(files.hook, run_dir_ / "python" / "hook");
    EXPECT_TRUE(fs::exists(files.hook / "sitecustomize.py"));
    EXPECT_TRUE(fs::exists(files.package / "dist_launch" / "snapshot.py"));
  }
  const fs::path not_a_directory = root_ / "a-file";  // unwritable even for root
  std::ofstream(not_a_directory) << "x";
  ScopedVariable xdg("XDG_CACHE_HOME", not_a_directory.string());
  const fs::path other_run = root_ / "run2";
  fs::create_directories(other_run);
  EXPECT_EQ(python_files(other_run, true).hook, other_run / "python" / "hook");
}

}  // namespace
}  // namespace dist::agent
