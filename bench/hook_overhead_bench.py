#!/usr/bin/env python3
"""What a compression hook itself costs a step, apart from the wire: one process (gloo, a world
of 1, so the all-reduce moves nothing), a DDP model of one bucket, its backward pass timed with
torch's fp16 hook, with dist_launch.compression's (`dist:SPEC`), and with none, interleaved:

    python3 bench/hook_overhead_bench.py [--hooks none,fp16,dist:fp16] [--rounds 5]
        [--steps 200] [--features 600]

The model is one Linear(F, F - 100) layer (F = 600: 300,500 parameters, the convergence bench's
larger bucket). Each round runs every hook for --steps backward passes after 20 unmeasured ones;
the table gives the median over rounds of each hook's mean backward time and that minus the
no-hook time (what the hook adds). DIST_LAUNCH_COMPRESSION_LIB picks the library under test.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))


def backward_ms(model, x, steps):
    for _ in range(20):
        model(x).pow(2).mean().backward()
    begin = time.perf_counter()
    for _ in range(steps):
        model(x).pow(2).mean().backward()
    return (time.perf_counter() - begin) / steps * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hooks", default="none,fp16,dist:fp16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--features", type=int, default=600)
    args = ap.parse_args()
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dist_launch import compression

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        hooks = args.hooks.split(",")
        models = {}
        for name in hooks:
            torch.manual_seed(0)
            model = DDP(torch.nn.Linear(args.features, args.features - 100))
            if name == "fp16":
                model.register_comm_hook(None, default_hooks.fp16_compress_hook)
            elif name.startswith("dist:"):
                model.register_comm_hook(*compression.hook(name[len("dist:"):]))
            models[name] = model
        x = torch.randn(32, args.features)
        times = {name: [] for name in hooks}
        for _ in range(args.rounds):
            for name in hooks:
                times[name].append(backward_ms(models[name], x, args.steps))
        dist.destroy_process_group()
    base = statistics.median(times["none"]) if "none" in times else None
    print(f"| hook | backward ms (median of {args.rounds}) | added by the hook, ms |")
    print("|---|---:|---:|")
    for name in hooks:
        ms = statistics.median(times[name])
        added = f"{ms - base:.3f}" if base is not None else "-"
        print(f"| {name} | {ms:.3f} | {added} |")


if __name__ == "__main__":
    main()
