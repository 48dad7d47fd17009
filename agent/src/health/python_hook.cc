#include "health/python_hook.h"

#include <cerrno>
#include <cstring>
#include <fstream>
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

}  // namespace

void write_stand_in_package(const fs::path& dir) {
  const fs::path package = dir / "dist_launch";
  std::error_code ec;
  fs::create_directories(package, ec);
  if (ec) throw std::runtime_error("cannot create " + package.string() + " (" + ec.message() + ")");
  write_file(package / "__init__.py", warm::python::kStandInPackage);
  write_file(package / "snapshot.py", warm::python::kSnapshot);
  write_file(package / "elastic.py", warm::python::kElastic);
}

fs::path write_python_hook(const fs::path& run_dir) {
  const fs::path dir = run_dir / "python";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create " + dir.string() + " (" + ec.message() + ")");
  write_file(dir / "_dist_launch_progress.py", kProgressModule);
  write_file(dir / "sitecustomize.py", kSiteCustomize);
  return dir;
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
