"""Healthy torch jobs that torchrun runs to the end, for tests/torch/healthy_test.py: a small DDP
model (gloo) trained for --steps steps, then, per --scenario, a long stretch of work of the
script's own (--pause seconds), then a few more steps. Nothing here is a hang: dist-launch's
defaults must end none of them.

  sleep         rank 0 sleeps while rank 1 waits in dist.barrier()
  save          rank 0 writes checkpoints (torch.save, in a loop) while rank 1 waits in a barrier
  eval          rank 0 evaluates (model.eval(), torch.no_grad()) while rank 1 waits in a barrier
  between       rank 1 pauses between two steps while rank 0 waits in DDP's all-reduce
  all           every rank stalls (a data stall on a shared file system)
  timeout       the script's own collective timeout (--pause + 60 s), rank 0 works --pause s
  first-step    the first step takes --pause s (a warm-up, a compile)
  loader        a DataLoader with 2 worker processes; rank 0 stalls in its loop; and each rank
                forks a trainer of its own (50 optimizer steps) that must not count as its
  no-optimizer  collectives only, no optimizer step ever; rank 0 stalls
  accumulate    gradient accumulation (no_sync, a step every 4 micro-batches); rank 0 stalls
                between micro-batches
  slow-log      rank 0 logs to a network service that reads slowly (--log-port): its send blocks
  c-poll        rank 0 waits --pause s in a C call that holds the GIL (ctypes.PyDLL): poll() of a
                pipe nobody writes, which a signal handler would break (EINTR)
  paused        rank 0 says its pause: dist_launch.progress.pause("checkpoint")
  compile       torch.compile(fullgraph=True) of a function with dist.all_reduce, torch's
                functional collectives and a DTensor (torch 2.x)
  crowded       every rank trains a larger model for --pause s, on a machine with fewer CPUs
                than ranks (healthy_test.py runs 4 ranks on one CPU): the scheduler, not a
                rank, makes one slower than the others from one second to the next
  exit          no pause; the interpreter ends while the progress sampler reads the group's
                counter (in torch's C++, the GIL released), pass after pass: the worker exits 0
  monitored     the group's timeout is short (10 s); rank 1 works --pause s while rank 0 waits
                in dist.monitored_barrier with a timeout of its own (--pause + 60 s: rank 0's
                wait for the others; theirs for rank 0 is the group's)
  scoring       the script's own collective timeout is short (10 s); an evaluation of --pause s
                with no optimizer step, its scores all-reduced batch by batch while rank 0 scores
                each slowly (3 s: a remote service): every wait is short, the silence long
  alone         the script's own collective timeout is short (10 s); rank 0 ends after the
                training, rank 1 then works alone for --pause s (an evaluation, an upload), its
                group still up: past that timeout and its margin, but no rank waits for it
  join          uneven inputs under DDP's join: rank 1's data ends after the training, rank 0
                trains on alone for --pause s, rank 1 shadowing its all-reduces (no step of its
                own: it is out of data, not a straggler)
  skewed        three ranks; a monitored_barrier (torch 2.x numbers its sends and receives in the
                group's sequence, more of them on rank 0: the counts differ from then on), then rank 0
                computes for --pause s while ranks 1 and 2 wait in a broadcast from it
  async-save    torch 2.x: every rank checkpoints with torch.distributed.checkpoint.async_save
                and waits for its save to finish; rank 0's storage is slow (--pause s: a
                network file system): its save's thread writes, rank 1's waits for it in the
                checkpoint's collective that ends the writes

Prints "rank R done steps N hook H" at the end (H: the steps the agent's hook counted, or "off").
"""
import argparse
import datetime
import io
import os
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def busy_for(seconds, work):
    """Calls work() until `seconds` passed."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        work()


class Slow:
    """An object whose pickling (when="pickled") or unpickling ("unpickled") takes `pause`
    seconds: an upload first, a load from slow storage."""

    def __init__(self, n, when, pause):
        self.n, self.when, self.pause = n, when, pause

    def __getstate__(self):
        if self.when == "pickled":
            time.sleep(self.pause)
        return dict(self.__dict__)

    def __setstate__(self, state):
        if state["when"] == "unpickled":
            time.sleep(state["pause"])
        self.__dict__.update(state)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--scenario", required=True)
    p.add_argument("--pause", type=float, default=36)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--log-port", type=int, default=0)
    p.add_argument("--batch", type=int, default=128, help="crowded: the larger model's batch")
    p.add_argument("--until-file", default="",
                   help="final-eval: evaluate until this file exists (the other node has left)")
    a = p.parse_args()
    timeout = {"timeout": datetime.timedelta(seconds=a.pause + 60),
               "alone": datetime.timedelta(seconds=10),
               "scoring": datetime.timedelta(seconds=10),
               "monitored": datetime.timedelta(seconds=10)}.get(a.scenario)
    dist.init_process_group("gloo", **({"timeout": timeout} if timeout else {}))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(32, 32))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(16, 32)
    steps = 0

    def step():
        nonlocal steps
        loss = model(data).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
        time.sleep(0.02)

    def train(n):
        for _ in range(n):
            step()

    s = a.scenario
    if s == "first-step":
        time.sleep(a.pause)
    if s == "loader":
        child = os.fork()
        if child == 0:  # a trainer of the script's own: its steps are not the rank's
            local = torch.nn.Linear(8, 8)
            local_opt = torch.optim.SGD(local.parameters(), lr=0.1)
            for _ in range(50):
                local(torch.ones(8)).sum().backward()
                local_opt.step()
            os._exit(0)
        os.waitpid(child, 0)
        dataset = torch.utils.data.TensorDataset(torch.randn(4096, 32))
        loader = torch.utils.data.DataLoader(dataset, batch_size=16, num_workers=2)
        for i, (batch,) in enumerate(loader):
            if rank == 0 and i == a.steps:
                time.sleep(a.pause)
            loss = model(batch).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            if i == a.steps + 10:
                break
    elif s == "accumulate":
        for micro in range(4 * (a.steps + 10)):
            if rank == 0 and micro == 4 * a.steps + 2:
                time.sleep(a.pause)
            last = micro % 4 == 3
            if last:
                model(data).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
                steps += 1
            else:
                with model.no_sync():
                    model(data).pow(2).mean().backward()
    elif s == "no-optimizer":
        t = torch.ones(8)
        for i in range(a.steps):
            dist.all_reduce(t)
            time.sleep(0.02)
        if rank == 0:
            time.sleep(a.pause)
        dist.barrier()
    elif s == "join":
        end = time.monotonic() + a.pause
        with model.join():
            train(a.steps)
            while rank == 0 and time.monotonic() < end:
                step()
    elif s == "crowded":
        big = DDP(torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                      torch.nn.Linear(1024, 512)))
        big_opt = torch.optim.SGD(big.parameters(), lr=0.001)
        x = torch.randn(a.batch, 512)
        end = time.monotonic() + a.pause
        go = torch.ones(1)
        while go.item() > 0:  # the same steps on every rank: they stop together
            for _ in range(20):
                big_opt.zero_grad()
                big(x).pow(2).mean().backward()
                big_opt.step()
                steps += 1
            go.fill_(1.0 if time.monotonic() < end else 0.0)
            dist.all_reduce(go, op=dist.ReduceOp.MIN)
    else:
        train(a.steps)
    print(f"rank {rank} trained", flush=True)

    if s in ("sleep", "timeout", "end-wait") and rank == 0:
        time.sleep(a.pause)
    elif s == "save" and rank == 0:
        path = os.path.join(tempfile.mkdtemp(prefix="healthy-save-"), "checkpoint.pt")
        busy_for(a.pause, lambda: torch.save({"model": model.state_dict(),
                                               "pad": torch.zeros(1 << 18)}, path))
    elif s == "eval" and rank == 0:
        model.eval()
        with torch.no_grad():
            busy_for(a.pause, lambda: model.module(torch.randn(256, 32)).sum())
        model.train()
    elif s == "between" and rank == 1:
        time.sleep(a.pause)
    elif s == "scoring":
        model.eval()
        score, go = torch.zeros(1), torch.ones(1)
        end = time.monotonic() + a.pause
        while go.item() > 0:  # the same batches on every rank: they stop together
            with torch.no_grad():
                score += model.module(data).mean()
            if rank == 0:
                time.sleep(3)
            dist.all_reduce(score)
            go.fill_(1.0 if time.monotonic() < end else 0.0)
            dist.all_reduce(go, op=dist.ReduceOp.MIN)
        model.train()
    elif s == "all":
        time.sleep(a.pause)
    elif s == "monitored":
        if rank == 1:
            time.sleep(a.pause)
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=a.pause + 60))
    elif s == "slow-log" and rank == 0:
        with socket.create_connection(("127.0.0.1", a.log_port)) as log:
            line = b"step done, loss 0.1234 " * 40 + b"\n"
            for _ in range(4000):  # about 3.7 MB: the service reads it for --pause seconds
                log.sendall(line)
    elif s == "c-poll" and rank == 0:
        import ctypes

        class PollFd(ctypes.Structure):
            _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_short),
                        ("revents", ctypes.c_short)]

        libc = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the GIL stays held through the call
        libc.poll.argtypes = [ctypes.POINTER(PollFd), ctypes.c_ulong, ctypes.c_int]
        read_end, _write_end = os.pipe()
        began = time.monotonic()
        ready = libc.poll(ctypes.byref(PollFd(read_end, 1, 0)), 1, int(a.pause * 1000))
        took = time.monotonic() - began
        if ready != 0 or took < a.pause - 1:
            raise SystemExit(f"rank 0: C poll() returned {ready} (errno {ctypes.get_errno()}) "
                             f"after {took:.1f} s of {a.pause} s")
    elif s == "async-save":
        import torch.distributed.checkpoint as dcp

        class SlowStorage(dcp.FileSystemWriter):  # rank 0's: a network file system, slow
            def write_data(self, plan, planner):
                if rank == 0:
                    time.sleep(a.pause)
                return super().write_data(plan, planner)

        path = tempfile.mkdtemp(prefix="healthy-dcp-")
        dcp.async_save({"model": model.state_dict()}, storage_writer=SlowStorage(path)).result()
    elif s == "objects":
        # Rank 0 unpickles what it gathered (loaded from slow storage, say) while rank 1 pickles
        # what it broadcasts next (uploaded first): each in an object collective's call, neither
        # waiting in a collective (the same count on both, in gather and broadcast).
        gathered = [None, None] if rank == 0 else None
        dist.gather_object(Slow(rank, "unpickled", a.pause / 2), gathered, dst=0)
        sent = [Slow(42, "pickled", a.pause)] if rank == 1 else [None]
        dist.broadcast_object_list(sent, src=1)
        assert sent[0].n == 42 and (rank != 0 or [g.n for g in gathered] == [0, 1])
    elif s == "side-thread":
        # A collective of a thread of the script's own on a group of its own (rank 0's at once,
        # rank 1's after the pause), while rank 0's main thread spends the pause in its model's
        # forward (a remote fetch, say) and rank 1 waits for it in DDP's all-reduce.
        import threading

        side = dist.new_group()

        class Fetching(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.layer, self.fetch = torch.nn.Linear(32, 32), rank == 0

            def forward(self, x):
                if self.fetch:
                    self.fetch = False
                    time.sleep(a.pause)
                return self.layer(x)

        fetching = DDP(Fetching())
        fetching_opt = torch.optim.SGD(fetching.parameters(), lr=0.01)

        def side_all_reduce():
            t = torch.ones(1)
            dist.all_reduce(t, group=side)
            assert t.item() == 2

        thread = threading.Thread(target=side_all_reduce)
        if rank == 0:
            thread.start()
        for _ in range(3):
            fetching_opt.zero_grad()
            fetching(data).pow(2).mean().backward()
            fetching_opt.step()
            steps += 1
        if rank == 1:
            thread.start()
        thread.join()
    elif s == "producer":
        # Rank 1's main thread waits in a barrier while a thread of its own waits for a result (a
        # remote service, say: asleep) and then broadcasts it on a group of its own, which rank 0
        # waits for before its barrier. Each main thread waits in a collective the other has not
        # issued: no proof, the producer thread issues it.
        import threading

        side = dist.new_group()
        result = torch.zeros(4)

        def produce():
            time.sleep(a.pause)
            result.fill_(7)
            dist.broadcast(result, src=1, group=side)

        if rank == 1:
            producer = threading.Thread(target=produce)
            producer.start()
            dist.barrier()
            producer.join()
        else:
            dist.broadcast(result, src=1, group=side)
            assert result.tolist() == [7.0] * 4, result
            dist.barrier()
    elif s == "p2p-offset":
        # Three ranks. Rank 0 sends to rank 1, which then computes: the send is numbered in the
        # group's sequence on ranks 0 and 1 only, so that rank 0's gather is #n on it and rank
        # 2's next all_reduce #n on rank 2 (which gave its part of the gather and went on).
        t = torch.ones(4)
        if rank == 0:
            dist.send(t, dst=1)
        elif rank == 1:
            dist.recv(t, src=0)
            busy_for(a.pause, lambda: torch.tanh(torch.randn(64, 64) @ torch.randn(64, 64)))
        gathered = [torch.zeros(4) for _ in range(3)] if rank == 0 else None
        dist.gather(torch.full((4,), float(rank)), gathered, dst=0)
        total = torch.ones(1)
        dist.all_reduce(total)
        assert total.item() == 3 and (rank != 0 or [g[0].item() for g in gathered] == [0, 1, 2])
    elif s == "skewed":
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=120))
        t = torch.zeros(4)
        if rank == 0:
            busy_for(a.pause, lambda: torch.tanh(torch.randn(64, 64) @ torch.randn(64, 64)))
            t += 7
        dist.broadcast(t, src=0)
        assert t.tolist() == [7.0] * 4, t
    elif s == "paused" and rank == 0:
        from dist_launch import progress

        with progress.pause("checkpoint"):
            time.sleep(a.pause)
    elif s == "compile":
        def f(x):
            dist.all_reduce(x)
            return x * 2

        compiled = torch.compile(f, fullgraph=True)
        got = compiled(torch.ones(4))
        assert got.tolist() == [4.0] * 4, got
        import torch.distributed._functional_collectives as fc
        reduced = fc.all_reduce(torch.ones(4), "sum", dist.group.WORLD)
        assert reduced.tolist() == [2.0] * 4, reduced
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        full = torch.arange(8.0)
        assert distribute_tensor(full, mesh, [Shard(0)]).full_tensor().tolist() == full.tolist()
        print(f"rank {rank} compiled, functional collectives and DTensor", flush=True)
    if s == "end-wait":
        dist.barrier()  # and no step after it: the job ends
    elif s not in ("loader", "accumulate", "no-optimizer"):
        dist.barrier()
        train(5)
    hook = sys.modules.get("_dist_launch_progress")
    counted = hook._words[3] if hook is not None and hook._words is not None else "off"
    print(f"rank {rank} done steps {steps} hook {counted}", flush=True)
    if s == "alone":
        if rank == 1:
            time.sleep(a.pause)
            print(f"rank {rank} worked alone after the job", flush=True)
        return  # the group is not destroyed (nor is it in many scripts)
    if s == "exit" and hook is not None and hook._sampler is not None:
        # The interpreter ends while the sampler is inside torch's C++ with the GIL released:
        # passes back to back, each reading the group's counter many times. A pass under way
        # must finish before the interpreter finalizes, or the worker aborts (exit 134).
        sampler, group, read = hook._sampler, dist.group.WORLD, hook._sampler.read_groups

        def slow_read(now):
            for _ in range(1000):
                group._get_sequence_number_for_group()
            return read(now)

        sampler.read_groups = slow_read
        hook._SAMPLE_SECONDS = 0
        print(f"rank {rank} exits with the sampler reading", flush=True)
        time.sleep(0.2)
        return  # the group is not destroyed: the sampler reads it until the interpreter ends
    dist.destroy_process_group()
    if s == "final-eval" and rank == 0:  # alone, after the job, while the other node has left
        model.eval()
        with torch.no_grad():
            busy_for(a.pause, lambda: model.module(torch.randn(256, 32)).sum())
            end = time.monotonic() + 150
            while a.until_file and not os.path.exists(a.until_file) and time.monotonic() < end:
                model.module(torch.randn(256, 32)).sum()
        print(f"rank {rank} evaluated after the job", flush=True)


if __name__ == "__main__":
    main()
