#!/usr/bin/env bash
# Configures (once) and builds dist-launch. Incremental; Release unless BUILD_TYPE says otherwise.
#   BUILD_DIR (default build), BUILD_TYPE (default Release), extra arguments go to CMake's configure.
#   BUILD_TARGETS: only these targets (space-separated; default: everything, tests included).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${BUILD_DIR:-$root/build}
build_type=${BUILD_TYPE:-Release}
jobs=${JOBS:-$(nproc)}

# A new tree is made with Ninja when there is one: unlike Make, it compiles a target's files while
# the libraries it links are still being built, so neither core waits for a library's last file.
generator=()
if [ ! -f "$build_dir/CMakeCache.txt" ] && command -v ninja >/dev/null; then generator=(-G Ninja); fi
if [ ! -f "$build_dir/CMakeCache.txt" ] || [ $# -gt 0 ]; then
  cmake -S "$root" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE="$build_type" "$@"
fi
targets=()
for target in ${BUILD_TARGETS:-}; do targets+=(--target "$target"); done
cmake --build "$build_dir" -j "$jobs" "${targets[@]}"
