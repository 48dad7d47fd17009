#!/usr/bin/env python3
"""Stragglers on a crowded machine (issue 41): more runnable threads than CPUs, where the
scheduler, not a rank, decides which rank's wall-clock work is the longest from one second to the
next. Two torch jobs under each build of dist-launch given, interleaved (A B A B ...):

  identical  tests/torch/healthy_worker.py's crowded scenario (DDP of a 512-1024-512 MLP, gloo):
             every rank computes the same, a straggler flagged is a false one
  slow       tests/torch/hang_worker.py --busy: rank 1 computes 1.5x the others' CPU time a step
             (a tiny DDP model): what is told of it (since 2026-12-05 no rank is
             taken for a straggler while the ranks wait for CPUs: the scheduler's noise, in the
             work and the CPU time alike, is as large as that)

    python3 bench/crowded_bench.py [--builds build,OLD] [--ranks 4] [--cpus 1] [--runs 3]
        [--seconds 30] [--jobs identical,slow] [--batch 256] [--python python3]

Each job runs `dist-launch --nproc-per-node RANKS` with its affinity set to the first CPUS CPUs
this process may use, and no other flag. Reported per build and job: the runs with a flag, the
ranks flagged, and for `slow` the seconds from the job's start to rank 1's flag (event log).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "torch", "hang_worker.py")
HEALTHY = os.path.join(ROOT, "tests", "torch", "healthy_worker.py")
sys.path.insert(0, os.path.join(ROOT, "tests", "torch"))
from launcher_test_main import on_cpus  # noqa: E402


def run(args, build, job, cpus):
    directory = tempfile.mkdtemp(prefix="crowded-bench-")
    events_path = os.path.join(directory, "events.jsonl")
    if job == "identical":  # a larger model (DDP's all-reduce takes CPU too), every rank alike
        script = [HEALTHY, "--scenario", "crowded", "--pause", str(args.seconds), "--batch",
                  str(args.batch)]
    else:
        script = [WORKER, "--busy", "--work", "0.02", "--seconds", str(args.seconds), "--fault",
                  "slow", "--slow-factor", "1.5"]
    cmd = [os.path.join(build, "bin", "dist-launch"), "--nproc-per-node", str(args.ranks),
           "--event-log", events_path, *script]
    env = dict(os.environ, PYTHON_EXEC=args.python, GLOO_SOCKET_IFNAME="lo")
    start = time.time()
    proc = subprocess.run(on_cpus(cpus, cmd), env=env, capture_output=True, text=True,
                          timeout=args.seconds + 300)
    events = []
    if os.path.exists(events_path):
        with open(events_path) as f:
            events = [json.loads(line) for line in f if line.strip()]
    flags = [e for e in events if e["event"] == "straggler" and e["straggler"]]
    first = next((e for e in flags if e["rank"] == 1), None)
    return {"rc": proc.returncode, "flagged": sorted({e["rank"] for e in flags}),
            "flags": len(flags), "crowded": "wait for a CPU" in proc.stderr,
            "rank1_after": round(first["ts_ms"] / 1000 - start, 1) if first else None}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--builds", default=os.path.join(ROOT, "build"))
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--cpus", type=int, default=1)
    p.add_argument("--jobs", default="identical,slow")
    p.add_argument("--batch", type=int, default=256, help="the identical job's batch")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--python", default="python3")
    args = p.parse_args()
    builds = [os.path.abspath(b) for b in args.builds.split(",")]
    cpus = set(sorted(os.sched_getaffinity(0))[:args.cpus])
    print(f"{args.ranks} ranks on CPUs {sorted(cpus)}; {args.seconds:g} s a job; {args.runs} runs",
          flush=True)
    results = {}
    for _ in range(args.runs):
        for job in args.jobs.split(","):
            for build in builds:  # A B A B
                r = run(args, build, job, cpus)
                results.setdefault((build, job), []).append(r)
                print(f"  {build} {job}: {r}", file=sys.stderr, flush=True)
    print(f"\n{'build':40} {'job':10} {'runs flagged':>12} {'ranks flagged (each run)':28} "
          f"{'rank 1 flagged after, s':>24}")
    for (build, job), rs in results.items():
        flagged_runs = sum(1 for r in rs if r["flagged"])
        ranks = "; ".join(",".join(map(str, r["flagged"])) or "-" for r in rs)
        after = [r["rank1_after"] for r in rs if r["rank1_after"] is not None]
        print(f"{build:40} {job:10} {flagged_runs:>5} of {len(rs):<4} {ranks:28} "
              f"{statistics.median(after) if after else '-':>24}")


if __name__ == "__main__":
    main()
