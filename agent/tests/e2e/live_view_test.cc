// The live view through the real dist-launch and real workers (dist-test-worker counting steps and
// heartbeats in its progress slot): `dist-launch status --watch` reading every node's published
// progress from the job's store (two static nodes; one node, from the store its agent hosts), and
// the agent's /status.json and page at --metrics-port.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "http_client.h"
#include "process_helpers.h"
#include "programs.h"
#include "test_ports.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using dist::agent::testing::Child;
using dist::agent::testing::eventually;
using dist::agent::testing::http_request;
using dist::agent::testing::run_command;
using Json = nlohmann::json;

const std::string kWorker = DIST_TEST_WORKER_BIN;
const std::string kLaunch = DIST_LAUNCH_BIN;
const std::string kMaster = "127.0.0.1";

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class LiveView : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dist-live-view-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    // Stopped as a user would: every worker goes with its agent. Of several nodes, one may end
    // first and the other then see it gone (exit 1) before its own SIGTERM arrives.
    for (auto& agent : agents_) ::kill(agent->pid(), SIGTERM);
    for (auto& agent : agents_) {
      const int code = agent->wait(30s);
      if (agents_.size() == 1) {
        EXPECT_EQ(code, 128 + SIGTERM) << agent->output();
      }
      EXPECT_TRUE(code == 128 + SIGTERM || code == 1) << code << "\n" << agent->output();
    }
    fs::remove_all(dir_);
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  Child& launch(const std::string& name, std::vector<std::string> args) {
    agents_.push_back(std::make_unique<Child>(kLaunch, std::move(args), dir_ / (name + ".log"),
                                              std::map<std::string, std::string>{},
                                              std::vector<std::string>{"OMP_NUM_THREADS"}));
    return *agents_.back();
  }

  // `dist-launch status ... --json` until every one of `ranks` ranks has beaten (the workers'
  // progress reached the store), at most 30 s.
  Json status_with_ranks(const std::string& target, std::size_t ranks) {
    Json status;
    eventually(
        [&] {
          const auto [code, out] = run_command(kLaunch + " status " + target + " --json");
          if (code != 0) return false;
          status = Json::parse(out);
          std::size_t beating = 0;
          for (const auto& node : status["nodes"]) {
            for (const auto& r : node["ranks"]) beating += r["beats"].get<int>() > 0 ? 1 : 0;
          }
          return beating == ranks;
        },
        30s);
    return status;
  }

  // The port in the agent's "serving <what> at http://host:PORT" line.
  static int served_port(const Child& agent, const std::string& what) {
    const std::regex line("serving " + what + " at http://[^ ]*:([0-9]+)");
    std::smatch m;
    std::string out;
    const bool found = eventually(
        [&] {
          out = agent.output();
          return std::regex_search(out, m, line);
        },
        20s);
    return found ? std::stoi(m[1]) : -1;
  }

  fs::path dir_;
  std::vector<std::unique_ptr<Child>> agents_;
};

TEST_F(LiveView, StatusWatchShowsEveryRankOfATwoNodeJob) {
  const int port = dist::agent::testing::free_port(kMaster);
  for (int k : {0, 1}) {
    launch("node" + std::to_string(k),
           {"--nnodes", "2", "--node-rank", std::to_string(k), "--master-addr", kMaster,
            "--master-port", std::to_string(port), "--nproc-per-node", "2", "--rdzv-id", "live2",
            "--metrics-port", "0", "--no-python", kWorker, "progress", "50", "forever"});
  }
  const std::string target =
      "--rdzv-endpoint " + kMaster + ":" + std::to_string(port) + " --rdzv-id live2";
  const Json status = status_with_ranks(target, 4);
  ASSERT_EQ(status["nodes"].size(), 2u) << status.dump();
  for (int k : {0, 1}) {
    const Json& node = status["nodes"][k];
    EXPECT_EQ(node["agent_state"], "running") << node.dump();
    ASSERT_EQ(node["ranks"].size(), 2u) << node.dump();
    for (int local : {0, 1}) {
      const Json& r = node["ranks"][local];
      EXPECT_EQ(r["rank"], 2 * k + local);
      EXPECT_EQ(r["local_rank"], local);
      EXPECT_LT(r["progress_age_seconds"].get<double>(), 10) << r.dump();
    }
  }

  // Not a terminal: three plain blocks, one per refresh, no escape sequence.
  const auto [code, out] =
      run_command(kLaunch + " status " + target + " --watch --interval 0.2 --count 3");
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(count(out, "dist-launch status --watch: "), 3u) << out;
  for (const char* n : {"(1 of 3)", "(2 of 3)", "(3 of 3)"}) {
    EXPECT_NE(out.find(n), std::string::npos) << out;
  }
  EXPECT_EQ(out.find('\x1b'), std::string::npos) << out;
  EXPECT_EQ(count(out, "(static): round 0, restarts so far 0, 2 node(s), running"), 3u) << out;
  EXPECT_EQ(count(out, "rank  node  local  steps      steps/s  step time  last progress"), 3u);
  for (const std::string row :
       {"\n0     0     0  ", "\n1     0     1  ", "\n2     1     0  ", "\n3     1     1  "}) {
    EXPECT_EQ(count(out, row), 3u) << "rank row" << row << "\n" << out;
  }
  EXPECT_EQ(count(out, "4 running worker(s)"), 3u) << out;

  // A terminal (script(1) gives it one): redrawn in place.
  const auto [tty_code, tty] = run_command("script -qec '" + kLaunch + " status " + target +
                                           " --watch --interval 0.2 --count 2' /dev/null");
  EXPECT_EQ(tty_code, 0) << tty;
  EXPECT_EQ(count(tty, "\x1b[H"), 2u) << "cursor home once per refresh";
  EXPECT_EQ(count(tty, "\x1b[J"), 2u) << "the rest of the screen cleared once per refresh";
  EXPECT_NE(tty.find("\x1b[K"), std::string::npos);

  // --json: one object a line, for scripts.
  const auto [json_code, lines] =
      run_command(kLaunch + " status " + target + " --watch --json --interval 0.2 --count 2");
  EXPECT_EQ(json_code, 0) << lines;
  std::istringstream each(lines);
  std::string line;
  int objects = 0;
  while (std::getline(each, line)) {
    EXPECT_EQ(Json::parse(line)["nodes"].size(), 2u) << line;
    ++objects;
  }
  EXPECT_EQ(objects, 2);
}

TEST_F(LiveView, AOneNodeJobsStatusIsInTheStoreItsAgentHosts) {
  Child& agent = launch(
      "node", {"--nproc-per-node", "2", "--rdzv-id", "solo", "--metrics-port", "0", "--no-python",
               kWorker, "env", path("env_${local_rank}"), "progress", "40", "forever"});
  // The store's port is the workers' MASTER_PORT.
  std::string master_port;
  ASSERT_TRUE(eventually(
      [&] {
        std::ifstream in(path("env_0"));
        for (std::string l; std::getline(in, l);) {
          if (l.starts_with("MASTER_PORT=")) master_port = l.substr(12);
        }
        return !master_port.empty();
      },
      20s))
      << agent.output();
  const std::string target = "--rdzv-endpoint 127.0.0.1:" + master_port + " --rdzv-id solo";
  const Json status = status_with_ranks(target, 2);
  EXPECT_EQ(status["mode"], "static") << status.dump();
  EXPECT_EQ(status["state"], "running");
  ASSERT_EQ(status["nodes"].size(), 1u) << status.dump();
  EXPECT_EQ(status["nodes"][0]["alive"], true);
  EXPECT_EQ(status["nodes"][0]["first_rank"], 0);
  EXPECT_EQ(status["nodes"][0]["pid"], agent.pid());
  const auto [code, table] = run_command(kLaunch + " status " + target);
  EXPECT_EQ(code, 0) << table;
  EXPECT_NE(table.find("(static): round 0, restarts so far 0, 1 node(s), running"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("2 running worker(s)"), std::string::npos) << table;
  const auto [other_code, other] = run_command(
      kLaunch + " status --rdzv-endpoint 127.0.0.1:" + master_port + " --rdzv-id other");
  EXPECT_EQ(other_code, 1);
  EXPECT_NE(other.find("no job 'other'"), std::string::npos) << other;
}

TEST_F(LiveView, TheAgentServesItsWorkersProgressAndThePage) {
  Child& agent = launch("node", {"--nproc-per-node", "2", "--rdzv-id", "paged", "--metrics-port",
                                 "0", "--no-python", kWorker, "progress", "40", "forever"});
  const int port = served_port(agent, "the status page");
  ASSERT_GT(port, 0) << agent.output();
  Json body;
  // Two samples a rank at least with a measured interval: the plots have lines.
  ASSERT_TRUE(eventually(
      [&] {
        const auto r = http_request(port, "GET /status.json HTTP/1.1");
        if (r.status != 200) return false;
        body = Json::parse(r.body);
        const Json& h = body["history"]["ranks"];
        for (const char* rank : {"0", "1"}) {
          if (!h.contains(rank)) return false;
          int measured = 0;
          for (const auto& v : h[rank]["beat_s"]) measured += v.is_null() ? 0 : 1;
          if (measured < 2) return false;
        }
        return true;
      },
      30s))
      << body.dump() << agent.output();
  EXPECT_EQ(body["run_id"], "paged");
  EXPECT_EQ(body["state"], "running");
  EXPECT_EQ(body["workers_alive"], 2);
  ASSERT_EQ(body["ranks"].size(), 2u);
  for (int rank : {0, 1}) {
    const Json& r = body["ranks"][rank];
    EXPECT_EQ(r["rank"], rank);
    EXPECT_GT(r["beats"].get<int>(), 0);
    // Rank 1 beats every 80 ms, rank 0 every 40 ms: the history measures each one's pace
    // (loosely: a loaded machine delays the workers' threads).
    const double last = body["history"]["ranks"][std::to_string(rank)]["beat_s"].back();
    EXPECT_GT(last, 0.03 * (rank + 1)) << body.dump();
    EXPECT_LT(last, 1.0) << body.dump();
  }
  std::vector<std::string> events;
  for (const auto& e : body["events"]) events.push_back(e["event"]);
  EXPECT_EQ(events,
            (std::vector<std::string>{"job_start", "rendezvous", "worker_start", "worker_start"}));
  const auto page = http_request(port, "GET / HTTP/1.1\r\nAccept: text/html");
  EXPECT_EQ(page.status, 200);
  EXPECT_NE(page.head.find("Content-Type: text/html"), std::string::npos) << page.head;
  EXPECT_NE(page.body.find("\"run_id\":\"paged\""), std::string::npos) << "its data inside";
  EXPECT_EQ(http_request(port, "GET /metrics HTTP/1.1").status, 200) << "the metrics unchanged";
}

}  // namespace
