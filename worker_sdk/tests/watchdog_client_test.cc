// The SDK's side of torch's file timer, against what the agent does: timer requests read from a
// real named pipe. (Heartbeats: progress_test.cc.)
#include <fcntl.h>
#include <gtest/gtest.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "dist/sdk/file_timer.h"

namespace dist::sdk {
namespace {

class FileTimer : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = "/tmp/dist-sdk-timer-" + std::to_string(::getpid());
    ::unlink(path_.c_str());
    ASSERT_EQ(::mkfifo(path_.c_str(), 0600), 0);
    reader_ = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK);
    ASSERT_GE(reader_, 0);
  }
  void TearDown() override {
    if (reader_ >= 0) ::close(reader_);
    ::unlink(path_.c_str());
  }
  nlohmann::json read_request() {
    char buffer[PIPE_BUF + 1];
    const ssize_t n = ::read(reader_, buffer, sizeof buffer);
    EXPECT_GT(n, 0);
    std::string line(buffer, static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
    EXPECT_TRUE(line.ends_with("\n")) << line;
    return nlohmann::json::parse(line);
  }

  std::string path_;
  int reader_ = -1;
};

TEST_F(FileTimer, RequestsAreTorchsJsonLines) {
  FileTimerClient client(path_, SIGTERM);
  const auto expiration = std::chrono::system_clock::now() + std::chrono::seconds(30);
  client.acquire("train step", expiration);
  const auto acquire = read_request();
  EXPECT_EQ(acquire["version"], 1);
  EXPECT_EQ(acquire["pid"], ::getpid());
  EXPECT_EQ(acquire["scope_id"], "train step");
  EXPECT_EQ(acquire["signal"], SIGTERM);
  EXPECT_NEAR(acquire["expiration_time"].get<double>(),
              std::chrono::duration<double>(expiration.time_since_epoch()).count(), 1e-3);
  client.release("train step");
  const auto release = read_request();
  EXPECT_EQ(release["expiration_time"], -1);
  EXPECT_EQ(release["signal"], 0);
  {
    TimerScope scope(client, "block", std::chrono::seconds(5));
    EXPECT_GT(read_request()["expiration_time"].get<double>(), 0);
  }
  EXPECT_EQ(read_request()["expiration_time"], -1) << "the scope's end releases it";
}

TEST_F(FileTimer, NobodyReadingThePipeIsAnErrorThatSaysWhatToDo) {
  ::close(reader_);
  reader_ = -1;
  try {
    FileTimerClient(path_).acquire("x", std::chrono::system_clock::now());
    FAIL() << "sent to a pipe nobody reads";
  } catch (const FileTimerError& e) {
    EXPECT_NE(std::string(e.what()).find("TORCHELASTIC_ENABLE_FILE_TIMER=1"), std::string::npos)
        << e.what();
  }
}

TEST_F(FileTimer, AScopeTooLongForOneAtomicWriteIsRefused) {
  EXPECT_THROW(
      FileTimerClient(path_).acquire(std::string(PIPE_BUF, 's'), std::chrono::system_clock::now()),
      FileTimerError);
}

TEST(FileTimerEnvironment, WithoutTheVariableTheClientSaysHowToGetIt) {
  ::unsetenv("TORCHELASTIC_TIMER_FILE");
  try {
    FileTimerClient client;
    FAIL() << "made a client without a pipe";
  } catch (const FileTimerError& e) {
    EXPECT_NE(std::string(e.what()).find("TORCHELASTIC_TIMER_FILE is not set"), std::string::npos);
  }
}

}  // namespace
}  // namespace dist::sdk
