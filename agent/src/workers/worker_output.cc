#include "workers/worker_output.h"

#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>

#include <utility>

#include "output/log_line_prefix.h"

namespace dist::agent {
namespace {

namespace fs = std::filesystem;

bool selects(const StreamSelection& selection, ConsoleStream stream) {
  return stream == ConsoleStream::kStdout ? selection.stdout_stream : selection.stderr_stream;
}

}  // namespace

WorkerOutput::WorkerOutput(boost::asio::io_context& io, const OutputConfig& config,
                           std::string role, std::shared_ptr<Console> console)
    : io_(io),
      config_(config),
      role_(std::move(role)),
      console_(std::move(console)),
      hostname_(this_host()) {}

void WorkerOutput::begin_round(const fs::path& attempt_dir) {
  pumps_.clear();
  if (attempt_dir.empty()) return;
  duplicates_ = {};
  const auto& filters = {config_.duplicate_stdout_filters, config_.duplicate_stderr_filters};
  const char* names[] = {"filtered_stdout.log", "filtered_stderr.log"};
  std::size_t i = 0;
  for (const auto& list : filters) {
    if (!list.empty()) {
      std::error_code ec;
      fs::create_directories(attempt_dir, ec);
      duplicates_[i] = std::make_shared<DuplicateLog>(attempt_dir / names[i], list);
    }
    ++i;
  }
}

bool WorkerOutput::merges_streams() const {
  return console_ && console_->one_stream() && !config_.writes_log_files();
}

void WorkerOutput::abandon() {
  for (auto& pump : pumps_) pump->abandon();
}

void WorkerOutput::warn_incomplete_logs() const {
  for (const LogFileError& e : incomplete_logs_) {
    spdlog::warn("worker logs are incomplete: {} holds the first {} bytes only ({})", e.path,
                 e.bytes_written, e.error);
  }
}

std::string WorkerOutput::prefix_of(const Worker& worker) const {
  return config_.log_line_prefix_template.empty()
             ? default_log_line_prefix(role_, worker.local_rank)
             : render_log_line_prefix(config_.log_line_prefix_template, {role_, worker, hostname_});
}

bool WorkerOutput::prefixed(int local_rank, ConsoleStream stream) const {
  return config_.console_prefix == ConsolePrefix::kAll ||
         (config_.console_prefix == ConsolePrefix::kTee &&
          selects(config_.tee_for(local_rank), stream));
}

std::optional<std::pair<int, int>> WorkerOutput::terminal_size(const Worker& worker) const {
  if (!console_ || !config_.shows_on_console(worker.local_rank)) return std::nullopt;
  std::pair<int, int> size;
  if (config_.relayed_terminal_size) {
    size = *config_.relayed_terminal_size;
  } else {
    winsize own{};
    if (!console_->is_terminal(ConsoleStream::kStdout) ||
        ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &own) != 0) {
      return std::nullopt;
    }
    size = {own.ws_col, own.ws_row};
  }
  if (size.first <= 0) return std::nullopt;
  constexpr int kNarrowest = 20;
  const int prefix = prefixed(worker.local_rank, ConsoleStream::kStdout)
                         ? static_cast<int>(prefix_of(worker).size())
                         : 0;
  return std::pair{std::max(size.first - prefix, kNarrowest), size.second};
}

void WorkerOutput::attach(const Worker& worker, const SpawnedProcess& p, const fs::path& dir,
                          const std::function<void()>& closed) {
  const int local_rank = worker.local_rank;
  const bool write_logs = config_.writes_log_files();
  const std::string prefix = prefix_of(worker);
  pump(local_rank, p.stdout_fd, ConsoleStream::kStdout, prefix,
       write_logs ? dir / "stdout.log" : fs::path(), closed);
  if (p.stderr_fd >= 0) {  // (else its stderr is the stdout pipe's)
    pump(local_rank, p.stderr_fd, ConsoleStream::kStderr, prefix,
         write_logs ? dir / "stderr.log" : fs::path(), closed);
  }
}

void WorkerOutput::pump(int local_rank, int pipe_fd, ConsoleStream stream,
                        const std::string& prefix, const fs::path& file,
                        const std::function<void()>& closed) {
  const bool teed = selects(config_.tee_for(local_rank), stream);
  const bool redirected = selects(config_.redirects_for(local_rank), stream);
  const bool shown = config_.shows_on_console(local_rank) && (teed || !redirected);
  LogPump::Sink sink;
  if (shown) sink.console = console_;
  sink.stream = stream;
  sink.file_path = file.string();
  sink.on_file_error = [this](const LogFileError& e) { incomplete_logs_.push_back(e); };
  if (prefixed(local_rank, stream)) sink.prefix = prefix;
  const auto& duplicate = duplicates_[stream == ConsoleStream::kStdout ? 0 : 1];
  if (duplicate && teed && shown) {
    sink.duplicate = duplicate;
    sink.duplicate_prefix = prefix;
  }
  pumps_.push_back(LogPump::start(io_, pipe_fd, std::move(sink), closed));
}

}  // namespace dist::agent
