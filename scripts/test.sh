#!/usr/bin/env bash
# Sets up and runs every test: installs missing dependencies, builds, runs ctest and the demo
# (scripts/demo.sh, its own build); then the sanitized builds of the store, agent and SDK tests
# (scripts/sanitize.sh).
#   DIST_SANITIZE: which sanitized builds run after the plain suite: asan (ASan+UBSan), tsan, or
#   asan,tsan (default); empty (DIST_SANITIZE=) skips them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# Each phase's wall time, so a CI log shows where its minutes go.
phase_start=$SECONDS
phase() {
  echo "== test.sh: $1 took $((SECONDS - phase_start)) s ($SECONDS s in all)"
  phase_start=$SECONDS
}
"$root/scripts/install-deps.sh"
phase "installing dependencies"
# A build tree made here (CI's always is) is a unity build, the tests' too: the same compiler work
# packed into fewer, evenly sized runs (the libraries and programs alone: 586 s against 702 s cold
# on 2 cores). An existing tree keeps its configuration.
if [ ! -f "${BUILD_DIR:-$root/build}/CMakeCache.txt" ]; then
  "$root/scripts/build.sh" -DCMAKE_UNITY_BUILD=ON
else
  "$root/scripts/build.sh"
fi
phase "the build"
# PyTorch's own launcher tests (tests/torchrun_compat) run where python3 has torch 2.x: their
# pinned files are fetched once into the build tree; without them (no network) they skip.
if [ -z "${DIST_TORCHRUN_COMPAT_UPSTREAM:-}" ] &&
   python3 -c 'import sys, torch; sys.exit(int(torch.__version__.split(".")[0]) < 2)' 2>/dev/null; then
  upstream="${BUILD_DIR:-$root/build}/torchrun-compat-upstream"
  if python3 "$root/tests/torchrun_compat/fetch_upstream.py" "$upstream"; then
    export DIST_TORCHRUN_COMPAT_UPSTREAM=$upstream
  fi
fi
sanitize=${DIST_SANITIZE-asan,tsan}
# The sanitized builds start now, beside the plain tests, one compile at a time at the lowest
# priority: they take the CPU the tests leave idle (most of them wait on processes and sockets),
# and the tests keep what they need. Once the tests are done the builds stop where they are and
# scripts/sanitize.sh below goes on from there on every core. In a session of their own (setsid),
# so that stopping them stops every compiler they started. A new session is also a new scheduling
# group where the kernel groups by session (sched_autogroup): its own nice (/proc/self/autogroup)
# must be lowered too, or the group gets as much CPU as the tests' whole group.
early_build=""
if [ -n "$sanitize" ] && command -v setsid >/dev/null; then
  early_log="${BUILD_DIR:-$root/build}/sanitized-early-build.log"
  setsid bash -c 'echo 19 >/proc/self/autogroup 2>/dev/null; exec nice -n 19 "$@"' _ \
    env JOBS=1 DIST_SANITIZE_BUILD_ONLY=1 "$root/scripts/sanitize.sh" "$sanitize" \
    >"$early_log" 2>&1 &
  early_build=$!
fi
stop_early_build() {
  if [ -n "$early_build" ] && kill -0 "$early_build" 2>/dev/null; then
    kill -TERM -- "-$early_build" 2>/dev/null || true
  fi
  [ -z "$early_build" ] || wait "$early_build" 2>/dev/null || true
}
trap stop_early_build EXIT
rc=0
(cd "${BUILD_DIR:-$root/build}" && ctest --output-on-failure -j "${JOBS:-$(nproc)}" --timeout 600) || rc=$?
if [ "$rc" -ne 0 ]; then
  python3 "$root/scripts/failed-tests-digest.py" "${BUILD_DIR:-$root/build}" || true
  exit "$rc"
fi
phase "the tests"
# The newcomer's first command, as README.md gives it, run on the build above: its own quick build
# (build-demo/) would compile the same sources a third time (about 190 s of CI's 2 cores); its time
# from a fresh clone is measured apart (docs/BENCHMARKS.md, "The demo's build").
BUILD_DIR="${BUILD_DIR:-$root/build}" "$root/scripts/demo.sh"
phase "the demo"
if [ -n "$sanitize" ]; then
  if [ -n "$early_build" ]; then
    running=$(kill -0 "$early_build" 2>/dev/null && echo "stopped" || echo "done")
    stop_early_build
    echo "== test.sh: the sanitized builds beside the tests: $running ($(grep -c '^\[[0-9]*/[0-9]*\]' "$early_log") build steps; $early_log)"
  fi
  "$root/scripts/sanitize.sh" "$sanitize"
  phase "the sanitized builds and tests"
fi
