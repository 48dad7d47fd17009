"""One rank of an FSDP2 job (torch 2.x, gloo, CPU) that saves its sharded state with
dist_launch.snapshot every step and resumes from it (tests/torch/sharded_snapshot_test.py). With
--fsdp1, FSDP1 instead, whose sharded state dict holds ShardedTensors.

    sharded_snapshot_worker.py --steps N [--crash-at K] [--mmap] [--fsdp1] --out FILE

Rank 1 exits with an error right after its save of step K in the job's first attempt; the
restarted group (or the job's next run, from --snapshot-dir) loads each rank's shards (DTensors
back on the job's mesh; mapped with --mmap) and trains on. Rank 0 writes the final full weights'
digest to FILE.
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import StateDictType, fully_shard
from torch.distributed.tensor import DTensor

from dist_launch import snapshot


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--crash-at", type=int, default=-1)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mmap", action="store_true", help="load(mmap=True)")
    ap.add_argument("--fsdp1", action="store_true", help="FSDP1 (ShardedTensor state)")
    args = ap.parse_args()
    if snapshot.steps():  # a restart: shards need the job's group to come back as DTensors
        try:
            snapshot.load()
            print("loaded sharded state without a process group", flush=True)
        except snapshot.SnapshotShardError as e:
            print(f"before init_process_group: {e}", flush=True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    if args.fsdp1:
        model = FSDP(model, device_id=torch.device("cpu"), use_orig_params=True)
    else:
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

    def local(t):
        return t.local_shards()[0].tensor if args.fsdp1 else t.to_local()

    def state_dict():
        if not args.fsdp1:
            return {"model": model.state_dict(), "optim": optimizer.state_dict()}
        with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
            return {"model": model.state_dict(), "optim": FSDP.optim_state_dict(model, optimizer)}

    start = 0
    restored = snapshot.load(mmap=args.mmap)
    if restored is not None:
        step, state = restored
        kinds = {type(v).__name__ for v in state["model"].values()}
        moments = {type(s["exp_avg"]).__name__ for s in state["optim"]["state"].values()}
        print(f"rank {rank} restart {restart} loads step {step}: model {sorted(kinds)}, "
              f"moments {sorted(moments)}", flush=True)
        # Any rank's save (replicated=True) never gives this rank another rank's shards.
        _, anyones = snapshot.load(step, replicated=True)
        same = all(torch.equal(local(anyones["model"][k]), local(v))
                   for k, v in state["model"].items())
        print(f"rank {rank} replicated load gives its own shards: {same}", flush=True)
        if args.fsdp1:
            with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
                model.load_state_dict(state["model"])
                optimizer.load_state_dict(
                    FSDP.optim_state_dict_to_load(model, optimizer, state["optim"]))
        else:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optim"])
        start = step + 1

    for step in range(start, args.steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(16, 8, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), x[:, :4])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        snapshot.save(step, state_dict())
        if step == args.crash_at and restart == 0 and rank == 1:
            print(f"rank {rank} fails after its save of step {step}", flush=True)
            os._exit(3)

    digest = hashlib.sha256()
    if args.fsdp1:
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):
            full_state = model.state_dict()  # collective
    else:
        full_state = {name: value.full_tensor() if isinstance(value, DTensor) else value
                      for name, value in model.state_dict().items()}
    for name, full in full_state.items():
        digest.update(name.encode() + full.detach().numpy().tobytes())
    if rank == 0:
        with open(args.out, "w") as f:
            f.write(digest.hexdigest())
    dist.barrier()  # no rank tears gloo down under another's last collective
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
