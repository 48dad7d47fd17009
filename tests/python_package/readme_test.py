"""The README's commands as a newcomer runs them, word for word (issue #47), in a fresh copy of
the working tree:

  wheel           `scripts/wheel.sh`: the wheel, from the programs of --build (built already)
  install-wheel   a fresh venv, the wheel, `pip install torch`, the torch example, python -m
  multi-node      two agents on this machine, two workers each, the same example
  two-commands    scripts/demo.sh and scripts/test.sh: CI runs them (.ci/run, scripts/test.sh),
                  so this test only holds the block to what CI runs
and every sh block of the Install section is one the tests run (install-source: package_test.py).

    python3 readme_test.py --source REPO --build BUILD_DIR --python P --torch-python T

`pip install torch` runs as written, with pip pointed at a folder of wheels (PIP_NO_INDEX,
PIP_FIND_LINKS) made from T's installed torch: Debian's torch 1.13, 45 MB, CPU only. PyPI's torch
is 2.8 GB with its CUDA libraries, download.pytorch.org's CPU wheels cannot be reached from this
machine (its name does not resolve), and like every torch wheel this one brings no numpy: the
examples must do without, as in the README's venv. The session's environment sets only what the
machine needs: PET_MASTER_PORT (a free port for the multi-node job, which names none),
GLOO_SOCKET_IFNAME=lo, TMPDIR.

Exits 77 (skip) when T has no torch, its torch is for another Python than P, BUILD_DIR is not a
Release build, a venv cannot be made, or the wheel's packaging tools cannot be installed (no
network to PyPI).
"""
import argparse
import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

import readme_blocks

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))
from launcher_test_main import free_port  # noqa: E402

SKIP = 77
WHEEL_TIMEOUT_S = 600  # scripts/wheel.sh: its tools from PyPI the first time, the build up to date
SESSION_TIMEOUT_S = 600
STEPS = 20  # the README's --steps


def log(message):
    print(f"readme_test: {message}", flush=True)


def skip(message):
    log(f"SKIP: {message}")
    sys.exit(SKIP)


# What the torch interpreter says of a distribution it has installed.
DESCRIBE = """
import importlib.metadata as m, json, os, sys, sysconfig
d = m.distribution(sys.argv[1])
base = str(d.locate_file(""))
if d.files:
    files = [str(f) for f in d.files if ".dist-info" not in str(f) and ".egg-info" not in str(f)]
else:  # an egg-info without a file list (Debian's torch): its top-level packages, walked.
    # Debian's torch links into the system's libtorch (torch/lib/*.so, torch/include/*): a link
    # to a small file is taken as that file (libtorch_global_deps.so, which torch opens by its
    # path), the others left out (the libraries, which the loader finds by soname).
    files = []
    for top in (d.read_text("top_level.txt") or "").split():
        for root, dirs, names in os.walk(os.path.join(base, top)):
            dirs[:] = [x for x in dirs if x != "__pycache__"]
            for n in names:
                p = os.path.join(root, n)
                if os.path.isfile(p) and (not os.path.islink(p) or os.path.getsize(p) < 1 << 20):
                    files.append(os.path.relpath(p, base))
        if os.path.isfile(os.path.join(base, top + ".py")):
            files.append(top + ".py")
print(json.dumps({"name": d.metadata["Name"], "version": d.version, "base": base,
                  "files": [f for f in files if "__pycache__" not in f and not f.startswith("..")],
                  "requires": d.requires or [],
                  "python": "cp%d%d" % sys.version_info[:2], "platform":
                  sysconfig.get_platform().replace("-", "_").replace(".", "_")}))
"""


def wheel_of_installed(python, name, out_dir, extra_requires=()):
    """A wheel of `name` as `python` has it installed: its files and metadata, stored (not
    compressed: this is a local folder of wheels, quick to write and to install)."""
    proc = subprocess.run([python, "-c", DESCRIBE, name], capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    d = json.loads(proc.stdout)
    binary = any(f.endswith(".so") or ".so." in f for f in d["files"])
    tag = f"{d['python']}-{d['python']}-{d['platform']}" if binary else "py3-none-any"
    dist = re.sub(r"[-_.]+", "_", d["name"]).lower()
    info = f"{dist}-{d['version']}.dist-info"
    metadata = (f"Metadata-Version: 2.1\nName: {d['name']}\nVersion: {d['version']}\n"
                + "".join(f"Requires-Dist: {r}\n" for r in [*d["requires"], *extra_requires]))
    wheel_file = (f"Wheel-Version: 1.0\nGenerator: readme_test\n"
                  f"Root-Is-Purelib: {'false' if binary else 'true'}\nTag: {tag}\n")
    path = os.path.join(out_dir, f"{dist}-{d['version']}-{tag}.whl")
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        def add(arcname, data):
            z.writestr(arcname, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            writer.writerow([arcname, f"sha256={digest.decode()}", len(data)])
        for f in sorted(d["files"]):
            with open(os.path.join(d["base"], f), "rb") as src:
                add(f, src.read())
        add(f"{info}/METADATA", metadata.encode())
        add(f"{info}/WHEEL", wheel_file.encode())
        writer.writerow([f"{info}/RECORD", "", ""])
        z.writestr(f"{info}/RECORD", record.getvalue())
    return d


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHON_EXEC", "PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("PIP_")}
    env.update(extra)
    return env


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True, help="the repository root")
    ap.add_argument("--build", required=True, help="a Release build tree with the two programs")
    ap.add_argument("--python", required=True, help="the newcomer's python3")
    ap.add_argument("--torch-python", required=True, help="an interpreter with a CPU torch")
    args = ap.parse_args()
    source, build = os.path.abspath(args.source), os.path.abspath(args.build)
    readme = os.path.join(source, "README.md")
    failures = []

    # Every sh block of the Install section is one a test runs.
    named = readme_blocks.blocks(readme)
    for line, section, mark, _ in readme_blocks.sh_blocks(readme):
        if section == "Install" and not mark:
            failures.append(f"README.md:{line}: an Install block no test runs (mark it "
                            "<!-- readme-test: NAME --> and run it here or in package_test.py)")
    for name in ("wheel", "install-wheel", "install-source", "multi-node", "two-commands"):
        if name not in named:
            failures.append(f"README.md has no sh block marked <!-- readme-test: {name} -->")
    if failures:
        sys.exit("\n".join(failures))

    # The two commands are what CI runs: .ci/run runs scripts/test.sh, which runs the demo.
    ci = {}
    for path in (".ci/run", "scripts/test.sh"):
        with open(os.path.join(source, path)) as f:
            ci[path] = f.read()
    for command in named["two-commands"].commands():
        program = command.split()[0]
        if not os.access(os.path.join(source, program), os.X_OK):
            failures.append(f"two-commands: {program} is not an executable of the repository")
        if not any(re.search(rf"(^|[/\s\"]){re.escape(program)}\b", text, re.M)
                   for text in ci.values()):
            failures.append(f"two-commands: CI (.ci/run, scripts/test.sh) never runs {program}")
    if failures:
        sys.exit("\n".join(failures))
    log("the two commands are the ones CI runs: " + ", ".join(named["two-commands"].commands()))

    why = readme_blocks.release_build(build)
    if why:
        skip(why)
    work = tempfile.mkdtemp(prefix="dist-readme-test-")
    try:
        # The newcomer's python3 first on PATH.
        bin_dir = os.path.join(work, "bin")
        os.makedirs(bin_dir)
        os.symlink(args.python, os.path.join(bin_dir, "python3"))
        path = bin_dir + os.pathsep + os.environ.get("PATH", "")

        # pip's folder of wheels: the torch of --torch-python, and what it needs.
        wheels = os.path.join(work, "wheels")
        os.makedirs(wheels)
        started = time.monotonic()
        # Debian's torch needs typing_extensions (its Debian package says so, not its egg-info;
        # PyPI's torch 1.13 requires it).
        torch = wheel_of_installed(args.torch_python, "torch", wheels, ["typing-extensions"])
        if torch is None:
            skip(f"{args.torch_python} has no torch to install from")
        if not wheel_of_installed(args.torch_python, "typing_extensions", wheels):
            skip(f"{args.torch_python} has no typing_extensions, which its torch needs")
        newcomer = subprocess.run([args.python, "-c", "import sys; print('cp%d%d' % "
                                   "sys.version_info[:2])"], capture_output=True, text=True)
        if newcomer.stdout.strip() != torch["python"]:
            skip(f"{args.torch_python}'s torch is for {torch['python']}, {args.python} is "
                 f"{newcomer.stdout.strip()}")
        log(f"pip's wheels: torch {torch['version']} from {args.torch_python} "
            f"({sum(os.path.getsize(os.path.join(wheels, f)) for f in os.listdir(wheels)) >> 20}"
            f" MB, {time.monotonic() - started:.1f} s)")

        clone = os.path.join(work, "clone")
        why = readme_blocks.fresh_copy(source, clone)
        if why:
            skip(why)

        # The wheel: scripts/wheel.sh as written, on the programs --build made.
        tools = os.path.join(build, "wheel-tools")
        code, out, err = readme_blocks.run_session(
            [named["wheel"]], clone,
            clean_env(PATH=path, BUILD_DIR=build, DIST_WHEEL_TOOLS=tools, TMPDIR=work),
            WHEEL_TIMEOUT_S)
        print(out + "".join(line for line in err.splitlines(keepends=True)
                            if not re.match(r"readme-test: [0-9]", line)), end="")
        if code == SKIP:
            skip("scripts/wheel.sh could not install its tools")
        if code != 0:
            sys.exit(f"the block 'wheel' (README.md:{named['wheel'].line}) "
                     f"{'timed out' if code is None else f'exited {code}'}")

        # The newcomer's terminal: the install block, then the multi-node one.
        session = [named["install-wheel"], named["multi-node"]]
        env = clean_env(PATH=path, PIP_NO_INDEX="1", PIP_FIND_LINKS=wheels,
                        PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1",
                        PET_MASTER_PORT=str(free_port()), GLOO_SOCKET_IFNAME="lo", TMPDIR=work)
        code, out, err = readme_blocks.run_session(session, clone, env, SESSION_TIMEOUT_S)
        times = readme_blocks.command_times(err)
        for at, took, command in times:
            log(f"{at:7.1f} s  {took:6.1f} s  {command}")
        outs, errs = readme_blocks.split_by_block(out), readme_blocks.split_by_block(err)
        if code != 0:
            failed = list(errs)[-1] if errs else "?"  # the last block that began
            sys.exit(f"{out}\n{err}\nthe README's commands failed in the block '{failed}' "
                     f"({'timed out' if code is None else f'exit code {code}'}): above")

        # What each block printed.
        def digests(text, world):
            found = re.findall(rf"rank (\d+)/{world} attempt 0: loss=\S+ weights in sync "
                               r"sha256 ([0-9a-f]{64})", text)
            return sorted(int(r) for r, _ in found), {d for _, d in found}
        ranks, sums = digests(outs.get("install-wheel", ""), 2)
        if ranks != [0, 1] or len(sums) != 1:
            failures.append(f"install-wheel: the example's ranks {ranks}, digests {sums}: not "
                            "two ranks with one digest")
        if "Usage:" not in outs.get("install-wheel", "") + errs.get("install-wheel", ""):
            failures.append("install-wheel: python -m dist_launch --help printed no usage")
        ranks, sums = digests(outs.get("multi-node", ""), 4)
        if ranks != [0, 1, 2, 3] or len(sums) != 1:
            failures.append(f"multi-node: ranks {ranks}, digests {sums}: not four ranks with "
                            "one digest")
        if failures:
            sys.exit(out + err + "\n" + "\n".join(failures))

        # The newcomer's first minute, as measured here.
        spans = {c: took for _, took, c in times}
        wheel_install = next((t for c, t in spans.items() if c.startswith("pip install dist/")), 0)
        torch_install = spans.get("pip install torch", 0)
        example = next((t for c, t in spans.items() if c.startswith("dist-launch --nproc-per-node")
                        and "ddp_train.py" in c), 0)
        log(f"the wheel installed in {wheel_install:.1f} s, torch in {torch_install:.1f} s, the "
            f"example's {STEPS} steps done {example:.1f} s after dist-launch started: "
            f"{wheel_install + example:.1f} s from the wheel's install to the last step, torch's "
            f"install aside")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
