#!/usr/bin/env python3
"""Loading a snapshot: a private copy against the file mapped (issue 44, item 3).

    python3 bench/snapshot_load_bench.py [--mb 100,1000] [--runs 5] [--python python3]

A state of --mb megabytes (torch float32 tensors of 4 MB each, as a model's and its optimizer's
state_dict) is saved once with dist_launch.snapshot into a folder in /dev/shm laid out as the
agent's. Then, in each round, one fresh interpreter per mode (interleaved: copy, mmap, copy, ...)
builds a model of the same shapes, loads the snapshot (load() or load(mmap=True)), copies it
into the model (load_state_dict's copy_), and reports:
  load ms       the time load() took
  resume ms     ... and the copy into the model after it (a mapped load's pages are read there)
  peak MiB      the private memory the process held at its peak above the model alone (its
                anonymous memory after the copy, with the loaded state still referenced: the
                moment load_state_dict is at), from /proc/self/smaps_rollup
The table gives medians over --runs rounds. No agent is needed: the worker's environment is set
by hand (DIST_LAUNCH_SNAPSHOT_DIR, RANK, WORLD_SIZE, TORCHELASTIC_RUN_ID).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(os.path.dirname(HERE), "python")

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import torch
from dist_launch import snapshot
mb, mode = int(sys.argv[2]), sys.argv[3]
parts = mb // 4

def anonymous():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("Anonymous:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no Anonymous line in smaps_rollup")

if mode == "save":
    state = {f"p{i}": torch.full((1024 * 1024,), float(i)) for i in range(parts)}
    assert snapshot.save(1, state)
    sys.exit(0)
model = {f"p{i}": torch.zeros(1024 * 1024) for i in range(parts)}
for t in model.values():
    t.add_(1)  # touched: the model's own memory is in the baseline
base = anonymous()
start = time.perf_counter()
step, loaded = snapshot.load(mmap=(mode == "mmap"))
took = time.perf_counter() - start
for name, t in model.items():
    t.copy_(loaded[name])
resumed = time.perf_counter() - start
peak = anonymous() - base
assert all(float(model[f"p{i}"][7]) == float(i) for i in range(parts))
print(json.dumps({"mode": mode, "mb": mb, "load_ms": took * 1000, "resume_ms": resumed * 1000,
                  "peak_mib": peak / 2**20}))
"""


def run_child(python, env, mb, mode):
    out = subprocess.run([python, "-c", CHILD, PACKAGE, str(mb), mode], env=env,
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"snapshot_load_bench: {mode} at {mb} MB failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1]) if mode != "save" else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", default="100,1000")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    sizes = [int(x) for x in args.mb.split(",")]
    results = {}
    for mb in sizes:
        root = tempfile.mkdtemp(prefix="dist-snapshot-bench-", dir="/dev/shm")
        try:
            env = dict(os.environ, DIST_LAUNCH_SNAPSHOT_DIR=root,
                       DIST_LAUNCH_SNAPSHOT_MEMORY=str(4 * mb * 2**20), RANK="0",
                       WORLD_SIZE="1", LOCAL_RANK="0", TORCHELASTIC_RUN_ID="bench")
            run_child(args.python, env, mb, "save")
            for _ in range(args.runs):
                for mode in ("copy", "mmap"):
                    r = run_child(args.python, env, mb, mode)
                    results.setdefault((mb, mode), []).append(r)
                    print(json.dumps(r), file=sys.stderr, flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    print("| state | load | load, ms | load and copy into the model, ms | peak private memory "
          "above the model, MiB |")
    print("|---:|---|---:|---:|---:|")
    for mb in sizes:
        for mode in ("copy", "mmap"):
            rs = results[(mb, mode)]
            name = "load()" if mode == "copy" else "load(mmap=True)"
            print(f"| {mb} MB | {name} | {statistics.median(r['load_ms'] for r in rs):.1f} | "
                  f"{statistics.median(r['resume_ms'] for r in rs):.1f} | "
                  f"{statistics.median(r['peak_mib'] for r in rs):.0f} |")


if __name__ == "__main__":
    main()
