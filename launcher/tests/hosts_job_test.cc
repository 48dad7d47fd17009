// dist-launch --hosts, piece by piece: the launch message on a real pipe, the ssh command line,
// what each host's agent is told, and how a failed start is explained. (The whole job, over real
// sshd, is tests/ssh_hosts/.)
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "dist/agent/agent_launch.h"
#include "dist/launcher/hosts_job.h"
#include "hosts/launch_plan.h"
#include "hosts/ssh_command.h"

namespace dist::launcher {
namespace {

using agent::AgentLaunch;
using agent::AgentLaunchError;
using agent::encode_agent_launch;
using agent::kAgentLaunchProtocol;
using agent::kMaxAgentLaunchBytes;
using agent::parse_signal_line;
using agent::read_agent_launch;
using agent::signal_line;

struct PipeFds {
  int read = -1, write = -1;
  PipeFds() {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    read = fds[0];
    write = fds[1];
  }
  ~PipeFds() {
    if (read >= 0) ::close(read);
    if (write >= 0) ::close(write);
  }
  void write_all(const std::string& bytes) const {
    EXPECT_EQ(::write(write, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  void close_write() {
    ::close(write);
    write = -1;
  }
};

AgentLaunch sample_launch() {
  AgentLaunch launch;
  launch.host = "node-a";
  launch.node_rank = 1;
  launch.options = {"--nnodes", "2", "--node-rank", "1"};
  launch.script = {"train.py", "--lr", "0.1", "quote'and\nnewline"};
  launch.environment = {{"NCCL_DEBUG", "INFO"}, {"SECRET", "s3cr3t"}};
  launch.working_directory = "/shared/project";
  launch.token = "0123abcd";
  launch.launcher_host = "launcher";
  launch.log_line_prefix_template = "[${role_name}${rank}@node-a]:";
  launch.print_failure_report = false;
  launch.console = {.one_stream = true, .columns = 101, .lines = 37};
  return launch;
}

TEST(AgentLaunchMessage, ReadsBackWhatWasSentAndNotAByteMore) {
  PipeFds pipe;
  const AgentLaunch sent = sample_launch();
  const std::string message = encode_agent_launch(sent);
  // In pieces, as ssh delivers it, with the first control line right behind it.
  std::thread writer([&] {
    for (std::size_t at = 0; at < message.size(); at += 7) {
      pipe.write_all(message.substr(at, 7));
      std::this_thread::yield();
    }
    pipe.write_all(signal_line(SIGINT));
  });
  const AgentLaunch got = read_agent_launch(pipe.read);
  writer.join();
  EXPECT_EQ(got.host, sent.host);
  EXPECT_EQ(got.node_rank, sent.node_rank);
  EXPECT_EQ(got.options, sent.options);
  EXPECT_EQ(got.script, sent.script);
  EXPECT_EQ(got.environment, sent.environment);
  EXPECT_EQ(got.working_directory, sent.working_directory);
  EXPECT_EQ(got.token, sent.token);
  EXPECT_EQ(got.launcher_host, sent.launcher_host);
  EXPECT_EQ(got.log_line_prefix_template, sent.log_line_prefix_template);
  EXPECT_EQ(got.print_failure_report, sent.print_failure_report);
  EXPECT_EQ(got.console.one_stream, sent.console.one_stream);
  EXPECT_EQ(got.console.columns, sent.console.columns);
  EXPECT_EQ(got.console.lines, sent.console.lines);
  char rest[32] = {};
  const ssize_t n = ::read(pipe.read, rest, sizeof rest);
  EXPECT_EQ(std::string(rest, static_cast<std::size_t>(std::max<ssize_t>(n, 0))), "signal 2\n");
}

TEST(AgentLaunchMessage, WhatIsNotALaunchMessageIsRefusedWithTheReason) {
  const std::string good = encode_agent_launch(sample_launch());
  const std::string header = "dist-launch-agent " + std::to_string(kAgentLaunchProtocol) + " ";
  const std::string other_protocol =
      "dist-launch-agent " + std::to_string(kAgentLaunchProtocol + 1) + " 2\n{}";
  const struct {
    std::string bytes;
    std::string expected;
  } cases[] = {
      {"", "stdin ended before the launch message"},
      {"hello world\n", "does not start with a launch message"},
      {std::string(100, 'x'), "does not start with a launch message"},
      {other_protocol, "install the same dist-launch on every host"},
      {header + "99999999999\n", "bad size"},
      {header + std::to_string(kMaxAgentLaunchBytes + 1) + "\n", "export fewer"},
      {good.substr(0, good.size() - 3), "stdin ended inside the launch message"},
      {header + "2\n{}", "the launch message is not valid"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.expected);
    PipeFds pipe;
    pipe.write_all(c.bytes);
    pipe.close_write();
    std::string error = "(none)";
    try {
      read_agent_launch(pipe.read);
    } catch (const AgentLaunchError& e) {
      error = e.what();
    }
    EXPECT_NE(error.find(c.expected), std::string::npos) << error;
  }
}

TEST(AgentLaunchMessage, NothingOnStdinTimesOut) {
  PipeFds pipe;
  std::string error;
  try {
    read_agent_launch(pipe.read, std::chrono::milliseconds(50));
  } catch (const AgentLaunchError& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("no launch message on stdin"), std::string::npos) << error;
}

TEST(AgentLaunchMessage, ControlLines) {
  EXPECT_EQ(signal_line(SIGTERM), "signal 15\n");
  EXPECT_EQ(parse_signal_line("signal 15"), SIGTERM);
  EXPECT_EQ(parse_signal_line("signal 10"), SIGUSR1);
  for (const std::string bad :
       {"signal", "signal 0", "signal -2", "signal 9x", "sig 2", "", "signal 99999"}) {
    SCOPED_TRACE(bad);
    EXPECT_FALSE(parse_signal_line(bad).has_value());
  }
}

TEST(SshCommand, BatchModeFirstTheUsersOptionsThenTheDefaults) {
  SshOptions ssh;
  ssh.config_file = "/tmp/cfg";
  ssh.port = 2222;
  ssh.options = {"ControlMaster=auto", "ServerAliveInterval=30"};
  EXPECT_EQ(ssh_command_line(ssh, "root@node-a", "exec 'dist-launch' remote-agent", 2, 4),
            (std::vector<std::string>{"ssh",
                                      "-T",
                                      "-x",
                                      "-o",
                                      "BatchMode=yes",
                                      "-F",
                                      "/tmp/cfg",
                                      "-o",
                                      "ControlMaster=auto",
                                      "-o",
                                      "ServerAliveInterval=30",
                                      "-p",
                                      "2222",
                                      "-o",
                                      "ServerAliveInterval=2",
                                      "-o",
                                      "ServerAliveCountMax=4",
                                      "--",
                                      "root@node-a",
                                      "exec 'dist-launch' remote-agent"}));
  EXPECT_EQ(remote_agent_command("/opt/my env/it's/dist-launch"),
            "exec '/opt/my env/it'\\''s/dist-launch' remote-agent");
}

int exited(int code) {
  return code << 8;  // a wait() status
}

TEST(SshCommand, StartFailuresNameTheHostAndSayWhatToDo) {
  const struct {
    int status;
    std::string said;
    bool over_ssh;
    std::string expected;
  } cases[] = {
      {exited(255), "ssh: connect to host n1 port 22: Connection refused", true,
       "host n1 is unreachable over ssh: ssh: connect to host n1 port 22: Connection refused"},
      {exited(255), "ssh: Could not resolve hostname n1: Name or service not known", true,
       "host n1 is unreachable over ssh"},
      {exited(255), "root@n1: Permission denied (publickey).", true, "host n1 refused the ssh key"},
      {exited(255), "Host key verification failed.", true, "host n1's host key is not in known"},
      {exited(255), "", true, "ssh to host n1 failed (ssh said nothing)"},
      {exited(127), "bash: line 1: exec: dist-launch: not found", true,
       "host n1 has no `dist-launch` on its PATH"},
      {exited(126), "bash: dist-launch: Permission denied", true,
       "host n1 cannot execute `dist-launch`"},
      {exited(2), "dist-launch remote-agent: error: the launcher speaks protocol 2", true,
       "the agent of host n1 did not start (exit 2): dist-launch remote-agent: error"},
      {SIGKILL, "", true, "ssh to host n1 was killed by SIGKILL"},
      {SIGKILL, "", false, "the agent of host n1 was killed by SIGKILL"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.expected);
    const std::string why =
        explain_start_failure("n1", c.over_ssh, c.status, c.said, "dist-launch");
    EXPECT_NE(why.find(c.expected), std::string::npos) << why;
  }
}

HostsJobConfig two_hosts() {
  HostsJobConfig c;
  c.hosts = {{"node-a", 2, {}}, {"node-b", 4, {1, 3}}};
  c.agent_options = {"--max-restarts", "1"};
  c.script_and_args = {"train.py", "--epochs", "3"};
  c.run_id = "job7";
  c.rdzv_conf = "keep_alive_interval=2";
  c.environment = {{"NCCL_DEBUG", "INFO"}};
  c.working_directory = "/shared";
  c.token = "t0k";
  return c;
}

TEST(LaunchPlan, EachHostGetsItsNodeRankTheStoreAndItsWorkers) {
  const HostsJobConfig c = two_hosts();
  const AgentLaunch a = plan_agent_launch(c, 0, 41000, "launcher", false);
  EXPECT_EQ(a.options, (std::vector<std::string>{"--max-restarts", "1", "--nnodes", "2",
                                                 "--node-rank", "0", "--master-port", "41000",
                                                 "--rdzv-conf", "keep_alive_interval=2,is_host=0",
                                                 "--rdzv-id", "job7", "--nproc-per-node", "2"}));
  EXPECT_EQ(a.script, c.script_and_args);
  EXPECT_EQ(a.launcher_host, "launcher");  // the address comes from its ssh connection
  EXPECT_TRUE(a.print_failure_report);
  EXPECT_EQ(a.environment, c.environment);
  EXPECT_EQ(a.working_directory, "/shared");
  EXPECT_EQ(a.token, "t0k");
  EXPECT_EQ(a.log_line_prefix_template, "[${role_name}${rank}@node-a]:");

  const AgentLaunch b = plan_agent_launch(c, 1, 41000, "launcher", true);
  EXPECT_EQ(b.options,
            (std::vector<std::string>{
                "--max-restarts", "1", "--nnodes", "2", "--node-rank", "1", "--master-port",
                "41000", "--rdzv-conf", "keep_alive_interval=2,is_host=0", "--master-addr",
                "127.0.0.1", "--rdzv-id", "job7", "--nproc-per-node", "2", "--devices", "1,3"}));
  EXPECT_TRUE(b.launcher_host.empty());
  EXPECT_FALSE(b.print_failure_report);  // one report: node rank 0's
}

TEST(LaunchPlan, OneHostHostsItsOwnStoreAndGivenWorkersAreKept) {
  HostsJobConfig c = two_hosts();
  c.hosts.resize(1);
  c.nproc_given = true;
  c.master_addr = "10.0.0.1";
  const AgentLaunch a = plan_agent_launch(c, 0, 0, "launcher", false);
  EXPECT_EQ(a.options, (std::vector<std::string>{"--max-restarts", "1", "--rdzv-id", "job7"}));
  EXPECT_TRUE(a.launcher_host.empty());
  EXPECT_EQ(host_log_line_prefix_template("a$b"), "[${role_name}${rank}@a$$b]:");
}

TEST(LaunchingHost, LoopbackNamesAndThisHostsNameNeedNoSsh) {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  for (const std::string& host : std::vector<std::string>{"localhost", "127.0.0.1", "::1", name}) {
    EXPECT_TRUE(is_launching_host(host)) << host;
  }
  for (const std::string host : {"127.0.0.2", "root@localhost", "a-host-that-is-not-this-one"}) {
    EXPECT_FALSE(is_launching_host(host)) << host;
  }
}

}  // namespace
}  // namespace dist::launcher
