// Worker failures and the summary printed when a job fails (torchrun's layout, honest exit code).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/rendezvous.h"

namespace dist::agent {

// When the file at `path` was last written, by its file system's clock; none when it is not there.
std::optional<std::chrono::system_clock::time_point> written_at(const std::string& path);

// Fills message/traceback/time from a TORCHELASTIC_ERROR_FILE written the way torch's @record
// does (a name that is not UTF-8 comes out with U+FFFD in its place); leaves them as they are when
// the file is missing or unreadable.
void read_error_file(WorkerFailure& failure);

// The agent's exit code for a failure: the worker's own code, or 128 + signal.
int exit_code_of(const WorkerFailure& failure);

// Whether a failure reads as the consequence of another's (a peer's connection reset or closed, a
// collective aborted or timed out waiting for a peer, the SDK's NCCL abort exit): by its message
// and traceback, and its exit code.
bool looks_collateral(const WorkerFailure& failure);

// The root cause: the earliest failure of its own, by when it happened (when its error file was
// written, else when the agent saw the exit); collateral failures only when there is nothing
// else. Ties (one reaping) go to a worker that exited on its own over one the stop's signal
// ended, then to a failure with an error file, then to the lower rank. Returns its index.
std::size_t root_cause_index(const std::vector<WorkerFailure>& failures);

// What torchrun's own @record does when its job fails: the root cause's error file copied to
// `destination` (the launcher's TORCHELASTIC_ERROR_FILE: a scheduler that started it reads the
// job's root cause there), its message's errorCode the worker's exit code; made from what the
// failure carries (message, traceback) when its file is on another node. False when there is
// nothing to write (no error file, no message); std::runtime_error when `destination` cannot be
// written.
bool copy_root_cause_error_file(const WorkerFailure& root, const std::string& destination);

// The whole block, from the "<script> FAILED" title to the closing rule; the workers replaced in
// place before the failure that ended the job, listed after the root cause. UTF-8: what is not
// (a script's name, an error message) replaced by U+FFFD.
std::string format_report(const std::string& script, const std::vector<WorkerFailure>& failures,
                          const std::vector<InPlaceReplacement>& replaced = {});

// The job's workers replaced in place, for every node's report: this node's (`own`) and those
// the other nodes published (`others`, which may repeat this node's), each once (a worker is its
// rank, pid and host), in the order they failed.
std::vector<InPlaceReplacement> merge_replacements(const std::vector<InPlaceReplacement>& own,
                                                   const std::vector<InPlaceReplacement>& others);

// The block printed when a worker is replaced in place, in the report's layout.
std::string format_replacement(const std::string& script, const InPlaceReplacement& r);

}  // namespace dist::agent
