"""A torch DDP job that survives a worker's failure in place (dist_launch.elastic):

    dist-launch --nproc-per-node 2 --restart-policy in-place --max-restarts 3 \\
        examples/torch/elastic_train.py --steps 60 --crash-at-step 25

Rank --crash-rank kills itself (SIGKILL, or --crash-how exit: an exception) at the start of step
--crash-at-step of the job's first attempt. Its peers keep their processes: their collective
fails, they wait for the agent's next generation, rebuild the group with the replacement, give it
their state (model, SGD momentum, the step counter) and redo the step. Each step's batch follows
from the step counter, so the job ends with the weights of a run that never failed: every rank
prints "rank R pid P generation G steps S digest D world W" at the end, and "rank R pid P started"
at its start. --timestamps: each step's completion and the crash, with the wall clock, for
bench/torch_recovery_bench.py. --crash-every K: the crash rank (each replacement too) crashes
every K steps, many recoveries in one job; --store-keys: rank 0 prints the workers' store's key
count after each. --hold-at-step S --hold-until-world N: the workers wait at step S
until a joining node has grown the world to N (a test's newcomer then always trains). Under
`--restart-policy group` (or torchrun) the same script restarts from step 0.
"""
import argparse
import hashlib
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from dist_launch import elastic


def tensor_bytes(tensor):
    """A tensor's bytes, as numpy's tobytes() gives them, without numpy: torch's wheels do not
    depend on it, so a venv with only torch has none (torch 1.13 and 2.x alike)."""
    return bytes(tensor.detach().flatten().contiguous().view(torch.uint8).tolist())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--crash-rank", type=int, default=1)
    ap.add_argument("--crash-at-step", type=int, default=-1)
    ap.add_argument("--crash-how", choices=("kill", "exit"), default="kill")
    ap.add_argument("--crash-every", type=int, default=0,
                    help="--crash-rank (each replacement too) crashes every this many steps: "
                         "many recoveries in one job")
    ap.add_argument("--store-keys", action="store_true",
                    help="rank 0 prints the workers' store's key count after each recovery")
    ap.add_argument("--crash-at-exit", action="store_true",
                    help="--crash-rank is SIGKILLed in its teardown instead, once every other "
                         "rank's process has exited (a crash at exit: the commonest)")
    ap.add_argument("--fail-before-returning", action="store_true",
                    help="--crash-rank raises instead, inside its training function after the "
                         "last step, once every other rank's process has exited (its part of the "
                         "result lost: a final checkpoint it could not write)")
    ap.add_argument("--commit-every", type=int, default=1)
    ap.add_argument("--pause-ms", type=float, default=0,
                    help="sleep this long after each step (a longer step, for tests)")
    ap.add_argument("--hold-at-step", type=int, default=-1,
                    help="at this step, wait (in barriers) until the world holds "
                         "--hold-until-world workers: a joining node's tests end with it in")
    ap.add_argument("--hold-until-world", type=int, default=0)
    ap.add_argument("--timestamps", action="store_true",
                    help="print each step's completion and the crash with the wall clock")
    args = ap.parse_args()

    rank = int(os.environ["RANK"])
    generation = int(os.environ.get("DIST_LAUNCH_GENERATION", "0"))
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    print(f"rank {rank} pid {os.getpid()} started (generation {generation})", flush=True)

    elastic.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = elastic.TorchState(model=model, optimizer=optimizer, step=0)

    joined_at = None  # the step this process first trained at (a replacement's: the survivors')
    seen_generation = generation

    def publish_pids():
        """Every rank's pid, through the group's store, not a collective: gloo's worker thread
        drops the last reference to a collective's tensors after the caller has gone on, and one
        dropped once the interpreter is finalizing aborts the process ("terminate called without
        an active exception": 2 of 14 runs of the crash-at-exit test, a healthy rank 0 at its
        exit)."""
        store = dist.distributed_c10d._get_default_store()
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store.set(f"elastic_train/pid/{attempt}/{dist.get_rank()}", str(os.getpid()))
        return [int(store.get(f"elastic_train/pid/{attempt}/{r}"))
                for r in range(dist.get_world_size())]

    def wait_gone(peers):
        for _ in range(6000):  # at most 60 s: until the launcher has reaped every other rank
            alive = False
            for pid in peers:
                try:
                    alive = alive or (pid != os.getpid() and os.kill(pid, 0) is None)
                except ProcessLookupError:
                    pass
            if not alive:
                return
            time.sleep(0.01)

    @elastic.run
    def train(state):
        nonlocal rank, joined_at, seen_generation
        if joined_at is None:
            joined_at = state.step
        ddp = DDP(state.model)  # built for the group of this entry
        while state.step < args.steps:
            rank = dist.get_rank()  # a lost node's survivors are renumbered
            holding = state.step == args.hold_at_step
            while holding and dist.get_world_size() < args.hold_until_world:
                dist.barrier()  # the regroup's generation aborts it; the next entry is grown
                time.sleep(0.05)
            crash = (first_attempt and generation == 0 and rank == args.crash_rank
                     and state.step == args.crash_at_step)
            if args.crash_every and rank == args.crash_rank and state.step > joined_at:
                crash = crash or state.step % args.crash_every == 0
            now = elastic._this_group().generation if elastic.in_place() else 0
            if args.store_keys and rank == 0 and now != seen_generation:
                seen_generation = now
                print(f"rank 0 generation {now} store keys "
                      f"{elastic._this_group().store.num_keys()}", flush=True)
            if crash and args.timestamps:
                print(f"rank {rank} crash at step {state.step} wall_ns {time.time_ns()}",
                      flush=True)
            if crash and args.crash_how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if crash:
                raise RuntimeError(f"injected failure at step {state.step}")
            g = torch.Generator().manual_seed(1000 * state.step + rank)
            x = torch.randn(32, 16, generator=g)
            loss = ((ddp(x) - x.sum(dim=1, keepdim=True).sin()) ** 2).mean()
            state.optimizer.zero_grad()
            loss.backward()
            state.optimizer.step()
            if args.timestamps:
                print(f"rank {rank} pid {os.getpid()} step {state.step} done wall_ns "
                      f"{time.time_ns()}", flush=True)
            state.step += 1
            if state.step % args.commit_every == 0:
                state.commit()
            if args.pause_ms:
                time.sleep(args.pause_ms / 1000)
        if args.fail_before_returning:
            peers = publish_pids()
            if first_attempt and rank == args.crash_rank:
                wait_gone(peers)
                raise OSError(f"rank {rank}: cannot write its part of the result (injected)")

    train(state)
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor_bytes(tensor))
    generation = elastic._this_group().generation if elastic.in_place() else 0
    print(f"rank {dist.get_rank()} pid {os.getpid()} generation {generation} steps {state.step} "
          f"digest {digest.hexdigest()[:16]} world {dist.get_world_size()}", flush=True)
    # The weights' sum and sum of squares, for comparisons that tolerate a summation order (a
    # step applied twice or skipped moves them by far more).
    flat = torch.cat([p.detach().double().flatten() for p in model.parameters()])
    print(f"rank {dist.get_rank()} weights sum {flat.sum().item():.17g} "
          f"sumsq {(flat * flat).sum().item():.17g}", flush=True)
    crash_at_exit = args.crash_at_exit and first_attempt and rank == args.crash_rank
    peers = []
    if args.crash_at_exit:
        peers = publish_pids()
    # torch's own advice (2.x warns without it): the group is torn down here, not by the
    # interpreter's exit.
    dist.destroy_process_group()
    if crash_at_exit:
        wait_gone(peers)
        print(f"rank {rank} crashing at exit", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
