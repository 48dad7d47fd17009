"""torch DDP over NCCL under `dist-launch --restart-policy in-place`, for the GPU check
(scripts/gpu-check.sh, step torch_nccl_inplace): a worker SIGKILLs itself in the middle of a step
(after its forward, before the backward whose all-reduce its peer then waits in on the device),
the survivor's NCCL communicators are aborted by dist_launch.elastic when the agent publishes the
next generation, it rolls back to its last commit, and the replacement receives the state. The
job must end with the weights of a run that lost nobody.

    dist-launch --nproc-per-node 2 --restart-policy in-place bench/cuda_inplace.py \\
        [--steps 200] [--kill-at 60 | --stop-at 60] [--share-gpu]

--share-gpu puts every rank on device 0 of a one-GPU machine: NCCL refuses two ranks of one
host on one device ("Duplicate GPU detected"), so each rank names a host of its own
(NCCL_HOSTID) and NCCL connects them with its socket transport, as it would two hosts
(NCCL_SOCKET_IFNAME=lo and NCCL_IB_DISABLE=1 from the caller). Rank 0 prints the weights'
SHA-256 at the end, and `kill at` (`stop at`) / `trains again at` wall-clock times around the
loss. A stopped rank is a silent peer: its connections stay open, and the agent must find it
(a stopped process is proof from its first look) and end it before anyone can go on.
"""
import argparse
import faulthandler
import hashlib
import os
import signal
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--kill-at", type=int, default=-1, help="rank 1 dies at this step (gen 0)")
parser.add_argument("--stop-at", type=int, default=-1,
                    help="rank 1 stops (SIGSTOP) at this step (gen 0): a silent peer")
parser.add_argument("--share-gpu", action="store_true", help="every rank on device 0")
parser.add_argument("--cpu", action="store_true", help="gloo on the CPU (a rehearsal without a GPU)")
args = parser.parse_args()

faulthandler.register(signal.SIGUSR1, all_threads=True)  # where a process that will not end is
rank = int(os.environ["RANK"])
if args.share_gpu:
    os.environ["NCCL_HOSTID"] = f"dist-launch-gpu-check-rank-{rank}"
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from dist_launch import elastic  # noqa: E402

if args.cpu:
    device = torch.device("cpu")
else:
    device = torch.device("cuda", 0 if args.share_gpu else int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
torch.use_deterministic_algorithms(True)
generation = int(os.environ.get("DIST_LAUNCH_GENERATION", "0"))
elastic.init_process_group("gloo" if args.cpu else "nccl")

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                            torch.nn.Linear(512, 10)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
state = elastic.TorchState(model=model, optimizer=optimizer, step=0)
recovered = {"pending": generation > 0}


def trains_again() -> None:
    recovered["pending"] = True


state.register_reset_callbacks([trains_again])


@elastic.run
def train(state):
    ddp = DistributedDataParallel(state.model, device_ids=None if args.cpu else [device])
    while state.step < args.steps:
        r = int(os.environ["RANK"])
        g = torch.Generator().manual_seed(1000 * state.step + r)  # the data follows the counters
        x = torch.randn(64, 256, generator=g).to(device)
        y = torch.randint(0, 10, (64,), generator=g).to(device)
        loss = F.cross_entropy(ddp(x), y)
        if generation == 0 and r == 1 and state.step in (args.kill_at, args.stop_at):
            how = "kill" if state.step == args.kill_at else "stop"
            print(f"rank 1 {how} at {time.time():.3f} (step {state.step})", flush=True)
            os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        state.optimizer.zero_grad()
        loss.backward()
        state.optimizer.step()
        state.step += 1
        state.commit()
        if recovered["pending"]:
            recovered["pending"] = False
            print(f"rank {r} trains again at {time.time():.3f} (step {state.step})", flush=True)
        if r == 0 and state.step % 50 == 0:
            print(f"step {state.step} loss {loss.item():.4f}", flush=True)


began = time.monotonic()
train(state)
digest = hashlib.sha256()
for tensor in state.model.state_dict().values():
    digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
print(f"rank {os.environ['RANK']} final step {state.step} weights sha256 {digest.hexdigest()} "
      f"({time.monotonic() - began:.1f} s, torch {torch.__version__}"
      f"{'' if args.cpu else ', NCCL ' + '.'.join(map(str, torch.cuda.nccl.version()))})",
      flush=True)
sys.stdout.flush()
