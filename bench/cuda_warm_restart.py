"""A worker for the GPU check's warm-restart step (scripts/gpu-check.sh): one rank per visible GPU,
torch.distributed over NCCL, a 4 MiB all-reduce per step on the GPU. Attempt 0 exits (code 1) at
--crash-at-step; the next attempt runs every step. Each step prints

    attempt A rank R step N done at T        (T: time.time(), after torch.cuda.synchronize())

and the crash "attempt 0 rank R crashes at T", so the check can measure, from the crash to the first
step of attempt 1, what a user waits for: python, import torch, CUDA context, NCCL communicator.
Under dist-launch --warm-restart, attempt 1 is forked from a zygote that imported torch without
touching CUDA; this proves that a forked worker can still create its CUDA context and NCCL
communicator, and says how long the restart took.

    dist-launch --nproc-per-node 1 --max-restarts 1 [--warm-restart] bench/cuda_warm_restart.py
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--crash-at-step", type=int, default=5)
    args = ap.parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    x = torch.ones(1 << 20, device="cuda")
    for step in range(1, args.steps + 1):
        dist.all_reduce(x)
        torch.cuda.synchronize()
        print(f"attempt {attempt} rank {rank} step {step} done at {time.time():.6f}", flush=True)
        if attempt == 0 and step == args.crash_at_step:
            print(f"attempt 0 rank {rank} crashes at {time.time():.6f}", flush=True)
            sys.stdout.flush()
            os._exit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
