// `dist-launch remote-agent`: one host's agent of a job started by dist-launch --hosts. It reads
// its part of the job from stdin (dist/agent/agent_launch.h), then runs it like any agent, its
// stdin kept as its line to the launcher.
#pragma once

#include <string>
#include <vector>

namespace dist::launcher {

// `args`: what follows "remote-agent" (nothing is expected). Returns the exit code.
int run_remote_agent(const std::vector<std::string>& args);

}  // namespace dist::launcher
