#include "recovery/recovery_policy.h"

#include "recovery/group_restart.h"
#include "recovery/in_place.h"

namespace dist::agent {

std::unique_ptr<RecoveryPolicy> make_recovery_policy(RecoveryParts parts) {
  if (parts.config.restart_policy == RestartPolicy::kInPlace) {
    return std::make_unique<InPlace>(std::move(parts));
  }
  return std::make_unique<GroupRestart>(std::move(parts));
}

}  // namespace dist::agent
