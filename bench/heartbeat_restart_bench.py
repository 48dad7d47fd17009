#!/usr/bin/env python3
"""Hang detection: how soon after a worker's last heartbeat its replacement runs.

    python3 bench/heartbeat_restart_bench.py [--build build] [--timeout 1] [--runs 7] [--nproc 2]

Each run is one dist-launch job (--max-restarts 1, --worker-heartbeat-timeout T) of
dist-watchdog-worker processes; attempt 0's local rank 0 leaves the round one of two ways, in
alternation (A B A B ...):
  A, crash (the anchor): stamps the clock and exits 1: the agent hears it at once (SIGCHLD);
  B, hang: beats once, stamps the clock, stops itself (SIGSTOP): only the heartbeat can tell.
Every attempt-1 worker stamps its start. Restart latency = the last attempt-1 start minus the stamp
(CLOCK_MONOTONIC in both). For B, the figure that matters is latency - T, the target being under
100 ms; the agent's own line "last beat X s ago" gives its detection lateness, X - T. Medians of
--runs each; the other workers of attempt 0 beat every 10 ms until stopped.
"""
import argparse
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile


def job(args, mode, out):
    """One job; returns (restart latency in s, the agent's "last beat X s ago" or None)."""
    # Every worker stamps its start; attempt 1 then succeeds. On attempt 0 all beat every 10 ms,
    # and local rank 0 leaves right after its stamp (its last beat comes just before it).
    leave = ["exit-if-rank", "0", "1"] if mode == "crash" else ["stop-if-rank", "0"]
    cmd = [os.path.join(args.build, "bin", "dist-launch"), "--nproc-per-node", str(args.nproc),
           "--max-restarts", "1", "--worker-heartbeat-timeout", str(args.timeout),
           "--no-python", os.path.join(args.build, "bin", "dist-watchdog-worker"),
           "stamp", f"{out}/start_${{local_rank}}_@", "exit-on-attempt", "1", "0",
           "beat-every", "10", "beat", "stamp", f"{out}/left_${{local_rank}}", *leave, "hang"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        sys.exit(f"{mode} run failed ({proc.returncode}):\n{proc.stderr}")
    left = int(open(f"{out}/left_0").read())
    starts = [int(open(f).read()) for f in glob.glob(f"{out}/start_*_1")]
    if len(starts) != args.nproc:
        sys.exit(f"{mode} run: {len(starts)} attempt-1 workers started, not {args.nproc}")
    said = re.search(r"last beat ([0-9.]+) s ago", proc.stderr)
    return (max(starts) - left) / 1e9, float(said.group(1)) if said else None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build")
    parser.add_argument("--timeout", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    results = {"crash": [], "hang": []}
    detected = []
    for run in range(args.runs):
        for mode in ("crash", "hang"):  # A B A B
            out = tempfile.mkdtemp(prefix="hang-bench-")
            try:
                latency, last_beat = job(args, mode, out)
            finally:
                shutil.rmtree(out, ignore_errors=True)
            results[mode].append(latency)
            if mode == "hang" and last_beat is not None:
                detected.append(last_beat - args.timeout)
        print(f"run {run}: crash {results['crash'][-1] * 1e3:.1f} ms, hang "
              f"{results['hang'][-1] * 1e3:.1f} ms", file=sys.stderr)
    ms = lambda xs: f"median {statistics.median(xs) * 1e3:.1f} ms (min {min(xs) * 1e3:.1f}, " \
                    f"max {max(xs) * 1e3:.1f})"
    print(f"workers: {args.nproc}, heartbeat timeout {args.timeout} s, {args.runs} runs each")
    print(f"A crash -> restarted:                 {ms(results['crash'])}")
    print(f"B SIGSTOP -> restarted:               {ms(results['hang'])}")
    print(f"B minus the timeout:                  {ms([x - args.timeout for x in results['hang']])}")
    if detected:
        print(f"B detection lateness (agent's clock): {ms(detected)}")


if __name__ == "__main__":
    main()
