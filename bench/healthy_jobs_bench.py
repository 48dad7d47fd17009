#!/usr/bin/env python3
"""Healthy jobs under dist-launch's defaults and under torchrun (issue 41): each scenario of
tests/torch/healthy_worker.py (a rank that sleeps, writes checkpoints or evaluates for longer than
the automatic hang timeout while the other waits; a pause between steps; every rank stalling; a
long first step; a DataLoader; no optimizer; gradient accumulation; a slow log service; a declared
pause; torch.compile with collectives), run by both launchers one after the other (A B A B), each
with 2 workers on this machine (crowded: 4 on one CPU): its exit code and wall time, and what dist-launch reported
(hang_suspected events) and did (hang events, workers it killed, straggler flags).

    python3 bench/healthy_jobs_bench.py [--build build] [--python python3] [--runs 1]
        [--pause 45] [--only sleep,save,...]

torchrun is torch 2.x's (`python -m torch.distributed.run`) in its default static rendezvous on a
free port (not --standalone); dist-launch is build/bin/dist-launch with no flags but
--nproc-per-node. Under torchrun the package in python/ is on PYTHONPATH (the paused scenario
imports dist_launch.progress, whose pause does nothing there).
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "torch", "healthy_worker.py")
sys.path.insert(0, os.path.join(ROOT, "tests", "torch"))
from healthy_test import SCENARIOS, SlowService  # noqa: E402  (the test's own scenarios)
from launcher_test_main import on_cpus  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args, launcher, scenario):
    directory = tempfile.mkdtemp(prefix="healthy-bench-")
    events_path = os.path.join(directory, "events.jsonl")
    service = SlowService() if scenario == "slow-log" else None
    script = [WORKER, "--scenario", scenario, "--pause", str(args.pause)]
    if service:
        script += ["--log-port", str(service.port)]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    # crowded: 4 ranks on one CPU, as healthy_test.py runs it.
    nproc, cpus = ("4", {min(os.sched_getaffinity(0))}) if scenario == "crowded" else ("2", None)
    if launcher == "dist-launch":
        cmd = [os.path.join(args.build, "bin", "dist-launch"), "--nproc-per-node", nproc,
               "--event-log", events_path, *script]
        env["PYTHON_EXEC"] = args.python
    else:
        # The script's `from dist_launch import progress` (the paused scenario) finds the package
        # as if installed: under torchrun its pause is a no-op.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.path.join(ROOT, "python"), env.get("PYTHONPATH")) if p)
        cmd = [args.python, "-m", "torch.distributed.run", "--nproc-per-node", nproc,
               "--master-port", str(free_port()), *script]
    start = time.monotonic()
    if cpus:
        cmd = on_cpus(cpus, cmd)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - start
    if service:
        service.close()
    events = []
    if os.path.exists(events_path):
        with open(events_path) as f:
            events = [json.loads(line) for line in f if line.strip()]
    of = lambda name: [e for e in events if e["event"] == name]  # noqa: E731
    return {"rc": proc.returncode, "seconds": seconds,
            "suspected": len(of("hang_suspected")), "hangs": len(of("hang")),
            "killed": len([e for e in of("worker_exit") if e["reason"]]),
            "stragglers": len([e for e in of("straggler") if e["straggler"]]),
            "tail": proc.stderr[-600:] if proc.returncode else ""}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--python", default="python3", help="the workers' interpreter: torch 2.x")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--pause", type=float, default=45)
    p.add_argument("--only", default=",".join(SCENARIOS))
    args = p.parse_args()
    args.build = os.path.abspath(args.build)
    version = subprocess.run([args.python, "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True).stdout.strip()
    print(f"torch {version} at {args.python}; {os.cpu_count()} cores; pause {args.pause:g} s",
          flush=True)
    results = {}
    for scenario in args.only.split(","):
        for _ in range(args.runs):
            for launcher in ("dist-launch", "torchrun"):  # A B A B
                r = run(args, launcher, scenario)
                results.setdefault((scenario, launcher), []).append(r)
                print(f"  {scenario} {launcher}: {r}", file=sys.stderr, flush=True)
    print(f"\n{'scenario':13} {'dist-launch: exit, s, reported/ended/killed/stragglers':56} "
          f"torchrun: exit, s")
    harmed = 0
    for scenario in args.only.split(","):
        ours, theirs = results[(scenario, "dist-launch")], results[(scenario, "torchrun")]
        codes = lambda rs: ",".join(str(r["rc"]) for r in rs)  # noqa: E731
        wall = lambda rs: statistics.median(r["seconds"] for r in rs)  # noqa: E731
        marks = "/".join(str(sum(r[k] for r in ours))
                         for k in ("suspected", "hangs", "killed", "stragglers"))
        harmed += sum(r["rc"] != t["rc"] or r["hangs"] or r["killed"] for r, t in zip(ours, theirs))
        print(f"{scenario:13} {codes(ours):>4} {wall(ours):7.1f} s  {marks:42} "
              f"{codes(theirs):>4} {wall(theirs):7.1f} s")
    print(f"\nhealthy jobs harmed by dist-launch's defaults (an exit other than torchrun's, a "
          f"hang acted upon, a worker killed): {harmed}")


if __name__ == "__main__":
    main()
