#include "output/duplicate_log.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "output/log_pump.h"

namespace dist::agent {

DuplicateLog::DuplicateLog(std::filesystem::path path, std::vector<std::string> filters)
    : path_(std::move(path)), filters_(std::move(filters)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) give_up(errno);
}

DuplicateLog::~DuplicateLog() {
  if (fd_ >= 0) ::close(fd_);
}

bool DuplicateLog::matches(std::string_view line) const {
  return std::any_of(filters_.begin(), filters_.end(),
                     [&](const std::string& f) { return line.find(f) != std::string_view::npos; });
}

void DuplicateLog::write(std::string_view bytes) {
  while (fd_ >= 0 && !bytes.empty()) {
    const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return give_up(n < 0 ? errno : EIO);
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

void DuplicateLog::give_up(int error) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  spdlog::warn("cannot write {} ({}): the lines the duplicate filters select are missing there",
               path_.string(), std::strerror(error));
}

DuplicateLog::Writer::Writer(std::shared_ptr<DuplicateLog> log, std::string prefix)
    : log_(std::move(log)), prefix_(std::move(prefix)) {}

void DuplicateLog::Writer::feed(std::string_view bytes) {
  while (!bytes.empty()) {
    const auto newline = bytes.find('\n');
    const std::string_view part =
        bytes.substr(0, newline == std::string_view::npos ? bytes.size() : newline + 1);
    bytes.remove_prefix(part.size());
    if (long_line_) {
      if (copying_rest_) log_->write(part);
    } else {
      line_.append(part);
      if (line_.size() > kMaxRecordBytes && line_.back() != '\n') {  // decide on what it holds
        long_line_ = true;
        copying_rest_ = log_->matches(line_);
        if (copying_rest_) log_->write(prefix_ + line_);
        line_.clear();
      }
    }
    if (part.back() == '\n') end_line();
  }
}

void DuplicateLog::Writer::end_line() {
  if (!long_line_ && log_->matches(line_)) log_->write(prefix_ + line_);
  line_.clear();
  long_line_ = copying_rest_ = false;
}

void DuplicateLog::Writer::finish() {
  if (line_.empty() && !long_line_) return;
  feed("\n");
}

}  // namespace dist::agent
