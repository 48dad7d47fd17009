#include "health/python_hook.h"

#include <spdlog/spdlog.h>
#include <stdlib.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string_view>

#include "warm_python_sources.h"  // the stand-in package (warm/warm.cmake)

namespace dist::agent {

extern const std::string_view kProgressModule;  // generated from python/dist_launch/progress.py

namespace {

namespace fs = std::filesystem;

// Installs the hook, then runs the sitecustomize this one shadows (Debian's, a virtualenv's), as
// site.py would have: found on sys.path past this directory, run as the module sitecustomize.
constexpr std::string_view kSiteCustomize =
    R"py(# Written by dist-launch's agent (agent/src/health/python_hook.h).
import os
import sys


def _dist_launch_hook():
    try:
        import _dist_launch_progress

        _dist_launch_progress.install()
    except Exception as e:
        print(f"dist-launch: progress hook not installed ({type(e).__name__}: {e})", file=sys.stderr)


def _dist_launch_chain():
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_dist_launch_hook()
_dist_launch_chain()
)py";

void write_file(const fs::path& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  if (!out) {
    throw std::runtime_error("cannot write " + path.string() + " (" + std::strerror(errno) + ")");
  }
}

// The files of python_files(), by their place under its directory.
struct PythonFile {
  std::string_view path;
  std::string_view text;
};

std::array<PythonFile, 8> every_python_file() {
  return {{{"hook/sitecustomize.py", kSiteCustomize},
           {"hook/_dist_launch_progress.py", kProgressModule},
           {"package/dist_launch/__init__.py", warm::python::kStandInPackage},
           {"package/dist_launch/snapshot.py", warm::python::kSnapshot},
           {"package/dist_launch/elastic.py", warm::python::kElastic},
           {"package/dist_launch/_sockets.py", warm::python::kSockets},  // elastic.py's
           // elastic.py writes a stuck rank's error file with _function_worker's writer
           {"package/dist_launch/_function_worker.py", warm::python::kFunctionWorker},
           {"package/dist_launch/progress.py", kProgressModule}}};
}

// A hash of every file's place and text: the cache directory's name, a new one for new text.
// (std::hash, eight bytes at a step: the name only has to differ between the texts one build
// and another put there.)
std::string content_name() {
  std::size_t h = 0;
  for (const auto& f : every_python_file()) {
    for (const std::string_view part : {f.path, f.text}) {
      h = (h ^ std::hash<std::string_view>{}(part)) * 1099511628211ULL;
    }
  }
  char name[32];
  std::snprintf(name, sizeof name, "python-%016zx", h);
  return name;
}

// $XDG_CACHE_HOME/dist-launch, else $HOME/.cache/dist-launch; empty without either.
fs::path cache_root() {
  const char* xdg = ::getenv("XDG_CACHE_HOME");
  if (xdg && xdg[0] == '/') return fs::path(xdg) / "dist-launch";
  const char* home = ::getenv("HOME");
  if (home && home[0] == '/') return fs::path(home) / ".cache" / "dist-launch";
  return {};
}

// Every file there, at its size (a stat each: a copy a cleaner emptied or cut is not used).
bool complete(const fs::path& dir) {
  for (const auto& f : every_python_file()) {
    std::error_code ec;
    if (fs::file_size(dir / f.path, ec) != f.text.size() || ec) return false;
  }
  return true;
}

void write_all(const fs::path& dir) {
  for (const auto& f : every_python_file()) {
    const fs::path path = dir / f.path;
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    if (ec) {
      throw std::runtime_error("cannot create " + path.parent_path().string() + " (" +
                               ec.message() + ")");
    }
    write_file(path, f.text);
  }
}

// Temporaries (and damaged copies set aside) that a launch killed while writing left behind: an
// hour old, no launch is still writing them.
void sweep_leftovers(const fs::path& root) {
  std::error_code ec;
  const auto old = fs::file_time_type::clock::now() - std::chrono::hours(1);
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(".writing-")) continue;
    std::error_code stat_ec;
    const auto written = fs::last_write_time(entry.path(), stat_ec);
    if (!stat_ec && written < old) fs::remove_all(entry.path(), stat_ec);
  }
}

// The cache's copy, written if missing; empty when the cache cannot be used.
fs::path cached_python_files() {
  const fs::path root = cache_root();
  if (root.empty()) return {};
  const fs::path dir = root / content_name();
  if (complete(dir)) return dir;
  std::error_code ec;
  fs::create_directories(root, ec);
  sweep_leftovers(root);
  std::string pattern = (root / ".writing-XXXXXX").string();
  if (ec || !::mkdtemp(pattern.data())) {
    spdlog::debug("no Python file cache in {}: {}", root.string(),
                  ec ? ec.message() : std::strerror(errno));
    return {};
  }
  const fs::path temporary = pattern;
  try {
    write_all(temporary);
  } catch (const std::exception& e) {
    spdlog::debug("no Python file cache: {}", e.what());
    fs::remove_all(temporary, ec);
    return {};
  }
  fs::rename(temporary, dir, ec);  // fails where a directory is in the way
  if (ec && !complete(dir)) {      // a damaged copy: set aside for ours (a complete one is in use)
    const fs::path aside = temporary.string() + ".damaged";
    fs::rename(dir, aside, ec);
    fs::rename(temporary, dir, ec);
    fs::remove_all(aside, ec);
  }
  fs::remove_all(temporary, ec);  // still there when another launch renamed its copy first
  return complete(dir) ? dir : fs::path{};
}

}  // namespace

PythonFiles python_files(const fs::path& run_dir, bool with_hook) {
  fs::path dir = cached_python_files();
  if (dir.empty()) {
    dir = run_dir / "python";
    write_all(dir);
  }
  return {with_hook ? dir / "hook" : fs::path{}, dir / "package"};
}

void add_python_paths(Variables& env, const fs::path& first, const fs::path& last,
                      const std::vector<std::string>& base_env) {
  std::string own;
  if (const auto it = env.find("PYTHONPATH"); it != env.end()) {
    own = it->second;
  } else {
    for (const auto& entry : base_env) {
      if (entry.starts_with("PYTHONPATH=")) own = entry.substr(11);
    }
  }
  std::string path;
  for (const std::string& part : {first.string(), own, last.string()}) {
    if (part.empty()) continue;
    if (!path.empty()) path += ':';
    path += part;
  }
  if (!path.empty()) env["PYTHONPATH"] = path;
}

}  // namespace dist::agent
