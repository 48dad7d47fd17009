#!/usr/bin/env bash
# Builds the store, agent, launcher and SDK with AddressSanitizer + UndefinedBehaviorSanitizer
# (build-asan/) and with ThreadSanitizer (build-tsan/), dist-launch and dist-rendezvous included,
# so the whole-program tests run sanitized agents and stores, and runs those tests. The PyTorch,
# Slurm, etcd, ssh and named-host tests stay in the plain build (scripts/test.sh): they test the
# same code through slower daemons.
#   scripts/sanitize.sh [KINDS]     KINDS: asan, tsan, or asan,tsan (default; "all" too)
# scripts/test.sh runs it after the plain suite (DIST_SANITIZE). JOBS: parallel compiles and tests.
# DIST_SANITIZE_BUILD_ONLY=1: the builds alone (scripts/test.sh starts them beside the plain tests).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kinds=${1:-asan,tsan}
[ "$kinds" = all ] && kinds=asan,tsan
jobs=${JOBS:-$(nproc)}
# The whole-program tests mostly wait on their processes (sanitized, ASan's took 0.4 of a core
# at 2 at a time on 2 cores): twice as many at a time as cores (ASan 273 s to 155 s here;
# docs/BENCHMARKS.md, "Off the DDP path, on a daemon's store, and CI's time").
e2e_jobs=${E2E_JOBS:-$((2 * jobs))}
# The whole-program tests (agent_e2e_tests) are the plain build's, run against these sanitized
# programs (DIST_TEST_PROGRAMS): their own code starts processes and reads files, and costs a
# third of a sanitized build's compile time.
targets=(dist-launch dist-rendezvous dist-test-worker dist-watchdog-worker dist-inplace-worker
  dist-placement-probe store_tests agent_unit_tests launcher_tests sdk_tests)
# What runs: every test of those programs but the ones that need a daemon or a package the
# sanitized build does not make (_NOT_BUILT: the test programs it leaves out), and the peak RSS
# bound of dist-rendezvous, which the sanitizers' shadow memory and quarantine exceed by design.
exclude='torch|slurm|etcd|Etcd|named_hosts|OnNamedHosts|SdkOnNamed|Kubeflow|ssh_hosts|install|lint'
exclude+='|DdpTrain|agent_resources|OneGpu|Nccl|_NOT_BUILT|Memory.PeakResident'
# UBSan's vptr check probes the vtable's memory through a pipe(2) (sanitizer_common's
# IsAccessibleMemoryRange): in a process at its open-file limit, which this test puts
# dist-rendezvous at on purpose, every virtual call then fails as "invalid vptr" (spdlog's sink
# call first). A limitation of the runtime, not a bug here; TSan and the plain build run the test.
asan_exclude='|Daemon.AtTheOpenFileLimit'
# Whole-program tests that hold a job paused or suspended for 20-45 s to see that nothing happens
# to it: the code they reach (the stop holds, the stall of the agent) runs sanitized in the
# shorter stop tests beside them; their waiting runs in the plain suite, and would cost each
# sanitized stage a minute and a half. Likewise the network outages that wait 15-30 s on the
# kernel's TCP (ridden out, or a static job's partition): the lost node's path they reach runs
# sanitized in the elastic partition test, the store's HELLO in store_tests.
e2e_exclude='|PauseOfTheWholeJob|WholeJobPaused|DuringAPauseOfTheJob|SuspendedAndResumed'
e2e_exclude+='|NetworkOutageOfSeconds|APartitionIsNoticedByBothSides'

# Warnings the sanitizers raise in headers that are not ours (-Werror stays on for the rest):
# - GCC 12 takes Asio 1.18's recycling allocator for a mismatched new/delete once the sanitizers
#   change its inlining;
quiet="-Wno-mismatched-new-delete"
# - optimised (TSan): GCC's manual warns that sanitizers raise false -Wmaybe-uninitialized, here
#   in libstdc++'s <regex> (std::function moves in _NFA::_M_insert_*);
# - -Wtsan: TSan does not model atomic_thread_fence, which Asio's std_fenced_block uses around
#   handler invocations; Asio's queues between threads are guarded by mutexes, which TSan sees.
quiet_tsan="$quiet -Wno-maybe-uninitialized -Wno-tsan"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$root/scripts/tsan.supp

# Debug keeps assert() on; -g1 is enough for the reports' file:line and costs less to build.
# ASan+UBSan at -O0: a third of -O1's compile time here, and the tests wait on processes.
# A unity build of the libraries, programs and tests (a few test files build alone): unoptimised and
# instrumented, a .cc costs its headers' templates more than its own code, which a unity file
# pays once for eight (10 of agent/src: 80 s alone, 33 s as one; under TSan 49 s and 23 s).
run() {
  local kind=$1 opt=$2 flags=$3 skip=$4
  local dir="$root/build-$kind" generator=()
  if [ ! -f "$dir/CMakeCache.txt" ] && command -v ninja >/dev/null; then generator=(-G Ninja); fi
  cmake -S "$root" -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="$opt" \
    -DDIST_WITH_NCCL=OFF -DDIST_BUILD_BENCH=OFF -DCMAKE_UNITY_BUILD=ON -DCMAKE_CXX_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" >/dev/null
  cmake --build "$dir" -j "$jobs" --target "${targets[@]}"
  [ "$build_only" = 1 ] && return
  (cd "$dir" && ctest --output-on-failure -j "$jobs" --timeout 600 -E "$exclude$skip")
  DIST_TEST_PROGRAMS="$dir/bin" ctest --test-dir "$plain" --output-on-failure -j "$e2e_jobs" \
    --timeout 600 -L agent_e2e -E "$exclude$skip$e2e_exclude"
}

# The plain build's whole-program tests (scripts/test.sh has built them already).
plain=${BUILD_DIR:-$root/build}
build_only=${DIST_SANITIZE_BUILD_ONLY:-0}
if [ "$build_only" != 1 ]; then
  BUILD_DIR=$plain BUILD_TARGETS=agent_e2e_tests "$root/scripts/build.sh" >/dev/null
fi

asan="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined $quiet"
IFS=, read -ra wanted <<<"$kinds"
for kind in "${wanted[@]}"; do
  case $kind in
    asan) run asan "-O0 -g1" "$asan" "$asan_exclude" ;;
    tsan) run tsan "-O1 -g1" "-fsanitize=thread $quiet_tsan" "" ;;
    *) echo "usage: $0 [asan|tsan|asan,tsan|all]" >&2; exit 2 ;;
  esac
done
