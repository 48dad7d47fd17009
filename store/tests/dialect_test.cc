// Both TCPStore dialects, byte for byte as PyTorch's clients send them, against a real server.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <thread>

#include "dist/store/server.h"
#include "protocol.h"
#include "raw_client.h"

namespace dist::store {
namespace {

using namespace std::chrono_literals;
using namespace testing;
namespace cur = wire::current;
namespace leg = wire::legacy;

class DialectTest : public ::testing::Test {
 protected:
  std::unique_ptr<RawClient> current() {
    auto c = std::make_unique<RawClient>("127.0.0.1", server_.port());
    c->send(validate());
    return c;
  }
  std::unique_ptr<RawClient> legacy() {
    return std::make_unique<RawClient>("127.0.0.1", server_.port());
  }
  StoreServerThread server_;
};

TEST_F(DialectTest, CurrentDialectEveryOperation) {
  auto c = current();
  c->send(u8(cur::kSet) + str("/a") + str("1"));  // no reply
  c->send(u8(cur::kGet) + str("/a"));
  EXPECT_EQ(c->read_bytes(), "1");
  c->send(u8(cur::kGet) + str("/missing"));
  EXPECT_EQ(c->read_bytes(), "") << "current dialect: GET of a missing key replies empty";
  c->send(u8(cur::kAdd) + str("/n") + i64(3));
  EXPECT_EQ(c->read_i64(), 3);
  c->send(u8(cur::kCompareSet) + str("/a") + str("1") + str("2"));
  EXPECT_EQ(c->read_bytes(), "2");
  c->send(u8(cur::kCheck) + list({"/a", "/n"}));
  EXPECT_EQ(c->read_u8(), wire::kCheckReady);
  c->send(u8(cur::kCheck) + list({"/a", "/zz"}));
  EXPECT_EQ(c->read_u8(), wire::kCheckNotReady);
  c->send(u8(cur::kWait) + list({"/a"}));
  EXPECT_EQ(c->read_u8(), wire::kStopWaiting);
  c->send(u8(cur::kGetNumKeys));
  EXPECT_EQ(c->read_i64(), 2);
  c->send(u8(cur::kAppend) + str("/a") + str("b"));
  c->send(u8(cur::kMultiSet) + u64(2) + str("/x") + str("X") + str("/y") + str("Y"));
  c->send(u8(cur::kMultiGet) + list({"/a", "/y", "/x"}));
  EXPECT_EQ(c->read_bytes(), "2b");
  EXPECT_EQ(c->read_bytes(), "Y");
  EXPECT_EQ(c->read_bytes(), "X");
  c->send(u8(cur::kDeleteKey) + str("/x"));
  EXPECT_EQ(c->read_i64(), 1);
  c->send(u8(cur::kDeleteKey) + str("/x"));
  EXPECT_EQ(c->read_i64(), 0);
  c->send(u8(cur::kPing) + u32(4242));
  EXPECT_EQ(c->read_u32(), 4242u);
  c->send(u8(cur::kListKeys));
  EXPECT_EQ(c->read_i64(), 3);
  EXPECT_EQ(c->read_bytes(), "/a");
  EXPECT_EQ(c->read_bytes(), "/n");
  EXPECT_EQ(c->read_bytes(), "/y");
  c->send(u8(cur::kQueuePush) + str("/q") + str("item"));
  c->send(u8(cur::kQueueLen) + str("/q"));
  EXPECT_EQ(c->read_i64(), 1);
  c->send(u8(cur::kQueuePop) + str("/q"));
  EXPECT_EQ(c->read_i64(), 1);
  EXPECT_EQ(c->read_bytes(), "item");
  c->send(u8(cur::kQueuePop) + str("/q"));
  EXPECT_EQ(c->read_i64(), 0) << "empty queue: length 0 and no value";
  c->send(u8(cur::kBarrier) + str("/bar") + i64(1));
  EXPECT_EQ(c->read_u8(), wire::kStopWaiting);
}

TEST_F(DialectTest, CurrentWaitIsReleasedByAnotherClientAndCancelWaitClearsIt) {
  auto waiter = current();
  auto writer = current();
  waiter->send(u8(cur::kWait) + list({"/k1", "/k2"}));
  EXPECT_EQ(waiter->read(1, 100ms), std::nullopt) << "nothing before the keys exist";
  writer->send(u8(cur::kSet) + str("/k1") + str("v"));
  EXPECT_EQ(waiter->read(1, 100ms), std::nullopt) << "one of two keys is not enough";
  writer->send(u8(cur::kAdd) + str("/k2") + i64(1));
  EXPECT_EQ(writer->read_i64(), 1);
  EXPECT_EQ(waiter->read_u8(), wire::kStopWaiting);

  // CANCEL_WAIT: the pending wait is dropped, and a later SET sends nothing.
  waiter->send(u8(cur::kWait) + list({"/never"}));
  waiter->send(u8(cur::kCancelWait));
  EXPECT_EQ(waiter->read_u8(), wire::kWaitCanceled);
  writer->send(u8(cur::kSet) + str("/never") + str("now"));
  writer->send(u8(cur::kPing) + u32(1));
  EXPECT_EQ(writer->read_u32(), 1u);
  EXPECT_EQ(waiter->read(1, 100ms), std::nullopt);
}

// Regression: when one of two pipelined waits on the same key finished, the other lost its entry
// in the key's waiter index and was never answered.
TEST_F(DialectTest, PipelinedWaitsOnOneKeyAreEachAnswered) {
  auto waiter = current();
  auto writer = current();
  waiter->send(u8(cur::kWait) + list({"/k"}) + u8(cur::kWait) + list({"/k", "/other"}));
  EXPECT_EQ(waiter->read(1, 100ms), std::nullopt);
  writer->send(u8(cur::kSet) + str("/k") + str("v"));
  EXPECT_EQ(waiter->read_u8(), wire::kStopWaiting) << "the first wait";
  EXPECT_EQ(waiter->read(1, 100ms), std::nullopt) << "the second still needs /other";
  writer->send(u8(cur::kSet) + str("/other") + str("v"));
  EXPECT_EQ(waiter->read_u8(), wire::kStopWaiting) << "the second wait, still registered";

  // The same with the second wait finishing first.
  waiter->send(u8(cur::kWait) + list({"/a", "/b"}) + u8(cur::kWait) + list({"/a"}));
  writer->send(u8(cur::kSet) + str("/a") + str("v"));
  EXPECT_EQ(waiter->read_u8(), wire::kStopWaiting);
  writer->send(u8(cur::kSet) + str("/b") + str("v"));
  EXPECT_EQ(waiter->read_u8(), wire::kStopWaiting);
}

// ADD on a stored value that is not plain decimal: PyTorch's servers parse it with std::stoll
// (white space, a sign, trailing bytes) and wrap on overflow; a value with no number in it closes
// the connection. Checked against torch 1.13's own server in tests/torch/store_diff_test.py.
TEST_F(DialectTest, AddParsesStoredValuesLikePyTorch) {
  struct Case {
    const char* name;
    std::string stored;
    std::int64_t delta;
    std::optional<std::int64_t> reply;  // nullopt: the connection is closed
  };
  const Case cases[] = {
      {"leading space", " 12", 1, 13},
      {"leading tab and newline", "\t\n12", 1, 13},
      {"trailing letters", "12abc", 1, 13},
      {"trailing NUL", std::string("12\0zz", 5), 1, 13},
      {"plus sign", "+5", 1, 6},
      {"hex is decimal 0 then junk", "0x10", 1, 1},
      {"wraps at the top", "9223372036854775807", 1, INT64_MIN},
      {"wraps at the bottom", "-9223372036854775808", -1, INT64_MAX},
      {"empty", "", 1, std::nullopt},
      {"letters", "abc", 1, std::nullopt},
      {"sign then space", "- 5", 1, std::nullopt},
      {"out of range", "99999999999999999999", 1, std::nullopt},
  };
  for (const Case& t : cases) {
    SCOPED_TRACE(t.name);
    for (bool legacy_client : {true, false}) {
      auto c = legacy_client ? legacy() : current();
      const std::uint8_t set = legacy_client ? leg::kSet : cur::kSet;
      const std::uint8_t add = legacy_client ? leg::kAdd : cur::kAdd;
      c->send(u8(set) + str("/odd") + str(t.stored) + u8(add) + str("/odd") + i64(t.delta));
      if (t.reply) {
        EXPECT_EQ(c->read_i64(), *t.reply);
      } else {
        EXPECT_TRUE(c->closed_by_server());
      }
    }
  }
}

TEST_F(DialectTest, LegacyDialectEveryOperation) {
  auto c = legacy();
  c->send(u8(leg::kSet) + str("/a") + str("1"));
  c->send(u8(leg::kGet) + str("/a"));
  EXPECT_EQ(c->read_bytes(), "1");
  c->send(u8(leg::kAdd) + str("/n") + i64(7));
  EXPECT_EQ(c->read_i64(), 7);
  c->send(u8(leg::kAdd) + str("/n") + i64(-2));
  EXPECT_EQ(c->read_i64(), 5);
  c->send(u8(leg::kCompareSet) + str("/missing") + str("") + str("d"));
  EXPECT_EQ(c->read_bytes(), "d");
  c->send(u8(leg::kCheck) + list({"/a", "/n", "/missing"}));
  EXPECT_EQ(c->read_u8(), wire::kCheckReady);
  c->send(u8(leg::kWait) + list({"/a"}));
  EXPECT_EQ(c->read_u8(), wire::kStopWaiting);
  c->send(u8(leg::kGetNumKeys));
  EXPECT_EQ(c->read_i64(), 3);
  c->send(u8(leg::kDeleteKey) + str("/a"));
  EXPECT_EQ(c->read_i64(), 1);
  c->send(u8(leg::kGetNumKeys));
  EXPECT_EQ(c->read_i64(), 2);
}

TEST_F(DialectTest, LegacyWatchKeyReportsUpdates) {
  auto watcher = legacy();
  auto writer = legacy();
  watcher->send(u8(leg::kWatchKey) + str("/w"));
  EXPECT_EQ(watcher->read_u8(), wire::kWatchCallbackRegistered);
  writer->send(u8(leg::kSet) + str("/w") + str("one"));
  EXPECT_EQ(watcher->read_u8(), wire::kWatchKeyCreated);
  EXPECT_EQ(watcher->read_bytes(), "/w");
  EXPECT_EQ(watcher->read_bytes(), "");
  EXPECT_EQ(watcher->read_bytes(), "one");
  writer->send(u8(leg::kSet) + str("/w") + str("two"));
  EXPECT_EQ(watcher->read_u8(), wire::kWatchKeyUpdated);
  EXPECT_EQ(watcher->read_bytes(), "/w");
  EXPECT_EQ(watcher->read_bytes(), "one");
  EXPECT_EQ(watcher->read_bytes(), "two");
  writer->send(u8(leg::kDeleteKey) + str("/w"));
  EXPECT_EQ(writer->read_i64(), 1);
  EXPECT_EQ(watcher->read_u8(), wire::kWatchKeyDeleted);
  EXPECT_EQ(watcher->read_bytes(), "/w");
  EXPECT_EQ(watcher->read_bytes(), "two");
  EXPECT_EQ(watcher->read_bytes(), "");
}

TEST_F(DialectTest, LegacyGetOfAMissingKeyClosesLikeTorch1) {
  auto c = legacy();
  c->send(u8(leg::kGet) + str("/missing"));
  EXPECT_TRUE(c->closed_by_server());
  auto other = legacy();  // the server itself is fine
  other->send(u8(leg::kAdd) + str("/n") + i64(1));
  EXPECT_EQ(other->read_i64(), 1);
}

TEST_F(DialectTest, BothDialectsShareOneStore) {
  auto old_client = legacy();
  auto new_client = current();
  old_client->send(u8(leg::kSet) + str("/shared") + str("from 1.13"));
  new_client->send(u8(cur::kWait) + list({"/shared"}));
  EXPECT_EQ(new_client->read_u8(), wire::kStopWaiting);
  new_client->send(u8(cur::kGet) + str("/shared"));
  EXPECT_EQ(new_client->read_bytes(), "from 1.13");
  new_client->send(u8(cur::kAdd) + str("/cnt") + i64(2));
  EXPECT_EQ(new_client->read_i64(), 2);
  old_client->send(u8(leg::kAdd) + str("/cnt") + i64(3));
  EXPECT_EQ(old_client->read_i64(), 5);
}

TEST_F(DialectTest, RequestsSplitIntoSingleBytesArePiecedTogether) {
  auto c = current();
  const std::string request = u8(cur::kSet) + str("/split") + str(std::string(300, 'v')) +
                              u8(cur::kMultiGet) + list({"/split", "/split"});
  for (char byte : request) c->send(std::string(1, byte));
  EXPECT_EQ(c->read_bytes(), std::string(300, 'v'));
  EXPECT_EQ(c->read_bytes(), std::string(300, 'v'));
}

TEST_F(DialectTest, PipelinedRequestsAreAnsweredInOrder) {
  auto c = current();
  std::string batch;
  constexpr int kPairs = 2000;
  for (int i = 0; i < kPairs; ++i) {
    batch += u8(cur::kSet) + str("/p" + std::to_string(i)) + str(std::to_string(i * 7));
    batch += u8(cur::kGet) + str("/p" + std::to_string(i));
  }
  c->send(batch);
  for (int i = 0; i < kPairs; ++i) ASSERT_EQ(c->read_bytes(), std::to_string(i * 7));
}

TEST_F(DialectTest, AStalledHalfRequestDelaysNobodyElse) {
  // torch 1.13's server stalls every client when one sends half a request.
  auto stalled = current();
  stalled->send(u8(cur::kSet) + u64(16) + "only-part");  // key promised 16 bytes, 9 sent
  auto legacy_stalled = legacy();
  legacy_stalled->send(u8(leg::kSet));

  auto c = current();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 200; ++i) {
    c->send(u8(cur::kAdd) + str("/ops") + i64(1));
    ASSERT_EQ(c->read_i64(), i + 1);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);

  // The stalled request completes once its last bytes arrive.
  stalled->send("-rest!!" + str("value"));
  c->send(u8(cur::kWait) + list({"only-part-rest!!"}));
  EXPECT_EQ(c->read_u8(), wire::kStopWaiting);
  c->send(u8(cur::kGet) + str("only-part-rest!!"));
  EXPECT_EQ(c->read_bytes(), "value");
}

}  // namespace
}  // namespace dist::store
