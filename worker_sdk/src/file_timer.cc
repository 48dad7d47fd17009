#include "dist/sdk/file_timer.h"

#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

namespace dist::sdk {
namespace {

// As torch's client: the server may not be up yet, so opening the pipe is retried.
constexpr int kOpenAttempts = 10;
constexpr std::chrono::milliseconds kOpenRetryDelay{100};

// Non-blocking, as torch's client: a pipe nobody reads fails at once (ENXIO) instead of blocking.
int open_pipe(const std::string& path) {
  int error = 0;
  for (int attempt = 0; attempt < kOpenAttempts; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(kOpenRetryDelay);
    const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) return fd;
    error = errno;
  }
  throw FileTimerError("cannot send a timer request to " + path + ": " + std::strerror(error) +
                       " (nobody serves it: is the agent running with "
                       "TORCHELASTIC_ENABLE_FILE_TIMER=1?)");
}

}  // namespace

std::string FileTimerClient::path_from_environment() {
  const char* path = std::getenv("TORCHELASTIC_TIMER_FILE");
  if (!path || !*path) {
    throw FileTimerError(
        "TORCHELASTIC_TIMER_FILE is not set: run the worker under dist-launch (or torchrun) with "
        "TORCHELASTIC_ENABLE_FILE_TIMER=1");
  }
  return path;
}

FileTimerClient::FileTimerClient(std::string file_path, int signal)
    : file_path_(std::move(file_path)), signal_(signal) {}

void FileTimerClient::acquire(const std::string& scope_id,
                              std::chrono::system_clock::time_point expiration) {
  send(scope_id, std::chrono::duration<double>(expiration.time_since_epoch()).count(), signal_);
}

void FileTimerClient::release(const std::string& scope_id) {
  send(scope_id, -1, 0);
}

void FileTimerClient::send(const std::string& scope_id, double expiration_time, int signal) const {
  nlohmann::json request = {
      {"version", 1}, {"pid", ::getpid()}, {"scope_id", scope_id}, {"signal", signal}};
  if (expiration_time < 0) {
    request["expiration_time"] = -1;
  } else {
    request["expiration_time"] = expiration_time;
  }
  const std::string line = request.dump() + "\n";
  if (line.size() > PIPE_BUF) {  // only writes up to PIPE_BUF reach the pipe whole
    throw FileTimerError("a timer request for scope '" + scope_id + "' takes " +
                         std::to_string(line.size()) + " bytes, more than PIPE_BUF (" +
                         std::to_string(PIPE_BUF) + "): use a shorter scope id");
  }
  const int fd = open_pipe(file_path_);
  const ssize_t n = ::write(fd, line.data(), line.size());
  const int error = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(line.size())) {
    throw FileTimerError("cannot send a timer request to " + file_path_ + ": " +
                         (n < 0 ? std::strerror(error) : "a partial write") +
                         (n < 0 && error == EAGAIN ? " (the agent is not reading it)" : ""));
  }
}

TimerScope::TimerScope(FileTimerClient& client, std::string scope_id,
                       std::chrono::system_clock::duration after)
    : client_(client), scope_id_(std::move(scope_id)) {
  client_.acquire(scope_id_, std::chrono::system_clock::now() + after);
}

TimerScope::~TimerScope() {
  try {
    client_.release(scope_id_);
  } catch (const FileTimerError& e) {
    std::fprintf(stderr, "dist::sdk::TimerScope: %s\n", e.what());
  }
}

}  // namespace dist::sdk
