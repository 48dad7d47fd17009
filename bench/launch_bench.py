#!/usr/bin/env python3
"""Launcher benchmark: dist-launch beside torchrun, interleaved, in one run.

    python3 bench/launch_bench.py [--build build] [--runs 10] [--torch2-python python3]

1. Launch + reap of 8 trivial workers (`--no_python true`): wall time and the launcher's peak RSS,
   measured by GNU time (`/usr/bin/time -f %M`). Not by this script's own wait4: the kernel keeps a
   process's RSS high-water mark across exec, so a child forked from this Python process would
   inherit Python's ~14 MB before it even starts.
2. Worker crash to all workers restarted: rank 0 crashes on attempt 0 (writing the time), every
   worker of attempt 1 writes its start time; the latency is the last start minus the crash.

Each launcher runs in both of torchrun's single-node settings: its default static rendezvous
(`--nnodes 1 --master_addr 127.0.0.1 --master_port P`, a free port each run) and `--standalone`
(which re-runs a c10d rendezvous on every restart). Every launcher gets `--monitor_interval 0.1`,
torch 2.x's default (dist-launch accepts it and does not poll: SIGCHLD tells it of a crash). Runs
are interleaved, A B C ... A B C ..., so that a machine loaded by others weighs on every variant
alike; the tables give medians.

Launchers: build/bin/dist-launch; torch 2.x's torchrun (`PYTHON -m torch.distributed.run`) when
--torch2-python has torch 2.x; Debian's torch 1.13 torchrun through bench/torchrun113.py (see its
docstring). Options use the underscore spellings, the only ones torch 1.13 knows (dist-launch
accepts both).
"""
import argparse
import glob
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile

from blocking_run import blocking_run

HERE = os.path.dirname(os.path.abspath(__file__))
MONITOR_INTERVAL = ["--monitor_interval", "0.1"]


def torch_version(python, major):
    r = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                       capture_output=True, text=True)
    version = r.stdout.strip()
    return version if r.returncode == 0 and version.startswith(f"{major}.") else None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, env=None, timeout=120):
    """Runs cmd under GNU time; returns (wall seconds, peak RSS KiB of the launcher, exit code)."""
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        wall, code = blocking_run(["/usr/bin/time", "-f", "%M", "-o", rss.name] + cmd, timeout,
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        lines = rss.read().split()
        return wall, int(lines[-1]) if lines else 0, code


class Launcher:
    """One launcher in one rendezvous setting; prefix() is its command line before the workers'."""

    def __init__(self, name, base, static):
        self.name = f"{name}, {'static' if static else '--standalone'}"
        self.base = base
        self.static = static
        self.walls, self.rss, self.codes, self.restarts = [], [], [], []

    def prefix(self):
        if self.static:
            rdzv = ["--nnodes", "1", "--master_addr", "127.0.0.1", "--master_port", str(free_port())]
        else:
            rdzv = ["--standalone"]
        return self.base + rdzv + MONITOR_INTERVAL


def launchers(build, torch2_python):
    bases = [("dist-launch", [os.path.join(build, "bin", "dist-launch")])]
    v2 = torch_version(torch2_python, 2)
    if v2:
        bases.append((f"torchrun (torch {v2})", [torch2_python, "-m", "torch.distributed.run"]))
    else:
        print(f"note: {torch2_python} has no torch 2.x (scripts/install-torch2.sh)",
              file=sys.stderr)
    v1 = torch_version("/usr/bin/python3", 1)
    if v1:
        bases.append((f"torchrun (torch {v1}, Debian, shim)",
                      ["/usr/bin/python3", os.path.join(HERE, "torchrun113.py")]))
    return [Launcher(name, base, static) for name, base in bases for static in (True, False)]


def restart_latency(launcher, env, worker, nproc):
    d = tempfile.mkdtemp(prefix="dist-launch-bench-")
    try:
        args = launcher.prefix() + ["--nproc_per_node", str(nproc), "--max_restarts", "1",
                                    "--no_python", worker, "crash-if", d, "0", "0", "stamp", d,
                                    "sleep-if-attempt", "0", "30000"]
        _, _, code = run(args, env=env, timeout=120)
        if code != 0:
            return None
        crash = int(open(os.path.join(d, "crash")).read())
        starts = [int(open(f).read()) for f in glob.glob(os.path.join(d, "start_1_*"))]
        if len(starts) != nproc:
            return None
        return (max(starts) - crash) / 1e6
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("--torch2-python", default="python3")
    args = ap.parse_args()
    worker = os.path.join(args.build, "bin", "dist-test-worker")
    env = dict(os.environ, OMP_NUM_THREADS="1", LOGLEVEL="WARNING")
    variants = launchers(args.build, args.torch2_python)

    for i in range(args.runs):
        for v in variants:
            w, r, c = run(v.prefix() + ["--nproc_per_node", str(args.nproc), "--no_python", "true"],
                          env=env)
            v.walls.append(w)
            v.rss.append(r)
            v.codes.append(c)
            v.restarts.append(restart_latency(v, env, worker, args.nproc))
        print(f"run {i + 1}/{args.runs} done", file=sys.stderr, flush=True)

    print(f"| launcher | launch + reap {args.nproc} workers, median ms | launcher peak RSS MiB "
          f"(median) | crash to all {args.nproc} restarted, median ms | exit codes |")
    print("|---|---:|---:|---:|---|")
    for v in variants:
        ok = [x for x in v.restarts if x is not None]
        rs = (f"{statistics.median(ok):.1f} ({len(ok)}/{len(v.restarts)} runs)" if ok
              else f"failed ({len(v.restarts)} runs)")
        codes = "all 0" if all(c == 0 for c in v.codes) else "NON-ZERO"
        print(f"| {v.name} | {statistics.median(v.walls) * 1000:.1f} | "
              f"{statistics.median(v.rss) / 1024:.1f} | {rs} | {codes} |")


if __name__ == "__main__":
    main()
