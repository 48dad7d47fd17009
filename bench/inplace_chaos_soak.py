#!/usr/bin/env python3
"""Chaos soak of in-place recovery: one long job, --faults SIGKILLs of random workers at random
moments (in a step, in a collective, while a recovery is under way), and the job must still end
with the weights of an uninterrupted run.

    python3 bench/inplace_chaos_soak.py [--build build] [--faults 100] [--nproc 4] [--epochs 200]
        [--min-gap 0.1] [--max-gap 0.6] [--seed 1]

The job: dist-launch --restart-policy in-place --max-restarts 100000 over --nproc
examples/ddp_train workers (--in-place, a checkpoint every 20 steps for the group restarts that a
fault during a recovery falls back to). A killer picks one of the agent's ddp_train children at
random every --min-gap..--max-gap s (uniform) and SIGKILLs it, until --faults kills. Then the job
runs to its end. Checked: exit 0, no process of the job left (by ttfs_bench's marker in the
environment), every rank's final SHA-256 equal to an uninterrupted run's of the same job.
Reported, from the agent's event log: the in-place recoveries and their stall (the kill to the
group's word that it is whole again), the fallbacks to a group restart and why, and the
wall time. With --torch PYTHON the job is examples/torch/elastic_train.py (dist_launch.elastic, a
commit every step; two workers, so that the weights are the uninterrupted run's to the bit: see
tests/torch/elastic_test.py), cold or --warm. (bench/chaos_soak.py is the wider soak of issue 12:
group restarts of elastic jobs on named hosts under agent kills, partitions, store loss.)
"""
import argparse
import collections
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from ttfs_bench import JOB_MARKER, end_job

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DIGEST = re.compile(r"rank (\d+) weights sha256 ([0-9a-f]{64})")
TORCH_DIGEST = re.compile(r"rank (\d+) pid \d+ generation \d+ steps \d+ digest (\w+)")
ELASTIC = os.path.join(ROOT, "examples", "torch", "elastic_train.py")


def workers_of(agent_pid, torch):
    """The agent's children that run the job's workers (ddp_train, or elastic_train.py)."""
    found = []
    try:
        children = open(f"/proc/{agent_pid}/task/{agent_pid}/children").read().split()
    except OSError:
        return found
    for pid in map(int, children):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if torch and any(a.endswith(b"elastic_train.py") for a in argv):
            found.append(pid)
        elif not torch and argv and os.path.basename(argv[0]) == b"ddp_train":
            found.append(pid)
    return found


def run(args, chaos):
    work = tempfile.mkdtemp(prefix="chaos-soak-")
    events = os.path.join(work, "events.jsonl")
    cmd = [os.path.join(args.build, "bin", "dist-launch"), "--nproc-per-node", str(args.nproc),
           "--event-log", events]
    if chaos:
        cmd += ["--restart-policy", "in-place", "--max-restarts", "100000"]
    if args.torch:  # every recovery from the last commit (each step): no checkpoint needed
        cmd += (["--warm-restart"] if args.warm else []) + [ELASTIC, "--steps", str(args.steps)]
    else:
        cmd += ["--no-python", os.path.join(args.build, "bin", "ddp_train"), "--epochs",
                str(args.epochs), "--checkpoint-dir", os.path.join(work, "ckpt"),
                "--checkpoint-every", "20"] + (["--in-place"] if chaos else [])
    job = f"{os.getpid()}-{'chaos' if chaos else 'clean'}"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHON_EXEC=args.torch or "python3",
               **{JOB_MARKER: job})
    began = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    output = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout))
    reader.start()
    kills = []
    if chaos:
        rng = random.Random(args.seed)
        while len(kills) < args.faults and proc.poll() is None:
            time.sleep(rng.uniform(args.min_gap, args.max_gap))
            victims = workers_of(proc.pid, bool(args.torch))
            if not victims:
                continue
            victim = rng.choice(victims)
            try:
                os.kill(victim, signal.SIGKILL)
                kills.append(time.monotonic())
            except ProcessLookupError:
                pass
    try:
        proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        reader.join()
        sys.exit(f"the job did not end in {args.timeout} s:\n{''.join(output[-60:])}")
    reader.join()
    wall = time.monotonic() - began
    left = end_job(proc, job)  # kills and counts what carries the job's marker
    if left:
        sys.exit(f"{left} of the job's processes outlived it")
    text = "".join(output)
    with open(events) as f:
        log = [json.loads(line) for line in f]
    shutil.rmtree(work, ignore_errors=True)
    if proc.returncode != 0:
        sys.exit(f"exit {proc.returncode} after {len(kills)} kills:\n{text[-6000:]}")
    digests = dict((TORCH_DIGEST if args.torch else DIGEST).findall(text))
    if len(digests) != args.nproc:
        sys.exit(f"not every rank printed its digest:\n{text[-4000:]}")
    return digests, kills, log, wall


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--faults", type=int, default=100)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--min-gap", type=float, default=0.1)
    parser.add_argument("--max-gap", type=float, default=0.6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--torch", metavar="PYTHON", default="",
                        help="soak examples/torch/elastic_train.py (dist_launch.elastic) on this "
                             "interpreter instead of ddp_train")
    parser.add_argument("--steps", type=int, default=3000, help="elastic_train.py's steps")
    parser.add_argument("--warm", action="store_true", help="with --torch: --warm-restart")
    args = parser.parse_args()

    clean, _, _, clean_wall = run(args, chaos=False)
    if len(set(clean.values())) != 1:
        sys.exit(f"the uninterrupted run's ranks disagree: {clean}")
    digests, kills, log, wall = run(args, chaos=True)
    expected = next(iter(clean.values()))
    wrong = {rank: d for rank, d in digests.items() if d != expected}
    events = collections.Counter(e["event"] for e in log)
    stalls = [e["stall_ms"] for e in log if e["event"] == "inplace_recovered"]
    reasons = collections.Counter(re.sub(r"\d+", "N", e["reason"]) for e in log
                                  if e["event"] == "inplace_fallback")
    job = (f"elastic_train.py --steps {args.steps} ({args.torch}{', warm' if args.warm else ''})"
           if args.torch else f"ddp_train --epochs {args.epochs}")
    print(f"{args.nproc} workers of {job}: uninterrupted run "
          f"{clean_wall:.1f} s; chaos run {wall:.1f} s with {len(kills)} SIGKILLs "
          f"(every {args.min_gap}-{args.max_gap} s, seed {args.seed})")
    print(f"in-place recoveries: {events['inplace_recovered']}, stall median "
          f"{statistics.median(stalls) if stalls else 0:.0f} ms (min {min(stalls, default=0)}, "
          f"max {max(stalls, default=0)}); group restarts: {events['restart']}")
    for reason, n in reasons.most_common():
        print(f"  fallback x{n}: {reason}")
    if len(kills) < args.faults:
        sys.exit(f"the job ended after {len(kills)} of {args.faults} kills: raise --epochs "
                 "(--steps)")
    if wrong:
        sys.exit(f"FAILED: ranks {sorted(wrong)} ended with other weights than the "
                 f"uninterrupted run's ({expected[:16]})")
    print(f"every rank's weights are the uninterrupted run's (sha256 {expected[:16]}...)")


if __name__ == "__main__":
    main()
