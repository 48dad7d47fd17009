#!/usr/bin/env bash
# Builds what a GPU machine runs to prove the SDK's NCCL path (issue 24) and puts it, with the
# shared libraries such a machine lacks, into one git-ignored folder that travels to it; there,
# gpu-check.sh (copied in) is the one command:  bash gpu-bundle/gpu-check.sh
#
#   scripts/gpu-bundle.sh [--no-build] [OUT_DIR]      OUT_DIR: default gpu-bundle/ at the root
#   BUILD_DIR (default build/): a Release build with the NCCL backend (configured here if absent)
#   JOBS: parallel compiles (default 2).   --no-build: take the programs BUILD_DIR already has.
#
# The folder: bin/ (the GPU tests, the SDK tests, ddp_train with its device path, dist-launch,
# nccl-bench; stripped), lib/ (the shared libraries they load that the GPU machine lacks: Gloo's;
# never libnccl, 218 MB: the GPU machine's pip NCCL is linked in by gpu-check.sh, found
# through the programs' RPATH $ORIGIN/../lib), bench/ (nccl_compare.py, nccl_torch_bench.py,
# cuda_warm_restart.py, cuda_inplace.py), python/ (the dist_launch package's sources),
# data/ (the digits set), gpu-check.sh, MANIFEST.txt. The GPU machine needs its own libc,
# libstdc++ (GLIBCXX_3.4.30: GCC 12's, Ubuntu 22.04 and later), CUDA driver and pip NCCL; the
# checks at the end hold the bundle to that (glibc symbols up to 2.35), and to 64 MiB.
# Exit 77 when this machine cannot build it (no nvcc or NCCL); 1 when a check fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=true
if [ "${1:-}" = "--no-build" ]; then
  build=false
  shift
fi
out=${1:-$root/gpu-bundle}
build_dir=$(readlink -f "${BUILD_DIR:-$root/build}")
jobs=${JOBS:-2}
# bundle name = build target
declare -A programs=([sdk_gpu_tests]=sdk_gpu_tests [sdk_tests]=sdk_tests [ddp_train]=ddp_train
  [nccl-bench]=nccl-bench [dist-launch]=dist-launch-portable)
# What the GPU machine has: glibc's libraries, the C++ runtime, zlib, the CUDA driver, and NCCL
# (its pip NCCL, linked into lib/ by gpu-check.sh).
system_libs='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libstdc\+\+\.so\.6|libgcc_s\.so\.1|libz\.so\.1|libcuda\.so\.1|libnccl\.so\.2)$'
# The oldest platform it is meant for: Ubuntu 22.04 (glibc 2.35, GCC 12's libstdc++).
max_glibc=2.35 max_glibcxx=3.4.30 max_cxxabi=1.3.13
max_bytes=$((64 * 1024 * 1024))

say() { echo "gpu-bundle: $*"; }
fail() {
  echo "gpu-bundle: FAILED: $*" >&2
  exit 1
}

nvcc=$(command -v nvcc || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
if $build; then
  if [ -z "$nvcc" ]; then
    say "no nvcc on this machine (PATH, /usr/local/cuda/bin): the bundle needs the CUDA toolkit"
    exit 77
  fi
  if [ ! -f "$build_dir/CMakeCache.txt" ]; then
    cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DDIST_WITH_NCCL=ON
  fi
  type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build_dir/CMakeCache.txt")
  [ "$type" = Release ] || say "warning: $build_dir is a '$type' build, not Release"
  # (not `| grep -q`: under pipefail, make's broken pipe would fail the test when grep matched)
  if ! cmake --build "$build_dir" --target help | grep sdk_gpu_tests >/dev/null; then
    say "$build_dir has no NCCL backend or no nvcc (DIST_WITH_NCCL, CUDAToolkit_ROOT, NCCL_ROOT)"
    exit 77
  fi
  cmake --build "$build_dir" -j "$jobs" --target "${programs[@]}"
fi
for name in "${!programs[@]}"; do
  [ -x "$build_dir/bin/${programs[$name]}" ] ||
    fail "$build_dir/bin/${programs[$name]} is not built (run without --no-build)"
done

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/bench" "$out/data"
for name in "${!programs[@]}"; do
  strip --strip-unneeded -o "$out/bin/$name" "$build_dir/bin/${programs[$name]}"
done
cp "$root/scripts/gpu-check.sh" "$out/gpu-check.sh"
cp "$root/bench/nccl_compare.py" "$root/bench/nccl_torch_bench.py" "$root/bench/cuda_warm_restart.py" \
  "$root/bench/cuda_inplace.py" "$out/bench/"
# The Python package's sources, for the torch workers' dist_launch.elastic (PYTHONPATH=python).
mkdir -p "$out/python"
cp -r "$root/python/dist_launch" "$out/python/"
find "$out/python" -name __pycache__ -prune -exec rm -rf {} +
cp "$root/examples/data/"* "$out/data/"

# The libraries the programs load, transitively, that are not the GPU machine's own: copied under
# their soname (ldd resolves them here; LD_LIBRARY_PATH cleared so nothing foreign leaks in).
declare -A copied=()
for program in "$out"/bin/*; do
  while read -r soname path; do
    [[ $soname =~ $system_libs ]] && continue
    [ -n "${copied[$soname]:-}" ] && continue
    [ -f "$path" ] || fail "$(basename "$program") needs $soname, which is not found here"
    cp -L "$path" "$out/lib/$soname"
    chmod u+w "$out/lib/$soname"
    strip --strip-unneeded "$out/lib/$soname" 2>/dev/null || true
    copied[$soname]=$path
  done < <(env -u LD_LIBRARY_PATH ldd "$program" | awk '/=>/ {print $1, $3}')
done

{
  echo "# GPU bundle of dist-launch (issue 24): run  bash gpu-check.sh  from this folder."
  echo "commit: $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1)"
  echo "build: $build_dir ($(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build_dir/CMakeCache.txt"))"
  [ -n "$nvcc" ] && echo "nvcc: $("$nvcc" --version | tail -1)"
  echo "CUDA code: $({ [ -f "$build_dir/build.ninja" ] && cat "$build_dir/build.ninja"; find "$build_dir" -name flags.make -exec cat {} +; } | grep -ohE -- '--generate-code=arch=[^ ]*' | sort -u | paste -sd' ')"
  echo "NCCL built with: $(grep -hE '^#define NCCL_(MAJOR|MINOR|PATCH) ' "$(sed -n 's/^NCCL_INCLUDE_DIR:[A-Z]*=//p' "$build_dir/CMakeCache.txt")/nccl.h" | awk '{print $3}' | paste -sd.)"
  echo "lib/ carries: ${!copied[*]}"
  echo "files:"
  (cd "$out" && find . -type f ! -name MANIFEST.txt | sort | xargs sha256sum)
} >"$out/MANIFEST.txt"

# ---- checks ----
problems=()
# 1. Nothing outside the bundle but the GPU machine's own libraries (ldd, LD_LIBRARY_PATH cleared):
#    every other library resolves into lib/, through the programs' RPATH.
for f in "$out"/bin/*; do
  while read -r soname path; do
    if [ "$path" = "not" ]; then
      problems+=("$(basename "$f"): $soname not found")
    elif ! [[ $soname =~ $system_libs ]] && [ "$(dirname "$(readlink -f "$path")")" != "$(readlink -f "$out/lib")" ]; then
      problems+=("$(basename "$f"): $soname resolves to $path, outside the bundle")
    fi
  done < <(env -u LD_LIBRARY_PATH ldd "$f" | awk '/=>/ {print $1, $3}')
  readelf -d "$f" | grep -q 'Library rpath: \[\$ORIGIN:\$ORIGIN/../lib' ||
    problems+=("$(basename "$f"): its RPATH does not start with \$ORIGIN:\$ORIGIN/../lib")
done
ls "$out"/lib/libnccl* >/dev/null 2>&1 && problems+=("lib/ carries libnccl: it must not travel")
# 2. Symbol versions the GPU machine's glibc and libstdc++ must have.
version_ok() { [ -z "$2" ] || [ "$(printf '%s\n%s\n' "${2#*_}" "$3" | sort -V | tail -1)" = "$3" ]; }
for f in "$out"/bin/* "$out"/lib/*; do
  for pair in "GLIBC $max_glibc" "GLIBCXX $max_glibcxx" "CXXABI $max_cxxabi"; do
    set -- $pair
    v=$(objdump -T "$f" | { grep -oE "$1_[0-9][0-9.]*" || true; } | sort -Vu | tail -1)
    version_ok "$1" "$v" "$2" || problems+=("$(basename "$f") needs $v (the bundle's limit: $1_$2)")
  done
done
# 3. Size: the bundle travels with the working tree, 64 MiB in all.
bytes=$(du -sb "$out" | cut -f1)
[ "$bytes" -le "$max_bytes" ] || problems+=("$bytes bytes: over 64 MiB")

echo
say "$out: $(du -sh "$out" | cut -f1) ($bytes bytes; limit 64 MiB with the working tree)"
(cd "$out" && du -b bin/* lib/* | sort -rn | awk '{printf "  %9d  %s\n", $1, $2}')
say "glibc up to $(for f in "$out"/bin/* "$out"/lib/*; do objdump -T "$f" | grep -oE 'GLIBC_[0-9.]+'; done | sort -Vu | tail -1), libstdc++ up to $(for f in "$out"/bin/* "$out"/lib/*; do objdump -T "$f" | grep -oE 'GLIBCXX_[0-9.]+'; done | sort -Vu | tail -1) (limits GLIBC_$max_glibc, GLIBCXX_$max_glibcxx)"
if [ ${#problems[@]} -gt 0 ]; then
  printf '  %s\n' "${problems[@]}" >&2
  fail "${#problems[@]} problem(s)"
fi
say "ldd: every library is the GPU machine's own (libc, libstdc++, zlib, the CUDA driver, NCCL) or in lib/"
say "on the GPU machine:  bash $(basename "$out")/gpu-check.sh   (writes to \$OUT when set)"
