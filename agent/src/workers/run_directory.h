// Where a run's worker logs and error files go. With --log-dir: a directory of this run's own,
// <log_dir>/<run id>_<random>/ as torchrun makes it (an earlier run's logs are never
// overwritten); without: a temporary directory that is kept, and its path said, whenever a worker
// failed, and removed otherwise.
//
// Inside it: [node_<rank>/ (static, several nodes) | node_<host>_<pid>/ (elastic)]
//            attempt_<round>/<local rank>/{stdout.log, stderr.log, error.json}
//
// The temporary directory is made in $TMPDIR (or $TMP, $TEMP, $TEMPDIR) when that is set.
// Otherwise, for a run that writes no log into it (only error files and a token, a few KB), in
// /dev/shm when that is a writable tmpfs: its directories are then made and removed in memory
// rather than on a journalled disk (on ext4 about 1 ms of a launch of 8 workers); else in /tmp.
#pragma once

#include <filesystem>
#include <string>

#include "dist/agent/config.h"

namespace dist::agent {

// /dev/shm when it is a tmpfs this process may write to; empty otherwise.
std::filesystem::path shared_memory_directory();

class RunDirectory {
 public:
  // Throws std::runtime_error with a one-line reason when it cannot be made.
  // The job names it (run id, node), the output part says where and whether it is kept.
  RunDirectory(const JobConfig& job, const OutputConfig& output, const std::string& host);
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  const std::filesystem::path& path() const { return run_dir_; }
  // What mkdtemp made (path() or the folder above the node's): the whole of a temporary one.
  const std::filesystem::path& root() const { return root_; }
  std::filesystem::path attempt(int round, int local_rank) const;
  bool temporary() const { return temporary_; }

  // At exit: a temporary directory goes unless `keep` (`why`, when given, is said). Returns what
  // happened, for a message ("" when nothing needs saying).
  std::string finish(bool keep, const std::string& why = "");

 private:
  std::filesystem::path root_;     // what mkdtemp made: removed as a whole if temporary
  std::filesystem::path run_dir_;  // root_, or the node's directory within it
  bool temporary_ = false;
};

// Removes the empty files and folders in the folder `name` of `parent` (and that folder too when
// nothing is left); whether anything is left: RunDirectory::finish's rule for a temporary
// directory worth keeping. Allocation-free (system calls into the stack: the janitor runs it
// after a raw clone); what cannot be read or removed, a link, or a tree deeper than a run's,
// counts as left.
bool prune_empty_tree(int parent, const char* name);

// Where the workers find the job's token (DIST_LAUNCH_TOKEN_FILE): the file given, or one written
// in `dir`, mode 0600, for a secret without a file (generated, or read from stdin), whose path is
// then `written` too (the agent removes it when it ends). Empty: no token.
std::string provide_token_file(const RendezvousConfig& rendezvous, const RunDirectory& dir,
                               std::string& written);

}  // namespace dist::agent
