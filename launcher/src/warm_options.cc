#include "warm_options.h"

#include <cctype>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace dist::launcher {

void add_warm_options(CommandLine& app, WarmFlags& flags) {
  app.flag("--warm-restart,--warm_restart", flags.warm_restart,
           "Fork Python workers from a zygote that imported torch (and --preload's modules) "
           "once: a restarted group trains again without importing them (C++ workers: no "
           "effect)")
      .env("PET_WARM_RESTART");
  app.text("--preload", flags.preload,
           "Modules the zygote imports, e.g. torch,numpy,transformers (default: torch, "
           "torch._dynamo and numpy, where the workers' Python has them)")
      .env("PET_PRELOAD");
  app.text("--snapshot-memory,--snapshot_memory", flags.snapshot_memory,
           "Keep the workers' dist_launch.snapshot / dist::sdk::save_snapshot snapshots in "
           "the agent's shared memory, at most this much in all (e.g. 8G)")
      .env("PET_SNAPSHOT_MEMORY");
  app.text("--snapshot-dir,--snapshot_dir", flags.snapshot_dir,
           "Also persist the newest snapshots to this directory (in the background, and at "
           "once when a worker fails), where a restarted node's workers find them")
      .env("PET_SNAPSHOT_DIR");
  app.number("--snapshot-replicas,--snapshot_replicas", flags.snapshot_replicas, 0, 8,
             "Also keep each rank's newest snapshot in the shared memory of this many other "
             "nodes' agents (sent by the agents in the background): a lost node's replacement "
             "restores its workers' state from them, without disk")
      .env("PET_SNAPSHOT_REPLICAS");
}

std::uint64_t parse_size(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  double value = -1;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  for (auto& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (unit.ends_with("IB")) unit.resize(unit.size() - 2);
  if (unit.size() == 2 && unit.back() == 'B') unit.pop_back();
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  if (unit == "K") scale = 1024.0;
  if (unit == "M") scale = 1024.0 * 1024;
  if (unit == "G") scale = 1024.0 * 1024 * 1024;
  if (unit == "T") scale = 1024.0 * 1024 * 1024 * 1024;
  const double bytes = value * scale;
  if (used == 0 || scale == 0 || !(bytes >= 1) || !std::isfinite(bytes) || bytes > 1e18) {
    throw std::invalid_argument(flag + " must be a size such as 512M or 8G, got '" + text + "'");
  }
  return static_cast<std::uint64_t>(bytes);
}

void apply_warm_options(const WarmFlags& flags, bool preload_given, agent::LaunchConfig& c,
                        std::ostream& err) {
  c.warm.warm_restart = flags.warm_restart;
  if (preload_given || !flags.preload.empty()) {
    std::vector<std::string> modules;
    std::stringstream items(flags.preload);
    for (std::string item; std::getline(items, item, ',');) {
      if (item.empty()) continue;
      for (const char ch : item) {
        if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '.') {
          throw std::invalid_argument("--preload takes module names (a,b.c), got '" + item + "'");
        }
      }
      modules.push_back(item);
    }
    c.warm.preload = modules;
    if (!flags.warm_restart) {
      err << "[dist-launch] notice: --preload applies to --warm-restart only\n";
    }
  }
  if (!flags.snapshot_memory.empty()) {
    c.warm.snapshot_memory_bytes = parse_size("--snapshot-memory", flags.snapshot_memory);
  }
  c.warm.snapshot_dir = flags.snapshot_dir;
  c.warm.snapshot_replicas = flags.snapshot_replicas;
  if (flags.warm_restart && !c.python_workers) {
    err << "[dist-launch] notice: --warm-restart forks Python workers only: these (--no-python) "
           "start as usual\n";
  }
}

}  // namespace dist::launcher
