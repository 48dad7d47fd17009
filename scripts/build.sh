#!/usr/bin/env bash
# Configures (once) and builds dist-launch. Incremental; Release unless BUILD_TYPE says otherwise.
#   BUILD_DIR (default build), BUILD_TYPE (default Release), extra arguments go to CMake's configure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${BUILD_DIR:-$root/build}
build_type=${BUILD_TYPE:-Release}
jobs=${JOBS:-$(nproc)}

if [ ! -f "$build_dir/CMakeCache.txt" ] || [ $# -gt 0 ]; then
  cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE="$build_type" "$@"
fi
cmake --build "$build_dir" -j "$jobs"
