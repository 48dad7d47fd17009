"""An unmodified torch DDP job (gloo) for the hang and straggler tests and bench/hang_bench.py:
a small model trained for --steps steps, each with --work seconds of "forward" work, a loss
all_reduce after each optimizer step. On the first attempt, --fault-rank injects --fault at
--fault-step:

  sleep      time.sleep() forever                       (GIL released)
  gil        a C call that deadlocks holding the GIL (a mutex locked twice, ctypes.PyDLL)
  spin       a pure-Python busy loop
  sigstop    SIGSTOP to itself (the kernel holds it)
  io         a read of a FIFO nobody writes (blocked file I/O)
  skip       skips the loss all_reduce once (the others wait in it, it waits in the next
             backward's)
  slow       --slow-factor times the work of every step (a straggler, not a hang)

With --start-after PATH, rank --fault-rank waits for PATH to exist before it joins the process
group (its peers wait for it in init_process_group meanwhile).

Each fault's line is marked "# FAULT: <name>" so that a test can find its line number.
Prints "rank R steps N hook H seconds T" at the end (H: the steps the agent's hook counted, or
"off"; T: the training loop's time).
"""
import argparse
import ctypes
import os
import signal
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def stall_sleep():
    time.sleep(3600)  # FAULT: sleep


def stall_gil():
    libc = ctypes.PyDLL(None)  # PyDLL: its calls keep the GIL
    mutex = ctypes.create_string_buffer(64)  # a default pthread mutex (all zeros), unlocked
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)  # FAULT: gil


def stall_spin():
    x = 0
    while True:  # FAULT: spin
        x += 1


def stall_sigstop():
    os.kill(os.getpid(), signal.SIGSTOP)  # FAULT: sigstop


def stall_io():
    path = os.path.join(tempfile.mkdtemp(prefix="hang-io-"), "fifo")
    os.mkfifo(path)
    with open(path) as f:  # FAULT: io
        f.read()


STALLS = {"sleep": stall_sleep, "gil": stall_gil, "spin": stall_spin, "sigstop": stall_sigstop,
          "io": stall_io}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--work", type=float, default=0.02)
    p.add_argument("--fault", default="none")
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-step", type=int, default=10)
    p.add_argument("--slow-factor", type=float, default=1.3)
    p.add_argument("--explicit-step", action="store_true",
                   help="also call dist_launch.progress.step() twice a step")
    p.add_argument("--busy", action="store_true",
                   help="a step's own work computes (--work s of CPU time) instead of sleeping")
    p.add_argument("--seconds", type=float, default=0,
                   help="train this long instead of --steps")
    p.add_argument("--start-after", help="rank --fault-rank joins once this file exists")
    args = p.parse_args()

    if args.start_after and int(os.environ["RANK"]) == args.fault_rank:
        while not os.path.exists(args.start_after):
            time.sleep(0.01)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    faulty = first_attempt and rank == args.fault_rank
    progress = None
    if args.explicit_step:
        from dist_launch import progress
    metrics = dist.new_group()  # the loss all_reduce's own group: a skip deadlocks, never mismatches
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(32, 32))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(16, 32)
    work = args.work * (args.slow_factor if faulty and args.fault == "slow" else 1)
    print(f"rank {rank} training", flush=True)
    start = time.monotonic()
    step = 0
    stop = False  # --seconds: rank 0's clock decides, every rank stops after the same step
    while not stop if args.seconds else step < args.steps:
        step += 1
        if faulty and step == args.fault_step and args.fault in STALLS:
            print(f"rank {rank} step {step}: {args.fault}", flush=True)
            STALLS[args.fault]()
        if args.busy:  # the step's own work: CPU time, however long the CPU takes to give it
            until = time.thread_time() + work
            while time.thread_time() < until:
                pass
        else:
            time.sleep(work)  # the step's own work
        loss = model(data).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if progress:
            progress.step()
            progress.step()
        if faulty and step == args.fault_step and args.fault == "skip":
            print(f"rank {rank} step {step}: skip", flush=True)
            continue  # FAULT: skip
        time_up = rank == 0 and args.seconds and time.monotonic() - start >= args.seconds
        message = torch.stack([loss.detach(), torch.tensor(1.0 if time_up else 0.0)])
        dist.all_reduce(message, group=metrics)
        stop = bool(message[1] > 0)
    hook = sys.modules.get("_dist_launch_progress")
    counted = hook._words[3] if hook is not None and hook._words is not None else "off"
    elapsed = time.monotonic() - start
    print(f"rank {rank} steps {step} hook {counted} seconds {elapsed:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
