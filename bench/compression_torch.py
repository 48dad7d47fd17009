"""The torch 2.x twin of examples/ddp_train, for bench/compression_bench.py: the same digits split
(torch.randperm seeded 20261122, the last 360 rows for test), the same model (64-128-10, ReLU,
PyTorch's default Linear init), the same DistributedSampler (seed 0), global batch 32, SGD with
lr 0.1 and momentum 0.9, 30 epochs; DDP over gloo with one of torch's communication hooks.

    dist-launch --nproc-per-node 2 bench/compression_torch.py --hook fp16|powersgd:2|none
        [--nan-at-step STEP]

Rank 0 prints the lines compression_bench.py reads: the training steps' time (forward, backward
with DDP's all-reduce, optimizer step) and the final test accuracy.
"""
import argparse
import gzip
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "examples", "data", "digits.csv.gz")
TEST_ROWS = 360
SPLIT_SEED = 20261122


def load_digits(path):
    rows, labels = [], []
    with gzip.open(path, "rt") as f:
        for line in f:
            fields = line.strip().split(",")
            if len(fields) != 65:
                continue
            rows.append([float(v) / 16.0 for v in fields[:64]])
            labels.append(int(float(fields[64])))
    x, y = torch.tensor(rows), torch.tensor(labels)
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(SPLIT_SEED))
    train, test = order[: len(rows) - TEST_ROWS], order[len(rows) - TEST_ROWS:]
    return (x[train], y[train]), (x[test], y[test])


def register(model, hook):
    if hook.startswith("dist:"):  # the SDK's compressors as a hook (dist_launch.compression)
        import dist_launch.compression
        state, compression_hook = dist_launch.compression.hook(hook[len("dist:"):])
        model.register_comm_hook(state, compression_hook)
        return state
    if hook == "none":
        return None
    if hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return None
    if hook.startswith("powersgd:"):
        # Error feedback and warm start, as the SDK; PowerSGD from the earliest step torch allows.
        state = powersgd.PowerSGDState(process_group=None,
                                       matrix_approximation_rank=int(hook.split(":")[1]),
                                       start_powerSGD_iter=2, use_error_feedback=True,
                                       warm_start=True)
        model.register_comm_hook(state, powersgd.powerSGD_hook)
        return None
    raise SystemExit(f"compression_torch.py: unknown --hook {hook!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hook", default="none")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--nan-at-step", type=int, default=-1,
                    help="the last rank's batch holds a NaN at this step (bench/nonfinite_bench.py)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    (train_x, train_y), (test_x, test_y) = load_digits(DATA)

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.ReLU(),
                                    torch.nn.Linear(args.hidden, 10)))
    hook_state = register(model, args.hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    local_batch = args.global_batch // world
    sampler = DistributedSampler(range(len(train_x)), num_replicas=world, rank=rank, shuffle=True,
                                 seed=0, drop_last=False)
    seconds, steps = 0.0, 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        indices = torch.tensor(list(sampler))
        for begin in range(0, len(indices), local_batch):
            batch = indices[begin:begin + local_batch]
            x = train_x[batch]
            if steps == args.nan_at_step and rank == world - 1:
                x = x.clone()
                x[0, 0] = float("nan")  # a bad batch: every gradient of this rank is NaN
            start = time.perf_counter()
            loss = loss_fn(model(x), train_y[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
            seconds += time.perf_counter() - start
            steps += 1
    with torch.no_grad():
        accuracy = (model(test_x).argmax(dim=1) == test_y).float().mean().item()
    if rank == 0:
        print(f"torch {torch.__version__} hook {args.hook}: {steps} steps in {seconds:.3f} s of "
              f"training steps", flush=True)
        print(f"final test accuracy {accuracy:.4f}", flush=True)
        if hook_state is not None:
            print(f"compression stats {hook_state.stats()}", flush=True)
    # Both ranks leave together: gloo's threads can abort a rank whose peer tore down first.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
