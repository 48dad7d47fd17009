"""An ordinary PyTorch DDP training script, as bench/ttfs_bench.py and tests/warm restart it: gloo,
an MLP on synthetic data (each step's batch a function of the step and the rank, so a resumed run
recomputes exactly what it lost), rank 0 saving a checkpoint (model and optimizer, torch.save to a
temporary file, then renamed) every --checkpoint-every steps, every rank resuming from it at start.
No import of dist-launch's: it runs as well under torchrun.

With --snapshots it also keeps dist_launch.snapshot snapshots at those steps (every rank its own)
and resumes from the newest one before looking at the disk. With --in-place it recovers in place
instead (dist_launch.elastic, for `dist-launch --restart-policy in-place`): the same model, batches
and steps, its state committed after every step, no checkpoint (--checkpoint-in-place: the
checkpoints too, for a restart of the whole group); the same final weights.

Each rank prints "rank R step N done at T" (T: time.time()) as each step completes, its pid at
start, and at the end the SHA-256 of its final weights (torchrun does not prefix the lines).

    dist-launch --nproc-per-node 2 --max-restarts 1 bench/ttfs_train.py --checkpoint-dir DIR
"""
import argparse
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def say(line):
    """One line in one write: ranks that share a pipe (torchrun's workers) do not mix theirs."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def build(hidden):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 1))


def checkpoint_path(directory):
    return os.path.join(directory, "checkpoint.pt")


def resume(args, model, optimizer):
    """The step to start after: from a snapshot (--snapshots), else the checkpoint, else 0."""
    if args.snapshots:
        from dist_launch import snapshot
        restored = snapshot.load(mmap=args.snapshots_mmap)
        if restored is not None:
            step, state = restored
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])  # may keep the mapped tensors
            return step, "mapped snapshot" if args.snapshots_mmap else "snapshot"
    path = checkpoint_path(args.checkpoint_dir)
    if os.path.exists(path):
        state = torch.load(path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        return state["step"], "checkpoint"
    return 0, "scratch"


def save(args, step, model, optimizer, rank):
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    if args.snapshots:
        from dist_launch import snapshot
        snapshot.save(step, state)
    if rank == 0:
        path = checkpoint_path(args.checkpoint_dir)
        torch.save(dict(state, step=step), path + ".tmp")
        os.replace(path + ".tmp", path)
    dist.barrier()  # no rank runs ahead of a checkpoint that is not written yet


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--checkpoint-dir", required=True)
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--step-seconds", type=float, default=0.0,
                    help="sleep this long in each step (a step's time on a real model)")
    ap.add_argument("--snapshots", action="store_true")
    ap.add_argument("--snapshots-mmap", action="store_true",
                    help="with --snapshots: load them mapped (snapshot.load(mmap=True))")
    ap.add_argument("--in-place", action="store_true",
                    help="recover in place through dist_launch.elastic (no checkpoint)")
    ap.add_argument("--checkpoint-in-place", action="store_true",
                    help="with --in-place: checkpoint too, and start from the checkpoint (for "
                         "what restarts the whole group: a lost node of a static job)")
    args = ap.parse_args()
    if args.in_place:
        return train_in_place(args)

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    say(f"rank {rank} pid {os.getpid()} attempt {attempt}")
    module = build(args.hidden)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
    start, source = resume(args, module, optimizer)
    model = DDP(module)
    say(f"rank {rank} attempt {attempt} resumes after step {start} from {source}")
    for step in range(start + 1, args.steps + 1):
        train_step(args, model, optimizer, step, rank)
        if step % args.checkpoint_every == 0:
            save(args, step, module, optimizer, rank)
    say_final(module, rank)
    dist.destroy_process_group()
    return 0


def train_step(args, model, optimizer, step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(args.batch, 64, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    loss = ((model(x) - y) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if args.step_seconds:
        time.sleep(args.step_seconds)
    say(f"rank {rank} step {step} done at {time.time():.6f}")


def say_final(module, rank):
    flat = torch.cat([p.detach().flatten() for p in module.parameters()])
    say(f"rank {rank} final weights sha256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}")


def train_in_place(args):
    """The same training, recovered in place: a survivor keeps its process, a replacement takes
    the lowest survivor's state (model, momentum, step) and the interrupted step is redone."""
    from dist_launch import elastic
    elastic.init_process_group("gloo")
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    say(f"rank {dist.get_rank()} pid {os.getpid()} attempt {attempt} "
        f"generation {os.environ.get('DIST_LAUNCH_GENERATION', '0')}")
    module = build(args.hidden)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
    start = resume(args, module, optimizer)[0] if args.checkpoint_in_place else 0
    state = elastic.TorchState(model=module, optimizer=optimizer, step=start)

    @elastic.run
    def train(state):
        model = DDP(state.model)  # built for this entry's group
        while state.step < args.steps:
            train_step(args, model, state.optimizer, state.step + 1, dist.get_rank())
            state.step += 1
            state.commit()
            if args.checkpoint_in_place and state.step % args.checkpoint_every == 0:
                save(args, state.step, state.model, state.optimizer, dist.get_rank())

    train(state)
    say_final(module, dist.get_rank())
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
