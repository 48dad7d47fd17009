// The hosts of a job started from one command (dist-launch --hosts / --hostfile), as the command
// line or a hostfile lists them, and the selection --include / --exclude make of them.
#pragma once

#include <istream>
#include <stdexcept>
#include <string>
#include <vector>

#include "dist/launcher/hosts_job.h"

namespace dist::launcher {

// A host list, hostfile or selection that cannot be used; what() names the host (and the file and
// line) and says what to write.
class HostsError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// --hosts: "a:2,b:2" (host:slots; a host without ":slots" has 1), as horovodrun and mpirun's -H
// take it. A host may be user@host or an ssh_config alias; an IPv6 address with slots is written
// in brackets, "[fe80::1]:2". Every host once, each with at least one slot.
std::vector<JobHost> parse_host_list(const std::string& text);

// --hostfile, as deepspeed and mpirun write it: one "host slots=N" per line (a host alone has 1
// slot; mpirun's max_slots=M is accepted and has no effect), '#' starts a comment, blank lines
// are skipped. `path` is for messages.
std::vector<JobHost> parse_hostfile(std::istream& in, const std::string& path);

// --include / --exclude (at most one of them), deepspeed's form: hosts separated by '@', each
// alone (the whole host) or with the slots chosen, "a:0,1@b". Include keeps only the hosts named
// (in the list's order), exclude drops them or their slots. Chosen slots are device indices: the
// host runs one worker on each (JobHost::devices). Throws HostsError for a host that is not in the
// list, a slot it does not have, or a selection that leaves nothing.
std::vector<JobHost> select_hosts(std::vector<JobHost> hosts, const std::string& include,
                                  const std::string& exclude);

}  // namespace dist::launcher
