#!/usr/bin/env python3
"""What a compression hook itself costs a step, apart from the wire: one process (gloo, a world
of 1, so the all-reduce moves nothing), a DDP model of one bucket, its backward pass timed with
torch's fp16 hook, with dist_launch.compression's (`dist:SPEC`), and with none, interleaved:

    python3 bench/hook_overhead_bench.py [--hooks none,fp16,dist:fp16] [--rounds 5]
        [--steps 200] [--features 600] [--model linear|transformer] [--against CHECKOUT]

The model is one Linear(F, F - 100) layer (F = 600: 300,500 parameters, the convergence bench's
larger bucket), or with --model transformer the convergence bench's own (bench/convergence_torch.py:
two buckets, both staged, as DDP rebuilds them in another order than the compressor keeps). Each
round runs every hook for --steps backward passes after 20 unmeasured ones; the table gives the
median over rounds of each hook's mean backward time and that minus the no-hook time (what the
hook adds). DIST_LAUNCH_COMPRESSION_LIB picks the library under test. With --against, the hooks
`against:SPEC` are CHECKOUT's dist_launch.compression (its python/ package, over the same library),
interleaved with the others: a change to the hook measured against what it replaces.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))


def backward_ms(model, loss_of, steps):
    """The mean time of a backward pass (its forward pass not counted)."""
    for _ in range(20):
        loss_of(model).backward()
    total = 0.0
    for _ in range(steps):
        loss = loss_of(model)
        begin = time.perf_counter()
        loss.backward()
        total += time.perf_counter() - begin
    return total / steps * 1e3


def other_compression(checkout):
    """CHECKOUT's dist_launch.compression, as a module of its own."""
    import importlib.util

    path = os.path.join(checkout, "python", "dist_launch", "compression.py")
    spec = importlib.util.spec_from_file_location("against_compression", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hooks", default="none,fp16,dist:fp16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--features", type=int, default=600)
    ap.add_argument("--model", choices=["linear", "transformer"], default="linear")
    ap.add_argument("--against", help="a checkout whose dist_launch.compression the against: "
                                      "hooks are")
    args = ap.parse_args()
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dist_launch import compression

    against = other_compression(args.against) if args.against else None
    torch.set_num_threads(1)
    if args.model == "transformer":
        sys.path.insert(0, HERE)
        import convergence_torch

        context = convergence_torch.CONTEXT
        tokens = torch.randint(0, 256, (16, context), generator=torch.Generator().manual_seed(0))
        targets = torch.randint(0, 256, (16, context), generator=torch.Generator().manual_seed(1))

        def make():
            return convergence_torch.Model()

        def loss_of(model):
            logits = model(tokens).reshape(-1, 256)
            return torch.nn.functional.cross_entropy(logits, targets.reshape(-1))
    else:
        x = torch.randn(32, args.features)

        def make():
            return torch.nn.Linear(args.features, args.features - 100)

        def loss_of(model):
            return model(x).pow(2).mean()

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        hooks = args.hooks.split(",")
        models = {}
        for name in hooks:
            torch.manual_seed(0)
            model = DDP(make())
            if name == "fp16":
                model.register_comm_hook(None, default_hooks.fp16_compress_hook)
            elif name.startswith("dist:"):
                model.register_comm_hook(*compression.hook(name[len("dist:"):]))
            elif name.startswith("against:") and against is not None:
                model.register_comm_hook(*against.hook(name[len("against:"):]))
            elif name != "none":
                raise SystemExit(f"unknown hook {name!r} (none, fp16, dist:SPEC, against:SPEC "
                                 f"with --against)")
            models[name] = model
        times = {name: [] for name in hooks}
        for _ in range(args.rounds):
            for name in hooks:
                times[name].append(backward_ms(models[name], loss_of, args.steps))
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
