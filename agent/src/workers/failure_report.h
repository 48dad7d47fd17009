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

// A worker replaced alone (--restart-policy in-place): its failure, the generation its
// replacement joined, the replacement's pid, and the ranks that kept running.
struct InPlaceReplacement {
  WorkerFailure failure;
  int generation = 0;
  pid_t new_pid = -1;
  std::vector<int> survivors;
};

// The whole block, from the "<script> FAILED" title to the closing rule; the workers replaced in
// place before the failure that ended the job, listed after the root cause.
std::string format_report(const std::string& script, const std::vector<WorkerFailure>& failures,
                          const std::vector<InPlaceReplacement>& replaced = {});

// The block printed when a worker is replaced in place, in the report's layout.
std::string format_replacement(const std::string& script, const InPlaceReplacement& r);

}  // namespace dist::agent
