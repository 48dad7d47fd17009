// dist-launch on hosts known only by their names: every address in the commands below is a name
// that each host's own /etc/hosts resolves (node-a maps its own name to 127.0.1.1, as Debian does).
// Static and elastic jobs, IPv6 names, an unresolvable master, and the C++ SDK's Gloo group
// across hosts ending with the same weights as on one host.
#include <map>
#include <regex>
#include <set>

#include "named_hosts.h"

namespace dist::testing {
namespace {

using namespace std::chrono_literals;

// The hosts are fresh network namespaces: nothing else can hold a port there.
constexpr const char* kStorePort = "29500";
constexpr const char* kEndpointPort = "29400";
constexpr int kDdpTrainEpochs = 2;
constexpr int kDdpTrainGlobalBatch = 48;  // divisible by the 3 ranks

const NamedHosts::Layout kThreeHosts{{"node-a", "node-b", "node-c"}, "node-a", ""};

class OnNamedHosts : public NamedHostsTest {
 protected:
  // A static node: --nnodes 3, node rank `rank`, the store on `master`.
  agent::testing::Child& static_node(const std::string& host, int rank, const std::string& master,
                                     int nproc, std::vector<std::string> worker,
                                     int rdzv_timeout_s = 60,
                                     const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args{"--nnodes",         "3",
                                  "--node-rank",      std::to_string(rank),
                                  "--master-addr",    master,
                                  "--master-port",    kStorePort,
                                  "--nproc-per-node", std::to_string(nproc),
                                  "--rdzv-conf",      "timeout=" + std::to_string(rdzv_timeout_s)};
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {"--no-python", DIST_TEST_WORKER_BIN});
    args.insert(args.end(), worker.begin(), worker.end());
    return hosts_->start(host, DIST_LAUNCH_BIN, args, log(host));
  }

  // An elastic node of job `job` at `endpoint`; its workers wait for a world of `world`.
  agent::testing::Child& elastic_node(const std::string& host, const std::string& name,
                                      const std::string& endpoint, const std::string& nnodes,
                                      int world) {
    return hosts_->start(host, DIST_LAUNCH_BIN,
                         {"--nnodes", nnodes, "--rdzv-endpoint", endpoint, "--rdzv-id", "job",
                          "--rdzv-conf", "join_timeout=40,last_call_timeout=1", "--nproc-per-node",
                          "1", "--no-python", DIST_TEST_WORKER_BIN, "env", path("env_" + name),
                          "exit-if-world", std::to_string(world), "0", "forever"},
                         log(name));
  }

  // The static job of every node in `logs` ended 0 and its workers saw `world` ranks and `master`.
  void expect_ranks(const std::vector<std::string>& env_files, int world,
                    const std::string& master) {
    std::set<std::string> ranks;
    for (const auto& file : env_files) {
      auto e = env(file);
      SCOPED_TRACE(file);
      EXPECT_EQ(e["WORLD_SIZE"], std::to_string(world));
      EXPECT_EQ(e["MASTER_ADDR"], master);
      ranks.insert(e["RANK"]);
    }
    EXPECT_EQ(ranks.size(), static_cast<std::size_t>(world));
  }

  // An elastic job's workers find their store on the round's node rank 0, by its host's name (as
  // torch's c10d rendezvous gives them): `hosts` maps each env file to its agent's host.
  void expect_elastic_ranks(const std::map<std::string, std::string>& hosts, int world) {
    std::string node_rank_0;
    for (const auto& [file, host] : hosts) {
      if (env(file)["GROUP_RANK"] == "0") node_rank_0 = host;
    }
    ASSERT_FALSE(node_rank_0.empty()) << "no worker of node rank 0";
    std::vector<std::string> files;
    for (const auto& [file, host] : hosts) files.push_back(file);
    expect_ranks(files, world, node_rank_0);
  }

  std::string output(const std::string& name) const {
    std::ifstream in(log(name));
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
};

TEST_F(OnNamedHosts, AStaticJobOnThreeHostsByName) {
  hosts(kThreeHosts);
  std::vector<agent::testing::Child*> nodes;
  const std::string hosts[] = {"node-a", "node-b", "node-c"};
  for (int rank : {2, 0, 1}) {
    nodes.push_back(&static_node(hosts[rank], rank, "node-a", 2,
                                 {"env", path("env_" + std::to_string(rank) + "_${local_rank}")}));
  }
  for (auto* n : nodes) EXPECT_EQ(n->wait(90s), 0) << n->output();
  expect_ranks({"env_0_0", "env_0_1", "env_1_0", "env_1_1", "env_2_0", "env_2_1"}, 6, "node-a");
  EXPECT_EQ(env("env_2_1")["RANK"], "5");
}

TEST_F(OnNamedHosts, AStaticJobWhoseMasterIsAnIPv6Name) {
  // Pending the agent: node 0 binds 0.0.0.0 for a name; a dual-stack wildcard (::) accepts the
  // other nodes' IPv6 connections.
  hosts(kThreeHosts);
  std::vector<agent::testing::Child*> nodes;
  const std::string hosts[] = {"node-b", "node-a", "node-c"};
  for (int rank : {0, 1, 2}) {
    nodes.push_back(&static_node(hosts[rank], rank, "node-b-v6", 1,
                                 {"env", path("env_" + std::to_string(rank))}, 20));
  }
  for (auto* n : nodes) EXPECT_EQ(n->wait(60s), 0) << n->output();
  expect_ranks({"env_0", "env_1", "env_2"}, 3, "node-b-v6");
}

TEST_F(OnNamedHosts, AnElasticJobAtAHostsName) {
  hosts(kThreeHosts);
  const std::string endpoint = std::string("node-b:") + kEndpointPort;
  auto& b = elastic_node("node-b", "b", endpoint, "2:3", 3);  // hosts the store: its own name
  auto& a = elastic_node("node-a", "a", endpoint, "2:3", 3);
  auto& c = elastic_node("node-c", "c", endpoint, "2:3", 3);
  for (auto* n : {&a, &b, &c}) EXPECT_EQ(n->wait(90s), 0) << n->output();
  expect_elastic_ranks({{"env_a", "node-a"}, {"env_b", "node-b"}, {"env_c", "node-c"}}, 3);
}

TEST_F(OnNamedHosts, AnElasticJobAtANameItsHostMapsToLoopback) {
  // Pending the agent: node-a resolves its own name to 127.0.1.1 and binds only that; the store's
  // host must bind the wildcard address and advertise the endpoint as given.
  hosts(kThreeHosts);
  const std::string endpoint = std::string("node-a:") + kEndpointPort;
  auto& a = elastic_node("node-a", "a", endpoint, "2:3", 3);
  auto& b = elastic_node("node-b", "b", endpoint, "2:3", 3);
  auto& c = elastic_node("node-c", "c", endpoint, "2:3", 3);
  for (auto* n : {&a, &b, &c}) EXPECT_EQ(n->wait(90s), 0) << n->output();
  expect_elastic_ranks({{"env_a", "node-a"}, {"env_b", "node-b"}, {"env_c", "node-c"}}, 3);
}

TEST_F(OnNamedHosts, AnElasticJobAtLocalhostOnOneHost) {
  // Two agents on one host, the endpoint `localhost` (which resolves to ::1 and 127.0.0.1).
  hosts(kThreeHosts);
  const std::string endpoint = std::string("localhost:") + kEndpointPort;
  auto& first = elastic_node("node-b", "first", endpoint, "2", 2);
  auto& second = elastic_node("node-b", "second", endpoint, "2", 2);
  for (auto* n : {&first, &second}) EXPECT_EQ(n->wait(60s), 0) << n->output();
  expect_elastic_ranks({{"env_first", "node-b"}, {"env_second", "node-b"}}, 2);
}

TEST_F(OnNamedHosts, ASpareOnAThirdHostLeavesWithTheJobsSuccess) {
  // 1:2 nodes on node-a (whose agent hosts the store) and node-b; node-c's agent comes as a spare
  // and waits for a place. The job ends well: node-a's agent keeps the store until the spare has
  // read the outcome, and the spare exits 0 having run nothing. last_call_timeout stays at its
  // default (30 s): the spare looks at the job's verdict more often than that.
  hosts(kThreeHosts);
  const std::string endpoint = std::string("node-a:") + kEndpointPort;
  const std::string go = path("go");
  const auto node = [&](const std::string& host, const std::string& name) -> auto& {
    return hosts_->start(
        host, DIST_LAUNCH_BIN,
        {"--nnodes", "1:2", "--rdzv-endpoint", endpoint, "--rdzv-id", "job", "--rdzv-conf",
         "join_timeout=60", "--nproc-per-node", "1", "--no-python", DIST_TEST_WORKER_BIN, "env",
         path("env_" + name), "wait-file", go, "exit", "0"},
        log(name));
  };
  auto& a = node("node-a", "a");
  auto& b = node("node-b", "b");
  ASSERT_TRUE(eventually(
      [&] { return env("env_a")["WORLD_SIZE"] == "2" && env("env_b")["WORLD_SIZE"] == "2"; }, 60s))
      << a.output() << b.output();
  auto& spare = node("node-c", "spare");
  ASSERT_TRUE(eventually(
      [&] { return spare.output().find("is full: waiting for a place") != std::string::npos; },
      60s))
      << spare.output();

  std::ofstream(go) << "1\n";
  EXPECT_EQ(a.wait(60s), 0) << a.output();
  EXPECT_EQ(b.wait(60s), 0) << b.output();
  EXPECT_EQ(spare.wait(60s), 0) << spare.output();
  EXPECT_NE(spare.output().find("the job already finished (round 0)"), std::string::npos)
      << spare.output();
  EXPECT_EQ(spare.output().find("connection lost"), std::string::npos) << spare.output();
  EXPECT_TRUE(env("env_spare").empty()) << "a worker ran on the spare";
  expect_elastic_ranks({{"env_a", "node-a"}, {"env_b", "node-b"}}, 2);
}

TEST_F(OnNamedHosts, AnUnresolvableMasterIsSaidWhileRetryingThenNamed) {
  // Pending the agent: resolution retried with a visible message every ~10 s until the
  // rendezvous timeout, then an error naming the name.
  hosts(kThreeHosts);
  auto& b = static_node("node-b", 1, "no-such-host", 1, {"exit", "0"}, 30);
  const bool said =
      eventually([&] { return output("node-b").find("no-such-host") != std::string::npos; }, 15s);
  EXPECT_TRUE(said) << "nothing said about the unresolvable name within 15 s:\n" << b.output();
  if (said) {
    EXPECT_EQ(::kill(b.pid(), 0), 0) << "gave up before the rendezvous timeout:\n" << b.output();
  }
  EXPECT_EQ(b.wait(60s), 1) << b.output();
  EXPECT_NE(b.output().find("no-such-host"), std::string::npos) << b.output();
}

TEST_F(OnNamedHosts, AStaticNodeRelaunchedWithItsRankRejoins) {
  // Pending the agent: node-c's agent dies; relaunched with node rank 2 while the job lives, it
  // rejoins and the job restarts once, job-wide, and ends 0.
  hosts(kThreeHosts);
  const std::string hosts[] = {"node-a", "node-b", "node-c"};
  auto node = [&](int rank) -> agent::testing::Child& {
    return static_node(hosts[rank], rank, "node-a", 1,
                       {"env", path("env_" + std::to_string(rank)), "pidfile",
                        path("pid_" + std::to_string(rank)), "sleep-if-attempt", "0", "600000"},
                       60, {"--max-restarts", "1"});
  };
  auto& a = node(0);
  auto& b = node(1);
  auto& c = node(2);
  ASSERT_TRUE(eventually(
      [&] {
        return fs::exists(path("pid_0")) && fs::exists(path("pid_1")) && fs::exists(path("pid_2"));
      },
      60s))
      << a.output() << b.output() << c.output();
  ::kill(c.pid(), SIGKILL);
  c.wait(10s);
  auto& again = node(2);  // its log replaces the killed agent's
  for (auto* n : {&a, &b, &again}) EXPECT_EQ(n->wait(90s), 0) << n->output();
  for (const char* file : {"env_0", "env_1", "env_2"}) {
    EXPECT_EQ(env(file)["TORCHELASTIC_RESTART_COUNT"], "1") << file;
  }
}

// ddp_train's final weights digest (every rank must agree).
std::string weights_digest(const std::vector<std::string>& outputs) {
  const std::regex line(R"(rank \d+ weights sha256 ([0-9a-f]{64}))");
  std::set<std::string> digests;
  std::string all;
  for (const auto& out : outputs) {
    all += out;
    for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator();
         ++it) {
      digests.insert((*it)[1]);
    }
  }
  EXPECT_EQ(digests.size(), 1u) << all;
  return digests.empty() ? "" : *digests.begin();
}

class SdkOnNamedHosts : public OnNamedHosts {
 protected:
  // ddp_train as static node `rank` of 3, one worker each, the store on `master`.
  agent::testing::Child& trainer(const std::string& host, int rank, const std::string& master,
                                 const std::map<std::string, std::string>& env = {}) {
    return hosts_->start(host, DIST_LAUNCH_BIN,
                         {"--nnodes", "3", "--node-rank", std::to_string(rank), "--master-addr",
                          master, "--master-port", kStorePort, "--rdzv-conf", "timeout=60",
                          "--no-python", DDP_TRAIN_BIN, "--epochs", std::to_string(kDdpTrainEpochs),
                          "--global-batch", std::to_string(kDdpTrainGlobalBatch)},
                         log("train_" + host), env);
  }
  // The digest of the same training as three workers on one host.
  std::string one_host_digest() {
    auto& solo = hosts_->start(
        "node-c", DIST_LAUNCH_BIN,
        {"--nproc-per-node", "3", "--no-python", DDP_TRAIN_BIN, "--epochs",
         std::to_string(kDdpTrainEpochs), "--global-batch", std::to_string(kDdpTrainGlobalBatch)},
        log("solo"));
    EXPECT_EQ(solo.wait(180s), 0) << solo.output();
    return weights_digest({solo.output()});
  }
};

TEST_F(SdkOnNamedHosts, GlooAcrossThreeHostsEndsAsOnOneHost) {
  hosts(kThreeHosts);
  const std::string hosts[] = {"node-b", "node-a", "node-c"};
  std::vector<agent::testing::Child*> nodes;
  for (int rank : {0, 1, 2}) nodes.push_back(&trainer(hosts[rank], rank, "node-b"));
  std::vector<std::string> outputs;
  for (auto* n : nodes) {
    EXPECT_EQ(n->wait(180s), 0) << n->output();
    outputs.push_back(n->output());
  }
  EXPECT_EQ(weights_digest(outputs), one_host_digest());
}

TEST_F(SdkOnNamedHosts, AMasterThatMapsItsOwnNameToLoopbackIsAClearErrorOrTheInterface) {
  // node-a resolves node-a to 127.0.1.1: its rank would listen on loopback. Every rank says so at
  // once, naming that rank and the fix (whichever rank's error reaches the report first: node 0's
  // own worker may be stopped for the others' failure before it says it); GLOO_SOCKET_IFNAME (an
  // interface name, no address) fixes it.
  hosts(kThreeHosts);
  const std::string hosts[] = {"node-a", "node-b", "node-c"};
  {
    std::vector<agent::testing::Child*> nodes;
    for (int rank : {0, 1, 2}) nodes.push_back(&trainer(hosts[rank], rank, "node-a"));
    for (auto* n : nodes) EXPECT_NE(n->wait(120s), 0) << n->output();
    for (const char* says : {"a loopback address the other hosts cannot reach (1 of 3 ranks: "
                             "rank 0 at 127.",
                             "GLOO_SOCKET_IFNAME"}) {
      EXPECT_NE(nodes[0]->output().find(says), std::string::npos) << nodes[0]->output();
    }
  }
  std::vector<agent::testing::Child*> nodes;
  for (int rank : {0, 1, 2}) {
    nodes.push_back(&trainer(hosts[rank], rank, "node-a", {{"GLOO_SOCKET_IFNAME", "eth0"}}));
  }
  std::vector<std::string> outputs;
  for (auto* n : nodes) {
    EXPECT_EQ(n->wait(180s), 0) << n->output();
    outputs.push_back(n->output());
  }
  EXPECT_EQ(weights_digest(outputs), one_host_digest());
}

}  // namespace
}  // namespace dist::testing
