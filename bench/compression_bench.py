#!/usr/bin/env python3
"""Gradient compression across a slow link (issue 23): examples/ddp_train with each --compression
and --sync mode, beside torch 2.x DDP (gloo, CPU) with its fp16 and PowerSGD communication hooks
on the same link and the same model (bench/compression_torch.py), 2 workers.

    python3 bench/compression_bench.py [--build build] [--runs 3] [--rates 100mbit,1gbit]
        [--modes 'sdk fp16,torch fp16 hook'] [--hidden 128] [--out results.jsonl]

Each job runs one worker on each of two named hosts (network namespaces on one bridge, see
tests/named_hosts/named-hosts.sh), both under dist-launch; tc tbf limits each host's eth0 to the
rate (so each direction of the link). Per job: the training steps' mean time (forward, backward
with the exchange, optimizer step; rank 0's), the bytes per step (the SDK's own count by the ring
formulas, and what both hosts' eth0 sent over the whole job divided by its steps, so TCP/IP
headers, rendezvous and the per-epoch loss all-reduce included, the same measure for torch), and
the final test accuracy. Rounds interleave every configuration (rates, then modes) and the table
gives each one's median over --runs rounds. Needs root; exits 77 when named hosts cannot be made
or python3 has no torch 2.x.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "named_hosts"))
from named_hosts import SKIP, NamedHosts, unavailable  # noqa: E402

NAMED_HOSTS = os.path.join(ROOT, "tests", "named_hosts", "named-hosts.sh")
TORCH_WORKER = os.path.join(ROOT, "bench", "compression_torch.py")
HOSTS = ["node-a", "node-b"]
JOB_TIMEOUT_S = 600
# (label, side, arguments): the SDK's ddp_train flags, or compression_torch.py's --hook.
MODES = [
    ("sdk none", "sdk", []),
    ("sdk fp16", "sdk", ["--compression", "fp16"]),
    ("sdk bf16", "sdk", ["--compression", "bf16"]),
    ("sdk topk:0.01", "sdk", ["--compression", "topk:0.01"]),
    ("sdk threshold:0.01", "sdk", ["--compression", "threshold:0.01"]),
    ("sdk powersgd:2", "sdk", ["--compression", "powersgd:2"]),
    ("sdk partial:4", "sdk", ["--sync", "partial:4"]),
    ("sdk local-sgd:4", "sdk", ["--sync", "local-sgd:4"]),
    ("torch none", "torch", ["--hook", "none"]),
    ("torch fp16 hook", "torch", ["--hook", "fp16"]),
    ("torch powersgd:2 hook", "torch", ["--hook", "powersgd:2"]),
    # the SDK's compressors as torch hooks (dist_launch.compression), on the torch job
    ("hook fp16", "torch", ["--hook", "dist:fp16"]),
    ("hook bf16", "torch", ["--hook", "dist:bf16"]),
    ("hook topk:0.01", "torch", ["--hook", "dist:topk:0.01"]),
    ("hook threshold:0.01", "torch", ["--hook", "dist:threshold:0.01"]),
    ("hook powersgd:2", "torch", ["--hook", "dist:powersgd:2"]),
]
# tbf's bucket: a few packets, so that even one step's message is paced at the rate.
BURST = {"100mbit": "8kb", "1gbit": "32kb"}



def missing():
    """Why this machine cannot run the two-host torch jobs (named hosts, torch 2.x), or None."""
    why = unavailable(NAMED_HOSTS)
    if why:
        return why
    probe = subprocess.run([sys.executable, "-c",
                            "import sys, torch; sys.exit(int(torch.__version__.split('.')[0]) < 2)"],
                           capture_output=True)
    return None if probe.returncode == 0 else f"{sys.executable} has no torch 2.x"


def hook_env(build, checkout=ROOT):
    """What the "hook" rows' workers need: a checkout's dist_launch (this one's by default) and
    the library in `build`."""
    return {"PYTHONPATH": os.path.join(checkout, "python"),
            "DIST_LAUNCH_COMPRESSION_LIB": os.path.join(build, "lib", "libdist_compression.so")}


def shape_link(hosts, rate):
    for name in HOSTS:
        subprocess.run(["ip", "netns", "exec", f"{hosts.run_id}-{name}", "tc", "qdisc", "replace",
                        "dev", "eth0", "root", "tbf", "rate", rate, "burst",
                        BURST.get(rate, "32kb"), "latency", "200ms"], check=True)


def tx_bytes(hosts, name):
    out = subprocess.run(["ip", "netns", "exec", f"{hosts.run_id}-{name}", "cat",
                          "/sys/class/net/eth0/statistics/tx_bytes"], capture_output=True,
                         text=True, check=True)
    return int(out.stdout)


def parse(side, output):
    """(steps, seconds of training steps, the SDK's bytes per step or None, accuracy)."""
    accuracy = float(re.search(r"final test accuracy ([0-9.]+)", output).group(1))
    if side == "sdk":
        seconds = float(re.search(r"samples in ([0-9.]+) s of training steps", output).group(1))
        m = re.search(r"all-reduce bytes per step (\d+) \(.*, (\d+) steps\)", output)
        return int(m.group(2)), seconds, int(m.group(1)), accuracy
    m = re.search(r"(\d+) steps in ([0-9.]+) s of training steps", output)
    return int(m.group(1)), float(m.group(2)), None, accuracy


def run_job(hosts, args, side, flags, port, workdir):
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="eth0",
               PYTHON_EXEC=sys.executable,
               **hook_env(args.build))
    launcher = os.path.join(args.build, "bin", "dist-launch")
    procs, logs = [], []
    before = [tx_bytes(hosts, name) for name in HOSTS]
    for rank, name in enumerate(HOSTS):
        argv = [launcher, "--nnodes", "2", "--node-rank", str(rank), "--master-addr", HOSTS[0],
                "--master-port", str(port), "--nproc-per-node", "1"]
        if side == "sdk":
            argv += ["--no-python", os.path.join(args.build, "bin", "ddp_train")] + flags
        else:
            argv += [TORCH_WORKER] + flags
        argv += ["--hidden", str(args.hidden)]
        log = os.path.join(workdir, f"{port}-{name}.log")
        logs.append(log)
        procs.append(hosts.start(name, argv, env=env, log=log))
    codes = [p.wait(timeout=JOB_TIMEOUT_S) for p in procs]
    after = [tx_bytes(hosts, name) for name in HOSTS]
    with open(logs[0]) as f:
        output = f.read()
    if codes != [0, 0]:
        with open(logs[1]) as f:
            raise RuntimeError(f"job {side} {flags} failed {codes}:\n{output}\n{f.read()}")
    steps, seconds, sdk_bytes, accuracy = parse(side, output)
    wire = statistics.mean(a - b for a, b in zip(after, before)) / steps
    return {"step_ms": 1000 * seconds / steps, "sdk_bytes": sdk_bytes, "wire_bytes": wire,
            "accuracy": accuracy, "steps": steps}


def table(results, rates, labels):
    lines = []
    for rate in rates:
        lines.append(f"\n{rate} (median of {len(results[(rate, labels[0])])} runs)\n")
        lines.append("| mode | step ms | (min - max) | bytes/step (SDK count) | wire bytes/step "
                     "| wire vs sdk none | test accuracy |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|")
        none = results.get((rate, "sdk none"))
        base = statistics.median(r["wire_bytes"] for r in none) if none else None
        for label in labels:
            runs = results[(rate, label)]
            steps = [r["step_ms"] for r in runs]
            wire = statistics.median(r["wire_bytes"] for r in runs)
            acc = statistics.median(r["accuracy"] for r in runs)
            sdk = runs[0]["sdk_bytes"]
            sdk_text = f"{sdk:,}" if sdk is not None else "-"
            ratio = f"{wire / base:.3f}x" if base else "-"
            lines.append(f"| {label} | {statistics.median(steps):.2f} | ({min(steps):.2f} - "
                         f"{max(steps):.2f}) | {sdk_text} | {wire:,.0f} | {ratio} | {acc:.4f} |")
    return "\n".join(lines)


def report(path):
    """The tables of a JSON-lines file of earlier runs (--out), one per hidden size."""
    by_hidden = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            results, rates, labels = by_hidden.setdefault(r.get("hidden", 128), ({}, [], []))
            results.setdefault((r["rate"], r["mode"]), []).append(r)
            rates += [r["rate"]] if r["rate"] not in rates else []
            labels += [r["mode"]] if r["mode"] not in labels else []
    for hidden, (results, rates, labels) in by_hidden.items():
        print(f"\n## 64-{hidden}-10")
        print(table(results, rates, labels))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rates", default="100mbit,1gbit")
    ap.add_argument("--modes", default="", help="comma-separated labels to run (default: all)")
    ap.add_argument("--hidden", type=int, default=128, help="the MLP's hidden units (both sides)")
    ap.add_argument("--out", help="append every job's result to this JSON-lines file")
    ap.add_argument("--report", metavar="FILE", help="print the table of an --out file; run nothing")
    args = ap.parse_args()
    if args.report:
        report(args.report)
        return 0
    args.build = os.path.abspath(args.build)
    why = missing()
    if why:
        print(f"skipping: {why}", file=sys.stderr)
        return SKIP
    global MODES
    if args.modes:
        wanted = set(args.modes.split(","))
        MODES = [m for m in MODES if m[0] in wanted or m[0] == "sdk none"]
    rates = args.rates.split(",")
    results = {(rate, label): [] for rate in rates for label, _, _ in MODES}
    port = 29500
    with tempfile.TemporaryDirectory(prefix="compression-bench-") as workdir, \
            NamedHosts(NAMED_HOSTS, HOSTS) as hosts:
        for round_index in range(args.runs):
            for rate in rates:
                shape_link(hosts, rate)
                for label, side, flags in MODES:
                    for attempt in range(2):  # one retry: a job that fails twice stops the bench
                        port += 1  # a fresh store port per job: no wait for the last one's sockets
                        try:
                            r = run_job(hosts, args, side, flags, port, workdir)
                            break
                        except RuntimeError as e:
                            if attempt:
                                raise
                            print(f"retrying once: {e}", file=sys.stderr, flush=True)
                    r.update(rate=rate, mode=label, round=round_index, hidden=args.hidden)
                    results[(rate, label)].append(r)
                    print(json.dumps(r), flush=True)
                    if args.out:
                        with open(args.out, "a") as f:
                            f.write(json.dumps(r) + "\n")
    print(table(results, rates, [label for label, _, _ in MODES]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
