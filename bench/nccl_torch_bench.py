#!/usr/bin/env python3
"""torch's ProcessGroupNCCL measured as nccl-bench measures the SDK's group (see nccl_bench.cc).

    python3 bench/nccl_torch_bench.py [--sizes 8,1024,...] [--min-seconds 2] [--rounds 7] [--op sum]

World size 1 on cuda:0. One operation: dist.all_reduce(t) then torch.cuda.synchronize(), the
synchronous all-reduce a training script sees. For each size: --rounds rounds, each 3 warm-ups and
enough operations to fill its share of --min-seconds (at least 5); time = the median round's mean
per operation. Prints the columns `bytes` and `torch us`.
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist

DEFAULT_SIZES = "8,1024,65536,1048576,16777216,67108864"


def seconds_per_op(op, min_seconds):
    for _ in range(3):
        op()
    start = time.perf_counter()
    op()
    probe = time.perf_counter() - start
    iterations = max(5, min(1000000, int(min_seconds / probe)))
    start = time.perf_counter()
    for _ in range(iterations):
        op()
    return (time.perf_counter() - start) / iterations


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="message sizes in bytes")
    parser.add_argument("--min-seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--op", choices=["sum", "avg"], default="sum",
                        help="sum: nothing to do at one rank; avg: NCCL's kernel over every byte")
    args = parser.parse_args()
    reduce_op = dist.ReduceOp.AVG if args.op == "avg" else dist.ReduceOp.SUM

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                            device_id=device)
    print(f"# nccl_torch_bench: torch {torch.__version__}, NCCL "
          f"{'.'.join(map(str, torch.cuda.nccl.version()))}, 1 rank, device 0 "
          f"({torch.cuda.get_device_name(0)}), float32 {args.op} in place, synchronous; median of "
          f"{args.rounds} rounds")
    print(f"{'bytes':>12} {'torch us':>12}")
    for size in (int(s) for s in args.sizes.split(",")):
        data = torch.zeros(max(1, size // 4), dtype=torch.float32, device=device)

        def all_reduce():
            dist.all_reduce(data, op=reduce_op)
            torch.cuda.synchronize()

        times = [seconds_per_op(all_reduce, args.min_seconds / args.rounds)
                 for _ in range(args.rounds)]
        print(f"{data.numel() * 4:>12} {statistics.median(times) * 1e6:>12.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
