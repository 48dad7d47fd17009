#!/usr/bin/env bash
# Sets up and runs the main job: two C++ DDP workers (examples/ddp_train) under dist-launch, with a
# crash injected on the first attempt; the agent restarts the group, the workers resume from their
# checkpoint, and the run ends with the same weights (SHA-256) an uninterrupted run has.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh" >/dev/null
# Only what the demo runs (the tests and benchmarks are scripts/test.sh's, in build/), built for a
# quick first result in a folder of its own: a unity build (several .cc files per compiler run),
# with Ninja when there is one, at -O1 (-O3's optimisation is most of each file's compile time;
# GCC 12 at -O1 warns falsely about asio's coroutine frames, hence -Wno-mismatched-new-delete).
# From a fresh clone on 2 cores: 149 s against 320 s for the Release build file by file.
# A BUILD_DIR of the caller's is built as it is configured (scripts/build.sh's Release when new).
configure=()
if [ -n "${BUILD_DIR:-}" ]; then
  build_dir=$BUILD_DIR
else
  build_dir=$root/build-demo
  # Configured (again) unless it is already the quick build: an old or failed configure is redone.
  if ! grep -qE '^CMAKE_UNITY_BUILD:[A-Z]+=ON$' "$build_dir/CMakeCache.txt" 2>/dev/null; then
    rm -rf "$build_dir"
    configure=(-DCMAKE_UNITY_BUILD=ON
      "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG -Wno-mismatched-new-delete")
    if command -v ninja >/dev/null; then configure+=(-G Ninja); fi
  fi
fi
BUILD_DIR=$build_dir BUILD_TARGETS="dist-launch ddp_train" "$root/scripts/build.sh" \
  "${configure[@]}" >/dev/null
bin=$build_dir/bin
checkpoints=$(mktemp -d)
trap 'rm -rf "$checkpoints"' EXIT

set -x
"$bin/dist-launch" --nproc-per-node 2 --max-restarts 1 --no-python "$bin/ddp_train" \
  --checkpoint-dir "$checkpoints" --crash-at-step 320
