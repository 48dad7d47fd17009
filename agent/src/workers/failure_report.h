// Worker failures and the summary printed when a job fails (torchrun's layout, honest exit code).
#pragma once

#include <string>
#include <vector>

#include "rendezvous/rendezvous.h"

namespace dist::agent {

// Fills message/traceback/time from a TORCHELASTIC_ERROR_FILE written the way torch's @record
// does; leaves them as they are when the file is missing or unreadable.
void read_error_file(WorkerFailure& failure);

// The agent's exit code for a failure: the worker's own code, or 128 + signal.
int exit_code_of(const WorkerFailure& failure);

// Whether a failure reads as the consequence of another's (a peer's connection reset or closed, a
// collective aborted or timed out waiting for a peer, the SDK's NCCL abort exit): by its message
// and traceback, and its exit code.
bool looks_collateral(const WorkerFailure& failure);

// The root cause: the earliest failure of its own, by when it happened (the error file's time,
// else when the agent saw the exit); collateral failures only when there is nothing else. Ties
// (one reaping, the same second in torch's error files) go to a worker that exited on its own
// over one the stop's signal ended, then to a failure with an error file, then to the lower rank.
// Returns its index.
std::size_t root_cause_index(const std::vector<WorkerFailure>& failures);

// The whole block, from the "<script> FAILED" title to the closing rule.
std::string format_report(const std::string& script, const std::vector<WorkerFailure>& failures);

}  // namespace dist::agent
