"""A small PyTorch DDP job for dist-launch's tests: gloo process group, all_reduce checks, a tiny
model trained a few steps with DistributedDataParallel, weights compared across ranks.

    dist-launch --nproc-per-node 2 examples/torch/ddp_train.py [--crash-on-attempt 0] [--out DIR]

--crash-on-attempt N makes rank 1 raise on restart attempt N (torch's @record writes the error file).
--wait-for-world N keeps a smaller world waiting after its first all-reduce (an elastic job's round
before it scales up to N workers: the agent stops these workers then).
Each rank prints the SHA-256 of its final weights, so runs can be compared exactly.
"""
import argparse
import gc
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP


def tensor_bytes(tensor):
    """A tensor's bytes, as numpy's tobytes() gives them, without numpy: torch's wheels do not
    depend on it, so a venv with only torch has none (torch 1.13 and 2.x alike)."""
    return bytes(tensor.detach().flatten().contiguous().view(torch.uint8).tolist())


@record
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--crash-on-attempt", type=int, default=-1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default=None)
    ap.add_argument("--wait-for-world", type=int, default=0)
    args = ap.parse_args()

    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == int(os.environ["WORLD_SIZE"]) and rank == int(os.environ["RANK"])
    if rank == 1 and attempt == args.crash_on_attempt:
        # Before any collective: a torch 2.x process that exits just after one may abort
        # (SIGABRT, "terminate called without an active exception") instead of exiting 1, when
        # gloo's worker thread drops the finished work's tensors while the interpreter finalizes.
        raise RuntimeError(f"injected failure on attempt {attempt}")

    for op, expected in ((dist.ReduceOp.SUM, world * (world + 1) / 2), (dist.ReduceOp.MAX, world)):
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t, op=op)
        assert t.item() == expected, (op, t.item(), expected)

    print(f"rank {rank}/{world} attempt {attempt}: process group up", flush=True)
    while world < args.wait_for_world:
        time.sleep(0.1)

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(args.steps):
        x = torch.randn(32, 8, generator=g)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    # DDP keeps replicas identical: every rank's weights equal rank 0's.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    assert torch.equal(flat, reference), "replicas diverged"
    digest = hashlib.sha256(tensor_bytes(flat)).hexdigest()
    print(f"rank {rank}/{world} attempt {attempt}: loss={loss.item():.4f} weights in sync "
          f"sha256 {digest}", flush=True)
    if args.out:
        with open(os.path.join(args.out, f"done_{rank}"), "w") as f:
            f.write(f"{attempt}\n")
    # The model first (DDP holds the process group), so that destroying the group ends its gloo
    # threads now, while every tensor they were given is still held here. A gloo thread that drops
    # a collective's last tensor as the interpreter finalizes aborts a torch 2.x process that
    # succeeded ("terminate called without an active exception", exit 134: seen once in CI as
    # this script exited; pytorch/pytorch#179291 describes it).
    del model, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
