// The progress hook of Python workers (hang_detector.h): two files, sitecustomize.py and
// _dist_launch_progress.py (python/dist_launch/progress.py, embedded at build time), in a directory
// put first on the workers' PYTHONPATH (python_files() says where).
// Python imports sitecustomize at start: it installs the hook (the worker's slot mapped, the
// stack-dump signal taken by faulthandler, torch's optimizer steps counted once torch is
// imported) and then runs the sitecustomize it shadows, if any, as Python would have. Interpreters
// that ignore PYTHONPATH (-E, -I) get no hook. --no-step-hook: the hook's directory is not on
// PYTHONPATH.
//
// Every job's workers also get the dist_launch package, installed or not: a stand-in
// (python/dist_launch/_stand_in.py as dist_launch/__init__.py, with snapshot.py and elastic.py
// beside it, compiled in) put last on PYTHONPATH, after the workers' own entries. Where dist_launch
// is installed the stand-in makes way for it, so that `from dist_launch import snapshot, elastic`
// works either way.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "processes/process.h"

namespace dist::agent {

// Where a job's workers find the Python files: the hook's directory (empty without one) and the
// stand-in package's (what goes on PYTHONPATH).
struct PythonFiles {
  std::filesystem::path hook;
  std::filesystem::path package;
};

// The files, shared by every launch of this build: written once into the user's cache
// ($XDG_CACHE_HOME, else ~/.cache: dist-launch/python-<hash of their text>/, made complete in a
// temporary directory and renamed into place, so that a launch sees all of them or none) and found
// there by the next launch, with the bytecode Python compiled for them; into `run_dir` instead
// when there is no cache to use (no HOME, a read-only one). Throws std::runtime_error naming what
// it could not write.
PythonFiles python_files(const std::filesystem::path& run_dir, bool with_hook);

// PYTHONPATH for a worker: `first` (the hook's directory) before what the worker would have had
// (`env`'s own, else the agent's `base_env`'s), `last` (the stand-in dist_launch package) after it;
// an empty path is left out.
void add_python_paths(Variables& env, const std::filesystem::path& first,
                      const std::filesystem::path& last, const std::vector<std::string>& base_env);

}  // namespace dist::agent
