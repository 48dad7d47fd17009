#!/usr/bin/env bash
# Builds the store, agent, launcher and SDK with AddressSanitizer + UndefinedBehaviorSanitizer
# (build-asan/) and with ThreadSanitizer (build-tsan/), dist-launch and dist-rendezvous included,
# so the whole-program tests run sanitized agents and stores, and runs those tests. The PyTorch,
# Slurm, etcd and named-host tests stay in the plain build (scripts/test.sh): they test the same
# code through slower daemons.
#   scripts/sanitize.sh [asan|tsan|all]     (default: all)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
which=${1:-all}
jobs=${JOBS:-$(nproc)}
targets=(dist-launch dist-rendezvous dist-test-worker dist-placement-probe rendezvous_tests
  agent_tests tcp_store_tests launcher_tests sdk_tests)
# What runs: every test of those programs but the ones that need a daemon or a package the
# sanitized build does not make.
exclude='torch|slurm|etcd|Etcd|named_hosts|OnNamedHosts|SdkOnNamed|Kubeflow|install|lint|DdpTrain|agent_resources|OneGpu|Nccl'

# GCC 12 takes Asio 1.18's recycling allocator for a mismatched new/delete once the sanitizers
# change its inlining: a false positive in Boost's headers, not in this project's code.
quiet="-Wno-mismatched-new-delete"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

run() {
  local kind=$1 flags=$2
  local dir="$root/build-$kind"
  cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDIST_WITH_NCCL=OFF \
    -DDIST_BUILD_BENCH=OFF -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
    -DCMAKE_SHARED_LINKER_FLAGS="$flags" >/dev/null
  cmake --build "$dir" -j "$jobs" --target "${targets[@]}"
  (cd "$dir" && ctest --output-on-failure -j "$jobs" --timeout 600 -E "$exclude")
}

case $which in
  asan | all) run asan "-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined $quiet" ;;&
  tsan | all) run tsan "-fsanitize=thread $quiet" ;;
  *) echo "usage: $0 [asan|tsan|all]" >&2; exit 2 ;;
esac
