// The watchdog and telemetry settings as the command line and torch's variables give them.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <optional>
#include <sstream>
#include <string>
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

dist::launcher::CliOutcome parse(std::vector<std::string> args, std::string* errors = nullptr) {
  std::ostringstream out, err;
  args.insert(args.end(), {"--no-python", "/bin/true"});
  auto outcome = parse_command_line(args, out, err);
  if (errors) *errors = err.str();
  return outcome;
}

TEST(WatchdogFlags, OffByDefault) {
  ScopedEnv a("TORCHELASTIC_ENABLE_FILE_TIMER", nullptr), b("TORCHELASTIC_TIMER_FILE", nullptr),
      c("TORCHELASTIC_HEALTH_CHECK_PORT", nullptr);
  const auto o = parse({});
  ASSERT_FALSE(o.exit_now);
  EXPECT_FALSE(o.config.watchdogs.file_timer);
  EXPECT_EQ(o.config.watchdogs.worker_heartbeat_timeout.count(), 0);
  EXPECT_FALSE(o.config.watchdogs.health_check_port);
  EXPECT_TRUE(o.config.telemetry.event_log.empty());
  EXPECT_FALSE(o.config.telemetry.metrics_port);
}

TEST(WatchdogFlags, FlagsAndTorchsVariables) {
  ScopedEnv a("TORCHELASTIC_ENABLE_FILE_TIMER", "1"), b("TORCHELASTIC_TIMER_FILE", "/tmp/t"),
      c("TORCHELASTIC_HEALTH_CHECK_PORT", "8081");
  const auto o = parse(
      {"--worker-heartbeat-timeout", "2.5", "--event-log", "/tmp/e.jsonl", "--metrics-port", "0"});
  ASSERT_FALSE(o.exit_now);
  EXPECT_TRUE(o.config.watchdogs.file_timer);
  EXPECT_EQ(o.config.watchdogs.timer_file, "/tmp/t");
  EXPECT_EQ(o.config.watchdogs.worker_heartbeat_timeout.count(), 2500);
  EXPECT_EQ(o.config.watchdogs.health_check_port, 8081);
  EXPECT_EQ(o.config.telemetry.event_log, "/tmp/e.jsonl");
  EXPECT_EQ(o.config.telemetry.metrics_port, 0);
}

TEST(WatchdogFlags, HangsAreFoundByDefaultWithTheAutomaticTimeout) {
  const auto defaults = parse({});
  ASSERT_FALSE(defaults.exit_now);
  EXPECT_FALSE(defaults.config.watchdogs.hang_timeout) << "auto";
  EXPECT_TRUE(defaults.config.watchdogs.step_hook);

  const auto fixed = parse({"--hang-timeout", "12.5", "--no-step-hook"});
  ASSERT_FALSE(fixed.exit_now);
  ASSERT_TRUE(fixed.config.watchdogs.hang_timeout);
  EXPECT_EQ(fixed.config.watchdogs.hang_timeout->count(), 12500);
  EXPECT_FALSE(fixed.config.watchdogs.step_hook);

  const auto off = parse({"--hang-timeout", "0"});
  ASSERT_TRUE(off.config.watchdogs.hang_timeout);
  EXPECT_EQ(off.config.watchdogs.hang_timeout->count(), 0) << "0 is off";
  EXPECT_FALSE(parse({"--hang-timeout", "auto"}).config.watchdogs.hang_timeout);
}

TEST(WatchdogFlags, TheFileTimerIsOnForOneOnlyAsWithTorch) {
  for (const char* value : {"0", "true", "yes", ""}) {
    SCOPED_TRACE(value);
    ScopedEnv a("TORCHELASTIC_ENABLE_FILE_TIMER", value);
    const auto o = parse({});
    ASSERT_FALSE(o.exit_now);
    EXPECT_FALSE(o.config.watchdogs.file_timer);
  }
}

TEST(WatchdogFlags, BadValuesAreOneLineErrors) {
  struct Case {
    std::vector<std::string> args;
    const char* port;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{}, "http", "TORCHELASTIC_HEALTH_CHECK_PORT must be a port number"},
      {{}, "70000", "TORCHELASTIC_HEALTH_CHECK_PORT must be a port number"},
      {{"--metrics-port", "65536"}, nullptr, "--metrics-port"},
      {{"--worker-heartbeat-timeout", "-1"}, nullptr, "--worker-heartbeat-timeout"},
      {{"--hang-timeout", "soon"},
       nullptr,
       "--hang-timeout must be auto or a non-negative number of seconds, got 'soon'"},
      {{"--hang-timeout", "-3"}, nullptr, "--hang-timeout"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.says);
    ScopedEnv port("TORCHELASTIC_HEALTH_CHECK_PORT", c.port);
    std::string errors;
    const auto o = parse(c.args, &errors);
    EXPECT_TRUE(o.exit_now);
    EXPECT_EQ(o.exit_code, dist::launcher::kExitUsage);
    EXPECT_NE(errors.find(c.says), std::string::npos) << errors;
    EXPECT_EQ(std::count(errors.begin(), errors.end(), '\n'), 1) << errors;
  }
}

}  // namespace
