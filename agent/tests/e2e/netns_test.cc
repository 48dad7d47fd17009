// Agents in two network namespaces joined by a veth pair, as two hosts: a job across them, one
// --snapshot-dir both hosts share, a partition (one side's link taken down) noticed by both within
// seconds, and an elastic job that loses the partitioned host and goes on without it. Needs root
// and iproute2; skips, saying so, elsewhere. Addresses come from 198.18.0.0/15, the range set aside
// for network benchmarks, and exist only inside these namespaces.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "process_helpers.h"
#include "programs.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

int sh(const std::string& command) {
  const int status = std::system((command + " >/dev/null 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class TwoHosts : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string id = std::to_string(::getpid() % 100000);
    ns_[0] = "dl" + id + "a";
    ns_[1] = "dl" + id + "b";
    veth_[0] = "dv" + id + "a";
    veth_[1] = "dv" + id + "b";
    const int subnet = static_cast<int>(::getpid() % 250);
    addr_[0] = "198.18." + std::to_string(subnet) + ".1";
    addr_[1] = "198.18." + std::to_string(subnet) + ".2";
    port_ = std::to_string(20000 + ::getpid() % 20000);  // the namespaces are new: nothing holds it
    if (::geteuid() != 0 || sh("ip netns add " + ns_[0]) != 0) {
      GTEST_SKIP() << "network namespaces need root and iproute2; not available here";
    }
    created_ = true;
    ASSERT_EQ(sh("ip netns add " + ns_[1]), 0);
    ASSERT_EQ(sh("ip link add " + veth_[0] + " type veth peer name " + veth_[1]), 0);
    for (int i = 0; i < 2; ++i) {
      ASSERT_EQ(sh("ip link set " + veth_[i] + " netns " + ns_[i]), 0);
      ASSERT_EQ(sh("ip -n " + ns_[i] + " addr add " + addr_[i] + "/24 dev " + veth_[i]), 0);
      ASSERT_EQ(sh("ip -n " + ns_[i] + " link set " + veth_[i] + " up"), 0);
      ASSERT_EQ(sh("ip -n " + ns_[i] + " link set lo up"), 0);
    }
    dir_ = fs::temp_directory_path() / ("dist-netns-" + id);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    for (pid_t p : agents_) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
    if (created_) {
      sh("ip netns del " + ns_[0]);  // the veth pair goes with it
      sh("ip netns del " + ns_[1]);
    }
    fs::remove_all(dir_);
  }

  // dist-launch as static node `rank`, inside that host's namespace, with `options` of its own.
  pid_t agent(int rank, const std::vector<std::string>& worker,
              const std::vector<std::string>& options = {"--rdzv-conf", "timeout=20"}) {
    std::vector<std::string> args{DIST_LAUNCH_BIN,
                                  "--nnodes",
                                  "2",
                                  "--node-rank",
                                  std::to_string(rank),
                                  "--master-addr",
                                  addr_[0],
                                  "--master-port",
                                  "29511",
                                  "--nproc-per-node",
                                  "1"};
    args.insert(args.end(), options.begin(), options.end());
    args.push_back("--no-python");
    args.push_back(DIST_TEST_WORKER_BIN);
    args.insert(args.end(), worker.begin(), worker.end());
    return spawn(rank, args, "node" + std::to_string(rank));
  }

  // `command` inside host `host`'s namespace, its output in <name>.log.
  pid_t spawn(int host, std::vector<std::string> command, const std::string& name) {
    std::vector<std::string> args{"ip", "netns", "exec", ns_[host]};
    args.insert(args.end(), command.begin(), command.end());
    const pid_t pid = ::fork();
    if (pid == 0) {
      const std::string log = (dir_ / (name + ".log")).string();
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execvp("ip", argv.data());
      ::_exit(127);
    }
    agents_.push_back(pid);
    return pid;
  }
  int wait(pid_t pid, std::chrono::milliseconds timeout) {
    const auto end = Clock::now() + timeout;
    while (Clock::now() < end) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        std::erase(agents_, pid);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(20ms);
    }
    return -1;
  }
  std::string log(int rank) const { return log("node" + std::to_string(rank)); }
  std::string log(const std::string& name) const {
    std::ifstream in(dir_ / (name + ".log"));
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // The lines of a dist-test-worker `append` file: one per round the worker ran in.
  std::vector<std::string> lines(const std::string& name) const {
    std::ifstream in(path(name + ".rounds"));
    std::vector<std::string> all;
    for (std::string line; std::getline(in, line);) all.push_back(line);
    return all;
  }
  // dist-launch in an elastic job of `nnodes` whose store is on host 0, one worker each: it
  // appends its rounds to <name>.rounds, then runs `worker`.
  pid_t elastic_agent(int host, const std::string& name, const std::string& nnodes,
                      const std::vector<std::string>& worker) {
    std::vector<std::string> args{DIST_LAUNCH_BIN,
                                  "--nnodes",
                                  nnodes,
                                  "--rdzv-endpoint",
                                  addr_[0] + ":29512",
                                  "--rdzv-id",
                                  "job",
                                  "--nproc-per-node",
                                  "1",
                                  "--rdzv-conf",
                                  "join_timeout=20",
                                  "--event-log",
                                  path(name + ".events"),
                                  "--no-python",
                                  DIST_TEST_WORKER_BIN,
                                  "append",
                                  path(name + ".rounds")};
    args.insert(args.end(), worker.begin(), worker.end());
    return spawn(host, args, name);
  }
  // A job of three nodes (two on host 0) whose host 1 is cut off for 15 s mid-training.
  void ride_out_an_outage(bool on_a_daemon);

  std::string ns_[2], veth_[2], addr_[2], port_;
  fs::path dir_;
  std::vector<pid_t> agents_;
  bool created_ = false;
};

TEST_F(TwoHosts, AJobSpansTheTwoHosts) {
  const pid_t a = agent(0, {"env", path("env_0")});
  const pid_t b = agent(1, {"env", path("env_1")});
  EXPECT_EQ(wait(a, 60s), 0) << log(0);
  EXPECT_EQ(wait(b, 60s), 0) << log(1);
  std::ifstream env1(path("env_1"));
  std::string all((std::istreambuf_iterator<char>(env1)), std::istreambuf_iterator<char>());
  EXPECT_NE(all.find("RANK=1\n"), std::string::npos);
  EXPECT_NE(all.find("MASTER_ADDR=" + addr_[0] + "\n"), std::string::npos);
}

// Each host's worker is local rank 0; both keep their snapshots in one --snapshot-dir (storage
// the hosts share). When the job runs again, each rank resumes from its own state, not the
// other host's (the folders were per local rank: both wrote local_rank_0).
TEST_F(TwoHosts, ASharedSnapshotDirKeepsEachHostsRanksApart) {
  const std::string shared = path("snapshots");
  {
    std::ofstream script(path("resume.py"));
    script << "import os, sys\n"
              "from dist_launch import snapshot\n"
              "rank = int(os.environ['RANK'])\n"
              "found = snapshot.load()\n"
              "if found is None:\n"
              "    snapshot.save(7, {'rank': rank, 'host': sys.argv[1]})\n"
              "else:\n"
              "    with open(sys.argv[2] + str(rank) + '.log', 'w') as f:\n"
              "        f.write(repr(found))\n";
  }
  auto job = [&](const std::string& tag) {
    pid_t nodes[2];
    for (int rank = 0; rank < 2; ++rank) {
      nodes[rank] = spawn(
          rank,
          {DIST_LAUNCH_BIN, "--nnodes", "2", "--node-rank", std::to_string(rank), "--master-addr",
           addr_[0], "--master-port", "29512", "--rdzv-id", "shared", "--nproc-per-node", "1",
           "--snapshot-dir", shared, path("resume.py"), ns_[rank], path("loaded_")},
          tag + std::to_string(rank));
    }
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(wait(nodes[rank], 90s), 0) << log(tag + std::to_string(rank));
    }
  };
  job("first");
  EXPECT_TRUE(fs::exists(fs::path(shared) / "shared" / "rank_0"));
  EXPECT_TRUE(fs::exists(fs::path(shared) / "shared" / "rank_1"));
  job("again");
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(log("loaded_" + std::to_string(rank)),
              "(7, {'rank': " + std::to_string(rank) + ", 'host': '" + ns_[rank] + "'})")
        << log("again" + std::to_string(rank));
  }
}

// A job of a fixed size cannot go on without a node: it gives a vanished one 30 s (the keepalive's
// default for it, 1 s x 30) before either side ends it, and then both sides do.
TEST_F(TwoHosts, APartitionIsNoticedByBothSidesWithinHalfAMinute) {
  const pid_t a = agent(0, {"pidfile", path("pid_0"), "forever"});
  const pid_t b = agent(1, {"pidfile", path("pid_1"), "forever"});
  ASSERT_GT(dist::agent::testing::written_pid(path("pid_0")), 0) << log(0) << log(1);
  const pid_t worker1 = dist::agent::testing::written_pid(path("pid_1"));
  ASSERT_GT(worker1, 0) << log(0) << log(1);

  const auto cut = Clock::now();
  ASSERT_EQ(sh("ip -n " + ns_[1] + " link set " + veth_[1] + " down"), 0);
  // Keepalive: 1 s idle, then 29 more probes 1 s apart: about 30 s; allow for scheduling.
  EXPECT_NE(wait(a, 60s), -1) << "node 0 never noticed the partition\n" << log(0);
  EXPECT_NE(wait(b, 60s), -1) << "node 1 never noticed the partition\n" << log(1);
  EXPECT_LT(Clock::now() - cut, 45s);
  EXPECT_NE(log(0).find("node 1's agent is gone"), std::string::npos) << log(0);
  // Why the job failed: the node lost, not a failure record it never wrote.
  EXPECT_NE(log(0).find("the job failed: node 1's agent is gone: its connection to the store "
                        "ended (the agent died, or its host went down or was cut off for longer "
                        "than the keepalive, about 30 s)"),
            std::string::npos)
      << log(0);
  EXPECT_EQ(log(0).find("left no failure record"), std::string::npos) << log(0);
  EXPECT_NE(log(1).find("(no answer for about 30 s: this host was cut off from the store's, or "
                        "that host went down); this node's workers stop"),
            std::string::npos)
      << log(1);
  EXPECT_TRUE(dist::agent::testing::process_gone(worker1)) << "node 1's worker outlived the job";
}

TEST_F(TwoHosts, AnElasticJobLosesAPartitionedNodeAndGoesOnWithoutIt) {
  // Host 0 runs the store's agent and a second agent; host 1 runs the third. Host 1's link goes
  // down: the two agents on host 0 finish the job as a world of two; host 1's agent waits for the
  // store to answer again, to rejoin, for join_timeout (20 s here), and gives up.
  const std::vector<std::string> worker{"exit-if-world", "2", "0", "forever"};
  const pid_t a = elastic_agent(0, "a", "2:3", worker);  // hosts the store: the endpoint's host
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] { return log("a").find("hosting the rendezvous store") != std::string::npos; }, 30s))
      << log("a");
  const pid_t b = elastic_agent(0, "b", "2:3", worker);
  const pid_t c = elastic_agent(1, "c", "2:3", worker);
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] { return !lines("a").empty() && !lines("b").empty() && !lines("c").empty(); }, 30s))
      << log("a") << log("c");

  const auto cut = Clock::now();
  ASSERT_EQ(sh("ip -n " + ns_[1] + " link set " + veth_[1] + " down"), 0);
  EXPECT_EQ(wait(a, 40s), 0) << log("a");
  EXPECT_EQ(wait(b, 40s), 0) << log("b");
  EXPECT_LT(Clock::now() - cut, 25s);
  for (const auto& name : {"a", "b"}) {
    const auto history = lines(name);
    ASSERT_EQ(history.size(), 2u) << name;
    int rank = 0, world_size = 0;
    std::istringstream(history[1]) >> rank >> world_size;
    EXPECT_EQ(world_size, 2) << history[1];
  }
  EXPECT_NE(log("a").find("lost"), std::string::npos) << log("a");
  EXPECT_NE(wait(c, 45s), 0) << "the cut-off node cannot finish the job alone\n" << log("c");
  EXPECT_NE(log("c").find("it rejoins the job when the store answers again (for up to 20 s"),
            std::string::npos)
      << log("c");
  EXPECT_EQ(lines("c").size(), 1u) << log("c");
}

// The cut-off node of an elastic job rejoins it when its link comes back: the node that went on
// alone takes it in again, and the job ends with both.
TEST_F(TwoHosts, AnElasticJobsCutOffNodeRejoinsWhenItsLinkReturns) {
  const std::vector<std::string> worker{"wait-file", path("done")};  // then exits 0
  const pid_t a = elastic_agent(0, "a", "1:2", worker);
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] { return log("a").find("hosting the rendezvous store") != std::string::npos; }, 30s))
      << log("a");
  const pid_t c = elastic_agent(1, "c", "1:2", worker);
  const auto in_a_world_of = [&](const std::string& name, const std::string& world, size_t after) {
    const auto history = lines(name);
    for (size_t i = after; i < history.size(); ++i) {
      int rank = 0, world_size = 0;
      std::istringstream(history[i]) >> rank >> world_size;
      if (std::to_string(world_size) == world) return true;
    }
    return false;
  };
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] { return in_a_world_of("a", "2", 0) && in_a_world_of("c", "2", 0); }, 60s))
      << log("a") << log("c");

  const size_t a_before = lines("a").size(), c_before = lines("c").size();
  ASSERT_EQ(sh("ip -n " + ns_[1] + " link set " + veth_[1] + " down"), 0);
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] {
        return in_a_world_of("a", "1", a_before) &&
               log("c").find("rejoins the job when the store answers again") != std::string::npos;
      },
      40s))
      << log("a") << log("c");
  const size_t a_alone = lines("a").size();
  ASSERT_EQ(sh("ip -n " + ns_[1] + " link set " + veth_[1] + " up"), 0);
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] { return in_a_world_of("a", "2", a_alone) && in_a_world_of("c", "2", c_before); }, 40s))
      << log("a") << log("c");
  // The node's next agent is as guarded as its first: its janitor still runs.
  const auto janitor_of = [](pid_t agent) {
    for (const auto& p : dist::agent::testing::all_processes()) {
      if (p.ppid == agent && p.comm == "dist-janitor") return true;
    }
    return false;
  };
  EXPECT_TRUE(janitor_of(c)) << "the rejoined agent has no janitor";
  { std::ofstream done(path("done")); }
  EXPECT_EQ(wait(a, 60s), 0) << log("a");
  EXPECT_EQ(wait(c, 60s), 0) << log("c");
  EXPECT_NE(log("c").find("rejoining the job at " + addr_[0]), std::string::npos) << log("c");
  // Its event log tells one job: one start, one end (its success), the rejoin between.
  std::vector<std::string> events, said;
  {
    std::ifstream in(path("c.events"));
    for (std::string line; std::getline(in, line);) events.push_back(line);
  }
  ASSERT_FALSE(events.empty());
  for (const auto& line : events) {
    for (const char* event : {"job_start", "rejoin", "job_end"}) {
      if (line.find("\"event\":\"" + std::string(event) + "\"") != std::string::npos) {
        said.push_back(event);
      }
    }
  }
  EXPECT_EQ(said, (std::vector<std::string>{"job_start", "rejoin", "job_end"}));
  EXPECT_NE(events.back().find("\"outcome\":\"succeeded\""), std::string::npos) << events.back();
}

// A static job with a restart left: its cut-off node rejoins it when its link comes back, taking
// its node rank's place in the restart the other node waits in, and the job ends with both.
TEST_F(TwoHosts, AStaticJobsCutOffNodeRejoinsItsRestartWhenItsLinkReturns) {
  auto node = [&](int rank) {
    return agent(rank,
                 {"append", path(std::to_string(rank) + ".rounds"), "wait-file", path("done")},
                 {"--max-restarts", "1", "--rdzv-conf", "timeout=60,keep_alive_max_attempt=5"});
  };
  const pid_t a = node(0);
  const pid_t b = node(1);
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] { return lines("0").size() == 1 && lines("1").size() == 1; }, 60s))
      << log(0) << log(1);
  ASSERT_EQ(sh("ip -n " + ns_[1] + " link set " + veth_[1] + " down"), 0);
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] {
        return log(1).find(
                   "rejoins the job when the store answers again (for up to 60 s, "
                   "--rdzv-conf timeout)") != std::string::npos;
      },
      40s))
      << log(0) << log(1);
  ASSERT_EQ(sh("ip -n " + ns_[1] + " link set " + veth_[1] + " up"), 0);
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] { return lines("0").size() == 2 && lines("1").size() == 2; }, 60s))
      << log(0) << log(1);
  { std::ofstream done(path("done")); }
  EXPECT_EQ(wait(a, 60s), 0) << log(0);
  EXPECT_EQ(wait(b, 60s), 0) << log(1);
  for (const std::string rank : {"0", "1"}) {
    int r = 0, world = 0, group_rank = 0, group_world = 0, restarts = -1;
    std::istringstream(lines(rank)[1]) >> r >> world >> group_rank >> group_world >> restarts;
    EXPECT_EQ(world, 2) << lines(rank)[1];
    EXPECT_EQ(restarts, 1) << lines(rank)[1];
  }
}

// dist-inplace-worker's DIR/final_<rank> of ranks 0..world-1: every rank at `steps`, in a world
// of `world`, with one digest (one state).
void expect_one_final_state(const std::string& out, int world, int steps, const std::string& logs) {
  std::string digest;
  for (int rank = 0; rank < world; ++rank) {
    std::ifstream in(out + "/final_" + std::to_string(rank));
    long pid = -1;
    int step = -1, generation = -1, ended_in = -1;
    std::string d;
    ASSERT_TRUE(in >> pid >> step >> d >> generation >> ended_in) << logs;
    EXPECT_EQ(step, steps) << logs;
    EXPECT_EQ(ended_in, world) << logs;
    if (rank == 0) digest = d;
    EXPECT_EQ(d, digest) << "the ranks end with one state\n" << logs;
  }
}

// A network outage shorter than the agents' keepalive (for a job of a fixed size, 1 s x 30) is no
// lost node: host 1's link goes down for 15 s mid-training (past the elastic jobs' 8 s, and the
// 8 s this job had before) and comes back; the workers' all-reduces wait meanwhile (TCP resends
// what they sent once the link is back) and go on, and the job ends in its first round, a world
// of three, as under torchrun (the agents' 8 s keepalive of before ended such a job: the cut-off
// node's agent exited 1 and node 0's failed the job). The store is node 0's agent's (a static
// job), or a dist-rendezvous on host 0 with its own default keepalive, 8 s: the agents ask for
// their job's schedule on their connections, and it holds there too (it had dropped host 1's
// agent at 8 s).
void TwoHosts::ride_out_an_outage(bool on_a_daemon) {
  const std::string out = path("job");
  fs::create_directories(out);
  const std::string endpoint = addr_[0] + ":29514";
  if (on_a_daemon) {
    spawn(0, {DIST_RENDEZVOUS_BIN, "--host", addr_[0], "--port", "29514"}, "daemon");
    ASSERT_TRUE(dist::agent::testing::eventually(
        [&] { return log("daemon").find("listening on") != std::string::npos; }, 30s))
        << log("daemon");
  }
  auto agent = [&](int host, int node_rank, const std::string& name) {
    std::vector<std::string> args{DIST_LAUNCH_BIN, "--nnodes", "3"};
    if (on_a_daemon) {
      args.insert(args.end(), {"--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id",
                               "job", "--rdzv-conf", "is_host=0"});
    } else {
      args.insert(args.end(), {"--node-rank", std::to_string(node_rank), "--master-addr", addr_[0],
                               "--master-port", "29514"});
    }
    args.insert(args.end(),
                {"--local-addr", addr_[host], "--nproc-per-node", "1", "--no-python",
                 DIST_INPLACE_WORKER_BIN, "--steps", "400", "--step-ms", "20", "--out", out});
    return spawn(host, args, name);
  };
  const pid_t a = agent(0, 0, "a");
  const pid_t b = agent(0, 1, "b");
  const pid_t c = agent(1, 2, "c");
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] { return log("c").find(" step 20\n") != std::string::npos; }, 60s))
      << log("a") << log("c");
  ASSERT_EQ(sh("ip -n " + ns_[1] + " link set " + veth_[1] + " down"), 0);
  std::this_thread::sleep_for(15s);  // the outage itself: no process is ordered by it
  ASSERT_EQ(sh("ip -n " + ns_[1] + " link set " + veth_[1] + " up"), 0);
  EXPECT_EQ(wait(a, 90s), 0) << log("a");
  EXPECT_EQ(wait(b, 90s), 0) << log("b");
  EXPECT_EQ(wait(c, 90s), 0) << log("c");
  const std::string all = log("a") + log("b") + log("c");
  EXPECT_EQ(all.find("lost"), std::string::npos) << all;
  EXPECT_EQ(all.find("restarting"), std::string::npos) << all;
  expect_one_final_state(out, 3, 400, all);
}

TEST_F(TwoHosts, ANetworkOutageOfSecondsIsRiddenOut) {
  ride_out_an_outage(false);
}

TEST_F(TwoHosts, ANetworkOutageOfSecondsIsRiddenOutOnADaemonsStoreToo) {
  ride_out_an_outage(true);
}

// --restart-policy in-place, C++ workers (the SDK's InPlaceRecovery): hosts 0 and 1 train with
// host 1's worker in every all-reduce; host 1's link goes down mid-training. Its worker closes
// nothing (its host is cut off, not dead), so the survivors' all-reduce waits for it: Gloo would
// hold them until the group's timeout (minutes). The agents find host 1 lost and regroup the job
// without it; each survivor's recovery watcher sees the request, aborts its group, and the
// survivors train on in a world of two, in the same processes, ending with one state.
TEST_F(TwoHosts, AnInPlaceJobsSurvivorsLeaveTheirCollectiveWithAPartitionedHostAndTrainOn) {
  const std::string out = path("job");
  fs::create_directories(out);
  auto agent = [&](int host, const std::string& name) {
    return spawn(host,
                 {DIST_LAUNCH_BIN,
                  "--nnodes",
                  "2:3",
                  "--rdzv-endpoint",
                  addr_[0] + ":29513",
                  "--rdzv-id",
                  "job",
                  "--local-addr",
                  addr_[host],
                  "--nproc-per-node",
                  "1",
                  "--restart-policy",
                  "in-place",
                  "--max-restarts",
                  "1",
                  "--no-python",
                  DIST_INPLACE_WORKER_BIN,
                  "--steps",
                  "600",
                  "--step-ms",
                  "20",
                  "--out",
                  out},
                 name);
  };
  const pid_t a = agent(0, "a");  // hosts the store: the endpoint is its address
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] { return log("a").find("hosting the rendezvous store") != std::string::npos; }, 30s))
      << log("a");
  const pid_t b = agent(0, "b");
  const pid_t c = agent(1, "c");
  // Host 1's worker trains in the world of three (a round of three, its steps counted).
  ASSERT_TRUE(dist::agent::testing::eventually(
      [&] {
        const std::string text = log("c");
        return text.find(" of 3, global ranks") != std::string::npos &&
               text.find(" step 20\n") != std::string::npos;
      },
      60s))
      << log("a") << log("c");

  const auto cut = Clock::now();
  ASSERT_EQ(sh("ip -n " + ns_[1] + " link set " + veth_[1] + " down"), 0);
  EXPECT_EQ(wait(a, 60s), 0) << log("a");
  EXPECT_EQ(wait(b, 60s), 0) << log("b");
  EXPECT_LT(Clock::now() - cut, 40s) << "the survivors waited for the partitioned host";
  const std::string both = log("a") + log("b");
  expect_one_final_state(out, 2, 600, both);
  EXPECT_NE(both.find("its collectives are aborted"), std::string::npos) << both;
  EXPECT_EQ(both.find("stopping the workers"), std::string::npos) << both;
  EXPECT_NE(wait(c, 60s), 0) << "the cut-off host cannot finish the job alone\n" << log("c");
}

}  // namespace
