// The command line as a user meets it: the real dist-launch binary, and the parser behind it.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <sstream>
#include <string>

#include "dist/launcher/cli.h"

namespace {

struct RunResult {
  int exit_code;
  std::string output;  // stdout and stderr
};

RunResult run_binary(const std::string& args) {
  const std::string command = std::string(DIST_LAUNCH_BIN) + " " + args + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  std::string output;
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe)) output += buffer.data();
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

TEST(LauncherCli, HelpPrintsUsageAndExitsZero) {
  const RunResult r = run_binary("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("Usage: dist-launch"), std::string::npos) << r.output;
}

TEST(LauncherCli, VersionPrintsTheProjectVersion) {
  const RunResult r = run_binary("--version");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output, "dist-launch " + dist::launcher::version() + "\n");
}

TEST(LauncherCli, UnknownFlagIsAOneLineErrorWithExitTwo) {
  const RunResult r = run_binary("--no-such-flag");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_NE(r.output.find("dist-launch: error:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--no-such-flag"), std::string::npos) << r.output;
}

TEST(LauncherCli, ParserReportsErrorsToTheErrorStream) {
  std::ostringstream out, err;
  const auto outcome = dist::launcher::parse_command_line({"--bogus"}, out, err);
  EXPECT_TRUE(outcome.exit_now);
  EXPECT_EQ(outcome.exit_code, dist::launcher::kExitUsage);
  EXPECT_TRUE(out.str().empty());
  EXPECT_NE(err.str().find("--bogus"), std::string::npos);
}

}  // namespace
