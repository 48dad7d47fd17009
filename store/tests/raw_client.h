// A raw TCP peer for protocol tests: writes exactly the bytes a test composes (any dialect,
// partial requests, garbage) and reads replies with a deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dist::store::testing {

class RawClient {
 public:
  RawClient(const std::string& host, std::uint16_t port);
  ~RawClient();
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  void send(const std::string& bytes);
  void shutdown();  // both directions: unblocks a send() on another thread
  // Reads exactly n bytes; nullopt if the deadline passes or the connection closes first.
  std::optional<std::string> read(
      std::size_t n, std::chrono::milliseconds timeout = std::chrono::milliseconds(5000));
  // True once the server has closed the connection (reads return EOF or reset) within timeout.
  bool closed_by_server(std::chrono::milliseconds timeout = std::chrono::milliseconds(5000));

  std::uint8_t read_u8();
  std::int64_t read_i64();
  std::uint32_t read_u32();
  std::string read_bytes();

 private:
  int fd_ = -1;
};

// Encoding helpers that build requests byte by byte.
std::string u8(std::uint8_t v);
std::string u32(std::uint32_t v);
std::string u64(std::uint64_t v);
std::string i64(std::int64_t v);
std::string str(const std::string& s);  // uint64 length + bytes
std::string list(const std::vector<std::string>& keys);
std::string validate();  // the current dialect's first message

}  // namespace dist::store::testing
