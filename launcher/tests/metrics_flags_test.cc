// --metrics-addr and --metrics-token-file as the command line and the environment give them.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "dist/launcher/cli.h"

namespace metrics_flags_test {

namespace fs = std::filesystem;

dist::launcher::CliOutcome parse(std::vector<std::string> args, std::string* errors = nullptr) {
  std::ostringstream out, err;
  args.insert(args.end(), {"--no-python", "/bin/true"});
  auto outcome = dist::launcher::parse_command_line(args, out, err);
  if (errors) *errors = err.str();
  return outcome;
}

// A token file of this test, mode `mode`, holding `text`; removed with it.
class TokenFile {
 public:
  TokenFile(const std::string& text, mode_t mode)
      : path_(fs::temp_directory_path() / ("dist-metrics-token-" + std::to_string(::getpid()) +
                                           "-" + std::to_string(counter_++))) {
    std::ofstream(path_) << text;
    ::chmod(path_.c_str(), mode);
  }
  ~TokenFile() { fs::remove(path_); }
  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

TEST(MetricsFlags, NoneByDefault) {
  ::unsetenv("DIST_LAUNCH_METRICS_TOKEN_FILE");
  const auto o = parse({"--metrics-port", "0"});
  ASSERT_FALSE(o.exit_now);
  EXPECT_TRUE(o.config.telemetry.metrics_addr.empty()) << "the agent chooses by the job's nodes";
  EXPECT_TRUE(o.config.telemetry.metrics_token.empty());
}

TEST(MetricsFlags, TheAddressAndTheTokenFromTheirFlags) {
  const TokenFile token("0123456789abcdef\n", 0600);
  const auto o = parse({"--metrics-port", "9100", "--metrics-addr", "0.0.0.0",
                        "--metrics-token-file", token.path()});
  ASSERT_FALSE(o.exit_now);
  EXPECT_EQ(o.config.telemetry.metrics_addr, "0.0.0.0");
  EXPECT_EQ(o.config.telemetry.metrics_token, "0123456789abcdef");
}

TEST(MetricsFlags, TheTokenFileFromTheEnvironmentWhenMetricsAreServed) {
  const TokenFile token("from-the-environment\n", 0640);  // Prometheus' group may read it
  ::setenv("DIST_LAUNCH_METRICS_TOKEN_FILE", token.path().c_str(), 1);
  const auto served = parse({"--metrics-port", "0"});
  const auto not_served = parse({});
  ::unsetenv("DIST_LAUNCH_METRICS_TOKEN_FILE");
  ASSERT_FALSE(served.exit_now);
  EXPECT_EQ(served.config.telemetry.metrics_token, "from-the-environment");
  ASSERT_FALSE(not_served.exit_now) << "the variable alone asks for nothing";
  EXPECT_TRUE(not_served.config.telemetry.metrics_token.empty());
}

TEST(MetricsFlags, BadValuesAreOneLineErrors) {
  ::unsetenv("DIST_LAUNCH_METRICS_TOKEN_FILE");
  const TokenFile open_to_all("0123456789abcdef\n", 0644);
  const TokenFile spaced("two words\n", 0600);
  const TokenFile empty("\n", 0600);
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"--metrics-addr", "127.0.0.1"}, "--metrics-addr applies to the port --metrics-port opens"},
      {{"--metrics-token-file", spaced.path()},
       "--metrics-token-file applies to the port --metrics-port opens"},
      {{"--metrics-port", "0", "--metrics-addr", ""}, "--metrics-addr needs an address"},
      {{"--metrics-port", "0", "--metrics-token-file", "/nonexistent/token"},
       "--metrics-token-file: secret file '/nonexistent/token' cannot be read"},
      {{"--metrics-port", "0", "--metrics-token-file", open_to_all.path()},
       "is open to other users"},
      {{"--metrics-port", "0", "--metrics-token-file", spaced.path()},
       "printable ASCII without spaces"},
      {{"--metrics-port", "0", "--metrics-token-file", empty.path()}, "is empty"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.says);
    std::string errors;
    const auto o = parse(c.args, &errors);
    EXPECT_TRUE(o.exit_now);
    EXPECT_EQ(o.exit_code, dist::launcher::kExitUsage);
    EXPECT_NE(errors.find(c.says), std::string::npos) << errors;
    EXPECT_EQ(std::count(errors.begin(), errors.end(), '\n'), 1) << errors;
  }
}

}  // namespace metrics_flags_test
