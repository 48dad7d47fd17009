// The SDK's side of the agent's watchdogs, against what the agent does: a heartbeat slot made as
// the agent makes it (a memfd, the magic, its number in DIST_HEARTBEAT_FD) beaten by a real child
// process, and timer requests read from a real named pipe.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "dist/sdk/file_timer.h"
#include "dist/sdk/heartbeat.h"

namespace dist::sdk {
namespace {

namespace slot = heartbeat_slot;

// Runs `body` in a child process (heartbeat() maps its slot once per process); its exit code.
template <typename Body>
int in_child(Body body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(Heartbeat, BeatsLandInTheSlotTheAgentPassed) {
  const int fd = ::memfd_create("test-heartbeat", 0);
  ASSERT_EQ(::ftruncate(fd, slot::kBytes), 0);
  auto* s = static_cast<slot::Slot*>(
      ::mmap(nullptr, slot::kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(s, MAP_FAILED);
  s->magic = slot::kMagic;
  timespec before{};
  ::clock_gettime(CLOCK_MONOTONIC, &before);
  const int code = in_child([fd] {
    ::setenv(slot::kFdVariable, std::to_string(fd).c_str(), 1);
    if (!heartbeat_enabled()) return 1;
    for (int i = 0; i < 3; ++i) heartbeat();
    // The descriptor is not passed on to programs the worker runs.
    return (::fcntl(fd, F_GETFD) & FD_CLOEXEC) ? 0 : 2;
  });
  EXPECT_EQ(code, 0);
  const auto before_ns = static_cast<std::uint64_t>(before.tv_sec) * 1'000'000'000ULL +
                         static_cast<std::uint64_t>(before.tv_nsec);
  EXPECT_GE(s->last_beat_ns.load(), before_ns);
  EXPECT_EQ(s->beats.load(), 3u);
  ::munmap(s, slot::kBytes);
  ::close(fd);
}

TEST(Heartbeat, ADescriptorThatIsNotASlotTurnsHeartbeatsOff) {
  const int code = in_child([] {
    const int fd = ::open("/dev/null", O_RDONLY);  // what a reused descriptor number may be
    ::setenv(slot::kFdVariable, std::to_string(fd).c_str(), 1);
    heartbeat();  // must not crash
    return heartbeat_enabled() ? 1 : 0;
  });
  EXPECT_EQ(code, 0);
  EXPECT_EQ(in_child([] {
              ::unsetenv(slot::kFdVariable);
              heartbeat();
              return heartbeat_enabled() ? 1 : 0;
            }),
            0);
}

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
