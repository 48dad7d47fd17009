// The output of one round's workers on this node: each worker's stdout and stderr pipes pumped
// (output/log_pump.h) to its log files and the console by torchrun's rules (a tee'd stream to its
// file and the console, a redirected one to its file only, tee winning when a stream is both, any
// other to the console; --local-ranks-filter limits the console, never the files), with the prefix
// (--log-line-prefix-template, console_prefix), the round's filtered copies
// (--duplicate-stdout-filters / --duplicate-stderr-filters), and the log files given up on.
#pragma once

#include <array>
#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dist/agent/config.h"
#include "dist/agent/console.h"
#include "dist/agent/vocabulary.h"
#include "output/duplicate_log.h"
#include "output/log_pump.h"
#include "processes/process.h"

namespace dist::agent {

class WorkerOutput {
 public:
  // `role`: ${role_name} and the default prefix's.
  WorkerOutput(boost::asio::io_context& io, const OutputConfig& config, std::string role,
               std::shared_ptr<Console> console);
  WorkerOutput(const WorkerOutput&) = delete;
  WorkerOutput& operator=(const WorkerOutput&) = delete;

  // A worker's stderr can be its stdout's pipe (SpawnPlan::merge_stderr): both go to one console
  // stream (a terminal, `2>&1`) and to no log file, so that what it writes keeps its order.
  bool merges_streams() const;
  // COLUMNS and LINES for `worker`, whose stdout is a pipe, where its console lines go to a
  // terminal: that terminal's size, less the width of the lines' prefix (what tqdm, rich and
  // shutil.get_terminal_size read where their own stdout is no terminal). None otherwise.
  std::optional<std::pair<int, int>> terminal_size(const Worker& worker) const;
  // A round starts: no pump is left of the last one. With `attempt_dir`, its filtered copies are
  // opened there.
  void begin_round(const std::filesystem::path& attempt_dir = {});
  // Pumps the pipes of `worker`, its log files in `dir` (when the job writes any); `closed` runs
  // as each pipe closes.
  void attach(const Worker& worker, const SpawnedProcess& p, const std::filesystem::path& dir,
              const std::function<void()>& closed);
  // The pumps stop reading (the group is going).
  void abandon();
  // Warns of each log file given up on so far (a full disk, an I/O error): they miss output.
  void warn_incomplete_logs() const;

 private:
  std::string prefix_of(const Worker& worker) const;
  bool prefixed(int local_rank, ConsoleStream stream) const;
  void pump(int local_rank, int pipe_fd, ConsoleStream stream, const std::string& prefix,
            const std::filesystem::path& file, const std::function<void()>& closed);

  boost::asio::io_context& io_;
  const OutputConfig& config_;
  std::string role_;
  std::shared_ptr<Console> console_;
  std::string hostname_;  // ${hostname} in the prefix template
  std::vector<std::shared_ptr<LogPump>> pumps_;
  // This round's --duplicate-stdout-filters / --duplicate-stderr-filters files (null: none).
  std::array<std::shared_ptr<DuplicateLog>, 2> duplicates_;
  std::vector<LogFileError> incomplete_logs_;
};

}  // namespace dist::agent
