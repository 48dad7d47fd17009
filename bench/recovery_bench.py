#!/usr/bin/env python3
"""Recovery from one worker's crash: group restart against in-place (C++ workers).

    python3 bench/recovery_bench.py [--build build] [--runs 5] [--epochs 8] [--crash-at-step 320]
                                    [--nodes one|elastic]

Each run is one dist-launch job of 2 examples/ddp_train workers (--max-restarts 1, a checkpoint
every 50 steps into a fresh directory, --timestamps); rank 1 crashes as step 320 begins. The two
workers run under one agent, or (--nodes elastic) under two agents of elastic rendezvous (c10d,
--nnodes 2, the store on 127.0.0.2), one worker each: rank 1's node replaces it (in-place) or the
job's verdict restarts both nodes' groups (group). The modes
alternate (A B A B ...):
  A, group (today's and torchrun's behaviour): every worker stops, the group restarts from the
     last checkpoint (step 300: steps 300..319 are trained again);
  B, in-place (--restart-policy in-place, ddp_train --in-place): rank 1 alone is replaced; rank 0
     keeps its process and gives the replacement its state; step 320 is trained again.
From the wall clock the workers print (the crash, each process's first step after its start or
after an in-place recovery):
  survivors training again = rank 0's first completed step after the crash - the crash
  replacement training     = the new rank 1's first completed step - the crash
  crash step trained       = the later rank to complete step 320 after the crash - the crash (a
                             group restart first trains steps 300..319 again)
Both ranks' final digests must equal an uninterrupted run's (checked on every run). Medians of
--runs each, with min and max. The issue's targets for in-place: both <= 0.5 s.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import socket
import tempfile
import time

CRASH = re.compile(r"injected crash at step (\d+) on rank 1 at wall_ns (\d+)")
FIRST = re.compile(r"\[default(\d)\]:ddp_train: rank (\d) step (\d+) done at wall_ns (\d+) "
                   r"\(first since (start|recovery)\)")
CRASH_STEP = re.compile(r"ddp_train: rank (\d) step \d+ done at wall_ns (\d+) \(the crash step\)")
DIGEST = re.compile(r"rank (\d) weights sha256 ([0-9a-f]{64})")


def free_port(host):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_for_listener(host, port, proc, timeout=60):
    """Until the agent that hosts the rendezvous store accepts on host:port (or it ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.01)
    sys.exit(f"nothing listens on {host}:{port}")


def launch(args, extra, train_args):
    """One job: 2 workers on one agent, or (--nodes elastic) one worker on each of two agents
    behind c10d rendezvous on 127.0.0.2. Returns every agent's output, together."""
    program = [os.path.join(args.build, "bin", "dist-launch")]
    worker = ["--max-restarts", "1", *extra, "--no-python",
              os.path.join(args.build, "bin", "ddp_train"), "--epochs", str(args.epochs),
              *train_args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if args.nodes == "one":
        cmds = [program + ["--nproc-per-node", "2"] + worker]
    else:
        port = free_port("127.0.0.2")
        nodes = ["--nnodes", "2", "--rdzv-endpoint", f"127.0.0.2:{port}", "--rdzv-id",
                 f"bench-{port}", "--nproc-per-node", "1"]
        cmds = [program + nodes + worker] * 2
    procs = []
    for cmd in cmds:
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
        if args.nodes == "elastic" and len(procs) == 1:
            wait_for_listener("127.0.0.2", port, procs[0])
    output = ""
    for cmd, proc in zip(cmds, procs):
        output += proc.communicate(timeout=300)[0]
        if proc.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{output}")
    return output


def digests(output):
    found = {rank: sha for rank, sha in DIGEST.findall(output)}
    if len(found) != 2:
        sys.exit(f"not every rank printed its digest:\n{output}")
    return found


def job(args, mode, clean):
    """One crashed run; returns (survivors training again, replacement training, crash step
    trained) in s."""
    ckpt = tempfile.mkdtemp(prefix="recovery-bench-")
    try:
        extra = ["--restart-policy", "in-place"] if mode == "in-place" else []
        train = ["--checkpoint-dir", ckpt, "--crash-at-step", str(args.crash_at_step),
                 "--timestamps"] + (["--in-place"] if mode == "in-place" else [])
        output = launch(args, extra, train)
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)
    for rank, sha in digests(output).items():
        if sha != clean:
            sys.exit(f"{mode}: rank {rank} ended with {sha}, not the clean run's {clean}")
    crash = CRASH.search(output)
    if not crash:
        sys.exit(f"{mode}: no crash line:\n{output}")
    fault = int(crash.group(2))
    firsts = [(int(r), int(ns), since) for _, r, _, ns, since in FIRST.findall(output)
              if int(ns) > fault]
    survivor_since = "recovery" if mode == "in-place" else "start"
    survivor = [ns for r, ns, since in firsts if r == 0 and since == survivor_since]
    replacement = [ns for r, ns, since in firsts if r == 1 and since == "start"]
    if not survivor or not replacement:
        sys.exit(f"{mode}: missing first steps after the crash:\n{output}")
    if mode == "in-place" and "restarting the worker group" in output:
        sys.exit(f"in-place fell back to a group restart:\n{output}")
    trained = [int(ns) for _, ns in CRASH_STEP.findall(output) if int(ns) > fault]
    if len(trained) != 2:
        sys.exit(f"{mode}: not both ranks trained the crash step after the crash:\n{output}")
    return ((survivor[0] - fault) / 1e9, (replacement[0] - fault) / 1e9,
            (max(trained) - fault) / 1e9)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--crash-at-step", type=int, default=320)
    parser.add_argument("--nodes", choices=("one", "elastic"), default="one",
                        help="one agent of 2 workers, or two agents of one behind elastic "
                             "(c10d) rendezvous")
    args = parser.parse_args()
    clean = digests(launch(args, [], []))["0"]
    results = {mode: {"survivors": [], "replacement": [], "trained": []}
               for mode in ("group", "in-place")}
    for run in range(args.runs):
        for mode in ("group", "in-place"):  # A B A B
            survivors, replacement, trained = job(args, mode, clean)
            results[mode]["survivors"].append(survivors)
            results[mode]["replacement"].append(replacement)
            results[mode]["trained"].append(trained)
            print(f"run {run} {mode:8}: survivors training again {survivors * 1e3:7.1f} ms, "
                  f"replacement training {replacement * 1e3:7.1f} ms, crash step trained "
                  f"{trained * 1e3:7.1f} ms", file=sys.stderr)
    ms = lambda xs: f"median {statistics.median(xs) * 1e3:6.1f} ms (min {min(xs) * 1e3:.1f}, " \
                    f"max {max(xs) * 1e3:.1f})"
    where = "on one node" if args.nodes == "one" else "on two elastic nodes"
    print(f"2 workers {where}, ddp_train --epochs {args.epochs}, crash of rank 1 at step "
          f"{args.crash_at_step}, {args.runs} runs each, every digest the clean run's")
    for mode in ("group", "in-place"):
        print(f"{mode:8}  fault -> survivors training again:  {ms(results[mode]['survivors'])}")
        print(f"{mode:8}  fault -> replacement training:      {ms(results[mode]['replacement'])}")
        print(f"{mode:8}  fault -> crash step trained:        {ms(results[mode]['trained'])}")


if __name__ == "__main__":
    main()
