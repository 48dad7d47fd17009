// --warm-restart, --preload, --snapshot-memory and --snapshot-dir as the command line and their
// PET_ variables give them (launcher/src/warm_options.cc through options.cc and
// config_from_options.cc).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dist/launcher/cli.h"

namespace {

using dist::launcher::parse_command_line;

// Sets (or, with nullptr, unsets) a variable for one test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// A Python job (PYTHON_EXEC: any executable does, nothing runs) on /dev/null, a file that exists
// everywhere.
dist::launcher::CliOutcome parse_python(std::vector<std::string> args,
                                        std::string* errors = nullptr) {
  ScopedEnv python("PYTHON_EXEC", "/bin/sh");
  std::ostringstream out, err;
  args.push_back("/dev/null");
  auto outcome = parse_command_line(args, out, err);
  if (errors) *errors = err.str();
  return outcome;
}

TEST(WarmFlags, OffByDefault) {
  ScopedEnv a("PET_WARM_RESTART", nullptr), b("PET_PRELOAD", nullptr);
  const auto o = parse_python({});
  ASSERT_FALSE(o.exit_now);
  EXPECT_TRUE(o.config.python_workers);
  EXPECT_FALSE(o.config.warm.warm_restart);
  EXPECT_FALSE(o.config.warm.preload);
  EXPECT_FALSE(o.config.warm.snapshots());
}

TEST(WarmFlags, EveryFlagReachesTheConfig) {
  const auto o = parse_python({"--warm-restart", "--preload", "torch,numpy.linalg",
                               "--snapshot-memory", "1G", "--snapshot-dir", "/tmp/snapshots"});
  ASSERT_FALSE(o.exit_now);
  EXPECT_TRUE(o.config.warm.warm_restart);
  ASSERT_TRUE(o.config.warm.preload);
  EXPECT_EQ(*o.config.warm.preload, (std::vector<std::string>{"torch", "numpy.linalg"}));
  EXPECT_EQ(o.config.warm.snapshot_memory_bytes, 1ull << 30);
  EXPECT_EQ(o.config.warm.snapshot_dir, "/tmp/snapshots");
  EXPECT_TRUE(o.config.warm.snapshots());
}

// An empty --preload is a choice (nothing preloaded), not the default list.
TEST(WarmFlags, AnEmptyPreloadPreloadsNothing) {
  const auto o = parse_python({"--warm-restart", "--preload", ""});
  ASSERT_FALSE(o.exit_now);
  ASSERT_TRUE(o.config.warm.preload);
  EXPECT_TRUE(o.config.warm.preload->empty());
}

TEST(WarmFlags, FromPetVariables) {
  ScopedEnv a("PET_WARM_RESTART", "1"), b("PET_PRELOAD", "numpy"), c("PET_SNAPSHOT_MEMORY", "512M");
  const auto o = parse_python({});
  ASSERT_FALSE(o.exit_now);
  EXPECT_TRUE(o.config.warm.warm_restart);
  ASSERT_TRUE(o.config.warm.preload);
  EXPECT_EQ(*o.config.warm.preload, std::vector<std::string>{"numpy"});
  EXPECT_EQ(o.config.warm.snapshot_memory_bytes, 512ull << 20);
}

TEST(WarmFlags, BadValuesAreOneLineUsageErrors) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--warm-restart", "--preload", "torch;import os"}, {"--snapshot-memory", "lots"}}) {
    std::string errors;
    const auto o = parse_python(args, &errors);
    EXPECT_TRUE(o.exit_now) << args.back();
    EXPECT_EQ(o.exit_code, dist::launcher::kExitUsage) << args.back();
    EXPECT_EQ(errors.rfind("dist-launch: error: --", 0), 0u) << errors;
    EXPECT_EQ(std::count(errors.begin(), errors.end(), '\n'), 1) << errors;
  }
}

TEST(WarmFlags, CppWorkersStartAsUsualWithANotice) {
  std::ostringstream out, err;
  const auto o = parse_command_line({"--warm-restart", "--no-python", "/bin/true"}, out, err);
  ASSERT_FALSE(o.exit_now);
  EXPECT_FALSE(o.config.python_workers);
  EXPECT_NE(err.str().find("--warm-restart forks Python workers only"), std::string::npos)
      << err.str();
}

// K, M, G, T are powers of 1024, as the kernel's tmpfs size= takes them.
TEST(WarmFlags, SizesReadAsTheKernelsTmpfsTakesThem) {
  const std::vector<std::pair<std::string, std::uint64_t>> sizes{{"512M", 512ull << 20},
                                                                 {"8G", 8ull << 30},
                                                                 {"1.5GiB", 3ull << 29},
                                                                 {"100MB", 100ull << 20},
                                                                 {"4096", 4096u}};
  for (const auto& [text, bytes] : sizes) {
    const auto o = parse_python({"--snapshot-memory", text});
    ASSERT_FALSE(o.exit_now) << text;
    EXPECT_EQ(o.config.warm.snapshot_memory_bytes, bytes) << text;
  }
  for (const char* bad : {"G", "-1G", "1X", "0", "nan", "1e30T"}) {
    std::string errors;
    const auto o = parse_python({"--snapshot-memory", bad}, &errors);
    EXPECT_EQ(o.exit_code, dist::launcher::kExitUsage) << bad;
    EXPECT_NE(errors.find("--snapshot-memory must be a size"), std::string::npos) << errors;
  }
}

}  // namespace
