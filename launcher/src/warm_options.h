// Warm restarts and snapshots on dist-launch's command line (agent/src/warm/), declared with the
// other options (options.cc) and read into the LaunchConfig (config_from_options.cc):
//   --warm-restart        Python workers forked from a zygote that has imported torch once
//   --preload MOD,...     what the zygote imports (default: torch and numpy, where installed)
//   --snapshot-memory S   snapshots in the agent's shared memory, at most S ("8G", "512M")
//   --snapshot-dir DIR    ... and persisted to DIR (a restarted node reads them there)
//   --snapshot-replicas K ... and each rank's newest kept by K other nodes' agents too
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "command_line.h"
#include "dist/agent/config.h"

namespace dist::launcher {

struct WarmFlags {
  bool warm_restart = false;
  std::string preload;
  std::string snapshot_memory;
  std::string snapshot_dir;
  int snapshot_replicas = 0;
};

void add_warm_options(CommandLine& app, WarmFlags& flags);

// Into `config`, whose worker command is known (config_from_options.cc). `preload_given`: --preload
// was on the command line or in PET_PRELOAD, even empty (no module preloaded). Throws
// std::invalid_argument with a one-line message for the user; notes on `err` what does not apply
// (C++ workers).
void apply_warm_options(const WarmFlags& flags, bool preload_given, agent::LaunchConfig& config,
                        std::ostream& err);

// "512M", "8G", "1.5GiB", "100MB", "1048576": bytes (K, M, G, T are powers of 1024, as the
// kernel's tmpfs size= takes them). Throws std::invalid_argument naming `flag`.
std::uint64_t parse_size(const std::string& flag, const std::string& text);

}  // namespace dist::launcher
