#!/usr/bin/env python3
"""One NaN gradient against each gradient compression (issue 45): examples/ddp_train with each
--compression mode, clean and with a NaN in the last rank's batch at one step (--nan-at-step: every
gradient of that rank is NaN), beside torch 2.x DDP (gloo) with its fp16 and PowerSGD hooks on the
same model and the same injection (bench/compression_torch.py), 2 workers under dist-launch on
this machine.

    python3 bench/nonfinite_bench.py [--build build] [--epochs 30] [--nan-at-step 100]
        [--runs 1] [--out results.jsonl]

Per job: the final test accuracy (a model whose weights went NaN answers one class: about 0.1)
and the SDK's guard lines on rank 0 ("bucket(s) averaged to inf or NaN"). Jobs interleave (clean, hit) per mode and round; the table
gives each one's median. A run is "poisoned" when its accuracy falls more than 1 point below the
clean run's. torch rows need torch 2.x in python3 (else skipped, saying so).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH_WORKER = os.path.join(ROOT, "bench", "compression_torch.py")
JOB_TIMEOUT_S = 900
MODES = [
    ("sdk none", "sdk", []),
    ("sdk fp16", "sdk", ["--compression", "fp16"]),
    ("sdk bf16", "sdk", ["--compression", "bf16"]),
    ("sdk topk:0.1", "sdk", ["--compression", "topk:0.1"]),
    ("sdk threshold:0.01", "sdk", ["--compression", "threshold:0.01"]),
    ("sdk powersgd:2", "sdk", ["--compression", "powersgd:2"]),
    ("torch none", "torch", ["--hook", "none"]),
    ("torch fp16 hook", "torch", ["--hook", "fp16"]),
    ("torch powersgd:2 hook", "torch", ["--hook", "powersgd:2"]),
    # the SDK's compressors as torch hooks (dist_launch.compression), on the torch job
    ("hook fp16", "torch", ["--hook", "dist:fp16"]),
    ("hook bf16", "torch", ["--hook", "dist:bf16"]),
    ("hook topk:0.1", "torch", ["--hook", "dist:topk:0.1"]),
    ("hook threshold:0.01", "torch", ["--hook", "dist:threshold:0.01"]),
    ("hook powersgd:2", "torch", ["--hook", "dist:powersgd:2"]),
]



def hook_env(build):
    """What the "hook" rows' workers need: this checkout's dist_launch and its library."""
    return {"PYTHONPATH": os.path.join(ROOT, "python"),
            "DIST_LAUNCH_COMPRESSION_LIB": os.path.join(build, "lib", "libdist_compression.so")}


def has_torch2():
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True)
    return probe.returncode == 0 and probe.stdout.strip().startswith("2.")


def run(args, side, flags, nan_at):
    launcher = os.path.join(args.build, "bin", "dist-launch")
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
               PYTHON_EXEC=sys.executable,
               **hook_env(args.build))
    if side == "sdk":
        command = [launcher, "--nproc-per-node", "2", "--no-python",
                   os.path.join(args.build, "bin", "ddp_train"), "--epochs", str(args.epochs),
                   *flags]
    else:
        command = [launcher, "--nproc-per-node", "2", TORCH_WORKER, "--epochs", str(args.epochs),
                   *flags]
    if nan_at is not None:
        command += ["--nan-at-step", str(nan_at)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True,
                          timeout=JOB_TIMEOUT_S)
    out = proc.stdout + proc.stderr
    accuracy = re.findall(r"final test accuracy ([0-9.]+|nan)", out)
    hook_skipped = re.findall(r"compression stats \{'skipped': (\d+)", out)  # a "hook" row's
    return {"exit": proc.returncode,
            "accuracy": float(accuracy[-1]) if accuracy else None,
            "guarded": int(hook_skipped[-1]) if hook_skipped else
            len(re.findall(r"rank 0: step \d+: \d+ bucket\(s\) averaged to inf or NaN", out))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--nan-at-step", type=int, default=100)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args()
    modes = [m for m in MODES if m[1] == "sdk" or has_torch2()]
    if len(modes) < len(MODES):
        print("(no torch 2.x in python3: the torch rows are skipped)", flush=True)
    results = {}
    for r in range(args.runs):
        for label, side, flags in modes:
            for case, nan_at in (("clean", None), ("hit", args.nan_at_step)):
                res = run(args, side, flags, nan_at)
                results.setdefault((label, case), []).append(res)
                print(f"round {r + 1} {label:24} {case:5} {json.dumps(res)}", flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps({"mode": label, "case": case, "round": r + 1,
                                            "epochs": args.epochs,
                                            "nan_at_step": args.nan_at_step, **res}) + "\n")

    def median(label, case):
        values = [x["accuracy"] for x in results[(label, case)] if x["accuracy"] is not None]
        return statistics.median(values) if values else float("nan")

    print()
    print(f"{'mode':24} {'clean acc':>9} {'NaN at step ' + str(args.nan_at_step):>16} "
          f"{'poisoned':>8} {'guard lines':>11}")
    for label, _, _ in modes:
        clean, hit = median(label, "clean"), median(label, "hit")
        poisoned = not (hit >= clean - 0.01)
        guarded = statistics.median(x["guarded"] for x in results[(label, "hit")])
        print(f"{label:24} {clean:9.4f} {hit:16.4f} {'yes' if poisoned else 'no':>8} "
              f"{guarded:11.0f}")


if __name__ == "__main__":
    main()
