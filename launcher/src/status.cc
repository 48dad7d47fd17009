#include "dist/launcher/status.h"

#include <charconv>
#include <chrono>
#include <ctime>
#include <limits>
#include <optional>
#include <ostream>
#include <sstream>
#include <thread>
#include <variant>

#include "command_line.h"
#include "dist/agent/job_status.h"
#include "dist/launcher/cli.h"
#include "dist/store/client.h"
#include "dist/store/endpoint.h"
#include "dist/store/errors.h"
#include "dist/store/token.h"

namespace dist::launcher {
namespace {

// Once a watch has shown the job, a store that went away (the job ended) is said at once, not
// after the first connection's --timeout.
constexpr std::chrono::milliseconds kWatchReconnectTimeout{2000};
constexpr int kMaxTimeoutSeconds = std::numeric_limits<int>::max();

// A number of seconds ("0.5", "2"); nullopt when the text is not one.
std::optional<double> seconds_of(const std::string& text) {
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

struct StatusRequest {
  store::ClientOptions options;
  std::string endpoint;
  std::string run_id;
  bool json = false;
  bool watch = false;
  std::chrono::milliseconds interval{1000};
  int count = 0;  // --watch: refreshes before stopping; 0: until interrupted
};

// The command line, or the exit code for help and usage errors. The same parser as the launch's
// (command_line.h): abbreviations, --name=value, the token file's variable as a fallback.
std::variant<StatusRequest, int> parse(const std::vector<std::string>& args, std::ostream& out,
                                       std::ostream& err) {
  CommandLine app("dist-launch status",
                  "dist-launch status: the nodes and workers of a job, read from its rendezvous "
                  "store",
                  "[OPTIONS]", CommandLine::kNoVersion);
  StatusRequest r;
  std::string token_file;
  r.run_id = "none";
  int timeout_s = 10;
  std::string interval = "1";
  app.text("--rdzv-endpoint,--rdzv_endpoint,--master-addr-port", r.endpoint,
           "HOST:PORT of the job's store (static: node 0's --master-addr:--master-port; one node: "
           "127.0.0.1 and its workers' MASTER_PORT) (required)");
  app.text("--rdzv-id,--rdzv_id", r.run_id, "The job's id").show_default();
  app.number("--timeout", timeout_s, 1, kMaxTimeoutSeconds, "Seconds to wait for the store")
      .show_default();
  app.flag("--json", r.json, "One JSON object instead of the table (--watch: one a line)");
  app.flag("--watch", r.watch, "Refresh in place every --interval until interrupted");
  app.text("--interval", interval, "--watch: seconds between refreshes, 0.1 to 3600")
      .show_default();
  app.number("--count", r.count, 0, std::numeric_limits<int>::max(),
             "--watch: stop after this many refreshes (0: never)")
      .show_default();
  app.text("--token-file", token_file, "The job's token file, when the job has one")
      .env(store::kTokenFileVariable);
  const auto usage = [&err](const std::string& message) {
    err << "dist-launch status: error: " << message << "\n";
    return kExitUsage;
  };
  try {
    const CommandLine::Parsed parsed = app.parse(args);
    if (parsed.help) {
      out << app.help();
      return kExitOk;
    }
    if (!parsed.rest.empty()) return usage("unexpected argument '" + parsed.rest.front() + "'");
  } catch (const std::runtime_error& e) {  // OptionScanError, CommandLineError
    return usage(e.what());
  }
  if (r.endpoint.empty()) return usage("--rdzv-endpoint is required");
  const std::optional<double> interval_s = seconds_of(interval);
  if (!interval_s || !(*interval_s >= 0.1 && *interval_s <= 3600)) {  // (NaN is neither)
    return usage("--interval takes seconds from 0.1 to 3600, not '" + interval + "'");
  }
  try {
    const store::Endpoint store = store::parse_endpoint(r.endpoint);
    r.options.host = store.host;
    r.options.port = store.port;
  } catch (const store::EndpointError&) {
    return usage("--rdzv-endpoint must be HOST:PORT, got '" + r.endpoint + "'");
  }
  r.options.connect_timeout = std::chrono::seconds(timeout_s);
  r.options.timeout = std::chrono::seconds(timeout_s);
  r.interval = std::chrono::milliseconds(static_cast<long long>(*interval_s * 1000));
  try {
    if (!token_file.empty()) r.options.secret = store::read_secret_file(token_file);
  } catch (const store::StoreError& e) {
    return usage(e.what());
  }
  return r;
}

std::string local_time() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char text[16];
  std::strftime(text, sizeof text, "%H:%M:%S", &local);
  return text;
}

// One refresh of the watch: on a terminal the screen redrawn in place (cursor home, each line
// cleared to its end, the rest of the screen cleared), else a block after the previous one.
void show_refresh(const StatusRequest& r, const agent::JobStatus& status, int shown, bool terminal,
                  std::ostream& out) {
  if (r.json) {
    out << agent::to_json(status) << "\n" << std::flush;
    return;
  }
  std::ostringstream title;
  title << "dist-launch status --watch: " << local_time() << ", every "
        << std::chrono::duration<double>(r.interval).count() << " s";
  if (r.count > 0) {
    title << " (" << shown + 1 << " of " << r.count << ")";
  } else if (terminal) {
    title << " (Ctrl-C to stop)";
  }
  const std::string block = title.str() + "\n" + agent::format_table(status);
  if (!terminal) {
    out << (shown ? "\n" : "") << block << std::flush;
    return;
  }
  std::string screen = "\x1b[H";
  std::istringstream lines(block);
  for (std::string line; std::getline(lines, line);) screen += line + "\x1b[K\n";
  out << screen << "\x1b[J" << std::flush;
}

bool store_gone(const std::exception& e) {
  const auto* store = dynamic_cast<const store::StoreError*>(&e);
  return store && (store->code() == store::StoreErrc::kUnavailable ||
                   store->code() == store::StoreErrc::kConnectionLost);
}

int watch(StatusRequest r, bool terminal, std::ostream& out, std::ostream& err) {
  if (terminal && !r.json) out << "\x1b[2J";
  for (int shown = 0; r.count == 0 || shown < r.count; ++shown) {
    if (shown > 0) std::this_thread::sleep_for(r.interval);
    std::optional<agent::JobStatus> status;
    try {
      status = agent::read_job_status(r.options, r.run_id);
    } catch (const std::exception& e) {
      if (shown > 0 && store_gone(e)) {  // the normal end of a job: its store goes with it
        err << "dist-launch status: the store at " << r.endpoint
            << " is gone (the job ended, or the agent hosting it did): " << e.what() << "\n";
        return kExitOk;
      }
      err << "dist-launch status: error: " << e.what() << "\n";
      return 1;
    }
    if (!status) {
      err << "dist-launch status: no job '" << r.run_id << "' in the store at " << r.endpoint
          << (shown ? " any more\n" : " (check --rdzv-id)\n");
      return shown ? kExitOk : 1;
    }
    show_refresh(r, *status, shown, terminal, out);
    r.options.connect_timeout = std::min(r.options.connect_timeout, kWatchReconnectTimeout);
  }
  return kExitOk;
}

}  // namespace

int run_status(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
               bool terminal) {
  auto parsed = parse(args, out, err);
  if (const int* code = std::get_if<int>(&parsed)) return *code;
  const StatusRequest& r = std::get<StatusRequest>(parsed);
  if (r.watch) return watch(r, terminal, out, err);
  std::optional<agent::JobStatus> status;
  try {
    status = agent::read_job_status(r.options, r.run_id);
  } catch (const std::exception& e) {
    err << "dist-launch status: error: " << e.what() << "\n";
    return 1;
  }
  if (!status) {
    err << "dist-launch status: no job '" << r.run_id << "' in the store at " << r.endpoint
        << " (check --rdzv-id)\n";
    return 1;
  }
  out << (r.json ? agent::to_json(*status) + "\n" : agent::format_table(*status));
  return kExitOk;
}

}  // namespace dist::launcher
