// The dist_launch package every Python worker can import, installed or not: the agent writes a
// stand-in (python/dist_launch/_stand_in.py as dist_launch/__init__.py, with snapshot.py and
// elastic.py beside it, all compiled in) into the run directory and appends that directory to the
// workers' PYTHONPATH, after the user's own entries. Where dist_launch is installed, the stand-in
// makes way for it, so that `from dist_launch import snapshot, elastic` works either way.
#pragma once

#include <filesystem>

namespace dist::agent::warm {

// Writes the package under `dir` (dir/dist_launch/...); `dir` is what goes on PYTHONPATH. Throws
// std::runtime_error naming what it could not write.
void write_stand_in_package(const std::filesystem::path& dir);

}  // namespace dist::agent::warm
