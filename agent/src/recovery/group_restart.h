// --restart-policy group (torchrun's): whatever fails, the whole group stops, and the job goes on
// from a new round (a restart while restarts are left; elastic, as the job's verdict says). A
// node lost or waiting to join ends the round too.
#pragma once

#include "recovery/recovery_policy.h"

namespace dist::agent {

class GroupRestart final : public RecoveryPolicy {
 public:
  explicit GroupRestart(RecoveryParts parts) : p_(std::move(parts)) {}

  void add_facts(Facts&) const override {}
  int replacements() const override { return 0; }
  bool in_generations() const override { return false; }
  const std::vector<InPlaceReplacement>& replaced() const override { return none_; }

  void start_workers() override;
  void watching() override {}
  void replace() override;
  void regroup() override;
  void stopping() override {}

  void workers_failed(bool) override {}
  void workers_succeeded() override { p_.feed(Input::kWorkersSucceeded); }
  void worker_succeeded() override {}
  void node_lost(int) override {}
  void node_waiting(bool said) override;

  void close() override {}

 private:
  RecoveryParts p_;
  std::vector<InPlaceReplacement> none_;
};

}  // namespace dist::agent
