// The recovery folder's face: what the agent does when workers fail or the job's nodes change,
// behind one interface chosen once from the configuration (make_recovery_policy), as RoundSource
// hides how rounds form:
//
//   policy (--restart-policy)  a worker fails                  a node is lost, or one waits to
//                                                              join (elastic)
//   GroupRestart (group)       the group stops: a restart      the group stops: a new round
//   InPlace (in-place)         that worker alone is started    the workers run on and regroup in
//                              again (REPLACING), as the next  the next round (REGROUPING); a
//                              generation of its group         newcomer's workers join them
//
// The driver (lifecycle/agent.cc) keeps the state machine and the event loop: it asks the policy
// for its facts, runs its entry actions (REPLACING, REGROUPING, its parts of RUNNING and
// STOPPING) and tells it what the worker group and the round's watch report. The policy moves the
// machine by feeding it inputs and launches its store calls as the agent's steps, whose failures
// are the agent's.
#pragma once

#include <boost/asio/io_context.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "dist/agent/config.h"
#include "dist/agent/console.h"
#include "health/telemetry.h"
#include "lifecycle/machine.h"
#include "lifecycle/steps.h"
#include "rendezvous/round_source.h"
#include "workers/failure_report.h"
#include "workers/worker_group.h"

namespace dist::agent {

// What the driver records as the job goes, shared with its policy: the policy reads it, and a
// regroup moves it on to the round it joined.
struct AgentRecord {
  State state = State::kInit;
  std::optional<Round> round;           // the round this node is in, or was in last
  int restart_count = 0;                // group restarts (the workers' TORCHELASTIC_RESTART_COUNT)
  std::vector<WorkerFailure> failures;  // the last failures reaped (the report's)
  StopReason stop_reason = StopReason::kAllSucceeded;  // why STOPPING was entered
};

// What a policy works with: the agent's io_context, configuration, rounds, steps and record, its
// worker group and telemetry (present from RENDEZVOUS's preparation on), its console, the
// machine's input, and the round's watch (the driver's: it hears how the watch ends).
struct RecoveryParts {
  boost::asio::io_context& io;
  const LaunchConfig& config;
  RoundSource& rounds;
  Steps& steps;
  AgentRecord& now;
  std::optional<WorkerGroup>& group;
  std::optional<Telemetry>& telemetry;
  std::shared_ptr<Console> console;
  std::function<void(Input)> feed;
  std::function<void()> watch;
};

class RecoveryPolicy {
 public:
  virtual ~RecoveryPolicy() = default;

  // Its part of the machine's facts: in_place, unjoined, counting, joining.
  virtual void add_facts(Facts& facts) const = 0;
  // Workers replaced alone so far, every round (they count against --max-restarts).
  virtual int replacements() const = 0;
  // Whether the workers are generations of their group (WorkerGroup's `generations`).
  virtual bool in_generations() const = 0;
  // The workers replaced alone, for the failure report.
  virtual const std::vector<InPlaceReplacement>& replaced() const = 0;

  // RUNNING: starts the round's workers (throws as WorkerGroup::start does); then, several nodes,
  // once the round's watch runs.
  virtual void start_workers() = 0;
  virtual void watching() = 0;
  // The entry actions of REPLACING and REGROUPING: the machine enters them only when the facts
  // say in_place.
  virtual void replace() = 0;
  virtual void regroup() = 0;
  // STOPPING: the recovery's waits end; several nodes, the job's replacements are read.
  virtual void stopping() = 0;

  // What the worker group and the watch report. Workers failed, in RUNNING, REPLACING or
  // REGROUPING (`stops`: the machine stops the group for it).
  virtual void workers_failed(bool stops) = 0;
  // Every worker of this node exited 0: feeds the machine.
  virtual void workers_succeeded() = 0;
  // One worker exited 0 while others still run (a replacement may have nobody left to join).
  virtual void worker_succeeded() = 0;
  // The watch found another node lost, or a node waiting to join (`said`: the round was running
  // here, the finding logged); the machine is fed next.
  virtual void node_lost(int node) = 0;
  virtual void node_waiting(bool said) = 0;

  // The agent leaves: every wait of the policy is cancelled.
  virtual void close() = 0;
};

// --restart-policy: the one place it is read.
std::unique_ptr<RecoveryPolicy> make_recovery_policy(RecoveryParts parts);

}  // namespace dist::agent
