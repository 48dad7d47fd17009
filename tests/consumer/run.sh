#!/usr/bin/env bash
# Installs the build into a temporary prefix, moves the prefix elsewhere (the package must be
# relocatable: no absolute path of the build, the source, the prefix or the CUDA toolkit in any
# installed CMake file), then configures, builds and runs the consumer against the moved prefix
# with find_package(DistSdk). Usage: run.sh BUILD_DIR
set -euo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
mv "$work/prefix" "$work/moved"
for path in "$work/prefix" "$(cd "$build" && pwd)" "$source_dir" /usr/local/cuda; do
  if grep -rlF "$path" "$work/moved/lib/cmake" "$work/moved/include" >"$work/hits"; then
    echo "installed files name $path, so the package is not relocatable:" >&2
    cat "$work/hits" >&2
    exit 1
  fi
done
cmake -S "$here" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/moved" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/build" -j "$(nproc)" >/dev/null
"$work/build/consumer"
