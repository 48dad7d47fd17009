// The command line as a user meets it: the real dist-launch binary, and the parser behind it.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "dist/agent/devices.h"
#include "dist/launcher/cli.h"

namespace {

struct RunResult {
  int exit_code;
  std::string output;  // stdout and stderr
};

RunResult run_binary(const std::string& args) {
  const std::string command = std::string(DIST_LAUNCH_BIN) + " " + args + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  std::string output;
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe)) output += buffer.data();
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

TEST(LauncherCli, HelpPrintsUsageAndExitsZero) {
  const RunResult r = run_binary("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("Usage: dist-launch"), std::string::npos) << r.output;
}

TEST(LauncherCli, VersionPrintsTheProjectVersion) {
  const RunResult r = run_binary("--version");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output, "dist-launch " + dist::launcher::version() + "\n");
}

TEST(LauncherCli, UnknownFlagIsAOneLineErrorWithExitTwo) {
  const RunResult r = run_binary("--no-such-flag");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_NE(r.output.find("dist-launch: error:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--no-such-flag"), std::string::npos) << r.output;
}

TEST(LauncherCli, ParserReportsErrorsToTheErrorStream) {
  std::ostringstream out, err;
  const auto outcome = dist::launcher::parse_command_line({"--bogus"}, out, err);
  EXPECT_TRUE(outcome.exit_now);
  EXPECT_EQ(outcome.exit_code, dist::launcher::kExitUsage);
  EXPECT_TRUE(out.str().empty());
  EXPECT_NE(err.str().find("--bogus"), std::string::npos);
}

dist::launcher::CliOutcome parse(std::vector<std::string> args, std::string* error = nullptr) {
  std::ostringstream out, err;
  args.insert(args.end(), {"--no-python", "true"});
  auto outcome = dist::launcher::parse_command_line(args, out, err);
  if (error) *error = err.str();
  return outcome;
}

TEST(LauncherCli, AnEndpointMeansDynamicRendezvousWithTorchrunsDefaultPort) {
  auto o = parse({"--nnodes", "1:4", "--rdzv-endpoint", "node7", "--rdzv-id", "job7"});
  ASSERT_FALSE(o.exit_now);
  EXPECT_TRUE(o.config.elastic);
  EXPECT_EQ(o.config.min_nodes, 1);
  EXPECT_EQ(o.config.max_nodes, 4);
  EXPECT_EQ(o.config.master_addr, "node7");
  EXPECT_EQ(o.config.master_port, 29400);
  EXPECT_EQ(o.config.run_id, "job7");

  o = parse({"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "[::1]:1234",
             "--rdzv-conf", "join_timeout=5,last_call_timeout=0.5,is_host=0"});
  ASSERT_FALSE(o.exit_now);
  EXPECT_TRUE(o.config.elastic);
  EXPECT_EQ(o.config.master_addr, "::1");
  EXPECT_EQ(o.config.master_port, 1234);
  EXPECT_EQ(o.config.join_timeout, std::chrono::seconds(5));
  EXPECT_EQ(o.config.last_call_timeout, std::chrono::milliseconds(500));
  EXPECT_EQ(o.config.is_host, false);

  std::string notice;
  o = parse({"--nnodes", "1:2", "--rdzv-endpoint", "a", "--node-rank", "1"}, &notice);
  ASSERT_FALSE(o.exit_now);
  EXPECT_EQ(o.config.node_rank, 0);
  EXPECT_NE(notice.find("--node-rank is ignored with dynamic rendezvous"), std::string::npos);
}

TEST(LauncherCli, StaticRendezvousStaysStatic) {
  auto o = parse({"--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1"});
  ASSERT_FALSE(o.exit_now);
  EXPECT_FALSE(o.config.elastic);
  EXPECT_EQ(o.config.node_rank, 1);
  // An explicit static backend with an endpoint: torchrun takes the store's address from it.
  o = parse({"--nnodes", "2", "--rdzv-backend", "static", "--rdzv-endpoint", "10.0.0.2:4000"});
  ASSERT_FALSE(o.exit_now);
  EXPECT_FALSE(o.config.elastic);
  EXPECT_EQ(o.config.master_addr, "10.0.0.2");
  EXPECT_EQ(o.config.master_port, 4000);
  // --standalone: one node, its own store, whatever the backend says.
  o = parse({"--standalone"});
  ASSERT_FALSE(o.exit_now);
  EXPECT_FALSE(o.config.elastic);
}

TEST(LauncherCli, RendezvousMistakesAreOneLineErrors) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--nnodes", "1:2"}, "a range needs dynamic rendezvous"},
      {{"--nnodes", "3:2"}, "MIN must not exceed MAX"},
      {{"--rdzv-backend", "etcd", "--rdzv-endpoint", "a:1"},
       "speaks etcd's v2 API, which etcd 3.4+ turns off by default"},
      {{"--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "a:1"}, "use --rdzv-backend etcd-v3"},
      {{"--rdzv-backend", "etcd-v3"}, "needs --rdzv-endpoint with the etcd members"},
      {{"--rdzv-backend", "etcd-v3", "--rdzv-endpoint", "a:1", "--rdzv-conf", "user=u"},
       "needs password_file"},
      {{"--rdzv-conf", "cacert=/x"}, "is for --rdzv-backend etcd-v3"},
      {{"--rdzv-backend", "zookeeper"}, "must be static, c10d or etcd-v3"},
      {{"--rdzv-endpoint", "[::1"}, "missing ]"},
      {{"--rdzv-endpoint", ":80"}, "has no host"},
      {{"--rdzv-endpoint", "a:99999"}, "not below 65536"},
      {{"--rdzv-endpoint", "a:1", "--rdzv-conf", "last_call_timeout=-1"}, "positive number"},
      {{"--rdzv-endpoint", "a:1", "--rdzv-conf", "is_host=maybe"}, "must be 1 or 0"},
      {{"--rdzv-conf", "bogus=1"}, "is not one of key=value"},
  };
  for (const auto& [args, message] : cases) {
    std::string error;
    const auto o = parse(args, &error);
    EXPECT_TRUE(o.exit_now) << args[0];
    EXPECT_EQ(o.exit_code, dist::launcher::kExitUsage) << error;
    EXPECT_NE(error.find(message), std::string::npos) << error;
    EXPECT_EQ(std::count(error.begin(), error.end(), '\n'), 1) << error;
  }
}

TEST(LauncherCli, EtcdV3IsDynamicWithTheMembersAndItsOwnConfKeys) {
  const auto o =
      parse({"--nnodes", "2:3", "--rdzv-backend", "etcd-v3", "--rdzv-endpoint", "h1:2379,h2:2379",
             "--rdzv-conf", "cacert=/ca.pem,join_timeout=5,etcd_prefix=/jobs"});
  ASSERT_FALSE(o.exit_now);
  const auto& c = o.config;
  EXPECT_TRUE(c.elastic);
  EXPECT_EQ(c.rdzv_backend, "etcd-v3");
  EXPECT_EQ(c.etcd_endpoints, "h1:2379,h2:2379");
  EXPECT_EQ(c.etcd_conf.at("cacert"), "/ca.pem");
  EXPECT_EQ(c.etcd_conf.at("etcd_prefix"), "/jobs");
  EXPECT_EQ(c.join_timeout, std::chrono::seconds(5));
}

TEST(LauncherCli, AQuotedRdzvConfIsUnquotedAsTorchrunsUsersPassIt) {
  const auto o = parse({"--nnodes", "1:2", "--rdzv-endpoint", "h:1", "--rdzv-conf",
                        "'join_timeout=5,last_call_timeout=1,timeout=5'"});
  ASSERT_FALSE(o.exit_now);
  const auto& c = o.config;
  EXPECT_EQ(c.join_timeout, std::chrono::seconds(5));
  EXPECT_EQ(c.last_call_timeout, std::chrono::seconds(1));
  EXPECT_EQ(c.rdzv_timeout, std::chrono::seconds(5));
}

TEST(LauncherCli, PlacementFlagsReachTheConfig) {
  std::string notice;
  auto o = parse({"--nproc-per-node", "2", "--numa-binding", "exclusive"}, &notice);
  ASSERT_FALSE(o.exit_now) << notice;
  EXPECT_EQ(o.config.placement.numa_binding, dist::agent::NumaBinding::kExclusive);
  if (!std::getenv("OMP_NUM_THREADS")) {
    EXPECT_TRUE(o.config.omp_threads_defaulted);
    EXPECT_NE(notice.find("each worker's bound core count"), std::string::npos) << notice;
  }
  o = parse({"--nproc-per-node", "2", "--cpu-bind", "0;0-1"});
  ASSERT_FALSE(o.exit_now);
  EXPECT_EQ(o.config.placement.cpu_bind, dist::agent::CpuBind::kList);
  EXPECT_EQ(o.config.placement.cpu_lists, (std::vector<std::vector<int>>{{0}, {0, 1}}));
  o = parse({"--numa_binding", "node", "--cpu_bind", "none"});  // torchrun's spellings
  ASSERT_FALSE(o.exit_now);
  EXPECT_EQ(o.config.placement.cpu_bind, dist::agent::CpuBind::kNone);
  EXPECT_EQ(o.config.placement.numa_binding, dist::agent::NumaBinding::kNode);
}

TEST(LauncherCli, DeviceFlagsFollowTheGpusThisNodeHas) {
  const dist::agent::Accelerators found = dist::agent::discover_accelerators();
  std::string error;
  auto o = parse({"--nproc-per-node", "gpu", "--devices", "0,1", "--virtual-local-rank"}, &error);
  if (found.count() >= 2) {
    ASSERT_FALSE(o.exit_now) << error;
    EXPECT_EQ(o.config.nproc_per_node, 2);
    EXPECT_EQ(o.config.devices.devices, (std::vector<int>{0, 1}));
    EXPECT_TRUE(o.config.devices.virtual_local_rank);
  } else {
    EXPECT_EQ(o.exit_code, dist::launcher::kExitUsage);
    EXPECT_NE(error.find("GPU"), std::string::npos) << error;
  }
  o = parse({"--nproc-per-node", "gpu"}, &error);
  if (found.count() == 0) {
    EXPECT_EQ(o.exit_code, dist::launcher::kExitUsage);
    EXPECT_NE(error.find("--nproc-per-node gpu: no GPU found"), std::string::npos) << error;
  } else {
    EXPECT_EQ(o.config.nproc_per_node, found.count());
  }
}

TEST(LauncherCli, DeviceAndPlacementMistakesAreOneLineErrors) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--numa-binding", "rack"}, "--numa-binding takes node, socket, exclusive or core-complex"},
      {{"--cpu-bind", "0-1;x"}, "is not a CPU list like 0-3,8"},
      {{"--nproc-per-node", "3", "--cpu-bind", "0;1"}, "gives 2 CPU list(s) for 3 workers"},
      {{"--cpu-bind", "core", "--numa-binding", "node"}, "use one of them"},
      {{"--nproc-per-node", "4096", "--cpu-bind", "core"}, "--cpu-bind core: 4096 workers"},
      {{"--cpu-bind", "0;4095", "--nproc-per-node", "2"}, "CPU 4095 of local rank 1"},
      {{"--devices", "0,x"}, "--devices must be a non-negative integer"},
      {{"--nproc-per-node", "2", "--devices", "1,1"}, "--devices"},
      {{"--nproc-per-node", "1", "--devices", "9999"}, "--devices"},
  };
  for (const auto& [args, message] : cases) {
    std::string error;
    const auto o = parse(args, &error);
    EXPECT_TRUE(o.exit_now) << args[0];
    EXPECT_EQ(o.exit_code, dist::launcher::kExitUsage) << error;
    EXPECT_NE(error.find(message), std::string::npos) << error;
    EXPECT_EQ(std::count(error.begin(), error.end(), '\n'), 1) << error;
  }
}

}  // namespace
