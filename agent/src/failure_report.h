// Worker failures and the summary printed when a job fails (torchrun's layout, honest exit code).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace dist::agent {

struct WorkerFailure {
  std::chrono::system_clock::time_point time;  // from the error file when it has one
  std::string host;
  int rank = 0;
  int local_rank = 0;
  int exit_code = 0;  // the worker's status, or -signal when killed by a signal
  pid_t pid = -1;
  std::string error_file;
  std::string message;    // from the error file: "<Type>: <text>"
  std::string traceback;  // from the error file, else "Signal N (SIGX) received by PID p"
};

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
