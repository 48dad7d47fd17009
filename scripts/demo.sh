#!/usr/bin/env bash
# Sets up and runs the main job: two PyTorch DDP workers (Debian's torch 1.13) under dist-launch,
# with a crash injected on the first attempt so the restart and the recovery are visible.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh" >/dev/null
"$root/scripts/build.sh" >/dev/null
bin=${BUILD_DIR:-$root/build}/bin

export PYTHON_EXEC=${PYTHON_EXEC:-/usr/bin/python3}
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}
set -x
"$bin/dist-launch" --nproc-per-node 2 --max-restarts 1 \
  "$root/examples/torch/ddp_train.py" --crash-on-attempt 0 --steps 20
