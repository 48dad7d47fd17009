// The progress hook of Python workers (hang_detector.h): the agent writes two files into its run
// directory, python/sitecustomize.py and python/_dist_launch_progress.py (python/dist_launch/
// progress.py, embedded at build time), and puts that directory first on the workers' PYTHONPATH.
// Python imports sitecustomize at start: it installs the hook (the worker's slot mapped, the
// stack-dump signal taken by faulthandler, torch's optimizer steps counted once torch is
// imported) and then runs the sitecustomize it shadows, if any, as Python would have. Interpreters
// that ignore PYTHONPATH (-E, -I) get no hook. --no-step-hook: none is written.
//
// Every job's workers also get the dist_launch package, installed or not: a stand-in
// (python/dist_launch/_stand_in.py as dist_launch/__init__.py, with snapshot.py and elastic.py
// beside it, compiled in) written into the run directory and put last on PYTHONPATH, after the
// workers' own entries. Where dist_launch is installed the stand-in makes way for it, so that
// `from dist_launch import snapshot, elastic` works either way.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "processes/process.h"

namespace dist::agent {

// Writes the hook under `run_dir`; the directory to put on PYTHONPATH. Throws std::runtime_error
// naming the file it could not write.
std::filesystem::path write_python_hook(const std::filesystem::path& run_dir);

// Writes the stand-in package under `dir` (dir/dist_launch/...); `dir` is what goes on PYTHONPATH.
// Throws std::runtime_error naming what it could not write.
void write_stand_in_package(const std::filesystem::path& dir);

// PYTHONPATH for a worker: `first` (the hook's directory) before what the worker would have had
// (`env`'s own, else the agent's `base_env`'s), `last` (the stand-in dist_launch package) after it;
// an empty path is left out.
void add_python_paths(Variables& env, const std::filesystem::path& first,
                      const std::filesystem::path& last, const std::vector<std::string>& base_env);

}  // namespace dist::agent
