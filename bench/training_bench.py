#!/usr/bin/env python3
"""Training throughput of examples/ddp_train with 1 and 2 workers under dist-launch.

    python3 bench/training_bench.py [--build build] [--runs 3]

Samples/s counts only the training steps (forward, backward with DDP's overlapped all-reduce,
optimizer step), not evaluation. Each configuration is the median of --runs runs.
"""
import argparse
import os
import re
import statistics
import subprocess

CONFIGS = [  # (hidden units, global batch): the first is the example's own model, the others are
    (128, 32),  # made compute-bound: the per-step all-reduce is fixed by the parameter count, the
    (2048, 512),  # compute grows with the batch each worker handles
    (4096, 1024),
]


def throughput(build, nproc, hidden, batch, epochs):
    cmd = [os.path.join(build, "bin", "dist-launch"), "--nproc-per-node", str(nproc), "--no-python",
           os.path.join(build, "bin", "ddp_train"), "--hidden", str(hidden), "--global-batch",
           str(batch), "--epochs", str(epochs), "--lr", "0.05"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, OMP_NUM_THREADS="1")).stdout
    return float(re.search(r"throughput (\d+) samples/s", out).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    print("| model (64-H-10) | global batch | 1 worker samples/s | 2 workers samples/s | speed-up |")
    print("|---|---:|---:|---:|---:|")
    for hidden, batch in CONFIGS:
        one = statistics.median(throughput(args.build, 1, hidden, batch, args.epochs)
                                for _ in range(args.runs))
        two = statistics.median(throughput(args.build, 2, hidden, batch, args.epochs)
                                for _ in range(args.runs))
        print(f"| H = {hidden} | {batch} | {one:,.0f} | {two:,.0f} | {two / one:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
