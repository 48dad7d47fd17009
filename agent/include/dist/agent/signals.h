// Signal names, as the command line and the failure report spell them.
#pragma once

#include <string>

namespace dist::agent {

// "SIGTERM" for 15; "SIG15" when unknown.
std::string signal_name(int signal);
// 15 for "SIGTERM", "TERM" or "15"; -1 when unknown.
int signal_number(const std::string& name);

}  // namespace dist::agent
