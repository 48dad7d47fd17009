#!/usr/bin/env python3
"""Launch + reap of N trivial workers: dist-launch builds beside the least a launcher can do.

    python3 bench/launch_cost_bench.py [--runs 200] [--nproc 8] LABEL=DIST_LAUNCH_BINARY ...

The anchor is bench/fork_exec_wait.c (compiled here with cc -O2): fork N children that exec
`true`, wait for all. Each dist-launch binary runs `--standalone --nproc_per_node N --no_python
true`, as bench/launch_bench.py does. Runs are interleaved (anchor, A, B, ..., anchor, A, B, ...)
so that a machine loaded by others weighs on every variant alike; the table gives medians, the
25th and 75th percentiles, and each median's ratio to the anchor's.

Used to weigh a change to the agent's start or exit (e.g. the janitor: the same tree built with and
without it).
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from blocking_run import blocking_run

HERE = os.path.dirname(os.path.abspath(__file__))


def compile_anchor(out_dir):
    exe = os.path.join(out_dir, "fork_exec_wait")
    subprocess.run(["cc", "-O2", "-o", exe, os.path.join(HERE, "fork_exec_wait.c")], check=True)
    return exe


def timed(cmd, env):
    elapsed, code = blocking_run(cmd, 60, env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
    if code != 0:
        sys.exit(f"{cmd[0]} exited with {code}")
    return elapsed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("launchers", nargs="+", metavar="LABEL=DIST_LAUNCH_BINARY")
    args = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1", LOGLEVEL="WARNING")
    with tempfile.TemporaryDirectory() as tmp:
        variants = [("fork/exec/wait (C)", [compile_anchor(tmp), str(args.nproc), "true"])]
        for spec in args.launchers:
            label, binary = spec.split("=", 1)
            variants.append((label, [binary, "--standalone", "--nproc_per_node", str(args.nproc),
                                     "--no_python", "true"]))
        times = {label: [] for label, _ in variants}
        for _ in range(args.runs):
            for label, cmd in variants:
                times[label].append(timed(cmd, env))
    anchor = statistics.median(times[variants[0][0]])
    print(f"| launch + reap of {args.nproc} `true` ({args.runs} interleaved runs) | median ms "
          f"| p25 ms | p75 ms | median / anchor |")
    print("|---|---:|---:|---:|---:|")
    for label, _ in variants:
        t = sorted(times[label])
        q = statistics.quantiles(t, n=4)
        med = statistics.median(t)
        print(f"| {label} | {med * 1e3:.2f} | {q[0] * 1e3:.2f} | {q[2] * 1e3:.2f} "
              f"| {med / anchor:.2f}x |")


if __name__ == "__main__":
    main()
