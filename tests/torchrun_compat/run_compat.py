#!/usr/bin/env python3
"""PyTorch's own launcher tests (test/distributed/launcher/test_run.py and its bin/ scripts,
pinned in upstream.json), run against a launcher as a program, with torch 2.x workers.

    run_compat.py --launcher build/bin/dist-launch --python PY [--upstream DIR] [--json FILE]
    run_compat.py --launcher torchrun --python PY     # torchrun itself, through the same harness

PY must have torch 2.x, expecttest and pytest (upstream's imports). The upstream files come from
--upstream or DIST_TORCHRUN_COMPAT_UPSTREAM, as fetch_upstream.py lays them out. A copy is adapted
where the launcher is called, each changed line marked "# dist-launch compat:", and run by
compat_main.py. Exits 77 (skipped, with the reason) when PY, its packages or the files are missing.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import upstream

HERE = os.path.dirname(os.path.abspath(__file__))
EXIT_SKIP = 77
LAUNCHER_DIR = os.path.join("test", "distributed", "launcher")
MARK = "  # dist-launch compat: the launcher runs as a program (compat_launcher.py)"

# Where test_run.py calls the launcher in its own process, and what it calls instead; the counts
# are those of the pinned file, so that an upstream change is noticed, not half-adapted.
REPLACEMENTS = [
    ("launch.main(", "launch_cli(", 24),
    ("target=launch.main,", "target=launch_cli,", 1),
]
IMPORT_AFTER = "import torch.distributed.run as launch\n"
IMPORT_LINE = "from compat_launcher import launch_cli"


def skip(reason):
    print(f"torchrun_compat: skipped: {reason}")
    sys.exit(EXIT_SKIP)


def check_python(python):
    probe = ("import sys, torch\n"
             "sys.exit(0 if int(torch.__version__.split('.')[0]) >= 2 else 3)\n")
    if not shutil.which(python):
        skip(f"no interpreter {python} (set DIST_TORCH2_PYTHON to one with torch 2.x)")
    if subprocess.run([python, "-c", probe], capture_output=True).returncode != 0:
        skip(f"{python} has no torch 2.x (scripts/install-torch2.sh installs it)")
    missing = [m for m in ("expecttest", "pytest")
               if subprocess.run([python, "-c", f"import {m}"], capture_output=True).returncode]
    if missing:
        skip(f"{python} lacks {', '.join(missing)}, which upstream's tests import "
             f"(pip install {' '.join(missing)})")


def adapt(source):
    """test_run.py with the launcher calls replaced, each changed line marked."""
    lines = source.splitlines(keepends=True)
    for old, new, expected in REPLACEMENTS:
        changed = 0
        for i, line in enumerate(lines):
            if old in line:
                lines[i] = line.rstrip("\n").replace(old, new) + MARK + "\n"
                changed += 1
        if changed != expected:
            sys.exit(f"torchrun_compat: '{old}' is on {changed} lines of test_run.py, not "
                     f"{expected}: the pinned file changed; review REPLACEMENTS")
    at = lines.index(IMPORT_AFTER)
    lines.insert(at + 1, IMPORT_LINE + MARK + "\n")
    return "".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launcher", required=True, help="dist-launch's path, or torchrun")
    parser.add_argument("--python", required=True, help="an interpreter with torch 2.x")
    parser.add_argument("--upstream", default=os.environ.get("DIST_TORCHRUN_COMPAT_UPSTREAM"))
    parser.add_argument("--json", help="each test's outcome, as JSON")
    args = parser.parse_args()

    check_python(args.python)
    if not args.upstream:
        skip("no upstream files: fetch them with tests/torchrun_compat/fetch_upstream.py DIR and "
             "set DIST_TORCHRUN_COMPAT_UPSTREAM=DIR")
    wrong = upstream.problems(args.upstream)
    if wrong:
        print("torchrun_compat: the upstream files are not the pinned ones:", file=sys.stderr)
        for problem in wrong:
            print(f"  {problem}", file=sys.stderr)
        return 1

    work = tempfile.mkdtemp(prefix="torchrun-compat-")
    try:
        test_dir = os.path.join(work, LAUNCHER_DIR)
        shutil.copytree(os.path.join(args.upstream, LAUNCHER_DIR), test_dir)
        with open(os.path.join(test_dir, "test_run.py")) as f:
            adapted = adapt(f.read())
        with open(os.path.join(test_dir, "test_run.py"), "w") as f:
            f.write(adapted)
        shutil.copy(os.path.join(HERE, "compat_launcher.py"), test_dir)
        env = dict(os.environ, DIST_TORCHRUN_COMPAT_LAUNCHER=args.launcher)
        command = [args.python, os.path.join(HERE, "compat_main.py"), work]
        if args.json:
            command += ["--json", args.json]
        return subprocess.run(command, env=env).returncode
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
