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

// The earliest failure is the root cause; returns its index.
std::size_t root_cause_index(const std::vector<WorkerFailure>& failures);

// The whole block, from the "<script> FAILED" title to the closing rule.
std::string format_report(const std::string& script, const std::vector<WorkerFailure>& failures);

}  // namespace dist::agent
