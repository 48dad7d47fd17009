#include "store_conformance.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <set>

#include "dist/store/errors.h"

namespace dist::agent::testing {
namespace {

using namespace std::chrono_literals;
using store::StoreErrc;
using store::StoreError;

// Long enough never to pass on a loaded machine, where a wait is expected to end early.
constexpr std::chrono::milliseconds kLongWait = 60s;
// Short waits that are expected to time out.
constexpr std::chrono::milliseconds kShortWait = 300ms;
// Longer than any ephemeral key's grace after its session vanished (etcd: the lease TTL, 2 s in
// the tests): an ephemeral key still there after this is kept alive by its session.
constexpr std::chrono::milliseconds kOutlivesGrace = 5s;

std::string unique_run_id() {
  static std::atomic<int> next{0};
  const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string(test->name()) + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(next++);
}

}  // namespace

void PrintTo(const StoreBackendFactory& factory, std::ostream* out) {
  *out << factory.name;
}

void StoreConformance::SetUp() {
  backend_ = GetParam().make();
  run_id_ = unique_run_id();
  store_ = run(backend_->open(io_, run_id_));
}

void StoreConformance::TearDown() {
  // A test that stopped early leaves its calls beside unrun: they die with the io_context.
  EXPECT_EQ(beside_.running(), 0) << "a call beside the test's own did not finish";
  store_.reset();
}

std::unique_ptr<RendezvousStore> StoreConformance::another() {
  return run(store_->open_another());
}

TEST_P(StoreConformance, SetThenTryGet) {
  EXPECT_EQ(run(store_->try_get("a")), std::nullopt);
  run(store_->set("a", "1"));
  EXPECT_EQ(run(store_->try_get("a")), "1");
  run(store_->set("a", "2"));
  EXPECT_EQ(run(store_->try_get("a")), "2");
}

TEST_P(StoreConformance, ValuesKeepEveryByte) {
  std::string value(100'000, '\0');
  for (std::size_t i = 0; i < value.size(); ++i) value[i] = static_cast<char>(i * 7);
  run(store_->set("bytes/\x01\xff", value));
  EXPECT_EQ(run(store_->try_get("bytes/\x01\xff")), value);
}

TEST_P(StoreConformance, MultiSetThenMultiGetInOrder) {
  run(store_->multi_set({{"a", "1"}, {"b", "2"}, {"a", "3"}}));
  EXPECT_EQ(run(store_->multi_get({"b", "missing", "a"})),
            (std::vector<std::optional<std::string>>{"2", std::nullopt, "3"}));
  // More keys than one etcd transaction takes.
  std::vector<std::pair<std::string, std::string>> many;
  std::vector<std::string> keys;
  for (int i = 0; i < 300; ++i) {
    many.emplace_back("many/" + std::to_string(i), std::to_string(i * i));
    keys.push_back("many/" + std::to_string(i));
  }
  run(store_->multi_set(many));
  const auto values = run(store_->multi_get(keys));
  ASSERT_EQ(values.size(), keys.size());
  for (int i = 0; i < 300; ++i) EXPECT_EQ(values[i], std::to_string(i * i)) << i;
  EXPECT_TRUE(run(store_->check(keys)));
}

TEST_P(StoreConformance, AddCountsFromZeroAndReturnsTheNewValue) {
  EXPECT_EQ(run(store_->add("c", 5)), 5);
  EXPECT_EQ(run(store_->add("c", -2)), 3);
  EXPECT_EQ(run(store_->add("c", 0)), 3);
  EXPECT_EQ(run(store_->try_get("c")), "3");
  EXPECT_EQ(run(store_->add("c", 1)), 4);
  EXPECT_EQ(run(store_->add("c", 1)), 5);
  EXPECT_EQ(run(store_->multi_get({"c"})), (std::vector<std::optional<std::string>>{"5"}));
}

TEST_P(StoreConformance, AddZeroToAMissingKeyCreatesIt) {
  EXPECT_EQ(run(store_->add("z", 0)), 0);
  EXPECT_TRUE(run(store_->check({"z"})));
  EXPECT_EQ(run(store_->try_get("z")), "0");
}

TEST_P(StoreConformance, AddContinuesFromASetValueAndSetOverridesACounter) {
  run(store_->set("n", "7"));
  EXPECT_EQ(run(store_->add("n", 1)), 8);
  EXPECT_EQ(run(store_->add("n", 10)), 18);
  EXPECT_EQ(run(store_->try_get("n")), "18");
  run(store_->set("n", "100"));
  EXPECT_EQ(run(store_->add("n", 1)), 101);
}

TEST_P(StoreConformance, AddToANonNumberIsInvalidAndChangesNothing) {
  run(store_->set("x", "abc"));
  try {
    run(store_->add("x", 1));
    ADD_FAILURE() << "add to a non-number succeeded";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), StoreErrc::kInvalidArgument) << e.what();
    // The key is named (with or without the job's prefix, as the store knows it).
    EXPECT_NE(std::string(e.what()).find("x'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(run(store_->try_get("x")), "abc");
}

TEST_P(StoreConformance, ConcurrentAddsFromManySessionsCountEachOnce) {
  constexpr int kSessions = 8, kAddsEach = 25;
  std::vector<std::unique_ptr<RendezvousStore>> sessions;
  for (int i = 0; i < kSessions; ++i) sessions.push_back(another());
  std::vector<std::int64_t> results;
  for (auto& s : sessions) {
    beside([&results, session = s.get()]() -> Task<void> {
      for (int i = 0; i < kAddsEach; ++i) results.push_back(co_await session->add("tickets", 1));
    });
  }
  finish_beside();
  std::sort(results.begin(), results.end());
  std::vector<std::int64_t> expected(kSessions * kAddsEach);
  for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<std::int64_t>(i + 1);
  EXPECT_EQ(results, expected);  // every ticket handed out once
  EXPECT_EQ(run(store_->try_get("tickets")), std::to_string(kSessions * kAddsEach));
}

TEST_P(StoreConformance, CompareSetFollowsPyTorch) {
  struct Case {
    const char* name;
    std::optional<std::string> before;
    std::string expected, desired, returned;
    std::optional<std::string> after;
  };
  const std::vector<Case> cases{
      {"missing, expected empty: created", std::nullopt, "", "d", "d", "d"},
      {"missing, expected given: left missing", std::nullopt, "e", "d", "e", std::nullopt},
      {"equal: swapped", "v", "v", "d", "d", "d"},
      {"different: kept", "v", "w", "d", "v", "v"},
      {"empty value, expected empty: swapped", "", "", "d", "d", "d"},
  };
  int i = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const auto key = "cas/" + std::to_string(i++);
    if (c.before) run(store_->set(key, *c.before));
    EXPECT_EQ(run(store_->compare_set(key, c.expected, c.desired)), c.returned);
    EXPECT_EQ(run(store_->try_get(key)), c.after);
  }
}

TEST_P(StoreConformance, CompareSetSeesACounterAsItsValue) {
  run(store_->add("c", 3));
  EXPECT_EQ(run(store_->compare_set("c", "2", "x")), "3");
  EXPECT_EQ(run(store_->compare_set("c", "3", "x")), "x");
  EXPECT_EQ(run(store_->try_get("c")), "x");
}

TEST_P(StoreConformance, CheckAndDelete) {
  run(store_->set("a", "1"));
  EXPECT_TRUE(run(store_->check({"a"})));
  EXPECT_FALSE(run(store_->check({"a", "b"})));
  run(store_->set("b", ""));
  EXPECT_TRUE(run(store_->check({"a", "b"})));
  EXPECT_TRUE(run(store_->delete_key("b")));
  EXPECT_FALSE(run(store_->delete_key("b")));
  EXPECT_FALSE(run(store_->check({"a", "b"})));
}

TEST_P(StoreConformance, WaitReturnsOnceEveryKeyExists) {
  run(store_->set("a", "1"));
  const auto other = another();
  beside([&]() -> Task<void> {
    const std::vector<std::string> never{"never"};  // GCC 12: no braced list in a co_await
    co_await other->wait(never, kShortWait);        // lets the wait below begin first
    co_await other->set("b", "2");
  });
  EXPECT_TRUE(run(store_->wait({"a", "b"}, kLongWait)));
  finish_beside();
  EXPECT_TRUE(run(store_->wait({"a", "b"}, 0ms)));  // both there: no waiting
}

TEST_P(StoreConformance, WaitTimesOutWithFalse) {
  run(store_->set("a", "1"));
  const auto started = std::chrono::steady_clock::now();
  EXPECT_FALSE(run(store_->wait({"a", "missing"}, kShortWait)));
  EXPECT_GE(std::chrono::steady_clock::now() - started, kShortWait);
}

TEST_P(StoreConformance, WaitDeletedGivesAMissingKeyAtOnce) {
  run(store_->set("a", "1"));
  EXPECT_EQ(run(store_->wait_deleted({"a", "b"}, kLongWait)), 1u);
}

TEST_P(StoreConformance, WaitDeletedSeesADeletion) {
  run(store_->multi_set({{"a", "1"}, {"b", "2"}, {"c", "3"}}));
  const auto other = another();
  beside([&]() -> Task<void> {
    const std::vector<std::string> never{"never"};  // GCC 12: no braced list in a co_await
    co_await other->wait(never, kShortWait);        // lets the wait below begin first
    co_await other->delete_key("b");
  });
  EXPECT_EQ(run(store_->wait_deleted({"a", "b", "c"}, kLongWait)), 1u);
  finish_beside();
}

TEST_P(StoreConformance, WaitDeletedTimesOutWithNothing) {
  run(store_->set("a", "1"));
  EXPECT_EQ(run(store_->wait_deleted({"a"}, kShortWait)), std::nullopt);
}

TEST_P(StoreConformance, EphemeralKeyLivesExactlyAsLongAsItsSession) {
  const auto owner = another();
  run(owner->set_ephemeral("alive", "1"));
  EXPECT_EQ(run(store_->try_get("alive")), "1");
  // Kept while the session lives, well past any grace after a session's end.
  EXPECT_EQ(run(store_->wait_deleted({"alive"}, kOutlivesGrace)), std::nullopt);
  owner->close();
  EXPECT_EQ(run(store_->wait_deleted({"alive"}, kLongWait)), 0u);
}

TEST_P(StoreConformance, SessionsOpenedFromAnotherShareTheJobNotTheLifetime) {
  run(store_->set_ephemeral("mine", "a"));
  auto second = another();
  run(second->set_ephemeral("theirs", "b"));
  EXPECT_EQ(run(second->try_get("mine")), "a");
  EXPECT_EQ(run(store_->try_get("theirs")), "b");
  second->close();
  EXPECT_EQ(run(store_->wait_deleted({"theirs"}, kLongWait)), 0u);
  EXPECT_EQ(run(store_->try_get("mine")), "a");
}

TEST_P(StoreConformance, CloseCancelsTheCallInFlightAndEveryLaterOne) {
  const auto other = another();
  beside([&]() -> Task<void> {
    const std::vector<std::string> anything{"anything"};  // GCC 12: no braced list in a co_await
    co_await other->check(anything);  // a round trip while the wait below starts
    store_->close();
  });
  try {
    run(store_->wait({"never"}, kLongWait));
    ADD_FAILURE() << "the wait outlived close()";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), StoreErrc::kCancelled) << e.what();
  }
  finish_beside();
  try {
    run(store_->set("k", "v"));
    ADD_FAILURE() << "a call after close() succeeded";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), StoreErrc::kCancelled) << e.what();
  }
  store_->close();  // again: nothing happens
}

TEST_P(StoreConformance, JobsDoNotSeeEachOther) {
  const auto other_job = run(backend_->open(io_, run_id_ + "-other"));
  run(store_->set("k", "mine"));
  EXPECT_EQ(run(other_job->try_get("k")), std::nullopt);
  run(other_job->set("k", "theirs"));
  EXPECT_EQ(run(store_->try_get("k")), "mine");
  EXPECT_EQ(run(other_job->try_get("k")), "theirs");
}

TEST_P(StoreConformance, DescribeSaysWhereTheStoreIs) {
  EXPECT_FALSE(store_->describe().empty());
}

}  // namespace dist::agent::testing
