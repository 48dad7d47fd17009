#!/usr/bin/env bash
# Sets up and runs every test: installs missing dependencies, builds, runs ctest; then the
# sanitized builds of the store, agent and SDK tests (scripts/sanitize.sh).
#   DIST_SANITIZE: which sanitized builds run after the plain suite: asan (ASan+UBSan), tsan, or
#   asan,tsan (default); empty (DIST_SANITIZE=) skips them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
(cd "${BUILD_DIR:-$root/build}" && ctest --output-on-failure -j "${JOBS:-$(nproc)}" --timeout 600)
sanitize=${DIST_SANITIZE-asan,tsan}
if [ -n "$sanitize" ]; then
  "$root/scripts/sanitize.sh" "$sanitize"
fi
