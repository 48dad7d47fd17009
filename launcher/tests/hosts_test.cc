// --hosts, --hostfile, --include / --exclude and what the command line turns into for the agents.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <sstream>
#include <string>
#include <vector>

#include "dist/launcher/cli.h"
#include "dist/launcher/hosts.h"

namespace {

using dist::launcher::HostsError;
using dist::launcher::JobHost;

struct Host {
  std::string name;
  int slots;
  std::vector<int> devices;
};

std::vector<Host> plain(const std::vector<JobHost>& hosts) {
  std::vector<Host> out;
  for (const auto& h : hosts) out.push_back({h.name, h.slots, h.devices});
  return out;
}

void expect_hosts(const std::vector<JobHost>& got, const std::vector<Host>& want) {
  const auto g = plain(got);
  ASSERT_EQ(g.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("host " + std::to_string(i));
    EXPECT_EQ(g[i].name, want[i].name);
    EXPECT_EQ(g[i].slots, want[i].slots);
    EXPECT_EQ(g[i].devices, want[i].devices);
  }
}

// The message of the HostsError `f` throws.
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const HostsError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(HostList, HostsWithSlotsAddressesAndUsers) {
  expect_hosts(dist::launcher::parse_host_list("a:2,b:4"), {{"a", 2, {}}, {"b", 4, {}}});
  expect_hosts(dist::launcher::parse_host_list("a, root@b:3 ,c"),
               {{"a", 1, {}}, {"root@b", 3, {}}, {"c", 1, {}}});
  expect_hosts(dist::launcher::parse_host_list("[fe80::1]:2,::1"),
               {{"fe80::1", 2, {}}, {"::1", 1, {}}});
}

TEST(HostList, BadListsNameTheHost) {
  const struct {
    std::string text, expected;
  } cases[] = {
      {"a:2,a:1", "host a is listed twice"},      {"a:0", "host a has 0 slots"},
      {"a:two", "'two' is not a number"},         {"a,,b", "an empty entry"},
      {"-oProxyCommand=x", "is not a host name"}, {"[::1:2", "missing ]"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    const std::string error = error_of([&] { dist::launcher::parse_host_list(c.text); });
    EXPECT_NE(error.find(c.expected), std::string::npos) << error;
  }
}

TEST(Hostfile, DeepspeedAndMpirunLinesCommentsAndBlankLines) {
  std::istringstream in(
      "# the lab's machines\n"
      "worker-1 slots=4\n"
      "\n"
      "worker-2   slots=2 max_slots=8   # mpirun's\n"
      "   worker-3\n"
      "#worker-4 slots=4\n");
  expect_hosts(dist::launcher::parse_hostfile(in, "hf"),
               {{"worker-1", 4, {}}, {"worker-2", 2, {}}, {"worker-3", 1, {}}});
}

TEST(Hostfile, ErrorsNameTheFileAndLine) {
  const struct {
    std::string text, expected;
  } cases[] = {
      {"a slots=2\na slots=1\n", "hf line 2: host a is listed twice"},
      {"a slots=0\n", "hf line 1: host a has 0 slots"},
      {"a cpus=2\n", "hf line 1: 'cpus=2' is not understood"},
      {"a slots=x\n", "'x' is not a number"},
      {"# nothing\n\n", "lists no host"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    std::istringstream in(c.text);
    const std::string error = error_of([&] { dist::launcher::parse_hostfile(in, "hf"); });
    EXPECT_NE(error.find(c.expected), std::string::npos) << error;
  }
}

TEST(HostSelection, IncludeKeepsHostsOrSlotsInListOrder) {
  const auto hosts = dist::launcher::parse_host_list("a:4,b:2,c:2");
  expect_hosts(dist::launcher::select_hosts(hosts, "c@a:0,2", ""),
               {{"a", 4, {0, 2}}, {"c", 2, {}}});
  expect_hosts(dist::launcher::select_hosts(hosts, "", ""),
               {{"a", 4, {}}, {"b", 2, {}}, {"c", 2, {}}});
}

TEST(HostSelection, ExcludeDropsHostsOrSlots) {
  const auto hosts = dist::launcher::parse_host_list("a:4,b:2,c:2");
  expect_hosts(dist::launcher::select_hosts(hosts, "", "b@a:1"),
               {{"a", 4, {0, 2, 3}}, {"c", 2, {}}});
  expect_hosts(dist::launcher::select_hosts(hosts, "", "b:0,1"), {{"a", 4, {}}, {"c", 2, {}}});
}

TEST(HostSelection, BadSelectionsSayWhat) {
  const auto hosts = dist::launcher::parse_host_list("a:2,b:2");
  const struct {
    std::string include, exclude, expected;
  } cases[] = {
      {"z", "", "--include: host z is not listed"},
      {"a:2", "", "host a has slots 0 to 1, not 2"},
      {"a", "b", "not both"},
      {"", "a@b", "leaves no host"},
      {"a@a:1", "", "host a twice"},
      {"a:", "", "no slot after ':'"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.include + " / " + c.exclude);
    const std::string error =
        error_of([&] { dist::launcher::select_hosts(hosts, c.include, c.exclude); });
    EXPECT_NE(error.find(c.expected), std::string::npos) << error;
  }
}

// The whole command line: what reaches the agents, what the launcher keeps for itself.
dist::launcher::CliOutcome parse(const std::vector<std::string>& args,
                                 std::string* error = nullptr) {
  std::ostringstream out, err;
  auto outcome = dist::launcher::parse_command_line(args, out, err);
  if (error) *error = err.str();
  return outcome;
}

TEST(HostsCommandLine, AgentsGetTheirOptionsAndTheScriptTheLauncherKeepsItsOwn) {
  const auto outcome = parse({"--max-restarts",
                              "2",
                              "--hosts",
                              "a:2,b:2",
                              "--ssh-port",
                              "2222",
                              "--ssh-option",
                              "ControlMaster=auto",
                              "--ssh-option",
                              "ControlPersist=60",
                              "--rdzv-id=job7",
                              "--rdzv-conf",
                              "keep_alive_interval=2",
                              "--shutdown-timeout",
                              "5",
                              "train.py",
                              "--hosts",
                              "x",
                              "--lr",
                              "0.1"});
  ASSERT_FALSE(outcome.exit_now);
  ASSERT_TRUE(outcome.hosts_job.has_value());
  const auto& job = *outcome.hosts_job;
  EXPECT_EQ(job.hosts.size(), 2u);
  EXPECT_EQ(job.agent_options,
            (std::vector<std::string>{"--max-restarts", "2", "--shutdown-timeout", "5"}));
  EXPECT_EQ(job.script_and_args,
            (std::vector<std::string>{"train.py", "--hosts", "x", "--lr", "0.1"}));
  EXPECT_EQ(job.ssh.port, 2222);
  EXPECT_EQ(job.ssh.options, (std::vector<std::string>{"ControlMaster=auto", "ControlPersist=60"}));
  EXPECT_EQ(job.run_id, "job7");
  EXPECT_EQ(job.rdzv_conf, "keep_alive_interval=2");
  EXPECT_EQ(job.keep_alive_interval_seconds, 2);
  EXPECT_EQ(job.keep_alive_max_attempt, 30) << "the agents' default for a job of a fixed size";
  EXPECT_EQ(job.shutdown_timeout, std::chrono::seconds(5));
  EXPECT_FALSE(job.nproc_given);
  EXPECT_TRUE(job.master_addr.empty());
  EXPECT_FALSE(job.run_id.empty());
}

TEST(HostsCommandLine, ExportsByNameByPrefixAndAlways) {
  ::setenv("DIST_HOSTS_TEST_A", "1", 1);
  ::setenv("DIST_HOSTS_NCCL_X", "2", 1);
  ::setenv("PYTHON_EXEC", "/usr/bin/python3", 1);
  const auto outcome = parse({"--hosts", "a", "--export", "DIST_HOSTS_TEST_A", "--export",
                              "SET_HERE=v=w", "--export-prefix", "DIST_HOSTS_NCCL_", "t.py"});
  ::unsetenv("PYTHON_EXEC");
  ASSERT_TRUE(outcome.hosts_job.has_value());
  const auto& env = outcome.hosts_job->environment;
  EXPECT_EQ(env.at("DIST_HOSTS_TEST_A"), "1");
  EXPECT_EQ(env.at("SET_HERE"), "v=w");
  EXPECT_EQ(env.at("DIST_HOSTS_NCCL_X"), "2");
  EXPECT_EQ(env.at("PYTHON_EXEC"), "/usr/bin/python3");
  EXPECT_FALSE(outcome.hosts_job->working_directory.empty());
}

TEST(HostsCommandLine, ConflictsAreUsageErrors) {
  const struct {
    std::vector<std::string> args;
    std::string expected;
  } cases[] = {
      {{"--hosts", "a:2", "--nnodes", "2", "t.py"}, "--nnodes does not go with --hosts"},
      {{"--hosts", "a:2", "--node-rank", "1", "t.py"}, "--node-rank does not go with --hosts"},
      {{"--hosts", "a:2", "--rdzv-endpoint", "x:1", "t.py"}, "--rdzv-endpoint does not go"},
      {{"--hosts", "a:2", "--rdzv-backend", "c10d", "t.py"}, "--rdzv-backend c10d does not go"},
      {{"--hosts", "a:2", "--hostfile", "f", "t.py"}, "--hosts or --hostfile, not both"},
      {{"--hostfile", "/nonexistent/hf", "t.py"}, "--hostfile /nonexistent/hf: cannot read it"},
      {{"--hosts", "a:2", "--include", "a:1", "--devices", "0", "t.py"},
       "--devices and the slots chosen"},
      {{"--hosts", "a:2", "--export", "DIST_HOSTS_TEST_UNSET", "t.py"},
       "DIST_HOSTS_TEST_UNSET is not set here"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.expected);
    std::string error;
    const auto outcome = parse(c.args, &error);
    EXPECT_TRUE(outcome.exit_now);
    EXPECT_EQ(outcome.exit_code, dist::launcher::kExitUsage);
    EXPECT_NE(error.find(c.expected), std::string::npos) << error;
  }
}

TEST(HostsCommandLine, HostsAndTheirSlotSelectionReachTheJob) {
  const auto outcome = parse({"--hosts", "a:4,b:2", "--exclude", "a:0", "--nproc-per-node", "gpu",
                              "--master-addr", "10.0.0.9", "--master-port", "29511", "t.py"});
  ASSERT_TRUE(outcome.hosts_job.has_value());
  const auto& job = *outcome.hosts_job;
  ASSERT_EQ(job.hosts.size(), 2u);
  EXPECT_EQ(job.hosts[0].devices, (std::vector<int>{1, 2, 3}));
  EXPECT_TRUE(job.nproc_given);  // resolved on each host: "gpu" there, not here
  EXPECT_EQ(job.agent_options, (std::vector<std::string>{"--nproc-per-node", "gpu"}));
  EXPECT_EQ(job.master_addr, "10.0.0.9");
  EXPECT_EQ(job.master_port, 29511);
}

}  // namespace
