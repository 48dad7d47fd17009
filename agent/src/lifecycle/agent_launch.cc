#include "dist/agent/agent_launch.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstring>
#include <nlohmann/json.hpp>

namespace dist::agent {
namespace {

constexpr std::string_view kHeaderWord = "dist-launch-agent";
constexpr std::size_t kMaxHeaderBytes = 64;

using Clock = std::chrono::steady_clock;

// Reads up to `n` bytes, waiting until `deadline`; 0 at the end of the pipe.
std::size_t read_some(int fd, char* into, std::size_t n, Clock::time_point deadline) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      throw AgentLaunchError(
          "no launch message on stdin within " +
          std::to_string(
              std::chrono::duration_cast<std::chrono::seconds>(kAgentLaunchReadTimeout).count()) +
          " s: `dist-launch remote-agent` is started by dist-launch --hosts, which sends the job "
          "on its stdin");
    }
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno != EINTR) {
      throw AgentLaunchError(std::string("cannot read stdin: ") + std::strerror(errno));
    }
    if (ready <= 0) continue;
    const ssize_t got = ::read(fd, into, n);
    if (got >= 0) return static_cast<std::size_t>(got);
    if (errno != EINTR && errno != EAGAIN) {
      throw AgentLaunchError(std::string("cannot read stdin: ") + std::strerror(errno));
    }
  }
}

int parse_number(std::string_view text, const std::string& what) {
  int value = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) {
    throw AgentLaunchError("the launch message's header has a bad " + what + ": '" +
                           std::string(text) + "'");
  }
  return value;
}

}  // namespace

std::string encode_agent_launch(const AgentLaunch& launch) {
  const nlohmann::json j = {{"host", launch.host},
                            {"node_rank", launch.node_rank},
                            {"options", launch.options},
                            {"script", launch.script},
                            {"environment", launch.environment},
                            {"working_directory", launch.working_directory},
                            {"token", launch.token},
                            {"launcher_host", launch.launcher_host},
                            {"log_line_prefix_template", launch.log_line_prefix_template},
                            {"print_failure_report", launch.print_failure_report},
                            {"console",
                             {{"one_stream", launch.console.one_stream},
                              {"columns", launch.console.columns},
                              {"lines", launch.console.lines}}}};
  const std::string body = j.dump();
  return std::string(kHeaderWord) + " " + std::to_string(kAgentLaunchProtocol) + " " +
         std::to_string(body.size()) + "\n" + body;
}

AgentLaunch read_agent_launch(int fd, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  // The header a byte at a time: whatever follows it belongs to the control lines.
  std::string header;
  for (char c = 0; c != '\n';) {
    if (read_some(fd, &c, 1, deadline) == 0) {
      throw AgentLaunchError(header.empty() ? "stdin ended before the launch message: "
                                              "`dist-launch remote-agent` is started by "
                                              "dist-launch --hosts"
                                            : "stdin ended inside the launch message's header");
    }
    if (c != '\n') header.push_back(c);
    if (header.size() > kMaxHeaderBytes) {
      throw AgentLaunchError(
          "stdin does not start with a launch message: `dist-launch "
          "remote-agent` is started by dist-launch --hosts");
    }
  }
  const auto first = header.find(' '), second = header.rfind(' ');
  if (header.substr(0, first) != kHeaderWord || first == second) {
    throw AgentLaunchError(
        "stdin does not start with a launch message: `dist-launch "
        "remote-agent` is started by dist-launch --hosts");
  }
  const int protocol =
      parse_number(std::string_view(header).substr(first + 1, second - first - 1), "protocol");
  if (protocol != kAgentLaunchProtocol) {
    throw AgentLaunchError("the launcher speaks protocol " + std::to_string(protocol) +
                           ", this dist-launch (" DIST_VERSION ") speaks " +
                           std::to_string(kAgentLaunchProtocol) +
                           ": install the same dist-launch on every host");
  }
  const auto bytes =
      static_cast<std::size_t>(parse_number(std::string_view(header).substr(second + 1), "size"));
  if (bytes > kMaxAgentLaunchBytes) {
    throw AgentLaunchError("the launch message has " + std::to_string(bytes) +
                           " bytes, more than the " + std::to_string(kMaxAgentLaunchBytes) +
                           " allowed: export fewer or smaller variables");
  }
  std::string body(bytes, '\0');
  for (std::size_t at = 0; at < bytes;) {
    const std::size_t got = read_some(fd, body.data() + at, bytes - at, deadline);
    if (got == 0) throw AgentLaunchError("stdin ended inside the launch message");
    at += got;
  }
  try {
    const auto j = nlohmann::json::parse(body);
    AgentLaunch launch;
    launch.host = j.at("host").get<std::string>();
    launch.node_rank = j.at("node_rank").get<int>();
    launch.options = j.at("options").get<std::vector<std::string>>();
    launch.script = j.at("script").get<std::vector<std::string>>();
    launch.environment = j.at("environment").get<std::map<std::string, std::string>>();
    launch.working_directory = j.at("working_directory").get<std::string>();
    launch.token = j.at("token").get<std::string>();
    launch.launcher_host = j.at("launcher_host").get<std::string>();
    launch.log_line_prefix_template = j.at("log_line_prefix_template").get<std::string>();
    launch.print_failure_report = j.at("print_failure_report").get<bool>();
    const auto& console = j.at("console");
    launch.console.one_stream = console.at("one_stream").get<bool>();
    launch.console.columns = console.at("columns").get<int>();
    launch.console.lines = console.at("lines").get<int>();
    return launch;
  } catch (const nlohmann::json::exception& e) {
    throw AgentLaunchError(std::string("the launch message is not valid: ") + e.what());
  }
}

std::string signal_line(int signal) {
  return "signal " + std::to_string(signal) + "\n";
}

std::optional<int> parse_signal_line(std::string_view line) {
  constexpr std::string_view kWord = "signal ";
  if (!line.starts_with(kWord)) return std::nullopt;
  line.remove_prefix(kWord.size());
  int signal = 0;
  const auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), signal);
  if (ec != std::errc() || end != line.data() + line.size() || signal <= 0 || signal >= NSIG) {
    return std::nullopt;
  }
  return signal;
}

}  // namespace dist::agent
