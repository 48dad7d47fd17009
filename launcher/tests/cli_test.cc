// The command line as a user meets it: the real dist-launch binary, and the parser behind it.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "dist/launcher/cli.h"
#include "logging.h"
#include "resources/devices.h"

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

// Every option name bash completes (its -W word list), in order, repeats kept.
std::vector<std::string> completed_names() {
  const RunResult completion = run_binary("--print-completion bash");
  EXPECT_EQ(completion.exit_code, 0) << completion.output;
  const auto words = completion.output.find("-W \"");
  EXPECT_NE(words, std::string::npos) << completion.output;
  if (words == std::string::npos) return {};
  std::istringstream list(
      completion.output.substr(words + 4, completion.output.find('"', words + 4) - words - 4));
  std::vector<std::string> names;
  for (std::string name; list >> name;) names.push_back(name);
  return names;
}

// The options are declared in groups (one per concern, each under its heading in --help): each
// name is declared once across them, and --help is one option ("--hel" abbreviates it).
TEST(LauncherCli, EveryOptionIsNamedOnceAcrossItsGroups) {
  std::map<std::string, int> seen;
  for (const auto& name : completed_names()) ++seen[name];
  EXPECT_GT(seen.size(), 90u);  // every group was read (97 names today)
  for (const auto& [name, count] : seen) EXPECT_EQ(count, 1) << name;
  const RunResult help = run_binary("--hel");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_NE(help.output.find("\nNodes and rendezvous:\n"), std::string::npos) << help.output;
}

// As torchrun's: every long option has both spellings, dist-launch's own too (--event_log was
// taken for an abbreviation of --event_log_handler, and refused as one).
TEST(LauncherCli, EveryLongOptionHasBothSpellings) {
  const auto names = completed_names();
  const std::set<std::string> seen(names.begin(), names.end());
  ASSERT_GT(seen.size(), 90u);
  for (const auto& name : seen) {
    if (!name.starts_with("--") || name.find_first_of("-_", 2) == std::string::npos) continue;
    std::string other = name;
    const bool dashed = name.find('-', 2) != std::string::npos;
    std::replace(other.begin() + 2, other.end(), dashed ? '-' : '_', dashed ? '_' : '-');
    EXPECT_TRUE(seen.contains(other)) << name << " has no " << other;
  }
  std::ostringstream out, err;
  const auto o =
      dist::launcher::parse_command_line({"--event_log", "/tmp/events.jsonl", "--hang_timeout",
                                          "45", "--no_step_hook", "--no-python", "/bin/true"},
                                         out, err);
  ASSERT_FALSE(o.exit_now) << err.str();
  EXPECT_EQ(o.config.telemetry.event_log, "/tmp/events.jsonl");
  EXPECT_EQ(o.config.watchdogs.hang_timeout, std::chrono::milliseconds(45000));
  EXPECT_FALSE(o.config.watchdogs.step_hook);
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

// Values no job has, a typo's: a one-line usage error, not a worker table or a list of store
// keys the size of the number (an abort for memory; a loop that no signal could end); an
// endpoint that is a list or a URL, not a host name retried for join_timeout.
TEST(LauncherCli, OutlandishSizesAndEndpointsAreUsageErrors) {
  for (const char* bad : {"--nproc-per-node 2147483647 x.py", "--nproc-per-node 4097 x.py",
                          "--nnodes 2147483647 --node-rank 0 --master-addr 127.0.0.1 x.py",
                          "--nnodes 1:65537 --rdzv-endpoint 127.0.0.1:29400 x.py",
                          "--nnodes 1:2 --rdzv-endpoint a:1,b:2 x.py",
                          "--nnodes 1:2 --rdzv-endpoint http://127.0.0.1:29400 x.py"}) {
    SCOPED_TRACE(bad);
    const RunResult r = run_binary(bad);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_NE(r.output.find("dist-launch: error:"), std::string::npos) << r.output;
  }
}

// What is wrong with a value is said as it is: a number past its type's range is "out of range",
// not "must be a positive integer"; a signal no process can catch is not passed on.
TEST(LauncherCli, AValueOutOfRangeOrASignalThatCannotBeCaughtIsSaidSo) {
  const std::pair<const char*, const char*> cases[] = {
      {"--max-restarts 99999999999 x.py", "--max-restarts 99999999999 is out of range"},
      {"--exit-barrier-timeout 1e12 x.py", "--exit-barrier-timeout 1e12 s is out of range"},
      {"--signals-to-handle SIGTERM,SIGKILL x.py", "SIGKILL cannot be caught"},
      {"--signals-to-handle SIGSTOP x.py", "SIGSTOP cannot be caught"}};
  for (const auto& [bad, said] : cases) {
    SCOPED_TRACE(bad);
    const RunResult r = run_binary(bad);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_NE(r.output.find(said), std::string::npos) << r.output;
  }
}

TEST(LauncherCli, StatusWatchOptionsAreCheckedBeforeAnyConnection) {
  for (const char* bad : {"--watch --interval 0", "--watch --interval soon", "--watch --count -1",
                          "--watch --interval nan"}) {
    SCOPED_TRACE(bad);
    const RunResult r = run_binary(std::string("status --rdzv-endpoint 127.0.0.1:29400 ") + bad);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_NE(r.output.find("dist-launch status: error:"), std::string::npos) << r.output;
  }
  const RunResult help = run_binary("status --help");
  EXPECT_EQ(help.exit_code, 0);
  for (const char* option : {"--watch", "--interval", "--count", "--json"}) {
    EXPECT_NE(help.output.find(option), std::string::npos) << option << "\n" << help.output;
  }
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
  EXPECT_EQ(o.config.keep_alive_max_attempt, 30)
      << "a job of a fixed size, which cannot go on without a node, rides out 30 s of outage";
  EXPECT_FALSE(o.config.keep_alive_max_attempt_given);
  o = parse({"--nnodes", "2", "--node-rank", "1", "--master-addr", "a"});
  ASSERT_FALSE(o.exit_now);
  EXPECT_EQ(o.config.keep_alive_max_attempt, 30) << "a static job: the same";
  o = parse({"--nnodes", "1:2", "--rdzv-endpoint", "a:1"});
  ASSERT_FALSE(o.exit_now);
  EXPECT_EQ(o.config.keep_alive_max_attempt, 8)
      << "an elastic job goes on without a lost node: it notices it within 10 s";
  o = parse(
      {"--nnodes", "1:2", "--rdzv-endpoint", "a:1", "--rdzv-conf", "keep_alive_max_attempt=3"});
  ASSERT_FALSE(o.exit_now);
  EXPECT_EQ(o.config.keep_alive_max_attempt, 3);
  EXPECT_TRUE(o.config.keep_alive_max_attempt_given) << "etcd's leases follow a given one";

  // A key no backend of ours reads is ignored, as torchrun's backends ignore it: said.
  std::string ignored;
  o = parse({"--nnodes", "1:2", "--rdzv-endpoint", "a:1", "--rdzv-conf", "foo=bar,join_timeout=7"},
            &ignored);
  ASSERT_FALSE(o.exit_now) << ignored;
  EXPECT_EQ(o.config.join_timeout, std::chrono::seconds(7));
  EXPECT_NE(ignored.find("warning: --rdzv-conf foo=bar: no rendezvous of dist-launch reads this "
                         "key; ignored"),
            std::string::npos)
      << ignored;

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
      {{"--rdzv-endpoint", "a:99999"}, "is not a port (0-65535)"},
      {{"--rdzv-endpoint", "a:1", "--rdzv-conf", "last_call_timeout=-1"}, "positive number"},
      {{"--rdzv-endpoint", "a:1", "--rdzv-conf", "is_host=maybe"}, "must be 1 or 0"},
      {{"--rdzv-conf", "bogus"}, "'bogus' is not key=value (keys: "},
      {{"--rdzv-endpoint", "a:1", "--rdzv-conf", "store_type=file"},
       "--rdzv-conf store_type=file: dist-launch's c10d rendezvous runs over its TCP store only"},
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
  EXPECT_EQ(c.rdzv_backend, dist::agent::RendezvousBackend::kEtcdV3);
  EXPECT_EQ(c.etcd.endpoints, (std::vector<std::string>{"h1:2379", "h2:2379"}));
  EXPECT_EQ(c.etcd.ca_file, "/ca.pem");
  EXPECT_EQ(c.etcd.prefix, "/jobs");
  EXPECT_EQ(c.join_timeout, std::chrono::seconds(5));
}

TEST(LauncherCli, EtcdConfKeysAreTypedOnceAndTheirMistakesAreOneLine) {
  const auto o = parse({"--nnodes", "1:2", "--rdzv-backend", "etcd-v3", "--rdzv-endpoint",
                        " h1:2379, h2:2379 ,h3", "--rdzv-conf",
                        "cert=/c.crt,key=/c.key,protocol=https,unavailable_timeout=2.5,"
                        "member_order=given"});
  ASSERT_FALSE(o.exit_now);
  const auto& e = o.config.etcd;
  EXPECT_EQ(e.endpoints, (std::vector<std::string>{"h1:2379", "h2:2379", "h3"}));
  EXPECT_EQ(e.cert_file, "/c.crt");
  EXPECT_EQ(e.key_file, "/c.key");
  EXPECT_EQ(e.protocol, "https");
  EXPECT_EQ(e.unavailable_timeout, std::chrono::milliseconds(2500));
  EXPECT_FALSE(e.spread_over_members);
  const std::vector<std::pair<std::string, std::string>> bad{
      {"protocol=ftp", "http or https"},
      {"unavailable_timeout=0", "a positive number of seconds"},
      {"unavailable_timeout=soon", "a positive number of seconds"},
      {"etcd_prefix=/", "a non-empty prefix"},
      {"member_order=random", "spread or given"},
      {"password_file=/nonexistent", "needs user=<name>"},
      {"user=root,password_file=/nonexistent/pw", "cannot read the password"}};
  for (const auto& [conf, message] : bad) {
    std::string error;
    const auto r = parse({"--nnodes", "1:2", "--rdzv-backend", "etcd-v3", "--rdzv-endpoint",
                          "h1:2379", "--rdzv-conf", conf},
                         &error);
    EXPECT_TRUE(r.exit_now) << conf;
    EXPECT_EQ(r.exit_code, dist::launcher::kExitUsage) << conf;
    EXPECT_NE(error.find(message), std::string::npos) << conf << ": " << error;
    EXPECT_EQ(std::count(error.begin(), error.end(), '\n'), 1) << error;
  }
}

TEST(LauncherCli, TorchrunsOtherRdzvConfKeysAreAccepted) {
  const auto o = parse({"--nnodes", "1:2", "--rdzv-endpoint", "h:1", "--rdzv-conf",
                        "heartbeat_timeout=30,cas_backoff_max_seconds=0.5,store_type=tcp,"
                        "close_timeout=5,read_timeout=60"});
  EXPECT_FALSE(o.exit_now);
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

// LOGLEVEL=ERROR (or CRITICAL) hides the command line's warnings too, as torchrun prints nothing
// then; a name that is no level hides nothing (spdlog took it for "off").
TEST(LauncherCli, LoglevelErrorHidesTheCommandLinesWarnings) {
  const char* before = std::getenv("LOGLEVEL");
  const std::string kept = before ? before : "";
  std::string said;
  for (const char* level : {"ERROR", "critical", "bogus", "warning", ""}) {
    SCOPED_TRACE(level);
    ::setenv("LOGLEVEL", level, 1);
    const auto o = parse({"--nproc-per-node", "2", "--event-log-handler", "console"}, &said);
    ASSERT_FALSE(o.exit_now) << said;
    const bool hidden = std::string(level) == "ERROR" || std::string(level) == "critical";
    EXPECT_EQ(said.find("warning: --event-log-handler console") == std::string::npos, hidden)
        << said;
    EXPECT_EQ(dist::launcher::warnings_hidden(), hidden);
  }
  if (before) {
    ::setenv("LOGLEVEL", kept.c_str(), 1);
  } else {
    ::unsetenv("LOGLEVEL");
  }
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

// ------------------------------------------------------------------------------------------------
// torchrun 2.x's command line (argparse): abbreviations, unknown options, its flags.

TEST(LauncherCli, LongOptionsMayBeAbbreviatedToAUniquePrefixAsArgparseAllows) {
  auto o = parse({"--redirect=3", "--te", "1", "--max-rest", "2", "--nproc", "3", "-r0:1"});
  ASSERT_FALSE(o.exit_now);
  EXPECT_EQ(o.config.max_restarts, 2);
  EXPECT_EQ(o.config.nproc_per_node, 3);  // --nproc-per-node and --nproc_per_node: one option
  EXPECT_TRUE(o.config.tee.stdout_stream);
  EXPECT_FALSE(o.config.tee.stderr_stream);
  ASSERT_EQ(o.config.redirects_by_rank.count(0), 1u) << "the last -r wins, as with argparse";
  EXPECT_TRUE(o.config.redirects_by_rank.at(0).stdout_stream);
  // After the training script, everything is the script's.
  std::ostringstream out, err;
  o = dist::launcher::parse_command_line({"--no-python", "true", "--redirect=3", "--bogus"}, out,
                                         err);
  ASSERT_FALSE(o.exit_now) << err.str();
  EXPECT_EQ(o.config.worker_argv, (std::vector<std::string>{"true", "--redirect=3", "--bogus"}));
  // One `--` right after it is dropped, as torchrun's argparse drops it; a later one is the
  // script's.
  o = dist::launcher::parse_command_line({"--no-python", "true", "--", "--a", "--", "b"}, out, err);
  ASSERT_FALSE(o.exit_now) << err.str();
  EXPECT_EQ(o.config.worker_argv, (std::vector<std::string>{"true", "--a", "--", "b"}));
  o = dist::launcher::parse_command_line({"--no-python", "--", "true", "--", "x"}, out, err);
  ASSERT_FALSE(o.exit_now) << err.str();
  EXPECT_EQ(o.config.worker_argv, (std::vector<std::string>{"true", "--", "x"}));
}

TEST(LauncherCli, AmbiguousAndUnknownOptionsAreOneLineErrorsThatSayWhy) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--rdzv=x"},
       "ambiguous option '--rdzv=x' could match --rdzv-backend, --rdzv-endpoint, --rdzv-id, "
       "--rdzv-conf"},
      {{"--nprocs-per-node", "2"},
       "unknown option '--nprocs-per-node': did you mean --nproc-per-node?"},
      {{"--mastr_addr", "h"}, "did you mean --master-addr?"},
      {{"--use_env"}, "torch.distributed.launch's --use-env: dist-launch, like torchrun, always"},
      {{"--local-rank=0"}, "is the worker's own option"},
      {{"--nprocs", "2"},
       "torch.multiprocessing.spawn's nprocs: dist-launch's (and torchrun's) is "
       "--nproc-per-node"},
      {{"--num_processes", "4"}, "accelerate's --num-processes counts the whole job"},

      {{"--frobnicate"}, "unknown option '--frobnicate' (options go before the training script"},
      {{"-x"}, "unknown option '-x'"},
  };
  for (const auto& [args, message] : cases) {
    SCOPED_TRACE(args[0]);
    std::string error;
    const auto o = parse(args, &error);
    EXPECT_EQ(o.exit_code, dist::launcher::kExitUsage) << error;
    EXPECT_NE(error.find(message), std::string::npos) << error;
    EXPECT_EQ(std::count(error.begin(), error.end(), '\n'), 1) << error;
    EXPECT_EQ(error.find("not found"), std::string::npos) << error;
  }
}

// The launcher's options after the script are the script's, as with torchrun, and said.
TEST(LauncherCli, LaunchersOptionsAfterTheScriptGoToItAndAreSaid) {
  std::ostringstream out, err;
  const auto none = dist::launcher::parse_command_line({}, out, err);
  EXPECT_EQ(none.exit_code, dist::launcher::kExitUsage);
  EXPECT_NE(err.str().find("no training script given (dist-launch [options] SCRIPT [args...]; "
                           "see dist-launch --help)"),
            std::string::npos)
      << err.str();
  err.str("");
  auto o = dist::launcher::parse_command_line({"--no-python", "true", "--nproc_per_node", "2",
                                               "--nnodes=2", "--lr", "0.1", "--nnodes", "3"},
                                              out, err);
  ASSERT_FALSE(o.exit_now) << err.str();
  EXPECT_EQ(o.config.nproc_per_node, 1);
  EXPECT_EQ(o.config.worker_argv.size(), 8u);
  EXPECT_EQ(err.str(),
            "[dist-launch] warning: --nproc-per-node, --nnodes after the training script 'true' "
            "go to the script, not to dist-launch (its options go before the script; `true -- "
            "...` passes them on without this warning)\n");
  std::ostringstream quiet;
  o = dist::launcher::parse_command_line({"--no-python", "true", "--lr", "0.1", "--", "--nnodes"},
                                         out, quiet);
  ASSERT_FALSE(o.exit_now) << quiet.str();
  EXPECT_EQ(quiet.str(), "") << "a script's own options, and any after its --, are not said";
}

// Out-of-range numbers say what the flag takes, in words (CLI11's range checks printed 1.8e308 in
// full).
TEST(LauncherCli, NumbersOutOfRangeAreSaidInWords) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--max-restarts", "-1"}, "--max-restarts must be a non-negative integer, got '-1'"},
      {{"--node-rank", "-1"}, "--node-rank must be a non-negative integer, got '-1'"},
      {{"--shutdown-timeout", "-1"},
       "--shutdown-timeout must be a non-negative number of seconds, got '-1'"},
      {{"--exit-barrier-timeout", "0"},
       "--exit-barrier-timeout must be a positive number of seconds, got '0'"},
      {{"--monitor-interval", "-0.5"}, "--monitor-interval must be a non-negative number"},
      {{"--master-port", "70000"}, "--master-port 70000 is not below 65536"},
      {{"--master-port", "-1"}, "--master-port must be a non-negative integer, got '-1'"},
  };
  for (const auto& [args, message] : cases) {
    SCOPED_TRACE(args[0]);
    std::string error;
    const auto o = parse(args, &error);
    EXPECT_EQ(o.exit_code, dist::launcher::kExitUsage) << error;
    EXPECT_NE(error.find(message), std::string::npos) << error;
    EXPECT_EQ(error.find("00000000"), std::string::npos) << error;
  }
  auto o = parse({"--shutdown-timeout", "0", "--max-restarts", "0"});
  ASSERT_FALSE(o.exit_now);
  EXPECT_EQ(o.config.shutdown_timeout, std::chrono::milliseconds(0));
}

TEST(LauncherCli, ShutdownTimeoutFallsBackToTorchsVariable) {
  ::setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7", 1);
  auto o = parse({});
  auto flag = parse({"--shutdown-timeout", "2"});
  ::unsetenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
  ASSERT_FALSE(o.exit_now);
  EXPECT_EQ(o.config.shutdown_timeout, std::chrono::seconds(7));
  EXPECT_EQ(flag.config.shutdown_timeout, std::chrono::seconds(2));
  EXPECT_EQ(parse({}).config.shutdown_timeout, std::chrono::seconds(30));
}

TEST(LauncherCli, LayoutsTheNodeCannotHaveAreRejected) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--standalone", "--nnodes", "2"}, "--standalone runs a single node, but --nnodes 2"},
      {{"--standalone", "--nnodes", "1:3"}, "--standalone runs a single node"},
      {{"--nnodes", "2", "--master-port", "0"}, "works on a single node only"},
      {{"--nnodes", "1:2", "--rdzv-endpoint", "h:0"}, "--rdzv-endpoint h:0 asks for a free port"},
      {{"--nnodes", "1", "--rdzv-endpoint", "h:0", "--rdzv-conf", "is_host=0"},
       "with is_host=0: only the agent that hosts the store"},
  };
  for (const auto& [args, message] : cases) {
    SCOPED_TRACE(args[0] + " " + args[1]);
    std::string error;
    const auto o = parse(args, &error);
    EXPECT_EQ(o.exit_code, dist::launcher::kExitUsage) << error;
    EXPECT_NE(error.find(message), std::string::npos) << error;
  }
}

TEST(LauncherCli, PortZeroIsAFreePortOnOneNode) {
  auto o = parse({"--master-port", "0"});
  ASSERT_FALSE(o.exit_now);
  EXPECT_EQ(o.config.master_port, 0);
  o = parse({"--rdzv-endpoint", "localhost:0"});
  ASSERT_FALSE(o.exit_now);
  EXPECT_TRUE(o.config.elastic);
  EXPECT_EQ(o.config.master_port, 0);
}

TEST(LauncherCli, TorchrunsLogFlagsReachTheConfig) {
  auto o = parse({"--log_line_prefix_template", "[${rank}]: ", "--console-prefix", "tee",
                  "--duplicate-stdout-filters", "apple,,pie,orange,", "--duplicate_stderr_filters",
                  "", "--logs-specs", "default", "--event-log-handler", "null"});
  ASSERT_FALSE(o.exit_now);
  EXPECT_EQ(o.config.log_line_prefix_template, "[${rank}]: ");
  EXPECT_EQ(o.config.console_prefix, dist::agent::ConsolePrefix::kTee);
  EXPECT_EQ(o.config.duplicate_stdout_filters, (std::vector<std::string>{"apple,pie", "orange"}));
  EXPECT_TRUE(o.config.duplicate_stderr_filters.empty());

  ::setenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "${hostname}:${local_rank}|", 1);
  o = parse({});
  const auto flag_wins = parse({"--log-line-prefix-template", "x"});
  std::string error;
  ::setenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "${node}", 1);
  const auto bad_env = parse({}, &error);
  ::unsetenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
  EXPECT_EQ(o.config.log_line_prefix_template, "${hostname}:${local_rank}|");
  EXPECT_EQ(flag_wins.config.log_line_prefix_template, "x");
  EXPECT_EQ(bad_env.exit_code, dist::launcher::kExitUsage);
  EXPECT_NE(error.find("unknown variable 'node'"), std::string::npos) << error;
  EXPECT_NE(error.find("(from TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)"), std::string::npos) << error;
}

// Flags of the console alone that a torchrun launch script may pass: said, and the job runs, as
// under torchrun (a local rank the node does not have shows nothing).
TEST(LauncherCli, ConsoleFlagsThatCannotApplyHereAreSaidAndTheJobRuns) {
  std::string said;
  auto o = parse({"--nproc-per-node", "2", "--local-ranks-filter", "0,2,3"}, &said);
  ASSERT_FALSE(o.exit_now) << said;
  EXPECT_NE(said.find("warning: --local-ranks-filter: local ranks 2,3 do not exist on this node "
                      "(--nproc-per-node 2: local ranks 0 to 1): nothing of it is shown"),
            std::string::npos)
      << said;
  EXPECT_EQ(o.config.local_ranks_filter, (std::set<int>{0, 2, 3}));
  EXPECT_TRUE(o.config.shows_on_console(0));
  EXPECT_FALSE(o.config.shows_on_console(1));
  said.clear();
  o = parse({"--nproc-per-node", "2", "--local-ranks-filter", "2"}, &said);
  ASSERT_FALSE(o.exit_now) << said;
  EXPECT_FALSE(o.config.shows_on_console(0))
      << "a filter of absent ranks shows none, not every one";
  EXPECT_FALSE(o.config.shows_on_console(1));
  said.clear();  // (--hosts: each host's agent checks its own local ranks)
  o = parse({"--hosts", "a,b", "--nproc-per-node", "4", "--local-ranks-filter", "0,3"}, &said);
  ASSERT_FALSE(o.exit_now) << said;
  EXPECT_EQ(said.find("--local-ranks-filter"), std::string::npos) << said;
  said.clear();
  o = parse({"--event-log-handler", "console"}, &said);
  ASSERT_FALSE(o.exit_now) << said;
  EXPECT_NE(said.find("warning: --event-log-handler console: torchrun prints"), std::string::npos)
      << said;
}

TEST(LauncherCli, TorchrunFlagsDistLaunchCannotHonourAreRefusedWithTheReason) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--logs_specs=DOESNOT_EXIST"}, "--logs-specs DOESNOT_EXIST: torchrun loads a Python"},
      {{"--event-log-handler", "kafka"}, "torchrun knows null, dynamic_rendezvous and console"},
      {{"--log-line-prefix-template", "${node}"}, "unknown variable 'node'"},
      {{"--console-prefix", "some"}, "--console-prefix takes all, tee or none"},
      {{"--start-method", "thread"}, "--start-method"},
  };
  for (const auto& [args, message] : cases) {
    SCOPED_TRACE(args[0]);
    std::string error;
    const auto o = parse(args, &error);
    EXPECT_EQ(o.exit_code, dist::launcher::kExitUsage) << error;
    EXPECT_NE(error.find(message), std::string::npos) << error;
    EXPECT_EQ(std::count(error.begin(), error.end(), '\n'), 1) << error;
  }
  std::string notice;
  const auto o = parse({"--duplicate-stdout-filters", "loss"}, &notice);
  ASSERT_FALSE(o.exit_now);
  EXPECT_NE(notice.find("--duplicate-stdout-filters copies the lines of tee'd streams only"),
            std::string::npos)
      << notice;
}

TEST(LauncherCli, NprocPerNodeXpuCountsIntelGpus) {
  const dist::agent::Accelerators found = dist::agent::discover_intel_gpus();
  std::string error;
  const auto o = parse({"--nproc-per-node", "xpu"}, &error);
  if (found.count() == 0) {
    EXPECT_EQ(o.exit_code, dist::launcher::kExitUsage);
    EXPECT_NE(error.find("--nproc-per-node xpu: no Intel GPU found"), std::string::npos) << error;
  } else {
    EXPECT_EQ(o.config.nproc_per_node, found.count());
  }
}

TEST(LauncherCli, PrintCompletionWritesAScriptForTheShell) {
  for (const char* shell : {"bash", "zsh", "tcsh"}) {
    SCOPED_TRACE(shell);
    const RunResult r = run_binary(std::string("--print-completion ") + shell);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("dist-launch"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("nproc-per-node"), std::string::npos) << r.output;
  }
  const auto [code, bash] = [] {
    const RunResult r = run_binary("--print-completion bash");
    return std::pair{r.exit_code, r.output};
  }();
  ASSERT_EQ(code, 0);
  // The script works in bash: the completions of "--nproc" are the options that start with it.
  const std::string script = "/tmp/dist-launch-completion-" + std::to_string(::getpid());
  {
    FILE* f = std::fopen(script.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(bash.c_str(), f);
    std::fclose(f);
  }
  FILE* pipe = ::popen(("bash -c 'source " + script +
                        "; COMP_WORDS=(dist-launch --nproc); COMP_CWORD=1; _dist_launch; echo "
                        "${COMPREPLY[@]}'")
                           .c_str(),
                       "r");
  ASSERT_NE(pipe, nullptr);
  std::array<char, 4096> buffer{};
  std::string words;
  while (std::fgets(buffer.data(), buffer.size(), pipe)) words += buffer.data();
  ::pclose(pipe);
  std::remove(script.c_str());
  EXPECT_EQ(words, "--nproc-per-node --nproc_per_node\n");
}

TEST(LauncherCli, HelpSaysWhatSigusr1AndSigusr2Do) {
  const RunResult r = run_binary("--help");
  std::string help = r.output;
  // --help wraps the text: compare it as words.
  std::string words;
  std::istringstream in(help);
  for (std::string w; in >> w;) words += w + " ";
  EXPECT_NE(words.find("Add SIGUSR1,SIGUSR2 (Slurm's warning before a time limit or preemption): "
                       "those are forwarded to the workers and the job keeps running."),
            std::string::npos)
      << help;
  EXPECT_NE(words.find("TORCHELASTIC_SIGNALS_TO_HANDLE"), std::string::npos) << help;
}

}  // namespace
