#!/usr/bin/env python3
"""Launcher benchmark: dist-launch beside torchrun, in one run.

    python3 bench/launch_bench.py [--build build] [--runs 10]

1. Launch + reap of 8 trivial workers (`--no_python true`): wall time (median of --runs) and the
   launcher's peak RSS, measured by GNU time (`/usr/bin/time -f %M`). Not by this script's own
   wait4: the kernel keeps a process's RSS high-water mark across exec, so a child forked from this
   Python process would inherit Python's ~14 MB before it even starts.
2. Worker crash to all workers restarted: rank 0 crashes on attempt 0 (writing the time), every
   worker of attempt 1 writes its start time; the latency is the last start minus the crash.

Launchers: build/bin/dist-launch; torch 2.x's torchrun (`python3 -m torch.distributed.run`) when
`python3` has torch 2.x; Debian's torch 1.13 torchrun through bench/torchrun113.py (see its
docstring). torchrun runs with `--monitor_interval 0.05`, its fastest practical polling. Options use
the underscore spellings, the only ones torch 1.13 knows (dist-launch accepts both).
"""
import argparse
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def has_torch(python, major):
    r = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                       capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.strip().startswith(f"{major}."), r.stdout.strip()


def run(cmd, env=None, timeout=120):
    """Runs cmd under GNU time; returns (wall seconds, peak RSS KiB of the launcher, exit code)."""
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        start = time.perf_counter()
        proc = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss.name] + cmd, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout)
        wall = time.perf_counter() - start
        lines = rss.read().split()
        return wall, int(lines[-1]) if lines else 0, proc.returncode


def launchers(build):
    worker_env = dict(os.environ, OMP_NUM_THREADS="1", LOGLEVEL="WARNING")
    out = [("dist-launch", [os.path.join(build, "bin", "dist-launch"), "--standalone"], worker_env)]
    ok2, v2 = has_torch("python3", 2)
    if ok2:
        out.append((f"torchrun (torch {v2})",
                    ["python3", "-m", "torch.distributed.run", "--standalone",
                     "--monitor_interval", "0.05"], worker_env))
    else:
        print("note: python3 has no torch 2.x (scripts/install-torch2.sh)", file=sys.stderr)
    ok1, v1 = has_torch("/usr/bin/python3", 1)
    if ok1:
        out.append((f"torchrun (torch {v1}, Debian, shim)",
                    ["/usr/bin/python3", os.path.join(HERE, "torchrun113.py"), "--standalone",
                     "--monitor_interval", "0.05"], worker_env))
    return out


def restart_latency(cmd, env, worker, nproc):
    d = tempfile.mkdtemp(prefix="dist-launch-bench-")
    try:
        args = cmd + ["--nproc_per_node", str(nproc), "--max_restarts", "1", "--no_python", worker,
                      "crash-if", d, "0", "0", "stamp", d, "sleep-if-attempt", "0", "30000"]
        wall, _, code = run(args, env=env, timeout=120)
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
    args = ap.parse_args()
    worker = os.path.join(args.build, "bin", "dist-test-worker")

    rows = []
    for name, cmd, env in launchers(args.build):
        walls, rss, codes = [], [], []
        for _ in range(args.runs):
            w, r, c = run(cmd + ["--nproc_per_node", str(args.nproc), "--no_python", "true"], env=env)
            walls.append(w)
            rss.append(r)
            codes.append(c)
        restarts = [restart_latency(cmd, env, worker, args.nproc) for _ in range(max(3, args.runs // 2))]
        ok = [x for x in restarts if x is not None]
        rows.append((name, statistics.median(walls), min(walls), statistics.median(rss) / 1024,
                     statistics.median(ok) if ok else None, len(ok), len(restarts),
                     all(c == 0 for c in codes)))
        print(rows[-1], file=sys.stderr, flush=True)

    print(f"| launcher | launch + reap {args.nproc} workers, median s | best s | launcher peak RSS MiB (median) "
          f"| crash to all {args.nproc} restarted, median ms | exit codes |")
    print("|---|---:|---:|---:|---:|---|")
    for name, med, best, rss, restart, nok, n, ok in rows:
        rs = f"{restart:.1f} ({nok}/{n} runs)" if restart is not None else f"failed ({n} runs)"
        print(f"| {name} | {med:.3f} | {best:.3f} | {rss:.1f} | {rs} | {'all 0' if ok else 'NON-ZERO'} |")


if __name__ == "__main__":
    main()
