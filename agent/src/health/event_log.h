// --event-log FILE: what happens to the job, one JSON object per line, appended (the schema is in
// telemetry.h). Written at once with one write(2) per line: a regular file does not block the
// agent for long. A line is written whole or not at all (a short write is cut back off the file);
// a line that cannot be written (a full disk, an I/O error) is lost with a warning, and the next
// ones are tried again.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace dist::agent {

class EventLog {
 public:
  // Opens `path` for appending (created 0644 when missing); every line starts with "event" and
  // "time", then `common`'s fields. Throws std::runtime_error naming the file when it cannot.
  EventLog(std::string path, nlohmann::ordered_json common);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  void write(std::string_view event, const nlohmann::ordered_json& fields);
  std::uint64_t lost() const { return lost_; }  // lines not written

 private:
  std::string path_;
  nlohmann::ordered_json common_;
  int fd_ = -1;
  bool failing_ = false;  // the last line was lost: the next one that is written says so
  std::uint64_t lost_ = 0;
  std::uint64_t lost_in_a_row_ = 0;
};

}  // namespace dist::agent
