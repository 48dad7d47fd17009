#!/usr/bin/env python3
"""Convergence against bytes and time (issue 45, item 5): a small transformer language model
(bench/convergence_torch.py, on the text CPython ships in pydoc_data) trained to a fixed number of
steps with each gradient compression, torch's own hooks beside dist_launch.compression's (the
SDK's compressors), 2 workers on two named hosts across a rate-limited link.

    python3 bench/convergence_bench.py [--build build] [--runs 1] [--rate 100mbit] [--steps 600]
        [--modes 'torch none,hook powersgd:4'] [--out results.jsonl] [--against CHECKOUT]

Per job: the held-out loss at the end (bits per byte; lower is better), the training steps' mean
time (forward, backward with the exchange, optimizer step; rank 0's), and the bytes both hosts'
eth0 sent per step (TCP/IP headers and the rendezvous included, the same measure for every mode).
Modes interleave in each round; the table gives medians over --runs rounds. A job that makes no
step for a minute is ended by dist-launch (--hang-timeout 60) and reported as hung. Needs root (named
hosts, tc) and torch 2.x in python3; exits 77 otherwise.

--against CHECKOUT runs every "hook" row a second time, interleaved, with another checkout's
dist_launch package and library (CHECKOUT/python, CHECKOUT/build/lib; a `git worktree` of the
commit before, built): a change to the hooks measured against what it replaces in one run.
"""
import argparse
import json
import os
import re
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from compression_bench import (HOSTS, NAMED_HOSTS, hook_env, missing, shape_link,  # noqa: E402
                               tx_bytes)
from named_hosts import SKIP, NamedHosts  # noqa: E402

WORKER = os.path.join(HERE, "convergence_torch.py")
JOB_TIMEOUT_S = 1200
MODES = [
    ("torch none", "none"),
    ("torch fp16 hook", "fp16"),
    ("torch powersgd:4 hook", "powersgd:4"),
    ("hook fp16", "dist:fp16"),
    ("hook bf16", "dist:bf16"),
    ("hook topk:0.01", "dist:topk:0.01"),
    ("hook topk:0.1", "dist:topk:0.1"),
    ("hook powersgd:4", "dist:powersgd:4"),
]


def run_job(hosts, args, hook, port, workdir, checkout=ROOT):
    build = args.build if checkout == ROOT else os.path.join(checkout, "build")
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="eth0",
               PYTHON_EXEC=sys.executable, **hook_env(build, checkout))
    launcher = os.path.join(args.build, "bin", "dist-launch")
    procs, logs = [], []
    before = [tx_bytes(hosts, name) for name in HOSTS]
    for rank, name in enumerate(HOSTS):
        argv = [launcher, "--nnodes", "2", "--node-rank", str(rank), "--master-addr", HOSTS[0],
                "--master-port", str(port), "--nproc-per-node", "1",
                # a job whose ranks make no step for a minute is ended (torch's PowerSGD hook
                # deadlocks over gloo with two buckets: BENCHMARKS.md) and reported as hung
                "--hang-timeout", "60", WORKER, "--hook", hook, "--steps", str(args.steps)]
        log = os.path.join(workdir, f"{port}-{name}.log")
        logs.append(log)
        procs.append(hosts.start(name, argv, env=env, log=log))
    codes = [p.wait(timeout=JOB_TIMEOUT_S) for p in procs]
    after = [tx_bytes(hosts, name) for name in HOSTS]
    with open(logs[0]) as f:
        output = f.read()
    if codes != [0, 0]:
        with open(logs[1]) as f:
            both = output + f.read()
        if re.search(r"hang on .* ending|no progress|hung", both, re.IGNORECASE):
            return {"hung": True, "loss": None, "curve": [], "step_ms": None, "wire_bytes": None}
        raise RuntimeError(f"job {hook} failed {codes}:\n{both}")
    m = re.search(r"(\d+) steps in ([0-9.]+) s of training steps", output)
    steps, seconds = int(m.group(1)), float(m.group(2))
    loss = float(re.search(r"final held-out loss ([0-9.]+|nan)", output).group(1))
    curve = [float(v) for v in re.findall(r"held-out ([0-9.]+|nan) bits per byte", output)]
    return {"loss": loss, "curve": curve, "step_ms": 1000 * seconds / steps,
            "wire_bytes": statistics.mean(a - b for a, b in zip(after, before)) / steps}


def table(results, labels):
    first = results[labels[0]]
    lines = [f"(median of {len(first)} runs)", "",
             "| mode | held-out bits/byte | step ms | wire bytes/step | vs torch none |",
             "|---|---:|---:|---:|---:|"]
    clean = [r["wire_bytes"] for r in results.get("torch none", []) if not r.get("hung")]
    base = statistics.median(clean) if clean else None
    for label in labels:
        runs = [r for r in results[label] if not r.get("hung")]
        if not runs:
            lines.append(f"| {label} | hung ({len(results[label])} of {len(results[label])}) "
                         f"| | | |")
            continue
        wire = statistics.median(r["wire_bytes"] for r in runs)
        lines.append(f"| {label} | {statistics.median(r['loss'] for r in runs):.4f} | "
                     f"{statistics.median(r['step_ms'] for r in runs):.1f} | {wire:,.0f} | "
                     f"{f'{wire / base:.3f}x' if base else '-'} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--modes", default="", help="comma-separated labels to run (default: all)")
    ap.add_argument("--out", help="append every job's result to this JSON-lines file")
    ap.add_argument("--against", help="a checkout (python/, build/lib/) to run the hook rows with too")
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    why = missing()
    if why:
        print(f"skipping: {why}", file=sys.stderr)
        return SKIP
    modes = [(label, hook, ROOT) for label, hook in MODES]
    if args.modes:
        modes = [m for m in modes if m[0] in set(args.modes.split(","))]
    if args.against:
        args.against = os.path.abspath(args.against)
        name = os.path.basename(args.against)
        modes = [m for label, hook, root in modes
                 for m in [(label, hook, root)] + ([(f"{label} ({name})", hook, args.against)]
                                                   if hook.startswith("dist:") else [])]
    results = {label: [] for label, _, _ in modes}
    port = 29600
    with tempfile.TemporaryDirectory(prefix="convergence-bench-") as workdir, \
            NamedHosts(NAMED_HOSTS, HOSTS) as hosts:
        shape_link(hosts, args.rate)
        for round_index in range(args.runs):
            for label, hook, checkout in modes:
                port += 1  # a fresh store port per job
                r = run_job(hosts, args, hook, port, workdir, checkout)
                r.update(mode=label, round=round_index, rate=args.rate, steps=args.steps)
                results[label].append(r)
                print(json.dumps(r), flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(r) + "\n")
    print(f"\n{args.rate}, {args.steps} steps " + table(results, [label for label, _, _ in modes]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
