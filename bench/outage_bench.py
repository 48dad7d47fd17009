"""Network outages a healthy job rides out: a torch DDP job (gloo, CPU) on two hosts known by name
(tests/named_hosts/named-hosts.sh: network namespaces on one bridge), node-a node rank 0 and
node-b node rank 1, one worker each; about 5 s into training node-b's link goes down for CUT
seconds and comes back. Each launcher's default static job (torchrun's default static mode,
dist-launch's), interleaved (A B A B ...), for every cut asked for and once uninterrupted.

For each run: both nodes' exit codes, the wall time, the longest step gap the workers saw (a cut
costs more than its length: TCP resends at its next backoff step, 26.5 s for cuts of 15 to 25 s),
and whether the final weights are the uninterrupted run's (sha256 of the parameters).

    sudo python3 bench/outage_bench.py [--cuts 15,25,45] [--runs 1] [--python python3]
        [--launchers dist-launch,torchrun] [--steps 1000]

With --elastic the job is an elastic one (--nnodes 1:2 --rdzv-endpoint node-a:PORT, torchrun with
--rdzv-backend c10d): dist-launch's node-a goes on alone once its keepalive (8 s) ends node-b's
place, and node-b rejoins when its link is back; each run then says how long after the link
returned the job trained at two nodes again (its first step in a world of two).

Needs root (network namespaces) and torch 2.x in --python. Every process is killed by its PID and
the hosts removed at the end of each run.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "named_hosts"))
from named_hosts import NamedHosts, unavailable  # noqa: E402

SCRIPT = os.path.join(ROOT, "tests", "named_hosts", "named-hosts.sh")
RUN_TIMEOUT_S = 300

# Steps of about 20 ms; a global batch of 64 made from (seed, step), rank r taking rows r::world.
TRAIN = textwrap.dedent("""\
    import hashlib, os, time
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    steps, out = int(os.environ["OUTAGE_STEPS"]), os.environ["OUTAGE_DIR"]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)
    model = DDP(torch.nn.Linear(256, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    longest, before = 0.0, time.monotonic()
    for step in range(steps):
        began = time.monotonic()
        g = torch.Generator().manual_seed(10_000 + step)
        x, y = torch.randn(64, 256, generator=g), torch.randn(64, 256, generator=g)
        loss = torch.nn.functional.mse_loss(model(x[rank::world]), y[rank::world])
        opt.zero_grad(); loss.backward(); opt.step()
        if step == 0 and rank == 0:
            with open(os.path.join(out, "rounds"), "a") as f:
                f.write(f"{time.time():.3f} {world}\\n")
        now = time.monotonic()
        longest, before = max(longest, now - before), now
        if step == 1 and rank == 1:
            open(os.path.join(out, "training"), "w").close()
        time.sleep(max(0.0, 0.020 - (time.monotonic() - began)))
    params = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    with open(os.path.join(out, f"result_{rank}.json"), "w") as f:
        f.write('{"sha": "%s", "longest_gap_s": %.3f}' % (hashlib.sha256(params).hexdigest()[:16],
                                                          longest))
    dist.barrier()
    dist.destroy_process_group()
""")


def launcher_argv(args, launcher, node_rank, port):
    if launcher == "dist-launch":
        program = [os.path.join(args.build, "bin", "dist-launch")]
    else:
        program = [args.python, "-m", "torch.distributed.run"]
    if args.elastic:
        backend = ["--rdzv-backend", "c10d"] if launcher == "torchrun" else []
        return program + backend + ["--nnodes", "1:2", "--rdzv-endpoint", f"node-a:{port}",
                                    "--rdzv-id", "outage", "--nproc-per-node", "1"]
    return program + ["--nnodes", "2", "--node-rank", str(node_rank), "--master-addr", "node-a",
                      "--master-port", str(port), "--nproc-per-node", "1"]


def one_run(args, launcher, cut, out):
    """Both nodes' exit codes, the wall time, the longest gap and the weights' digest."""
    script = os.path.join(out, "train.py")
    with open(script, "w") as f:
        f.write(TRAIN)
    env = dict(os.environ, OUTAGE_STEPS=str(args.steps), OUTAGE_DIR=out, OMP_NUM_THREADS="1",
               PYTHON_EXEC=args.python)
    port = 20000 + int.from_bytes(os.urandom(2), "little") % 40000
    with NamedHosts(SCRIPT, ["node-a", "node-b"]) as hosts:
        began = time.monotonic()
        procs = [hosts.start(host, launcher_argv(args, launcher, rank, port) + [script], env=env,
                             log=os.path.join(out, f"{host}.log"))
                 for rank, host in enumerate(["node-a", "node-b"])]
        cutter = None
        restored = []
        if cut:
            def cut_link():
                deadline = time.monotonic() + 120
                while not os.path.exists(os.path.join(out, "training")):
                    if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                        return
                    time.sleep(0.1)
                time.sleep(5)
                namespace = f"{hosts.run_id}-node-b"
                subprocess.run(["ip", "-n", namespace, "link", "set", "eth0", "down"], check=True)
                time.sleep(cut)
                subprocess.run(["ip", "-n", namespace, "link", "set", "eth0", "up"], check=True)
                restored.append(time.time())
            cutter = threading.Thread(target=cut_link, daemon=True)
            cutter.start()
        codes = []
        for proc in procs:
            try:
                codes.append(proc.wait(timeout=max(1, RUN_TIMEOUT_S - (time.monotonic() - began))))
            except subprocess.TimeoutExpired:
                codes.append(None)  # killed with the hosts
        wall = time.monotonic() - began
        if cutter:
            cutter.join(timeout=cut + 10)
    results = []
    for rank in (0, 1):
        try:
            with open(os.path.join(out, f"result_{rank}.json")) as f:
                results.append(json.load(f))
        except (OSError, ValueError):
            results.append(None)
    done = all(results)
    return {"codes": codes, "wall_s": round(wall, 1), "rejoined_s": rejoined(out, restored),
            "longest_gap_s": max(r["longest_gap_s"] for r in results) if done else None,
            "sha": results[0]["sha"] if done else None,
            "said": said(out) if launcher == "dist-launch" else []}


def rejoined(out, restored):
    """Seconds from the link's return to the job's first step in a world of two after it; None
    without a cut, or when no such round came."""
    if not restored:
        return None
    try:
        with open(os.path.join(out, "rounds")) as f:
            rounds = [(float(t), int(w)) for t, w in (line.split() for line in f if line.strip())]
    except (OSError, ValueError):
        return None
    later = [t - restored[0] for t, w in rounds if w == 2 and t > restored[0]]
    return round(min(later), 2) if later else None


def said(out):
    """dist-launch's lines about the outage, node-a's then node-b's."""
    lines = []
    for host in ("node-a", "node-b"):
        with open(os.path.join(out, f"{host}.log"), errors="replace") as f:
            for line in f:
                if re.search(r"gone|lost the rendezvous store|the job failed|rejoining|round \d+:",
                             line):
                    lines.append(f"{host}: {line.strip()}")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuts", default="15,25,45", help="outage lengths, seconds")
    parser.add_argument("--runs", type=int, default=1, help="runs of each launcher and cut")
    parser.add_argument("--launchers", default="dist-launch,torchrun")
    parser.add_argument("--python", default="python3", help="an interpreter with torch 2.x")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--elastic", action="store_true",
                        help="an elastic job (--nnodes 1:2 over c10d) instead of a static one")
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    args = parser.parse_args()
    why = unavailable(SCRIPT)
    if why:
        print(f"outage_bench: skipped: {why}")
        return 77
    cuts = [0] + [int(c) for c in args.cuts.split(",") if c]
    launchers = args.launchers.split(",")
    rows = {}
    for run in range(args.runs):
        for cut in cuts:
            for launcher in launchers:  # interleaved
                with tempfile.TemporaryDirectory(prefix="outage-bench-") as out:
                    r = one_run(args, launcher, cut, out)
                rows.setdefault((launcher, cut), []).append(r)
                print(f"run {run + 1} {launcher:11} cut {cut:3} s: exit {r['codes']}, "
                      f"{r['wall_s']} s, longest gap {r['longest_gap_s']} s, weights {r['sha']}"
                      + (f", at two nodes again {r['rejoined_s']} s after the link returned"
                         if r["rejoined_s"] is not None else ""),
                      flush=True)
                for line in r["said"]:
                    print(f"    {line}", flush=True)
    clean = {launcher: rows[(launcher, 0)][0]["sha"] for launcher in launchers}
    print("\nlauncher     cut   ridden out   median wall   median longest gap   "
          "uninterrupted weights")
    for (launcher, cut), runs in rows.items():
        ridden = sum(1 for r in runs if r["codes"] == [0, 0])
        gaps = [r["longest_gap_s"] for r in runs if r["longest_gap_s"] is not None]
        same = sum(1 for r in runs if r["sha"] and r["sha"] == clean[launcher])
        print(f"{launcher:11} {cut:4} s   {ridden}/{len(runs)}        "
              f"{statistics.median(r['wall_s'] for r in runs):7.1f} s   "
              f"{(statistics.median(gaps) if gaps else float('nan')):10.1f} s        "
              f"{same}/{len(runs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
