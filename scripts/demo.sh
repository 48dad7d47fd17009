#!/usr/bin/env bash
# Sets up and runs the main job: two C++ DDP workers (examples/ddp_train) under dist-launch, with a
# crash injected on the first attempt; the agent restarts the group, the workers resume from their
# checkpoint, and the run ends with the same weights (SHA-256) an uninterrupted run has.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh" >/dev/null
# Only what the demo runs (the tests and benchmarks are scripts/test.sh's, in build/), as a unity
# build (several .cc files per compiler run: each header is parsed once per batch), in a folder of
# its own: from a fresh clone on 2 cores it takes half the time of a file-by-file build.
build_dir=${BUILD_DIR:-$root/build-demo}
configure=()
[ -f "$build_dir/CMakeCache.txt" ] || configure=(-DCMAKE_UNITY_BUILD=ON)
BUILD_DIR=$build_dir BUILD_TARGETS="dist-launch ddp_train" "$root/scripts/build.sh" \
  "${configure[@]}" >/dev/null
bin=$build_dir/bin
checkpoints=$(mktemp -d)
trap 'rm -rf "$checkpoints"' EXIT

set -x
"$bin/dist-launch" --nproc-per-node 2 --max-restarts 1 --no-python "$bin/ddp_train" \
  --checkpoint-dir "$checkpoints" --crash-at-step 320
