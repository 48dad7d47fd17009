// One worker's failure, as the agent records it, the other nodes read it from the store and the
// failure report prints it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

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

}  // namespace dist::agent
