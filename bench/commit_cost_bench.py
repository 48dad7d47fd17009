#!/usr/bin/env python3
"""What `dist_launch.elastic.TorchState.commit()` costs a training step, beside what it used to.

    python3 bench/commit_cost_bench.py [--runs 7] [--repeats 50] [--hidden 256,1280,4096]

A model of bench/ttfs_train.py's shape (Linear(64, H), ReLU, Linear(H, H), ReLU, Linear(H, 1)),
one training step (batch 32), then each way of committing its state timed `--repeats` times, the
ways interleaved (step, A, B, A, B, ...) so that a machine loaded by others weighs on each alike;
the table gives the medians over `--runs` runs of each run's median. One thread (torchrun's and
dist-launch's default OMP_NUM_THREADS=1 for several workers).

    clone+deepcopy   what commit() did before (6c4746d): the model's state dict cloned, the
                     optimizer's deep-copied, at every commit
    commit()         TorchState.commit() now: into the last commit's tensors, in place
    step             one forward, backward and optimizer step, for scale
"""
import argparse
import copy
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import torch  # noqa: E402

from dist_launch import elastic  # noqa: E402


def build(hidden, optimizer_name):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, 1))
    if optimizer_name == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
    return model, optimizer


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--hidden", default="256,1280,4096")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {args.runs} runs of {args.repeats} interleaved repeats")
    print("| model (hidden, optimizer) | state MB | step ms | clone+deepcopy ms | commit() ms "
          "| commit / before | commit / step |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for hidden in (int(h) for h in args.hidden.split(",")):
        for optimizer_name in ("sgd", "adam"):
            model, optimizer = build(hidden, optimizer_name)
            x, y = torch.randn(32, 64), torch.randn(32, 1)

            def step():
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()

            step()
            state = elastic.TorchState(model=model, optimizer=optimizer, step=0)
            kept = {}

            def before():
                kept["model"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
                kept["optimizer"] = copy.deepcopy(optimizer.state_dict())

            ways = {"step": step, "before": before, "commit": state.commit}
            medians = {name: [] for name in ways}
            for _ in range(args.runs):
                times = {name: [] for name in ways}
                for _ in range(args.repeats):
                    for name, f in ways.items():
                        began = time.perf_counter()
                        f()
                        times[name].append(time.perf_counter() - began)
                for name in ways:
                    medians[name].append(statistics.median(times[name]))
            ms = {name: statistics.median(v) * 1e3 for name, v in medians.items()}
            tensors = list(model.state_dict().values()) + [
                v for s in optimizer.state_dict()["state"].values() for v in s.values()
                if torch.is_tensor(v)]
            mb = sum(t.numel() * t.element_size() for t in tensors) / 1e6
            print(f"| {hidden}, {optimizer_name} | {mb:.1f} | {ms['step']:.2f} | "
                  f"{ms['before']:.2f} | {ms['commit']:.2f} | {ms['commit'] / ms['before']:.2f} | "
                  f"{ms['commit'] / ms['step']:.2f} |")


if __name__ == "__main__":
    main()
