// dist-rendezvous under the memory attacks of issue 12 stays within --max-total-bytes plus a fixed
// overhead, measured as the real process's peak resident memory (VmHWM, /proc/<pid>/status),
// while a legitimate client keeps being served.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include "daemon_process.h"
#include "dist/store/client.h"
#include "protocol.h"
#include "raw_client.h"

namespace dist::store {
namespace {

using namespace std::chrono_literals;
using namespace testing;
namespace cur = wire::current;

constexpr std::uint64_t kMiB = 1024 * 1024;
constexpr std::uint64_t kCapBytes = 64 * kMiB;
constexpr std::uint64_t kFixedOverheadBytes = 20 * kMiB;  // the program, its libraries, slack

// A connection that sends its bytes on its own thread and reads nothing.
struct Attacker {
  Attacker(std::uint16_t port, const std::string& bytes)
      : client(std::make_unique<RawClient>("127.0.0.1", port)) {
    thread = std::thread([c = client.get(), &bytes] {
      try {
        c->send(bytes);                  // blocks while the server holds back reading
      } catch (const std::exception&) {  // closed by the server: what the limits do
      }
    });
  }
  std::unique_ptr<RawClient> client;  // stays connected after sending
  std::thread thread;
};

TEST(Memory, PeakResidentMemoryStaysWithinTheLimitUnderAttack) {
  DaemonProcess daemon({"--max-total-bytes", std::to_string(kCapBytes), "--log-level", "error"});
  ASSERT_GT(daemon.port(), 0) << daemon.output();
  ClientOptions options;
  options.port = daemon.port();
  options.timeout = 20s;
  auto legit = StoreClient::connect(options);
  legit.set("big", std::string(4 * kMiB, 'b'));

  // A WAIT on 131,072 missing 200-byte keys (27 MiB), four times.
  std::vector<std::string> missing;
  for (int i = 0; i < 131'072; ++i) missing.push_back(std::to_string(i) + std::string(194, 'm'));
  const std::string big_wait = validate() + u8(cur::kWait) + list(missing);
  // Pipelined GETs of 4 MiB, never read: 256 MiB of replies asked for, eight times.
  std::string greedy = validate();
  for (int i = 0; i < 64; ++i) greedy += u8(cur::kGet) + str("big");
  // Half a SET that promises an 8 MiB value and sends 1 MiB of it, fifty times.
  const std::string slow =
      validate() + u8(cur::kSet) + str("/slow") + u64(8 * kMiB) + std::string(1 * kMiB, 's');

  std::vector<Attacker> attackers;
  attackers.reserve(62);
  for (int i = 0; i < 4; ++i) attackers.emplace_back(daemon.port(), big_wait);
  for (int i = 0; i < 8; ++i) attackers.emplace_back(daemon.port(), greedy);
  for (int i = 0; i < 50; ++i) attackers.emplace_back(daemon.port(), slow);

  // The legitimate client is served throughout; the attack is over when every attacker has
  // sent everything or been closed.
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    for (auto& a : attackers) a.thread.join();
    done = true;
  });
  int round_trips = 0;
  const auto give_up = std::chrono::steady_clock::now() + 60s;
  try {
    while (!done && std::chrono::steady_clock::now() < give_up) {
      EXPECT_EQ(legit.add("n", 1), ++round_trips);
    }
  } catch (const StoreError& e) {
    ADD_FAILURE() << "the legitimate client was not served: " << e.what();
  }
  const std::uint64_t peak = resident_bytes(daemon.pid(), "VmHWM");
  for (auto& a : attackers) a.client->shutdown();  // unblocks any sender still waiting
  waiter.join();
  EXPECT_EQ(legit.get("big").size(), 4 * kMiB);

  std::printf("dist-rendezvous peak RSS %.1f MiB with --max-total-bytes %llu MiB\n",
              static_cast<double>(peak) / kMiB, static_cast<unsigned long long>(kCapBytes / kMiB));
  EXPECT_GT(peak, 0u);
  EXPECT_LE(peak, kCapBytes + kFixedOverheadBytes);
  EXPECT_EQ(daemon.stop(), 0);
}

}  // namespace
}  // namespace dist::store
