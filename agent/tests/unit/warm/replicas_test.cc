// Peer replicas of the snapshots (warm/snapshot_replicas.h) between real agents' replica servers,
// over real sockets, around a real store: each rank's newest save reaches K peers, a node that has
// none restores the newest a peer holds, a torn or another job's file is never held or restored,
// and a connection without the job's token gets nothing.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dist/store/server.h"
#include "snapshot_file.h"
#include "warm/snapshot_replicas.h"
#include "warm/snapshot_store.h"

namespace dist::agent::warm {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// A snapshot of `job` and `rank` (snapshot_file.h).
void write_snapshot(const fs::path& path, const std::string& job, int rank, std::uint64_t save_id,
                    std::int64_t saved_at, std::uint64_t step, const std::string& payload,
                    std::uint64_t footer_id = 0) {
  testing::write_snapshot_file(path,
                               {{"format", 2},
                                {"job", job},
                                {"rank", rank},
                                {"world_size", 4},
                                {"step", step},
                                {"save_id", save_id},
                                {"saved_at", saved_at}},
                               payload, footer_id);
}

bool eventually(const std::function<bool()>& done, std::chrono::seconds limit = 30s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  return done();
}

// One agent's side: its snapshot folders, the replicas it holds, and its replica server.
struct Node {
  Node(const fs::path& root, const std::string& name, const store::Endpoint& store,
       const std::string& secret = {}, int replicas = 1)
      : snapshots(root / name / "snapshots"), held(root / name / "replicas") {
    fs::create_directories(snapshots);
    r = std::make_unique<SnapshotReplicas>(
        ReplicaOptions{replicas, "job", secret, "127.0.0.1", "127.0.0.1"}, snapshots, held);
    r->use_store(store);
  }
  std::string serving() const {
    const auto s = r->status()["serving"];
    return s.is_string() ? s.get<std::string>() : "";
  }
  std::vector<int> held_ranks() const {
    std::vector<int> ranks;
    const auto status = r->status();
    for (const auto& h : status["held"]) ranks.push_back(h["rank"].get<int>());
    return ranks;
  }
  std::optional<SaveStamp> held_stamp(int rank) const {
    const auto saved = snapshots_in(held / ("rank_" + std::to_string(rank)));
    if (saved.empty()) return std::nullopt;
    return saved.back().stamp;
  }
  // restore(), waited for.
  void restore(std::vector<int> ranks, int other_nodes) {
    std::promise<void> done;
    r->restore(std::move(ranks), other_nodes, [&] { done.set_value(); });
    ASSERT_EQ(done.get_future().wait_for(60s), std::future_status::ready);
  }
  fs::path snapshots, held;
  std::unique_ptr<SnapshotReplicas> r;
};

class Replicas : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("dist-replicas-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  store::Endpoint endpoint(const store::StoreServerThread& s) const {
    return {"127.0.0.1", s.port()};
  }
  fs::path root_;
};

TEST_F(Replicas, EachRanksNewestSaveReachesAPeerAndANodeWithoutItRestoresTheNewest) {
  store::StoreServerThread store;
  auto a = std::make_unique<Node>(root_, "a", endpoint(store));
  Node b(root_, "b", endpoint(store));
  ASSERT_TRUE(eventually([&] { return !a->serving().empty() && !b.serving().empty(); }));
  const fs::path rank1 = a->snapshots / "rank_1";
  write_snapshot(rank1 / "step_00000000000000000010.snap", "job", 1, 11, 1000, 10, "state 10");
  ASSERT_TRUE(eventually([&] { return b.held_stamp(1) && b.held_stamp(1)->save_id == 11; }));
  // A newer save replaces it: a holder keeps each rank's newest only.
  write_snapshot(rank1 / "step_00000000000000000020.snap", "job", 1, 21, 2000, 20, "state 20!");
  ASSERT_TRUE(eventually([&] { return b.held_stamp(1) && b.held_stamp(1)->save_id == 21; }));
  EXPECT_EQ(snapshots_in(b.held / "rank_1").size(), 1u);
  EXPECT_EQ(a->r->status()["saves_sent"], 2);

  a.reset();  // node a is lost; its replacement has no snapshot of rank 1
  Node replacement(root_, "a2", endpoint(store));
  EXPECT_EQ(replacement.r->missing({0, 1}), (std::vector<int>{0, 1}));
  replacement.restore({1}, 1);
  const auto restored = snapshots_in(replacement.snapshots / "rank_1");
  ASSERT_EQ(restored.size(), 1u);
  EXPECT_EQ(restored[0].stamp.save_id, 21u);
  EXPECT_EQ(restored[0].stamp.step, 20u);
  EXPECT_EQ(restored[0].path.filename(), "step_00000000000000000020.snap");
  EXPECT_TRUE(replacement.r->missing({0, 1}) == std::vector<int>{0});
  EXPECT_GT(replacement.r->status()["restored_bytes"].get<std::uint64_t>(), 0u);
}

TEST_F(Replicas, ARankNoPeerHoldsRestoresNothingAndEndsPromptly) {
  store::StoreServerThread store;
  Node a(root_, "a", endpoint(store));
  Node b(root_, "b", endpoint(store));
  const auto began = std::chrono::steady_clock::now();
  b.restore({3}, 1);
  EXPECT_LT(std::chrono::steady_clock::now() - began, 10s);
  EXPECT_TRUE(snapshots_in(b.snapshots / "rank_3").empty());
}

TEST_F(Replicas, ATornOrAnotherJobsFileIsNeverHeldNorRestored) {
  store::StoreServerThread store;
  Node a(root_, "a", endpoint(store));
  Node b(root_, "b", endpoint(store));
  // Rank 0: a file whose footer is another save's (read while rewritten); rank 2: another job's
  // state in this job's folder; rank 1: a whole one, which shows the others had their turn.
  write_snapshot(a.snapshots / "rank_0" / "step_00000000000000000005.snap", "job", 0, 5, 100, 5,
                 "torn", 6);
  write_snapshot(a.snapshots / "rank_2" / "step_00000000000000000005.snap", "other", 2, 7, 100, 5,
                 "another job's");
  ASSERT_TRUE(eventually([&] { return !b.serving().empty(); })) << a.r->status().dump();
  write_snapshot(a.snapshots / "rank_1" / "step_00000000000000000005.snap", "job", 1, 9, 100, 5,
                 "whole");
  ASSERT_TRUE(eventually([&] { return b.held_stamp(1).has_value(); }));
  // Every folder is scanned in each pass: rank 0 and rank 2 had theirs before or with rank 1's.
  ASSERT_TRUE(eventually([&] { return a.r->status()["saves_sent"] == 1; }));
  std::this_thread::sleep_for(2 * kReplicaScanInterval);  // one more pass, and nothing more
  EXPECT_EQ(b.held_ranks(), std::vector<int>{1}) << b.r->status().dump();
  b.restore({0, 2}, 1);
  EXPECT_TRUE(snapshots_in(b.snapshots / "rank_0").empty());
  EXPECT_TRUE(snapshots_in(b.snapshots / "rank_2").empty());
}

TEST_F(Replicas, AConnectionWithoutTheJobsTokenGetsNothing) {
  store::ServerOptions options;
  options.secret = "job token";
  store::StoreServerThread store("127.0.0.1", 0, options);
  Node a(root_, "a", endpoint(store), "job token");
  Node b(root_, "b", endpoint(store), "job token");
  write_snapshot(a.snapshots / "rank_0" / "step_00000000000000000003.snap", "job", 0, 3, 100, 3,
                 "secret state");
  ASSERT_TRUE(eventually([&] { return b.held_stamp(0).has_value(); }))
      << "the job's agents, with its token, send and hold";
  // A stranger asks b for rank 0 with a zero proof: refused (status 2), no byte of the state.
  const auto served = store::parse_endpoint(b.serving());
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(served.port);
  ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to), 0);
  char hello[40];
  ASSERT_EQ(::recv(fd, hello, sizeof hello, MSG_WAITALL), 40);
  EXPECT_EQ(std::string(hello, 8), "DLREPL01");
  std::string request(64, '\0');  // a nonce, a proof of zeros
  request += '\2';                // GET
  const std::uint32_t job_bytes = 3;
  request.append(reinterpret_cast<const char*>(&job_bytes), 4);
  request += "job";
  const std::int32_t rank = 0;
  request.append(reinterpret_cast<const char*>(&rank), 4);
  ASSERT_EQ(::send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  std::string reply(64, '\0');
  const ssize_t got = ::recv(fd, reply.data(), reply.size(), MSG_WAITALL);
  ::close(fd);
  ASSERT_EQ(got, 33) << "a proof of zeros and the status, then the connection closes";
  EXPECT_EQ(reply[32], 2);
  EXPECT_EQ(reply.find("secret state"), std::string::npos);
}

TEST_F(Replicas, EachRanksSaveGoesToKDistinctPeers) {
  store::StoreServerThread store;
  std::vector<std::unique_ptr<Node>> nodes;
  for (const char* name : {"a", "b", "c", "d"}) {
    nodes.push_back(std::make_unique<Node>(root_, name, endpoint(store), "", 2));
  }
  ASSERT_TRUE(eventually([&] {
    for (const auto& n : nodes) {
      if (n->serving().empty()) return false;
    }
    return true;
  }));
  write_snapshot(nodes[0]->snapshots / "rank_0" / "step_00000000000000000001.snap", "job", 0, 1,
                 100, 1, "replicated twice");
  auto holders = [&] {
    int n = 0;
    for (std::size_t i = 1; i < nodes.size(); ++i) n += nodes[i]->held_stamp(0).has_value();
    return n;
  };
  ASSERT_TRUE(eventually([&] { return holders() == 2; }));
  std::this_thread::sleep_for(2 * kReplicaScanInterval);  // one more pass, and no third copy
  EXPECT_EQ(holders(), 2);
  EXPECT_FALSE(nodes[0]->held_stamp(0)) << "never its own";
}

}  // namespace
}  // namespace dist::agent::warm
