#!/usr/bin/env bash
# The GPU bundle made from this build's programs (scripts/gpu-bundle.sh --no-build: copies,
# strips, collects libraries, checks ldd, glibc symbol versions and size), then
# scripts/gpu-check.sh run from it as on a machine without a GPU: its GPU steps must be skipped,
# saying so, and its own checks (NCCL linked in, every program loads, the SDK's CPU tests from
# the bundle) must pass. Exit 77 when this build has no NCCL backend or no nvcc.
#   tests/gpu_bundle/run.sh BUILD_DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
for program in sdk_gpu_tests sdk_tests ddp_train nccl-bench dist-launch-portable; do
  if [ ! -x "$build/bin/$program" ]; then
    echo "skipped: $build/bin/$program is not built (the bundle needs the NCCL backend, nvcc and" \
      "the benchmarks: DIST_WITH_NCCL, DIST_BUILD_BENCH)"
    exit 77
  fi
done
work=$(mktemp -d "$build/gpu-bundle-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
bundle=$work/gpu-bundle
status=0
BUILD_DIR=$build "$root/scripts/gpu-bundle.sh" --no-build "$bundle" || status=$?
[ $status -eq 77 ] && exit 77
[ $status -eq 0 ] || { echo "FAIL: gpu-bundle.sh exited $status"; exit 1; }

fail() {
  echo "FAIL: $*"
  exit 1
}
for f in bin/sdk_gpu_tests bin/sdk_tests bin/ddp_train bin/nccl-bench bin/dist-launch \
  lib/libgloo.so.0 gpu-check.sh bench/nccl_compare.py bench/nccl_torch_bench.py \
  bench/cuda_warm_restart.py \
  data/digits.csv.gz MANIFEST.txt; do
  [ -e "$bundle/$f" ] || fail "the bundle has no $f"
done
if ls "$bundle"/lib/libnccl* >/dev/null 2>&1; then fail "the bundle carries libnccl"; fi
bytes=$(du -sb "$bundle" | cut -f1)
[ "$bytes" -le $((64 * 1024 * 1024)) ] || fail "the bundle has $bytes bytes, over 64 MiB"
echo "bundle: $bytes bytes"

out=$work/out
status=0
GPU_CHECK_FORCE_CPU=1 OUT=$out timeout 300 bash "$bundle/gpu-check.sh" || status=$?
[ $status -eq 0 ] || fail "gpu-check.sh exited $status without a GPU"
summary=$out/summary.txt
[ -f "$summary" ] || fail "no summary.txt under \$OUT"
grep -q 'the GPU steps are SKIPPED' "$out/log.txt" || fail "no message that the GPU steps are skipped"
for s in facts nccl_link load sdk_cpu; do
  grep -qE "^$s +PASS" "$summary" || fail "step $s did not pass: $(grep "^$s " "$summary")"
done
for s in gpu_tests ddp_train warm_restart compare_sum compare_avg sdk_nccl; do
  grep -qE "^$s +SKIP .*no GPU on this machine" "$summary" || fail "step $s was not skipped"
done
grep -q 'loaded NCCL [0-9]' "$summary" || fail "the loaded NCCL's version is not in the summary"
echo "gpu-check without a GPU: $(grep -c PASS "$summary") steps passed, the GPU steps skipped"
