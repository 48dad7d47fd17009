#!/usr/bin/env python3
"""PyTorch's own launcher tests (test/distributed/launcher/test_run.py, api_test.py and their bin/
scripts, pinned in upstream.json), run against dist-launch with torch 2.x workers, and against
torchrun itself through the same harness as the reference.

    run_compat.py --launcher build/bin/dist-launch --python PY [--upstream DIR] [--json FILE]
    run_compat.py --launcher torchrun --python PY     # torchrun itself, through the same harness
    run_compat.py --suite api --launcher build/bin/dist-launch --python PY   # the Python API
    run_compat.py --suite api --launcher torchrun --bin-dir build/bin --python PY

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
from dataclasses import dataclass, field
from typing import List, Tuple

import upstream

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
EXIT_SKIP = 77
LAUNCHER_DIR = os.path.join("test", "distributed", "launcher")


@dataclass
class Suite:
    """One upstream test file and how it is adapted. `replacements` are (old, new, lines, why):
    `old` must be on exactly `lines` lines of the pinned file, so that an upstream change is
    noticed, not half-adapted; `inserts` are (the line they follow, new line, why)."""

    module: str  # the upstream file, test/distributed/launcher/<module>.py
    support: List[str]  # our files copied next to it
    replacements: List[Tuple[str, str, int, str]]
    inserts: List[Tuple[str, str, str]] = field(default_factory=list)


AS_PROGRAM = "the launcher runs as a program (compat_launcher.py)"
C10D = "c10d on a standalone store (compat_api.py) in place of upstream's etcd v2 server"
RUN_ID = "a fresh run id per job on the shared store (compat_api.py)"
DIST_API = "dist-launch's Python API in place of torch's launcher API"
EVENTS = "the run's end as dist-launch records it (PET_EVENT_LOG), for the mocked events.record"


def suite(name, launcher):
    """test_run.py: torchrun's command line, each in-process `launch.main(args)` run as a program.
    api_test.py: torch.distributed.launcher.api's elastic_launch with scripts and functions, given
    dist-launch's Python API (or, as the reference, left on torch's own)."""
    if name == "run":
        cli = Suite("test_run", ["compat_launcher.py", "compat_api.py"], [
            ("launch.main(", "launch_cli(", 24, AS_PROGRAM),
            ("target=launch.main,", "target=launch_cli,", 1, AS_PROGRAM),
        ], [("import torch.distributed.run as launch\n",
             "from compat_launcher import launch_cli", AS_PROGRAM)])
        if launcher != "torchrun":  # torchrun, a program here, records its events in itself
            cli.replacements.append(
                ("record_mock.assert_called_once()", "assert_one_job_end(self)", 2, EVENTS))
            cli.inserts += [
                ("import torch.distributed.run as launch\n",
                 "from compat_api import assert_one_job_end, watch_events", EVENTS),
                ('        os.environ["TEST_SENTINEL_PARENT"] = "FOOBAR"\n', "        watch_events()",
                 EVENTS)]
        return cli
    api = Suite("api_test", ["compat_api.py"], [
        ('rdzv_backend: str = "etcd",', 'rdzv_backend: str = "c10d",', 1, C10D),
        ("cls._etcd_server = EtcdServer()", "cls._etcd_server = RendezvousServer()", 1, C10D),
        ("run_id=run_id,", "run_id=fresh_run_id(run_id),", 1, RUN_ID),
    ], [("    TEST_WITH_DEV_DBG_ASAN,\n)\n",
         "from compat_api import RendezvousServer, fresh_run_id", C10D)])
    if launcher != "torchrun":
        api.replacements.append(
            ("record_mock.assert_called_once()", "assert_one_job_end(self)", 2, EVENTS))
        api.inserts += [
            ("    TEST_WITH_DEV_DBG_ASAN,\n)\n",
             "from dist_launch import ChildFailedError, LaunchConfig, elastic_launch", DIST_API),
            ("    TEST_WITH_DEV_DBG_ASAN,\n)\n",
             "from compat_api import assert_one_job_end, watch_events", EVENTS),
            ('        os.environ["OMP_NUM_THREADS"] = str(1)\n', "        watch_events()", EVENTS),
        ]
    return api


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


def ready(python, upstream_dir, name):
    """Skips (exit 77) without torch 2.x or the fetched files; False, said, when the files on
    disk are not the pinned ones."""
    check_python(python)
    if not upstream_dir:
        skip("no upstream files: fetch them with tests/torchrun_compat/fetch_upstream.py DIR and "
             "set DIST_TORCHRUN_COMPAT_UPSTREAM=DIR")
    wrong = upstream.problems(upstream_dir)
    for problem in wrong:
        print(f"{name}: not the pinned upstream file: {problem}", file=sys.stderr)
    return not wrong


def marked(line, why):
    return line.rstrip("\n") + f"  # dist-launch compat: {why}\n"


def adapt(source, spec):
    """The upstream file with spec's replacements and inserts, each changed line marked."""
    lines = source.splitlines(keepends=True)
    for old, new, expected, why in spec.replacements:
        changed = 0
        for i, line in enumerate(lines):
            if old in line:
                lines[i] = marked(line.replace(old, new), why)
                changed += 1
        if changed != expected:
            sys.exit(f"torchrun_compat: '{old}' is on {changed} lines of {spec.module}.py, not "
                     f"{expected}: the pinned file changed; review the suite's replacements")
    for after, new, why in reversed(spec.inserts):
        text = "".join(lines)
        if text.count(after) != 1:
            sys.exit(f"torchrun_compat: {after!r} is not once in {spec.module}.py: the pinned "
                     f"file changed; review the suite's inserts")
        at = text.index(after) + len(after)
        text = text[:at] + marked(new, why) + text[at:]
        lines = text.splitlines(keepends=True)
    return "".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launcher", required=True, help="dist-launch's path, or torchrun")
    parser.add_argument("--python", required=True, help="an interpreter with torch 2.x")
    parser.add_argument("--upstream", default=os.environ.get("DIST_TORCHRUN_COMPAT_UPSTREAM"))
    parser.add_argument("--suite", choices=("run", "api"), default="run",
                        help="test_run.py (the command line) or api_test.py (the Python API)")
    parser.add_argument("--bin-dir", help="where dist-launch and dist-rendezvous were built "
                        "(default: --launcher's directory)")
    parser.add_argument("--json", help="each test's outcome, as JSON")
    args = parser.parse_args()
    bin_dir = args.bin_dir or (os.path.dirname(os.path.abspath(args.launcher))
                               if args.launcher != "torchrun" else None)
    if args.suite == "api" and not bin_dir:
        parser.error("--suite api needs --bin-dir (the API and the shared store run dist-launch's "
                     "programs)")
    spec = suite(args.suite, args.launcher)

    if not ready(args.python, args.upstream, "torchrun_compat"):
        return 1

    work = tempfile.mkdtemp(prefix="torchrun-compat-")
    try:
        test_dir = os.path.join(work, LAUNCHER_DIR)
        shutil.copytree(os.path.join(args.upstream, LAUNCHER_DIR), test_dir)
        test_file = os.path.join(test_dir, spec.module + ".py")
        with open(test_file) as f:
            adapted = adapt(f.read(), spec)
        with open(test_file, "w") as f:
            f.write(adapted)
        for name in spec.support:
            shutil.copy(os.path.join(HERE, name), test_dir)
        env = dict(os.environ, DIST_TORCHRUN_COMPAT_LAUNCHER=args.launcher)
        if bin_dir:  # the Python API from this checkout, its programs from this build
            env["PATH"] = os.path.abspath(bin_dir) + os.pathsep + env.get("PATH", "")
            env["PYTHONPATH"] = os.pathsep.join(
                [os.path.join(SOURCE, "python")] + [p for p in [env.get("PYTHONPATH")] if p])
        command = [args.python, os.path.join(HERE, "compat_main.py"), work, spec.module]
        if args.json:
            command += ["--json", args.json]
        return subprocess.run(command, env=env).returncode
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
