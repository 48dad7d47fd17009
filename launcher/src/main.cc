// dist-launch: parse the command line, then run this node's agent, or the job on many hosts.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <iostream>

#include "dist/agent/agent.h"
#include "dist/agent/agent_launch.h"
#include "dist/agent/console.h"
#include "dist/launcher/cli.h"
#include "dist/launcher/hosts_job.h"
#include "dist/launcher/remote_agent.h"
#include "dist/launcher/status.h"
#include "logging.h"

namespace {

// A standard descriptor closed by whoever started dist-launch would be the next file or socket it
// opens: the workers' stdin, or the console written into a socket. /dev/null there, as daemons do.
void open_standard_descriptors() {
  for (int fd = STDIN_FILENO; fd <= STDERR_FILENO; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
    const int null = ::open("/dev/null", fd == STDIN_FILENO ? O_RDONLY : O_WRONLY);  // lowest: fd
    if (null > fd) {  // (something else took fd meanwhile: none can, single-threaded here)
      ::dup2(null, fd);
      ::close(null);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  open_standard_descriptors();
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args.front() == "status") {
    return dist::launcher::run_status({args.begin() + 1, args.end()}, std::cout, std::cerr,
                                      ::isatty(STDOUT_FILENO) == 1);
  }
  if (!args.empty() && args.front() == dist::agent::kRemoteAgentCommand) {
    return dist::launcher::run_remote_agent({args.begin() + 1, args.end()});
  }
  const auto outcome = dist::launcher::parse_command_line(args, std::cout, std::cerr);
  if (outcome.exit_now) return outcome.exit_code;
  const auto console = dist::agent::Console::process();
  dist::launcher::setup_logging(console, "dist-launch");
  const int exit_code = outcome.hosts_job ? dist::launcher::run_hosts_job(*outcome.hosts_job)
                                          : dist::agent::run_agent(outcome.config);
  console->drain();  // as long as its reader takes it; not after a stop signal
  return exit_code;
}
