// Warnings cannot be forged or flooded: bytes from the network are escaped, and a warning that
// repeats is logged once per interval and then summed up with a count.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <mutex>
#include <regex>
#include <sstream>
#include <thread>

#include "dist/store/client.h"
#include "dist/store/server.h"
#include "protocol.h"
#include "raw_client.h"
#include "text.h"

namespace dist::store {
namespace {

using namespace std::chrono_literals;
using namespace testing;
namespace leg = wire::legacy;

TEST(LogText, KeysAreQuotedWithEveryUnprintableByteEscaped) {
  struct Case {
    std::string key, quoted;
  };
  const Case cases[] = {
      {"rdzv/job/node/3", "'rdzv/job/node/3'"},
      {"a\nb", "'a\\x0ab'"},
      {"\x1b[31mred", "'\\x1b[31mred'"},
      {std::string("nul\0", 4), "'nul\\x00'"},
      {"it's \\", "'it\\x27s \\x5c'"},
      {"\xc3\xa9", "'\\xc3\\xa9'"},
      {std::string(200, 'k'), "'" + std::string(96, 'k') + "'... (200 bytes)"},
  };
  for (const Case& t : cases) EXPECT_EQ(quote_key(t.key), t.quoted);
  EXPECT_EQ(group_digits(5703), "5,703");
  EXPECT_EQ(group_digits(999), "999");
  EXPECT_EQ(group_digits(1234567), "1,234,567");
}

// Captures what the server logs, for one test.
class LogCapture {
 public:
  LogCapture() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(stream_);
    sink->set_pattern("[%l] %v");
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink));
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  std::vector<std::string> lines() {
    spdlog::default_logger()->flush();
    std::vector<std::string> out;
    std::istringstream in(stream_.str());
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  }

 private:
  std::ostringstream stream_;
  std::shared_ptr<spdlog::logger> previous_;
};

TEST(Logs, AKeyCannotForgeALogLine) {
  LogCapture capture;
  {
    StoreServerThread server;
    RawClient evil("127.0.0.1", server.port());
    // A legacy GET of a missing key closes the connection with a warning that names the key.
    evil.send(u8(leg::kGet) + str("/x\n[error] store: forged line\x1b[2J"));
    EXPECT_TRUE(evil.closed_by_server());
  }
  const auto lines = capture.lines();
  ASSERT_FALSE(lines.empty());
  for (const auto& line : lines) {
    EXPECT_NE(line.rfind("[error]", 0), 0u) << "a line of its own: " << line;
    EXPECT_EQ(line.find('\x1b'), std::string::npos) << line;
  }
  EXPECT_NE(lines.back().find("'/x\\x0a[error] store: forged line\\x1b[2J'"), std::string::npos)
      << lines.back();
}

std::uint64_t parse_grouped(const std::string& digits) {
  std::string plain;
  for (char c : digits)
    if (c != ',') plain += c;
  return std::stoull(plain);
}

TEST(Logs, RepeatedWarningsAreSummedUpOncePerInterval) {
  LogCapture capture;
  constexpr int kRefused = 300;
  ServerOptions options;
  options.limits.max_connections = 1;
  options.warning_interval = 200ms;
  std::uint64_t rejected = 0;
  {
    StoreServerThread server("127.0.0.1", 0, options);
    ClientOptions client;
    client.port = server.port();
    auto holder = StoreClient::connect(client);  // the one slot, working: never closed for others
    for (int i = 0; i < kRefused; ++i) {
      RawClient refused("127.0.0.1", server.port());
      EXPECT_TRUE(refused.closed_by_server());
    }
    rejected = server.stats().connections_rejected;
  }  // stopping writes the last summary
  EXPECT_EQ(rejected, static_cast<std::uint64_t>(kRefused));
  std::uint64_t logged = 0, summed = 0, summaries = 0;
  const std::regex summary(R"(refused connections: ([0-9,]+) more in the last 0\.2 s)");
  for (const auto& line : capture.lines()) {
    std::smatch m;
    if (std::regex_search(line, m, summary)) {
      ++summaries;
      summed += parse_grouped(m[1]);
    } else if (line.find("refusing 127.0.0.1") != std::string::npos) {
      ++logged;
    }
  }
  EXPECT_EQ(logged + summed, rejected) << "every refusal is counted exactly once";
  EXPECT_GE(summaries, 1u);
  EXPECT_LT(logged, static_cast<std::uint64_t>(kRefused) / 10) << "not one line per refusal";
}

}  // namespace
}  // namespace dist::store
