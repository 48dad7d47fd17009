#!/usr/bin/env python3
"""The SDK's NCCL group beside torch's ProcessGroupNCCL on one GPU: runs nccl-bench and
nccl_torch_bench.py alternately (A B A B ...), --runs times each, and prints per size the median
over runs of each program's own median (sdk, raw NCCL, torch), sdk minus torch, and GB/s. Each
program's NCCL version comes first: they may load different builds.

    python3 bench/nccl_compare.py [--bench build/bin/nccl-bench] [--python python3] [--runs 3]
                                  [--sizes 8,67108864] [--op sum|avg]

At one rank an in-place sum moves nothing (the time is the API's and the synchronization's); avg
runs NCCL's kernel over every byte, so its GB/s is the GPU's memory bandwidth (bytes / time, each
byte read and written once), not a network's bus bandwidth, which is zero at one rank.
"""
import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def table(output):
    """{bytes: [columns...]} from a benchmark's table (lines that start with a number)."""
    rows = {}
    for line in output.splitlines():
        fields = line.split()
        if fields and fields[0].isdigit():
            rows[int(fields[0])] = [float(f) for f in fields[1:]]
    return rows


def comments(output):
    return [line for line in output.splitlines() if line.startswith("#")]


def run(command):
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bench", default="build/bin/nccl-bench")
    parser.add_argument("--python", default="python3", help="interpreter with torch 2.x")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="8,1024,65536,1048576,16777216,67108864")
    parser.add_argument("--min-seconds", default="2")
    parser.add_argument("--op", choices=["sum", "avg"], default="sum")
    args = parser.parse_args()

    common = ["--sizes", args.sizes, "--min-seconds", args.min_seconds, "--op", args.op]
    sdk_runs, torch_runs, headers = [], [], {}
    for i in range(args.runs):
        order = ["sdk", "torch"] if i % 2 == 0 else ["torch", "sdk"]
        for side in order:
            if side == "sdk":
                out = run([args.bench] + common)
                sdk_runs.append(table(out))
            else:
                out = run([args.python, os.path.join(HERE, "nccl_torch_bench.py")] + common)
                torch_runs.append(table(out))
            headers.setdefault(side, comments(out))
    for side in ("sdk", "torch"):
        for line in headers.get(side, []):
            print(line)
    print(f"# medians over {args.runs} interleaved runs of each program; microseconds per "
          f"synchronous all-reduce ({args.op}); GB/s = bytes / time")
    print(f"{'bytes':>12} {'sdk us':>10} {'raw us':>10} {'torch us':>10} {'sdk-torch':>10} "
          f"{'sdk GB/s':>10} {'torch GB/s':>10}")
    for size in sorted(sdk_runs[0]):
        sdk = statistics.median(r[size][0] for r in sdk_runs)
        raw = statistics.median(r[size][1] for r in sdk_runs)
        torch_us = statistics.median(r[size][0] for r in torch_runs)
        print(f"{size:>12} {sdk:>10.2f} {raw:>10.2f} {torch_us:>10.2f} {sdk - torch_us:>10.2f} "
              f"{size / sdk / 1e3:>10.2f} {size / torch_us / 1e3:>10.2f}")


if __name__ == "__main__":
    main()
