#include "recovery/group_restart.h"

#include <spdlog/spdlog.h>

namespace dist::agent {

void GroupRestart::start_workers() {
  const Round& round = *p_.now.round;
  p_.group->start(round, p_.rounds.workers_store(round));
}

// Neither is entered: the facts say the group restarts.
void GroupRestart::replace() {
  p_.feed(Input::kRecoveryFailed);
}
void GroupRestart::regroup() {
  p_.feed(Input::kRegroupFailed);
}

void GroupRestart::node_waiting(bool said) {
  if (said) spdlog::info("a new node is waiting to join: stopping the workers for a new round");
}

}  // namespace dist::agent
