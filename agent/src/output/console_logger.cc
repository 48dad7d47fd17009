// The agent's own messages (spdlog) through the non-blocking console, so that a console nobody
// reads can never hold up the agent's io thread, its signal handling or its exit. They are UTF-8:
// a name in one that is not (a script's, a host's) is written with U+FFFD in its place, so that a
// log collector reading the console as UTF-8 takes the line.
#include <spdlog/logger.h>
#include <spdlog/sinks/base_sink.h>

#include <mutex>
#include <string_view>

#include "dist/agent/console.h"
#include "output/valid_text.h"

namespace dist::agent {
namespace {

// spdlog's own colors for a terminal (ansicolor_sink's defaults).
std::string_view level_color(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace:
      return "\033[37m";
    case spdlog::level::debug:
      return "\033[36m";
    case spdlog::level::info:
      return "\033[32m";
    case spdlog::level::warn:
      return "\033[33m\033[1m";
    case spdlog::level::err:
      return "\033[31m\033[1m";
    case spdlog::level::critical:
      return "\033[1m\033[41m";
    default:
      return "";
  }
}
constexpr std::string_view kColorReset = "\033[m";

class ConsoleSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit ConsoleSink(std::shared_ptr<Console> console)
      : console_(std::move(console)), colored_(console_->is_terminal(ConsoleStream::kStderr)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    const std::string_view text(formatted.data(), formatted.size());
    if (!colored_ || msg.color_range_end <= msg.color_range_start) {
      if (is_valid_utf8(text)) {
        console_->say(ConsoleStream::kStderr, text);
      } else {
        console_->say(ConsoleStream::kStderr, valid_utf8(text));
      }
      return;
    }
    const std::size_t start = msg.color_range_start, end = msg.color_range_end;
    std::string record;
    record.reserve(text.size() + 16);
    record.append(valid_utf8(text.substr(0, start)))
        .append(level_color(msg.level))
        .append(valid_utf8(text.substr(start, end - start)))
        .append(kColorReset)
        .append(valid_utf8(text.substr(end)));
    console_->say(ConsoleStream::kStderr, record);  // one record: a message is never split
  }

  void flush_() override { console_->flush_for(kConsoleExitFlushTimeout); }

 private:
  std::shared_ptr<Console> console_;
  const bool colored_;
};

}  // namespace

std::shared_ptr<spdlog::logger> make_console_logger(const std::string& name,
                                                    std::shared_ptr<Console> console) {
  return std::make_shared<spdlog::logger>(name, std::make_shared<ConsoleSink>(std::move(console)));
}

}  // namespace dist::agent
