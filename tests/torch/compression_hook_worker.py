"""A worker of compression_hook_test.py, run by dist-launch (2 ranks, gloo): DDP trains the digits
MLP (64-128-10) with dist_launch.compression's hooks and with torch's own, one run per case, and
writes what each run ended with to OUT/rank<R>.json: the test accuracy, whether every weight is
finite, a digest of the weights (the replicas must agree), the hook's stats.

    compression_hook_worker.py --out DIR --steps N
    compression_hook_worker.py --peer-dies     (rank 1 exits at step 5: rank 0's backward raises)

Cases: every spec clean; the lossy ones again with an inf in rank 1's gradient at one step (and,
with a torch.amp.GradScaler on the CPU, torch 2.3 or later, DDP's own and two hooks'); a run
stopped halfway and resumed from the hook's, model's and optimizer's state_dict; DDP without a
hook; torch's PowerSGD hook with the same inf.
"""
import argparse
import gzip
import hashlib
import inspect
import io
import json
import math
import os
import time
import weakref

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd
from torch.nn.parallel import DistributedDataParallel as DDP

import dist_launch.compression as compression

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "examples", "data", "digits.csv.gz")
SPECS = ["none", "fp16", "bf16", "topk:0.05", "threshold:0.002", "powersgd:2", "powersgd:2:20"]
INJECT_AT = 40
LOCAL_BATCH = 16


def load_digits():
    rows, labels = [], []
    with gzip.open(DATA, "rt") as f:
        for line in f:
            fields = line.strip().split(",")
            rows.append([float(v) / 16.0 for v in fields[:64]])
            labels.append(int(fields[64]))
    return torch.tensor(rows), torch.tensor(labels)


class WithUnused(torch.nn.Sequential):
    """The layers in order, and one more that no forward pass uses."""

    def __init__(self, *layers):
        super().__init__(*layers)
        self.add_module("unused", torch.nn.Linear(10, 10))

    def forward(self, x):
        for name, layer in self.named_children():
            if name != "unused":
                x = layer(x)
        return x


class Run:
    """One training run: the model, its optimizer, DDP, and the hook (ours: SPEC; torch's:
    'torch:powersgd'; none registered: 'ddp'; a case ending in @small has small buckets)."""

    def __init__(self, case, group=None):
        # CASE@small: a hidden layer more and buckets of 16 KiB, the first too (torch's default
        # first bucket is 1 MiB), instead of DDP's one bucket: DDP's first layout is one bucket,
        # its rebuilt one two, of other parameters
        # CASE*1e6: the loss (so every gradient) times 1e6 and the learning rate divided by it,
        # the same training with gradients past fp16's range
        self.loss_scale = 1e6 if case.endswith("*1e6") else 1.0
        # CASE#unused: a layer that no step uses, DDP with find_unused_parameters (its map's
        # all-reduce then runs while the hook's exchanges do)
        unused = "#unused" in case
        # CASE^: three hidden layers of one shape (a residual put on another of them is
        # not refused for its shape)
        stacked = "^" in case
        case = case.replace("^", "")
        # CASE%bf16: the model in bfloat16 (its buckets too)
        self.dtype = torch.bfloat16 if case.endswith("%bf16") else torch.float32
        case = case.split("%")[0]
        # CASE!scaler: a torch.amp.GradScaler steps the optimizer (the hook's nonfinite default);
        # CASE!nan: the same with hook(..., nonfinite="nan")
        scaled = case.split("!")[1] if "!" in case else None
        case = case.split("!")[0]
        case, small = case.split("@")[0].split("*")[0].split("#")[0], "@small" in case
        torch.manual_seed(0)
        hidden = [layer for _ in range(3 if stacked else int(small))
                  for layer in (torch.nn.Linear(128, 128), torch.nn.ReLU())]
        kind = WithUnused if unused else torch.nn.Sequential
        self.module = kind(torch.nn.Linear(64, 128), torch.nn.ReLU(), *hidden,
                           torch.nn.Linear(128, 10)).to(self.dtype)
        first_bucket_bytes = dist._DEFAULT_FIRST_BUCKET_BYTES
        if small:
            dist._DEFAULT_FIRST_BUCKET_BYTES = 16 * 1024
        self.model = DDP(self.module, bucket_cap_mb=1 / 64 if small else 25,
                         find_unused_parameters=unused, process_group=group)
        dist._DEFAULT_FIRST_BUCKET_BYTES = first_bucket_bytes
        self.state = None
        if case == "torch:powersgd":
            state = torch_powersgd.PowerSGDState(process_group=group, matrix_approximation_rank=2,
                                                 start_powerSGD_iter=2, use_error_feedback=True,
                                                 warm_start=True)
            self.model.register_comm_hook(state, torch_powersgd.powerSGD_hook)
        elif case != "ddp":
            self.state, hook = compression.hook(case, group,
                                                nonfinite="nan" if scaled == "nan" else "zero")
            self.model.register_comm_hook(self.state, hook)
        self.opt = torch.optim.SGD(self.module.parameters(), lr=0.1 / self.loss_scale,
                                   momentum=0.9)
        self.inject = False
        self.module[0].weight.register_hook(self._maybe_inject)
        # (no growth: each step that finds an inf or NaN halves the scale, and only those)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1 << 30) \
            if scaled else None
        self.scale_drops = 0

    def _maybe_inject(self, grad):
        if not self.inject:
            return grad
        grad = grad.clone()
        grad[0, 0] = float("inf")  # one overflowed entry of rank 1's gradient
        return grad

    def train(self, x, y, steps, first=0, inject_at=None):
        rank, world = dist.get_rank(), dist.get_world_size()
        for step in range(first, first + steps):
            at = (step * LOCAL_BATCH * world + rank * LOCAL_BATCH) % (len(x) - LOCAL_BATCH)
            self.inject = step == inject_at and rank == 1
            out = self.model(x[at:at + LOCAL_BATCH].to(self.dtype))
            loss = torch.nn.functional.cross_entropy(out, y[at:at + LOCAL_BATCH]) * self.loss_scale
            self.opt.zero_grad()
            if self.scaler is None:
                loss.backward()
                self.opt.step()
                continue
            scale = self.scaler.get_scale()
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
            self.scale_drops += self.scaler.get_scale() < scale
        self.inject = False

    def train_result(self, x, y, steps):
        self.train(x, y, steps)
        return self.result(x, y)

    def result(self, x, y):
        with torch.no_grad():
            accuracy = (self.module(x.to(self.dtype)).argmax(dim=1) == y).float().mean().item()
        digest = hashlib.sha256()
        finite = True
        for name, value in self.module.state_dict().items():
            digest.update(name.encode())
            digest.update(value.float().numpy().tobytes())
            finite = finite and bool(torch.isfinite(value).all())
        out = {"accuracy": accuracy if math.isfinite(accuracy) else -1.0, "finite": finite,
               "digest": digest.hexdigest()}
        if self.scaler is not None:
            out["scale_drops"] = self.scale_drops
        if self.state is not None:
            out["stats"] = self.state.stats()
            self.state.close()
        return out


def resumed(case, x, y, steps, then=None):
    """Half the steps, everything saved (through torch.save, as a checkpoint), a new Run (of case
    `then`, if given) loaded from it, the other half."""
    first = Run(case)
    first.train(x, y, steps // 2)
    saved = io.BytesIO()
    torch.save({"model": first.module.state_dict(), "opt": first.opt.state_dict(),
                "hook": first.state.state_dict()}, saved)
    first.state.close()
    saved.seek(0)
    loaded = torch.load(saved)
    second = Run(then or case)
    second.module.load_state_dict(loaded["model"])
    second.opt.load_state_dict(loaded["opt"])
    second.state.load_state_dict(loaded["hook"])
    # what a checkpoint taken before the first step after a resume holds is what was loaded
    second.state.load_state_dict(second.state.state_dict())
    second.train(x, y, steps - steps // 2, first=steps // 2)
    return second.result(x, y)


def peer_dies(x, y):
    """Rank 1 exits at step 5; rank 0's exchange must fail, not wait: its backward raises."""
    run = Run("powersgd:2")
    run.train(x, y, 5)
    if dist.get_rank() == 1:
        print("rank 1 exits", flush=True)
        os._exit(3)
    try:
        run.train(x, y, 5, first=5)
    except Exception as e:  # noqa: BLE001 (what DDP's backward raised is the report)
        print(f"rank 0's backward raised {type(e).__name__}: {e}", flush=True)
        os._exit(4)
    print("rank 0 trained on without its peer", flush=True)
    os._exit(5)


def dropped(x, y):
    """Hooks dropped without close(), as a sweep of trials does: each left to the garbage
    collector, which also runs (threshold 1) inside the next trials' exchanges."""
    import gc

    def trial(spec, steps):
        small = spec.endswith("@small")
        module = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                     torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                     torch.nn.Linear(128, 10))
        model = DDP(module, bucket_cap_mb=1 / 64 if small else 25)
        state, hook = compression.hook(spec.split("@")[0])
        model.register_comm_hook(state, hook)
        opt = torch.optim.SGD(module.parameters(), lr=0.1)
        for step in range(steps):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[:64]), y[:64]).backward()
            opt.step()
        return weakref.ref(state)

    for spec in ["topk:0.05", "powersgd:2@small", "threshold:0.002@small", "fp16"]:
        state = trial(spec, 2)
        # (its lanes' threads may still be ending the last exchange: they hold it until then)
        deadline = time.monotonic() + 30
        while gc.collect() >= 0 and state() is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert state() is None, f"{spec}: a dropped hook's state was never collected"
    gc.set_threshold(1)
    for number, spec in enumerate(["powersgd:2@small", "topk:0.05@small", "powersgd:2@small"]):
        trial(spec, 5)
        print(f"rank {dist.get_rank()}: trial {number} done", flush=True)
    gc.set_threshold(700)
    dist.barrier()


class Scaled(torch.nn.Module):
    """sum(weight * x): the weight's gradient is x."""

    def __init__(self, n, dtype):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n, dtype=dtype))

    def forward(self, x):
        return (self.weight * x).sum()


def fp16_sums(out):
    """An fp16 model's gradients of 40,000 on both ranks (past 65504 / 2, within fp16's range):
    DDP's average is 40,000. A dense exchange that summed before it divided overflowed (80,000)
    and skipped the bucket (zeros)."""
    results = {"torch": torch.__version__}
    for spec in ["topk:0.4", "threshold:0.5", "fp16", "none"]:
        model = DDP(Scaled(4096, torch.float16))
        state, hook = compression.hook(spec)
        model.register_comm_hook(state, hook)
        model(torch.full((4096,), 40000.0, dtype=torch.float16)).backward()
        grad = model.module.weight.grad.float()
        results[spec] = {"min": grad.min().item(), "max": grad.max().item(),
                         "stats": state.stats()}
        state.close()
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(results, f)


def misuse(out):
    """What a user can get wrong, and a resumed job's saved fp16 scale; each rank's findings."""
    rank = dist.get_rank()
    found = {"torch": torch.__version__}

    def error_of(fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 (what a user's script would see is the finding)
            return f"{type(e).__name__}: {e}"
        return None

    # One state registered with two DDP models: refused (they shared residuals and steps).
    torch.manual_seed(0)
    one, two = (DDP(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)))
                for _ in range(2))
    state, hook = compression.hook("topk:0.1")
    one.register_comm_hook(state, hook)
    two.register_comm_hook(state, hook)
    one(torch.ones(4, 8)).sum().backward()
    found["shared"] = error_of(lambda: two(torch.ones(4, 8)).sum().backward())
    state.close()

    # Sparse gradients: refused saying what to do; 'none' takes them.
    for spec in ["topk:0.1", "none"]:
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Embedding(100, 16, sparse=True),
                                        torch.nn.Linear(16, 4)))
        state, hook = compression.hook(spec)
        model.register_comm_hook(state, hook)
        found["sparse " + spec] = error_of(
            lambda: model(torch.arange(8)).sum().backward()) or "ok"
        state.close()

    # A rank outside the group it passes (torch 2.1 or later makes a hook over a subgroup).
    only_zero = dist.new_group([0])
    if rank == 1:
        found["nonmember"] = error_of(lambda: compression.hook("topk:0.1", only_zero))
    dist.barrier()

    # Hooks made and closed again and again: their groups (sockets, threads) go with them.
    import torch.distributed.distributed_c10d as c10d

    def groups():  # (torch 1.x: _pg_map)
        return len(c10d._world.pg_map if hasattr(c10d, "_world") else c10d._pg_map)

    module = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    before = (len(os.listdir("/proc/self/fd")), groups())
    for _ in range(20):
        model = DDP(module)
        state, hook = compression.hook("topk:0.1")
        model.register_comm_hook(state, hook)
        model(torch.ones(4, 8)).sum().backward()
        state.close()
        del model, state, hook
    import gc
    gc.collect()
    found["closed 20"] = {"before": before, "after": (len(os.listdir("/proc/self/fd")), groups())}

    # A resumed fp16 job of several buckets whose gradients are past fp16's range: DDP's first
    # layout (one bucket, or other buckets) learns its scale with a skipped step, as the first
    # step of any job does; the rebuilt one, the saved layout, takes the saved scale (it was
    # dropped: a second skipped step on every resume).
    def job(steps, first=0, saved=None):
        torch.manual_seed(0)
        module = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)],
                                     torch.nn.Linear(64, 10))
        model = DDP(module, bucket_cap_mb=0.02)
        state, hook = compression.hook("fp16")
        model.register_comm_hook(state, hook)
        opt = torch.optim.SGD(module.parameters(), lr=0.01 / 3e7)
        if saved:
            module.load_state_dict(saved["model"])
            opt.load_state_dict(saved["opt"])
            state.load_state_dict(saved["hook"])
        for step in range(first, first + steps):
            data = torch.randn(16, 64, generator=torch.Generator().manual_seed(step))
            opt.zero_grad()
            (model(data).pow(2).mean() * 3e7).backward()
            opt.step()
        return module, opt, state

    module, opt, state = job(6)
    saved = {"model": module.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()}
    state.close()
    module, opt, state = job(6, 6, saved)
    found["resumed skips"] = state.stats()["skipped"]
    state.close()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(found, f)


def subgroups(x, y, steps, out):
    """Four ranks, data parallelism within model parallelism: DDP over ranks 0-1 and another over
    ranks 2-3, a hook over each (every rank makes both groups; each hook only its own ranks)."""
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = pairs[dist.get_rank() // 2]
    results = {"torch": torch.__version__}
    for case in ["fp16", "topk:0.05", "powersgd:2", "powersgd:2@small"]:
        try:
            run = Run(case, mine)
        except compression.CompressionError as e:  # torch before 2.1
            results[case] = {"error": str(e)}
            continue
        run.train(x, y, steps)
        results[case] = run.result(x, y)
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(results, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--peer-dies", action="store_true", help="peer_dies() instead of the cases")
    ap.add_argument("--subgroups", action="store_true", help="subgroups() instead of the cases")
    ap.add_argument("--dropped", action="store_true", help="dropped() instead of the cases")
    ap.add_argument("--fp16-sums", action="store_true", help="fp16_sums() instead of the cases")
    ap.add_argument("--misuse", action="store_true", help="misuse() instead of the cases")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    x, y = load_digits()
    if args.peer_dies:
        peer_dies(x, y)
    if args.subgroups:
        return subgroups(x, y, args.steps, args.out)
    if args.dropped:
        return dropped(x, y)
    if args.fp16_sums:
        return fp16_sums(args.out)
    if args.misuse:
        return misuse(args.out)
    results = {}
    for case in ["ddp"] + SPECS:
        run = Run(case)
        run.train(x, y, args.steps)
        results[case] = run.result(x, y)
    # a bfloat16 model: DDP broadcasts it over gloo from torch 2.x on
    bf16_models = ["ddp%bf16", "topk:0.4%bf16", "topk:0.05%bf16"] \
        if int(torch.__version__.split(".")[0]) >= 2 else []
    scaled = []  # a GradScaler on the CPU: torch 2.3 or later
    if "device" in inspect.signature(torch.amp.GradScaler.__init__).parameters \
            if hasattr(torch.amp, "GradScaler") else False:
        scaled = ["ddp!scaler", "powersgd:2!nan", "fp16!nan", "powersgd:2!scaler"]
    for case in [s for s in SPECS if s != "none"] + ["torch:powersgd"] + scaled:
        run = Run(case)
        run.train(x, y, args.steps, inject_at=INJECT_AT)
        results["inf " + case] = run.result(x, y)
    for case in ["fp16@small", "powersgd:2@small", "fp16*1e6", "topk:0.05#unused",
                 "powersgd:2#unused", "powersgd:2:20@small"] + bf16_models:
        run = Run(case)
        run.train(x, y, args.steps)
        results[case] = run.result(x, y)
    for case in ["topk:0.05", "powersgd:2", "powersgd:2:20", "fp16@small", "powersgd:2@small",
                 "fp16^@small", "bf16^@small"]:
        if case not in results:
            results[case] = Run(case).train_result(x, y, args.steps)
        results["resumed " + case] = resumed(case, x, y, args.steps)
    # resumed with other bucket sizes (find_unused_parameters: DDP's first layout is then cut by
    # them too): threshold's exchange at 0.01 is the same whatever the buckets (too few entries
    # pass for one to go dense), so only where the residuals land tells the weights apart
    results["threshold:0.01^#unused"] = Run("threshold:0.01^#unused").train_result(
        x, y, args.steps)
    results["resumed threshold:0.01^#unused from small buckets"] = resumed(
        "threshold:0.01^#unused@small", x, y, args.steps, then="threshold:0.01^#unused")
    results["resumed threshold:0.01^#unused into small buckets"] = resumed(
        "threshold:0.01^#unused", x, y, args.steps, then="threshold:0.01^#unused@small")
    results["torch"] = torch.__version__
    with open(os.path.join(args.out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(results, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
