#include "warm/warm_start.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

#include "warm_python_sources.h"

namespace dist::agent::warm {

namespace fs = std::filesystem;

namespace {

// Beyond the workers' command line as configured: ${local_rank} substituted, and a margin.
constexpr std::size_t kCommandLineSlack = 256;

std::string join(const std::vector<std::string>& items, const char* separator) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : separator) + item;
  return out;
}

// The workers' sys.path[0]: the script's directory (symbolic links resolved, as CPython does), or
// the working directory for -m.
std::string workers_path0(const std::vector<std::string>& argv) {
  std::size_t i = 1;
  while (i < argv.size() && argv[i].starts_with("-") && argv[i] != "-m") ++i;
  std::error_code ec;
  if (i >= argv.size() || argv[i] == "-m") return fs::current_path(ec).string();
  const fs::path resolved = fs::canonical(argv[i], ec);
  return (ec ? fs::absolute(argv[i], ec) : resolved).parent_path().string();
}

std::vector<std::string> interpreter_flags(const std::vector<std::string>& argv) {
  std::vector<std::string> flags;
  for (std::size_t i = 1; i < argv.size() && argv[i].starts_with("-") && argv[i] != "-m"; ++i) {
    flags.push_back(argv[i]);
  }
  return flags;
}

void close_all(std::initializer_list<int> fds) {
  for (const int fd : fds) {
    if (fd >= 0) ::close(fd);
  }
}

}  // namespace

bool WarmStart::applies(const WorkerCommand& command, const WarmOptions& options) {
  return options.warm_restart && command.python_workers && !command.worker_argv.empty();
}

WarmStart::WarmStart(boost::asio::io_context& io, const WorkerCommand& command,
                     const WarmOptions& options, const PlacementOptions& placement, int workers,
                     const Scratch& scratch, std::vector<std::string> env)
    : io_(io), ready_timer_(io) {
  if (placement.binds()) {
    turn_off("workers bound to CPUs or memory nodes (--cpu-bind, --numa-binding) are not forked");
    return;
  }
  const auto& argv = command.worker_argv;
  spec_.python = argv.front();
  const char* path = std::getenv("PATH");
  const SpawnPlan plan = plan_spawn(spec_.python, path ? path : "");
  spec_.executable = plan.executable;
  spec_.reset_signals = signals_to_reset();
  spec_.flags = interpreter_flags(argv);
  spec_.path0 = workers_path0(argv);
  for (const auto& arg : argv) spec_.command_line_room += arg.size() + 1;
  spec_.standbys = workers;
  spec_.command_line_room += kCommandLineSlack;
  spec_.script = scratch.write_file("zygote/_zygote.py", python::kZygote).string();
  if (options.preload) spec_.preload = join(*options.preload, ",");
  spec_.env = std::move(env);
  spec_.log = (scratch.path() / "zygote").string();  // + "-<generation>.log"
  start_zygote();
}

WarmStart::~WarmStart() {
  alive_.reset();
}

void WarmStart::start_zygote() {
  ++generation_;
  ZygoteSpec spec = spec_;
  spec.log = spec_.log + "/zygote-" + std::to_string(generation_) + ".log";
  spec.env_file = spec_.log + "/zygote-" + std::to_string(generation_) + ".env";
  started_at_ = std::chrono::steady_clock::now();
  try {
    zygote_ =
        std::make_unique<Zygote>(io_, std::move(spec), [this](Zygote::State s) { on_state(s); });
  } catch (const ZygoteError& e) {
    zygote_.reset();
    return turn_off(e.what());
  }
  spdlog::debug("warm restart: zygote pid {} importing {} on {}", zygote_->pid(),
                spec_.preload.value_or("torch, torch._dynamo and numpy (where installed)"),
                spec_.python);
  std::weak_ptr<char> alive = alive_;
  ready_timer_.expires_after(kZygoteReadyTimeout);
  ready_timer_.async_wait([this, alive](const boost::system::error_code& ec) {
    if (ec || alive.expired() || !zygote_ || zygote_->state() != Zygote::State::kStarting) return;
    turn_off("the zygote did not finish its imports within " +
             std::to_string(kZygoteReadyTimeout.count()) + " s");
    settle();
  });
}

void WarmStart::turn_off(const std::string& why) {
  if (!off_) spdlog::warn("--warm-restart: {}: Python workers start cold", why);
  off_ = true;
  ready_timer_.cancel();
  // Not destroyed here: this may run inside the zygote's own notification.
  if (zygote_) boost::asio::post(io_, [z = std::shared_ptr<Zygote>(std::move(zygote_))] {});
}

void WarmStart::on_state(Zygote::State state) {
  switch (state) {
    case Zygote::State::kStarting:
      return;
    case Zygote::State::kReady: {
      ready_timer_.cancel();
      const auto waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started_at_);
      spdlog::info(
          "warm restart: zygote pid {} ready ({} imported in {:.2f} s, {:.2f} s after "
          "its start)",
          zygote_->pid(),
          zygote_->preloaded().empty() ? "nothing" : join(zygote_->preloaded(), ", "),
          zygote_->preload_seconds(), waited.count());
      return settle();
    }
    case Zygote::State::kFailed:
      turn_off(zygote_->failure());
      return settle();
    case Zygote::State::kExited:  // replaced at the next attempt (readiness())
      return settle();
  }
}

void WarmStart::settle() {
  auto waiting = std::move(waiting_);
  waiting_.clear();
  for (auto& then : waiting) post(std::move(then));
}

// On the io_context, unless this object is gone by then (its owner, the worker group, with it).
void WarmStart::post(std::function<void()> then) {
  std::weak_ptr<char> alive = alive_;
  boost::asio::post(io_, [alive, then = std::move(then)] {
    if (!alive.expired()) then();
  });
}

WarmStart::Readiness WarmStart::readiness() {
  if (off_) return Readiness::kOff;
  if (zygote_) {
    switch (zygote_->state()) {
      case Zygote::State::kStarting:
        return Readiness::kPreparing;
      case Zygote::State::kReady:
        if (!zygote_->stale()) return Readiness::kReady;
        spdlog::info("warm restart: {} or a preloaded module changed on disk: a new zygote",
                     spec_.python);
        break;
      case Zygote::State::kFailed:
      case Zygote::State::kExited:
        if (++deaths_ >= kMaxZygoteDeaths) {
          turn_off(zygote_->failure() + " (" + std::to_string(deaths_) + " zygotes died)");
          return Readiness::kOff;
        }
        spdlog::warn("warm restart: {}: this attempt gets a new zygote", zygote_->failure());
        break;
    }
    zygote_.reset();
  }
  start_zygote();
  return off_ ? Readiness::kOff : Readiness::kPreparing;
}

void WarmStart::when_settled(std::function<void()> then) {
  if (zygote_ && zygote_->state() == Zygote::State::kStarting && !off_) {
    waiting_.push_back(std::move(then));
    return;
  }
  post(std::move(then));
}

pid_t WarmStart::zygote_pid() const {
  if (!zygote_) return -1;
  const auto state = zygote_->state();
  return state == Zygote::State::kStarting || state == Zygote::State::kReady ? zygote_->pid() : -1;
}

std::vector<pid_t> WarmStart::helpers() const {
  if (!zygote_) return {};
  std::vector<pid_t> pids = zygote_->standbys();
  const auto state = zygote_->state();
  if (state == Zygote::State::kStarting || state == Zygote::State::kReady) {
    pids.push_back(zygote_->pid());
  }
  return pids;
}

bool WarmStart::reaped(pid_t pid, int status) {
  if (!zygote_) return false;
  if (zygote_->forget_standby(pid)) return true;  // its zygote is gone, or retired it
  if (zygote_->pid() != pid) return false;
  zygote_->reaped(status);
  return true;
}

std::optional<SpawnedProcess> WarmStart::spawn(const std::vector<std::string>& argv,
                                               const std::vector<std::string>& env,
                                               const std::vector<int>& inherited, int rank,
                                               bool keep_stdin, bool merge_stderr) {
  if (off_ || !zygote_ || zygote_->state() != Zygote::State::kReady) return std::nullopt;
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (::pipe2(out, O_CLOEXEC) != 0 || (!merge_stderr && ::pipe2(err, O_CLOEXEC) != 0) || null < 0) {
    spdlog::warn("worker {}: cannot fork it from the zygote ({}): it starts cold", rank,
                 std::strerror(errno));
    close_all({out[0], out[1], err[0], err[1], null});
    return std::nullopt;
  }
  WorkerRequest request;
  request.argv = argv;
  request.env = env;
  std::error_code ec;
  request.cwd = fs::current_path(ec).string();
  request.fds = {
      {keep_stdin ? STDIN_FILENO : null, 0}, {out[1], 1}, {merge_stderr ? out[1] : err[1], 2}};
  for (const int fd : inherited) request.fds.emplace_back(fd, fd);
  pid_t pid = -1;
  try {
    pid = zygote_->spawn(request, kSpawnTimeout);
  } catch (const ZygoteError& e) {
    spdlog::warn("worker {}: cannot fork it from the zygote ({}): it starts cold", rank, e.what());
    close_all({out[0], out[1], err[0], err[1], null});
    return std::nullopt;
  }
  close_all({out[1], err[1], null});
  SpawnedProcess p;
  p.pid = pid;
  p.stdout_fd = out[0];
  p.stderr_fd = err[0];
  p.status_fd = -1;  // nothing to confirm: it runs
  p.program = argv.front();
  return p;
}

}  // namespace dist::agent::warm
