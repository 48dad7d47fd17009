#!/usr/bin/env bash
# The GPU proof of the SDK's NCCL path (issue 24), in one command, run from the folder
# scripts/gpu-bundle.sh makes (this file is copied into it):
#
#   bash gpu-bundle/gpu-check.sh        everything goes to $OUT when set, else ./gpu-check-out
#
# Steps, newest first, each bounded by `timeout` and by what is left of
# GPU_CHECK_BUDGET (default 450 s: the command must end within 8 minutes); a step that fails is
# recorded and the next one runs; a summary table ends the output (and $OUT/summary.txt):
#   facts        nvidia-smi, the OS, glibc, Python, torch and its NCCL, the bundle's manifest
#   nccl_link    the machine's NCCL (torch's pip NCCL, else a system one) linked into lib/, where
#                the programs' RPATH ($ORIGIN/../lib) finds it; ldd of every program
#   load         every program starts; the NCCL it loads and the one it was built with
#   sdk_cpu      the SDK's tests that need no GPU (Gloo, keys, monitor), from the bundle
#   torch_nccl_inplace   (wave 4, issue 43) torch DDP over NCCL under --restart-policy in-place,
#                two ranks on the one GPU (each its own NCCL_HOSTID: NCCL's socket transport, as
#                between hosts): a rank SIGKILLed, then one SIGSTOPped; dist_launch.elastic
#                aborts the survivor's communicators; the weights of a run that lost nobody
#   nccl_compression     (wave 4, issue 45) ddp_train --backend nccl, two ranks, every
#                --compression: bytes per step (powersgd:2 <= 0.1x dense) and a NaN gradient
#                at step 100 that poisons nothing (the inf/NaN guard on the device)
#   nccl_restart the same two ranks, one crashing at step 320: the group restarted from the
#                checkpoint ends with the uninterrupted run's weights
#   gpu:<test>   each GPU test (sdk_gpu_tests) on its own, CUDA_MODULE_LOADING=EAGER
#   ddp_train    ddp_train --backend nccl under dist-launch: an uninterrupted run, then one that
#                crashes at step 320 and restarts: the same weights (SHA-256) or FAIL
#   warm_restart bench/cuda_warm_restart.py (torch, NCCL) crashed and restarted, cold and under
#                --warm-restart: the forked worker creates its CUDA context; crash-to-step times
#   compare_sum, compare_avg   bench/nccl_compare.py: the SDK's group beside torch's
#                ProcessGroupNCCL on this GPU, synchronous 8 B and 64 MiB all-reduces, interleaved,
#                medians (sum: nothing to move at one rank; avg: NCCL's kernel over every byte)
#   sdk_nccl     sdk_tests' NCCL tests (one rank per visible GPU)
# Without a GPU (nvidia-smi lists none, or GPU_CHECK_FORCE_CPU=1) the GPU steps are skipped,
# saying so, and the others run: a test runs it so on machines without one. GPU_CHECK_FORCE_GPU=1
# runs the GPU steps anyway (a rehearsal of this script: without a device they skip or fail).
# GPU_CHECK_ONLY=REGEX runs only the GPU steps whose names match (a re-run of a few).
# Exit 0 when no step failed or timed out, else 1.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$PWD/gpu-check-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
budget=${GPU_CHECK_BUDGET:-450}
start=$SECONDS
rows=()
failures=0
export here out

gpu=false
if [ "${GPU_CHECK_FORCE_CPU:-0}" != 1 ] && command -v nvidia-smi >/dev/null 2>&1 &&
  nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  gpu=true
fi
# A rehearsal of the GPU steps where there is no GPU (they skip or fail, but every step runs).
[ "${GPU_CHECK_FORCE_GPU:-0}" = 1 ] && gpu=true

# record NAME STATUS SECONDS NOTE
record() {
  rows+=("$(printf '%-64s %-7s %4s  %s' "$1" "$2" "$3" "$4")")
  case $2 in FAIL | TIMEOUT) failures=$((failures + 1)) ;; esac
}

# step NAME LIMIT FUNCTION [ARGS...]: runs the exported FUNCTION under timeout (LIMIT seconds at
# most, less when the budget is nearly spent), its output on the console and in $out/NAME.log.
# Exit 0: PASS, 77: SKIP, 124/137: TIMEOUT, else FAIL. The note is its last "NOTE:" line.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((budget - (SECONDS - start)))
  if ((left < 15)); then
    record "$name" SKIP 0 "out of time: the ${budget}s budget is spent"
    return
  fi
  ((limit > left - 10)) && limit=$((left - 10))
  local log="$out/${name//[^A-Za-z0-9_.-]/_}.log"
  echo
  echo "=== $name (at most ${limit}s)"
  local t0=$SECONDS
  timeout -k 10 "$limit" bash -c '"$@"' _ "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local note
  note=$(grep -a '^NOTE: ' "$log" | tail -1 | cut -c7-)
  case $rc in
    0) record "$name" PASS $((SECONDS - t0)) "$note" ;;
    77) record "$name" SKIP $((SECONDS - t0)) "$note" ;;
    124 | 137) record "$name" TIMEOUT $((SECONDS - t0)) "killed after ${limit}s; $note" ;;
    *) record "$name" FAIL $((SECONDS - t0)) "exit $rc; $note" ;;
  esac
}

# wanted STEP: whether GPU_CHECK_ONLY (an extended regular expression; default: every step)
# selects STEP, for a re-run of a few.
wanted() {
  [[ $1 =~ ${GPU_CHECK_ONLY:-.} ]]
}

gpu_step_skipped() {
  record "$1" SKIP 0 "no GPU on this machine (nvidia-smi lists none)"
}

# ---- the steps (exported: they run under timeout in a shell of their own) ----

facts() {
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,pci.bus_id --format=csv
  else
    echo "nvidia-smi: not installed"
  fi
  uname -a
  grep PRETTY_NAME /etc/os-release
  ldd --version | head -1
  echo "cores: $(nproc)"
  python3 --version
  timeout 60 python3 - <<'PY' || echo "torch: not importable"
import torch
info = [f"torch {torch.__version__}", f"CUDA {torch.version.cuda}",
        f"cuda available {torch.cuda.is_available()}"]
try:
    info.append("NCCL " + ".".join(map(str, torch.cuda.nccl.version())))
except Exception as e:  # a CPU build of torch
    info.append(f"NCCL: {e}")
print(", ".join(info))
PY
  env | grep -E '^(CUDA|NCCL|LD_LIBRARY_PATH)' || true
  head -8 "$here/MANIFEST.txt"
  local device
  device=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
  echo "NOTE: ${device:-no GPU}; $(grep -m1 '^commit:' "$here/MANIFEST.txt")"
}

# Links the machine's NCCL into lib/ (torch's pip NCCL first: the one torch runs on). What later
# steps need stays on disk: the link, or $out/.nccl_ld_path when lib/ is read-only.
link_nccl() {
  local dir="" d torch_dir
  dir=$(timeout 60 python3 -c 'import os, nvidia.nccl as m; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null)
  if [ ! -f "$dir/libnccl.so.2" ]; then  # where torch's own RPATH looks: site-packages/nvidia/*/lib
    torch_dir=$(timeout 60 python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null)
    dir=$(dirname "$(ls "$torch_dir"/../nvidia/*/lib/libnccl.so.2 2>/dev/null | head -1)" 2>/dev/null)
  fi
  if [ ! -f "$dir/libnccl.so.2" ]; then
    dir=""
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
      if [ -f "$d/libnccl.so.2" ]; then
        dir=$d
        break
      fi
    done
  fi
  if [ -z "$dir" ]; then
    echo "no libnccl.so.2: neither python3's nvidia.nccl (torch's pip NCCL) nor a system one"
    echo "NOTE: no NCCL found on this machine"
    return 1
  fi
  if ln -sfn "$dir/libnccl.so.2" "$here/lib/libnccl.so.2" 2>/dev/null; then
    echo "linked $here/lib/libnccl.so.2 -> $dir/libnccl.so.2"
  else
    echo "lib/ is read-only: LD_LIBRARY_PATH=$dir for the bundle's programs"
    echo "$dir" >"$out/.nccl_ld_path"
  fi
  local missing=0 f
  for f in "$here"/bin/*; do
    echo "--- ldd $(basename "$f")"
    with_nccl ldd "$f" | tee -a "$out/ldd.txt" | grep -E 'nccl|gloo|udev|not found|version .* not found'
    with_nccl ldd "$f" 2>&1 | grep -qE 'not found' && missing=1
  done
  echo "NOTE: libnccl.so.2 from $dir$([ $missing = 1 ] && echo '; a library is NOT FOUND (ldd.txt)')"
  return $missing
}

with_nccl() {
  if [ -f "$out/.nccl_ld_path" ]; then
    LD_LIBRARY_PATH="$(cat "$out/.nccl_ld_path")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"
  else
    "$@"
  fi
}

load() {
  local rc=0
  with_nccl "$here/bin/dist-launch" --version || rc=1
  with_nccl "$here/bin/ddp_train" --help >/dev/null || rc=1
  with_nccl "$here/bin/nccl-bench" --help >/dev/null || rc=1
  with_nccl "$here/bin/sdk_gpu_tests" --gtest_list_tests >/dev/null || rc=1
  local version
  version=$(with_nccl "$here/bin/sdk_tests" --gtest_filter=NcclBootstrap.TheLoadedNcclVersionIsReported |
    grep -a 'loaded NCCL')
  echo "$version"
  [ -n "$version" ] || rc=1
  echo "NOTE: ${version:-the NCCL version could not be read}"
  return $rc
}

sdk_cpu() {
  with_nccl "$here/bin/sdk_tests" \
    --gtest_filter='NcclBootstrap.*:StallMonitor.*:GlooPeerFailure.*:KeepAlive.*' --gtest_brief=1
  local rc=$?
  echo "NOTE: Gloo peer naming, keep_alive, communicator keys, stall monitor, from the bundle"
  return $rc
}

# One GPU test, in a process of its own.
gpu_test() {
  local log rc
  log=$(mktemp)
  CUDA_MODULE_LOADING=EAGER NCCL_DEBUG=${NCCL_DEBUG:-VERSION} with_nccl "$here/bin/sdk_gpu_tests" \
    --gtest_filter="$1" --gtest_brief=0 >"$log" 2>&1
  rc=$?
  cat "$log"
  if grep -aq '\[  SKIPPED \]' "$log" && ! grep -aq '\[       OK \]' "$log"; then
    echo "NOTE: $(grep -a -A1 'Skipped' "$log" | tail -1)"
    rm -f "$log"
    return 77
  fi
  echo "NOTE: $(grep -aoE 'wait\(\) returned a median [0-9.]+ us|destroyed with a collective running in [0-9.]+ s|failure seen after [0-9.]+ s|[0-9]+ collectives issued|gave up after [0-9.]+ s' "$log" | paste -sd';' -)"
  rm -f "$log"
  return $rc
}

# ddp_train on the GPU: an uninterrupted run and a crash-and-restart run, the same weights.
ddp_train() {
  local dir="$out/ddp_train" run digest=() accuracy=()
  rm -rf "$dir"
  for run in clean crash; do
    mkdir -p "$dir/$run/checkpoints"
    local extra=""
    [ $run = crash ] && extra="--crash-at-step 320"
    echo "--- $run"
    with_nccl timeout 200 "$here/bin/dist-launch" --nproc-per-node 1 --max-restarts 1 \
      --log-dir "$dir/$run/logs" --no-python "$here/bin/ddp_train" --backend nccl \
      --data "$here/data/digits.csv.gz" --checkpoint-dir "$dir/$run/checkpoints" $extra \
      2>&1 | tee "$dir/$run.txt" | grep -avE '^\[default0\]:epoch +([2-9]|1[0-9]|2[0-9]) '
    local line
    line=$(grep -aoE 'final test accuracy [0-9.]+ weights sha256 [0-9a-f]{64}' "$dir/$run.txt")
    digest+=("${line##* }")
    accuracy+=("$(echo "$line" | awk '{print $4}')")
  done
  local restarted
  restarted=$(grep -ac 'resumed from' "$dir/crash.txt")
  echo "clean:   accuracy ${accuracy[0]:-none} sha256 ${digest[0]:-none}"
  echo "crashed: accuracy ${accuracy[1]:-none} sha256 ${digest[1]:-none} (resumed: $restarted)"
  if [ -n "${digest[0]}" ] && [ "${digest[0]}" = "${digest[1]}" ] && [ "$restarted" -ge 1 ]; then
    echo "NOTE: crash at 320 + restart = uninterrupted: sha256 ${digest[0]:0:16}, accuracy ${accuracy[0]}"
    return 0
  fi
  echo "NOTE: digests differ or no restart: ${digest[0]:-none} vs ${digest[1]:-none}; $(grep -ah 'ddp_train: error' "$dir/clean.txt" "$dir/crash.txt" | tail -1 | cut -c1-160)"
  return 1
}

compare() {
  with_nccl python3 "$here/bench/nccl_compare.py" --bench "$here/bin/nccl-bench" --python python3 \
    --runs 3 --sizes 8,67108864 --min-seconds 1 --op "$1" >"$out/compare_$1.table" 2>&1
  local rc=$?
  cat "$out/compare_$1.table"
  if [ $rc -ne 0 ]; then
    echo "NOTE: $(grep -a . "$out/compare_$1.table" | tail -1 | cut -c1-160)"
  else
    echo "NOTE: $(awk '$1 == 8 {printf "8 B: sdk %s us, torch %s us (sdk-torch %s); ", $2, $4, $5} $1 == 67108864 {printf "64 MiB: sdk %s us (%s GB/s), torch %s us (%s GB/s)", $2, $6, $4, $7}' "$out/compare_$1.table")"
  fi
  return $rc
}

sdk_nccl() {
  local log rc
  log=$(mktemp)
  NCCL_DEBUG=${NCCL_DEBUG:-VERSION} with_nccl "$here/bin/sdk_tests" --gtest_filter='Nccl.*' \
    --gtest_brief=0 >"$log" 2>&1
  rc=$?
  cat "$log"
  echo "NOTE: $(grep -aE '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$log" | cut -c14- | paste -sd';' -)"
  rm -f "$log"
  return $rc
}

# Warm restart with CUDA workers: bench/cuda_warm_restart.py (NCCL, one rank per GPU) crashes at
# step 5 and is restarted, cold and under --warm-restart (forked from a zygote that imported torch
# without touching CUDA), interleaved; each run's time from the crash to attempt 1's first step.
warm_restart() {
  local dir="$out/warm_restart" run mode rc=0
  local -A times=([cold]="" [warm]="")
  local gpus
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  ((gpus >= 1)) || gpus=1
  rm -rf "$dir"
  mkdir -p "$dir"
  for run in 1 2 3; do
    for mode in cold warm; do
      local log="$dir/$mode-$run.txt" flags=()
      [ $mode = warm ] && flags=(--warm-restart)
      with_nccl timeout 60 "$here/bin/dist-launch" --nproc-per-node "$gpus" --max-restarts 1 \
        "${flags[@]}" "$here/bench/cuda_warm_restart.py" >"$log" 2>&1
      local status=$? ms forked
      ms=$(awk '/crashes at/ {c = $NF} /attempt 1 rank 0 step 1 done at/ {s = $NF}
        END {if (c && s) printf "%.0f", (s - c) * 1000}' "$log")
      forked=$(grep -acE 'round 1: [0-9]+ of [0-9]+ workers forked from the zygote' "$log")
      echo "$mode run $run: exit $status, crash to first step of attempt 1: ${ms:-none} ms, attempt 1 forked: $forked"
      if [ $status -ne 0 ] || [ -z "$ms" ] || ! grep -aq 'attempt 1 rank 0 step 10 done' "$log" ||
        { [ $mode = warm ] && [ "$forked" -eq 0 ]; }; then
        rc=1
        tail -20 "$log"
      fi
      times[$mode]+="${ms:-} "
    done
  done
  median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR] = $1} END {if (NR) print a[int((NR + 1) / 2)]; else print "none"}'; }
  echo "NOTE: crash to first CUDA step, $gpus rank(s), NCCL: cold $(echo "${times[cold]}" | median) ms, warm $(echo "${times[warm]}" | median) ms (medians of 3; cold ${times[cold]% }, warm ${times[warm]% })"
  return $rc
}

# ---- two ranks on the one GPU (wave 4) ----
# NCCL refuses two ranks of one host on one device ("Duplicate GPU detected"), but takes ranks
# whose NCCL_HOSTID differ as ranks of different hosts, connected by its socket transport over
# loopback: the exchanges, aborts and recoveries that several GPUs would prove, on one.
two_ranks_env() {
  export NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1
  cat >"$out/hostid.sh" <<'WRAP'
#!/usr/bin/env bash
# Each rank a host of its own for NCCL (see two_ranks_env in gpu-check.sh).
export NCCL_HOSTID=dist-launch-gpu-check-rank-$RANK
exec "$@"
WRAP
  chmod +x "$out/hostid.sh"
}

# ddp_train RUN_NAME DIR [ARGS...]: 2 ranks of ddp_train --backend nccl on the one GPU; the
# output in DIR/RUN_NAME.txt; prints "RUN_NAME exit E bytes B accuracy A ranks-agree Y|N".
ddp_train_two() {
  local name=$1 dir=$2
  shift 2
  with_nccl timeout 150 "$here/bin/dist-launch" --nproc-per-node 2 --log-dir "$dir/$name.logs" \
    "$@" >"$dir/$name.txt" 2>&1
  local status=$? bytes accuracy digests
  bytes=$(grep -aoE 'all-reduce bytes per step [0-9]+' "$dir/$name.txt" | awk '{print $NF}')
  accuracy=$(grep -aoE 'final test accuracy [0-9.]+' "$dir/$name.txt" | awk '{print $NF}')
  digests=$(grep -aoE 'rank [0-9]+ weights sha256 [0-9a-f]+' "$dir/$name.txt" | awk '{print $NF}' | sort -u | wc -l)
  echo "$name exit $status bytes ${bytes:-none} accuracy ${accuracy:-none} ranks-agree $([ "$digests" = 1 ] && echo Y || echo N)"
  [ $status -eq 0 ] || tail -15 "$dir/$name.txt"
}

# The SDK's compression over NCCL, 2 ranks: bytes per step of every mode against the dense
# exchange (target: powersgd:2 <= 0.1x), and one NaN gradient (rank 1's batch at step 100) that
# must poison no mode (the guard on the device).
nccl_compression() {
  local dir="$out/nccl_compression" rc=0 mode line
  rm -rf "$dir"
  mkdir -p "$dir"
  two_ranks_env
  local train=(--no-python "$out/hostid.sh" "$here/bin/ddp_train" --backend nccl --data "$here/data/digits.csv.gz")
  declare -A bytes=() accuracy=()
  for mode in none powersgd:2 fp16 bf16 topk:0.1 threshold:0.01; do
    line=$(ddp_train_two "clean-${mode//:/_}" "$dir" "${train[@]}" --compression "$mode")
    echo "$line"
    set -- $line
    bytes[$mode]=$5
    accuracy[$mode]=$7
    [ "$3" = 0 ] && [ "$9" = Y ] || rc=1
  done
  for mode in powersgd:2 fp16; do
    line=$(ddp_train_two "nan-${mode//:/_}" "$dir" "${train[@]}" --compression "$mode" --nan-at-step 100)
    echo "$line (clean ${accuracy[$mode]})"
    set -- $line
    if [ "$3" != 0 ] || [ "$7" = none ] || awk -v a="$7" -v c="${accuracy[$mode]}" 'BEGIN {exit !(a < c - 0.01)}'; then
      rc=1
    fi
    grep -aoE 'inf/NaN guard: [0-9]+ bucket update\(s\) skipped' "$dir/nan-${mode//:/_}.txt" | sed 's/^/  /'
    grep -aqE 'inf/NaN guard: [1-9][0-9]* bucket' "$dir/nan-${mode//:/_}.txt" || rc=1  # it acted
  done
  local ratio
  ratio=$(awk -v p="${bytes[powersgd:2]}" -v n="${bytes[none]}" 'BEGIN {if (n > 0 && p ~ /^[0-9]+$/) printf "%.3f", p / n; else print "none"}')
  [ "$ratio" != none ] && awk -v r="$ratio" 'BEGIN {exit !(r <= 0.1)}' || rc=1
  echo "NOTE: 2 ranks, NCCL: bytes/step none ${bytes[none]}, powersgd:2 ${bytes[powersgd:2]} (${ratio}x), fp16 ${bytes[fp16]}, topk:0.1 ${bytes[topk:0.1]}; accuracy none ${accuracy[none]}, powersgd:2 ${accuracy[powersgd:2]}; NaN at 100 poisons none: $([ $rc = 0 ] && echo yes || echo NO)"
  return $rc
}

# Two ranks of ddp_train --backend nccl, one crashing at step 320 and the group restarted from
# the checkpoint: the weights of an uninterrupted run (the one-rank ddp_train step, at two).
nccl_restart() {
  local dir="$out/nccl_restart" rc=0 run a b
  rm -rf "$dir"
  mkdir -p "$dir"
  two_ranks_env
  for run in clean crash; do
    mkdir -p "$dir/$run.checkpoints"
    local extra=()
    [ $run = crash ] && extra=(--crash-at-step 320)
    ddp_train_two "$run" "$dir" --max-restarts 1 --no-python "$out/hostid.sh" \
      "$here/bin/ddp_train" --backend nccl --data "$here/data/digits.csv.gz" \
      --checkpoint-dir "$dir/$run.checkpoints" "${extra[@]}"
  done
  a=$(grep -aoE 'final test accuracy [0-9.]+ weights sha256 [0-9a-f]+' "$dir/clean.txt" | awk '{print $NF}')
  b=$(grep -aoE 'final test accuracy [0-9.]+ weights sha256 [0-9a-f]+' "$dir/crash.txt" | awk '{print $NF}')
  grep -aq 'resumed from' "$dir/crash.txt" && [ -n "$a" ] && [ "$a" = "$b" ] || rc=1
  echo "NOTE: 2 ranks, NCCL: crash at 320 + group restart $([ $rc = 0 ] && echo = || echo '!=') uninterrupted (${a:0:16} vs ${b:0:16})"
  return $rc
}

# torch DDP over NCCL under --restart-policy in-place (bench/cuda_inplace.py, dist_launch.elastic),
# 2 ranks on the one GPU: rank 1 SIGKILLed mid-step, then (another run) SIGSTOPped: the survivor's
# communicators aborted, its step refused, the replacement given the state; the same weights as
# a run that lost nobody.
torch_nccl_inplace() {
  local dir="$out/torch_nccl_inplace" rc=0 run
  rm -rf "$dir"
  mkdir -p "$dir"
  two_ranks_env
  for run in clean kill stop kill-warm; do
    local extra=() flags=()
    case $run in
      kill) extra=(--kill-at 60) ;;
      stop) extra=(--stop-at 120) ;;
      kill-warm) extra=(--kill-at 60) flags=(--warm-restart) ;;
    esac
    PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}" with_nccl timeout 120 \
      "$here/bin/dist-launch" --nproc-per-node 2 --restart-policy in-place --max-restarts 2 \
      "${flags[@]}" --log-dir "$dir/$run.logs" "$here/bench/cuda_inplace.py" --share-gpu \
      --steps 200 "${extra[@]}" >"$dir/$run.txt" 2>&1 &
    local launcher=$! waited=0
    # Training done, the job must end: 20 s after the last worker's final line, the stacks of
    # whatever still runs (Python's by SIGUSR1, native by cuda-gdb), then it is ended.
    while kill -0 $launcher 2>/dev/null; do
      sleep 1
      if [ "$(grep -ac 'final step 200' "$dir/$run.txt")" -ge 2 ]; then
        waited=$((waited + 1))
        if [ $waited -ge 20 ]; then
          echo "--- $run: the job did not end 20 s after its workers' final lines: stacks"
          local pid
          for pid in $(pgrep -f 'python[0-9.]* .*cuda_inplace\.py'); do  # the workers alone
            kill -USR1 "$pid" 2>/dev/null
            sleep 1
            command -v cuda-gdb >/dev/null &&
              timeout 40 cuda-gdb -q -batch -p "$pid" -ex 'thread apply all bt 15' 2>&1 |
              grep -E '^Thread|^#' | head -150 >"$dir/$run.gdb.$pid.txt"
          done
          pkill -KILL -f 'python[0-9.]* .*cuda_inplace\.py'
          break
        fi
      fi
    done
    wait $launcher
    echo $? >"$dir/$run.status"
    echo "--- $run: exit $(cat "$dir/$run.status")"
    grep -aE 'final step|(kill|stop) at|trains again|recovered|aborted|joined generation|stopped|Duplicate|rror|Thread 0x|File ' "$dir/$run.txt" | head -40
  done
  local a b notes=() ms
  a=$(grep -aoE 'rank 0 final step 200 weights sha256 [0-9a-f]+' "$dir/clean.txt" | awk '{print $NF}')
  [ -n "$a" ] && [ "$(cat "$dir/clean.status")" = 0 ] ||
    { rc=1; notes+=("clean: exit $(cat "$dir/clean.status")"); tail -30 "$dir/clean.txt"; }
  for run in kill stop kill-warm; do
    local lost again
    b=$(grep -aoE 'rank 0 final step 200 weights sha256 [0-9a-f]+' "$dir/$run.txt" | awk '{print $NF}')
    lost=$(grep -aoE "rank 1 ${run%-warm} at [0-9.]+" "$dir/$run.txt" | awk '{print $NF}')
    again=$(grep -aoE 'rank 0 trains again at [0-9.]+' "$dir/$run.txt" | head -1 | awk '{print $NF}')
    ms=none
    [ -n "$lost" ] && [ -n "$again" ] && ms=$(awk -v k="$lost" -v t="$again" 'BEGIN {printf "%.0f", (t - k) * 1000}')
    if [ -n "$a" ] && [ "$a" = "$b" ] && [ -n "$again" ] && [ "$(cat "$dir/$run.status")" = 0 ]; then
      notes+=("$run -> training again ${ms} ms, weights = uninterrupted")
    else
      rc=1
      notes+=("$run: exit $(cat "$dir/$run.status"), weights ${b:0:12} (want ${a:0:12}), training again: ${ms}")
      tail -40 "$dir/$run.txt"
    fi
  done
  echo "NOTE: torch NCCL in place, 2 ranks on one GPU: ${notes[*]}; $(grep -aoE 'NCCL communicators of generation 0 aborted in [0-9]+ ms' "$dir/kill.txt" | head -1)"
  return $rc
}

export -f facts link_nccl with_nccl load sdk_cpu gpu_test ddp_train compare sdk_nccl warm_restart
export -f two_ranks_env ddp_train_two nccl_compression nccl_restart torch_nccl_inplace

main() {
  echo "gpu-check: $(date -u +%Y-%m-%dT%H:%M:%SZ), bundle $here, output $out, budget ${budget}s"
  if ! $gpu; then
    echo "gpu-check: no GPU on this machine (nvidia-smi lists none$([ "${GPU_CHECK_FORCE_CPU:-0}" = 1 ] && echo ', or GPU_CHECK_FORCE_CPU=1')): the GPU steps are SKIPPED; the bundle's own checks run"
  fi
  rm -f "$out/.nccl_ld_path" "$out/ldd.txt"
  step facts 60 facts
  step nccl_link 60 link_nccl
  step load 60 load
  step sdk_cpu 90 sdk_cpu
  local t
  if $gpu; then
    # Wave 4's steps first (never run on a GPU before), then the GPU tests, then the earlier ones.
    wanted torch_nccl_inplace && step torch_nccl_inplace 240 torch_nccl_inplace
    wanted nccl_compression && step nccl_compression 200 nccl_compression
    wanted nccl_restart && step nccl_restart 120 nccl_restart
    for t in $(with_nccl "$here/bin/sdk_gpu_tests" --gtest_list_tests |
      awk '/^[A-Za-z]/ {suite=$1} /^  [A-Za-z]/ && suite !~ /Child/ {print suite $1}' |
      awk '/Compression|Silent/ {print; next} {rest[NR] = $0} END {for (i = 1; i <= NR; i++) if (i in rest) print rest[i]}'); do
      wanted "gpu:$t" || continue
      case $t in *Abort* | *Init* | *TwoRanks* | *Refuses* | *OpTimeout*) step "gpu:${t#OneGpu.}" 100 gpu_test "$t" ;;
        *) step "gpu:${t#OneGpu.}" 60 gpu_test "$t" ;;
      esac
    done
    wanted ddp_train && step ddp_train 200 ddp_train
    wanted warm_restart && step warm_restart 120 warm_restart
    wanted compare_sum && step compare_sum 120 compare sum
    wanted compare_avg && step compare_avg 120 compare avg
    wanted sdk_nccl && step sdk_nccl 60 sdk_nccl
  else
    for t in torch_nccl_inplace nccl_compression nccl_restart gpu_tests ddp_train warm_restart compare_sum compare_avg sdk_nccl; do gpu_step_skipped "$t"; done
  fi

  {
    echo
    local device
    device=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
    echo "=== summary ($(date -u +%Y-%m-%dT%H:%M:%SZ), $((SECONDS - start)) s, ${device:-no GPU})"
    printf '%-64s %-7s %4s  %s\n' step status s note
    printf '%s\n' "${rows[@]}"
    echo "$failures step(s) failed or timed out; logs in $out"
  } | tee "$out/summary.txt"
  [ "$failures" -eq 0 ]
}

main "$@" 2>&1 | tee "$out/log.txt"
exit "${PIPESTATUS[0]}"
