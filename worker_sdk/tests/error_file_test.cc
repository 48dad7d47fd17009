#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dist/sdk/error_file.h"

namespace dist::sdk {
namespace {

TEST(ErrorFile, WritesTorchsRecordFormatWithAPreciseTimestamp) {
  const std::string path = "/tmp/dist-sdk-error-" + std::to_string(::getpid()) + ".json";
  ::setenv("TORCHELASTIC_ERROR_FILE", path.c_str(), 1);
  const double before =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  ASSERT_TRUE(write_error_file("RuntimeError: diverged at step 7", "train.cc:42"));
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in);
  std::remove(path.c_str());
  EXPECT_EQ(j["message"]["message"], "RuntimeError: diverged at step 7");
  EXPECT_EQ(j["message"]["extraInfo"]["py_callstack"], "train.cc:42");
  const double stamp = std::stod(j["message"]["extraInfo"]["timestamp"].get<std::string>());
  EXPECT_GE(stamp, before - 0.001);
  EXPECT_LT(stamp, before + 5);
}

TEST(ErrorFile, WithoutTheVariableNothingIsWritten) {
  ::unsetenv("TORCHELASTIC_ERROR_FILE");
  EXPECT_FALSE(write_error_file("x"));
}

}  // namespace
}  // namespace dist::sdk
