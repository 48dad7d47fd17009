#!/usr/bin/env bash
# The Python user's first minute with the binary wheel (issue #47): from `pip install` of the
# wheel to the README's torch example done (`dist-launch --nproc-per-node 2
# examples/torch/ddp_train.py --steps 20`), in a fresh venv that sees python3's torch
# (--system-site-packages: the user has torch already). Prints, from the install's start, when
# each rank's process group was up (its first step follows at once) and when its 20th step was
# done, then the load average.
#   bench/first_minute.sh [WHEEL] [RUNS]    WHEEL: default dist/dist_launch-*.whl, RUNS: 3
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
wheel=${1:-$(ls "$root"/dist/dist_launch-*.whl)}
runs=${2:-3}
python3 -c 'import torch' 2>/dev/null || { echo "first_minute: python3 has no torch" >&2; exit 77; }
since() { python3 -c "import sys; print(f'{float(sys.argv[1]) - float(sys.argv[2]):.1f}')" "$1" "$2"; }
for run in $(seq "$runs"); do
  work=$(mktemp -d)
  python3 -m venv --system-site-packages "$work/venv"
  (
    # shellcheck source=/dev/null
    . "$work/venv/bin/activate"
    cd "$root"
    t0=$EPOCHREALTIME
    pip install --quiet --no-index --disable-pip-version-check "$wheel"
    installed=$EPOCHREALTIME
    marks=()
    while IFS= read -r line; do
      case $line in
        *"process group up"*) marks+=("$(since "$EPOCHREALTIME" "$t0") s $line") ;;
        *"weights in sync"*) marks+=("$(since "$EPOCHREALTIME" "$t0") s ${line%%: loss=*}: 20 steps done") ;;
      esac
    done < <(GLOO_SOCKET_IFNAME=lo dist-launch --nproc-per-node 2 examples/torch/ddp_train.py --steps 20 2>&1)
    done_at=$(since "$EPOCHREALTIME" "$t0")
    echo "run $run: pip install $(since "$installed" "$t0") s; job done $done_at s; load $(cut -d' ' -f1-3 /proc/loadavg)"
    printf '  %s\n' "${marks[@]}"
  )
  rm -rf "$work"
done
