"""A torch DDP job (gloo) whose rank 0 stops for its user, for tests/torch/debugger_test.py: it
trains --steps steps, then rank 0 stops per --stop while the other ranks wait in a barrier, then it
trains 5 steps more and prints "rank R done x=X weight=W".

  breakpoint       rank 0 calls breakpoint() (pdb, reading the workers' stdin)
  dist-breakpoint  every rank calls torch.distributed.breakpoint() (torch 2.2 and later): rank 0
                   stops in pdb, the others wait in its barrier
  input            rank 0 reads x with input("x? ")

x is 41 unless the user changes it (in pdb: `x = 7`; at the prompt: a number).
"""
import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--stop", choices=["breakpoint", "dist-breakpoint", "input"], required=True)
    p.add_argument("--steps", type=int, default=20)
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def train(steps):
        for _ in range(steps):
            optimizer.zero_grad()
            model(torch.ones(4, 8) * (rank + 1)).sum().backward()
            optimizer.step()

    train(a.steps)
    x = 41
    if a.stop == "dist-breakpoint":
        dist.breakpoint()
    elif rank == 0 and a.stop == "breakpoint":
        breakpoint()
    elif rank == 0:
        x = int(input("x? "))
    dist.barrier()
    train(5)
    print(f"rank {rank} done x={x} weight={model.module.weight.sum().item():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
