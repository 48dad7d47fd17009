// torchrun 2.x's --duplicate-stdout-filters / --duplicate-stderr-filters: the tee'd lines that
// contain any of the filter strings, copied with the worker's prefix into one file per attempt and
// stream (attempt_<n>/filtered_stdout.log, filtered_stderr.log), shared by the attempt's workers.
//
// Each worker's pump feeds its bytes to its own Writer, which cuts them into lines and writes a
// matching line, prefix included, with one write(): lines of different workers never mix. A line
// longer than kMaxRecordBytes is matched on its first kMaxRecordBytes; the rest of it follows that
// decision. A file that cannot be written (ENOSPC, EIO) is given up with one warning naming it.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dist::agent {

class DuplicateLog {
 public:
  // Creates (truncates) `path`; a file that cannot be made is warned about and given up.
  DuplicateLog(std::filesystem::path path, std::vector<std::string> filters);
  ~DuplicateLog();
  DuplicateLog(const DuplicateLog&) = delete;
  DuplicateLog& operator=(const DuplicateLog&) = delete;

  // One worker's stream.
  class Writer {
   public:
    Writer(std::shared_ptr<DuplicateLog> log, std::string prefix);
    void feed(std::string_view bytes);
    void finish();  // the end of the output: a last line without its '\n' is ended with one

   private:
    void end_line();

    std::shared_ptr<DuplicateLog> log_;
    std::string prefix_;
    std::string line_;           // the start of a line not decided yet
    bool long_line_ = false;     // line_ outgrew kMaxRecordBytes: decided on what it held
    bool copying_rest_ = false;  // ... and matched: the rest of the line is copied as it comes
  };

 private:
  bool matches(std::string_view line) const;
  void write(std::string_view bytes);
  void give_up(int error);

  std::filesystem::path path_;
  std::vector<std::string> filters_;
  int fd_ = -1;
};

}  // namespace dist::agent
