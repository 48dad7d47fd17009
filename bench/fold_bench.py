#!/usr/bin/env python3
"""A second failure during an in-place recovery: folded into it, against a group restart.

    python3 bench/fold_bench.py --baseline BUILD [--build build] [--runs 5] [--nodes one|two]
                                [--steps 300] [--step-ms 10] [--fault fold|together]
                                [--torch PYTHON]

Each run is one in-place job (--restart-policy in-place --max-restarts 2) of dist-inplace-worker
(the SDK's InPlaceRecovery over Gloo): three workers on one agent (--nodes one), or two agents of
two workers each, static rendezvous on 127.0.0.2 (--nodes two). Rank 1 crashes as step
steps/2 begins; rank 2 (on the other node with --nodes two) dies as it reads the generation that
replaces rank 1, so that generation's group can never form. With --fault together (one node),
ranks 1 and 2 instead crash as the same step begins: the agent reaps them in one batch or apart,
as they exit. With --torch PYTHON the job is examples/torch/elastic_train.py under that
interpreter (dist_launch.elastic, gloo, three workers, --steps steps with --step-ms of pause each):
rank 1 crashes halfway, and rank 2 is SIGKILLed as soon as the agent reports rank 1's failure,
while rank 1's replacement is starting (torch to import). The two builds alternate (A B A B ...):
  A, --baseline: a build from before folds, whose agent restarts the whole group (the workers
     start again from step 0: dist-inplace-worker keeps no checkpoint);
  B, --build: the second failure is folded into the recovery under way (a later generation
     replaces both ranks; the others keep their processes).
Reported per build (medians of --runs, min-max): the job's wall time uninterrupted and with the two
failures (each run of a build runs both, the uninterrupted first), their ratio (ETTR), how many runs
restarted the group, replaced both in one generation or folded one into the other's recovery, and
how many ended with every rank at the digest of the uninterrupted run.
"""
import argparse
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def free_port(host):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def agents(build, nodes, out, worker_args):
    """The dist-launch command lines of one job."""
    launcher = os.path.join(build, "bin", "dist-launch")
    worker = os.path.join(build, "bin", "dist-inplace-worker")
    common = ["--max-restarts", "2", "--restart-policy", "in-place", "--no-python", worker,
              "--out", out] + worker_args
    if nodes == "one":
        return [[launcher, "--nproc-per-node", "3"] + common]
    port = str(free_port("127.0.0.2"))
    return [[launcher, "--nnodes", "2", "--node-rank", str(n), "--master-addr", "127.0.0.2",
             "--master-port", port, "--nproc-per-node", "2"] + common for n in (0, 1)]


def run_job(build, nodes, worker_args, world):
    """Wall seconds, how the failures were recovered (a group restart, one generation, folded),
    and every rank's final digest."""
    out = tempfile.mkdtemp(prefix="fold-bench-")
    try:
        began = time.monotonic()
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for cmd in agents(build, nodes, out, worker_args)]
        outputs = [p.communicate(timeout=300)[0] for p in procs]
        wall = time.monotonic() - began
        if any(p.returncode != 0 for p in procs):
            sys.exit("a job failed:\n" + "\n".join(outputs))
        if any("restarting the worker group" in o for o in outputs):
            path = "restart"
        elif any("which it supersedes" in o for o in outputs):
            path = "folded"
        else:
            path = "one generation"
        digests = []
        for rank in range(world):
            with open(os.path.join(out, f"final_{rank}")) as f:
                digests.append(f.read().split()[2])
        return wall, path, digests
    finally:
        shutil.rmtree(out, ignore_errors=True)


HERE = os.path.dirname(os.path.abspath(__file__))
ELASTIC_TRAIN = os.path.join(HERE, "..", "examples", "torch", "elastic_train.py")


def run_torch_job(build, python, steps, step_ms, faulted):
    """The torch job (faulted: rank 1 crashing halfway, rank 2 killed once that is reported):
    wall seconds, how it was recovered, and every rank's final weights (sum, sum of squares)."""
    cmd = [os.path.join(build, "bin", "dist-launch"), "--nproc-per-node", "3", "--max-restarts",
           "2", "--restart-policy", "in-place", ELASTIC_TRAIN, "--steps", str(steps),
           "--pause-ms", str(step_ms)]
    if faulted:
        cmd += ["--crash-at-step", str(steps // 2)]
    env = dict(os.environ, PYTHON_EXEC=python, GLOO_SOCKET_IFNAME="lo")
    began = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines, pids, killed = [], {}, False
    for line in proc.stdout:
        lines.append(line)
        m = re.search(r"rank (\d+) pid (\d+) started \(generation 0\)", line)
        if m:
            pids[int(m.group(1))] = int(m.group(2))
        if faulted and not killed and "worker 1 (local rank 1, pid" in line:
            os.kill(pids[2], signal.SIGKILL)
            killed = True
    code = proc.wait(timeout=600)
    wall = time.monotonic() - began
    out = "".join(lines)
    if code != 0:
        sys.exit("a job failed:\n" + out)
    if "restarting the worker group" in out:
        path = "restart"
    elif "which it supersedes" in out:
        path = "folded"
    else:
        path = "one generation" if faulted else "none"
    weights = [(float(a), float(b)) for a, b in
               re.findall(r"rank \d+ weights sum (\S+) sumsq (\S+)", out)]
    if len(weights) != 3:
        sys.exit("not every rank finished:\n" + out)
    return wall, path, weights


def same_weights(got, want):
    """Within rounding: three ranks sum a gradient in an order the rebuilt DDP may change (a
    step applied twice or skipped moves them by about 1e-2 of their size)."""
    return all(abs(g - w) <= 1e-4 * abs(w) for g, w in zip(got, want))


def torch_main(args):
    builds = {"baseline": args.baseline, "this build": args.build}
    clean = {name: [] for name in builds}
    results = {name: [] for name in builds}
    for run in range(args.runs):
        for name, build in builds.items():  # interleaved: A B A B ..., each uninterrupted first
            clean_wall, _, clean_weights = run_torch_job(build, args.torch, args.steps,
                                                         args.step_ms, False)
            clean[name].append(clean_wall)
            wall, path, weights = run_torch_job(build, args.torch, args.steps, args.step_ms, True)
            results[name].append((wall, path, all(same_weights(w, clean_weights[0])
                                                  for w in weights)))
            print(f"run {run + 1} {name}: {wall:.2f} s ({path})", flush=True)
    print(f"\ntorch ({args.torch}), 3 workers, {args.steps} steps with {args.step_ms} ms of pause, "
          f"rank 1 crashing at step {args.steps // 2}, rank 2 killed during its recovery; "
          f"{args.runs} runs each, interleaved")
    report(results, clean, "runs at the clean weights (within 1e-4)")


def report(results, clean, correct="runs at the clean digest"):
    print("| build | uninterrupted s, median | with the two failures s, median (min-max) | ETTR | "
          f"group restart / one generation / folded | {correct} |")
    print("|---|---|---|---|---|---|")
    for name, rows in results.items():
        walls = [r[0] for r in rows]
        median, clean_median = statistics.median(walls), statistics.median(clean[name])
        paths = " / ".join(str(sum(r[1] == p for r in rows))
                           for p in ("restart", "one generation", "folded"))
        print(f"| {name} | {clean_median:.2f} | {median:.2f} ({min(walls):.2f}-{max(walls):.2f}) "
              f"| {clean_median / median:.2f} | {paths} | {sum(r[2] for r in rows)} of "
              f"{len(rows)} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--baseline", required=True, help="a build without folds")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nodes", choices=("one", "two"), default="one")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--step-ms", type=int, default=10)
    parser.add_argument("--fault", choices=("fold", "together"), default="fold")
    parser.add_argument("--torch", metavar="PYTHON",
                        help="the torch job (dist_launch.elastic) under this interpreter")
    args = parser.parse_args()
    if args.torch:
        return torch_main(args)
    if args.fault == "together" and args.nodes != "one":
        parser.error("--fault together needs --nodes one (ranks 1 and 2 on one agent)")
    world = 3 if args.nodes == "one" else 4
    base = ["--steps", str(args.steps), "--step-ms", str(args.step_ms)]
    half = args.steps // 2
    if args.fault == "fold":
        faults = base + ["--crash", f"1:{half}", "--fail-in-recovery", "2"]
        said = f"rank 1 crashing at step {half}, rank 2 during its recovery"
    else:
        faults = base + ["--crash", f"1:{half}", "--crash", f"2:{half}"]
        said = f"ranks 1 and 2 crashing at step {half}"
    builds = {"baseline": args.baseline, "this build": args.build}
    clean = {name: [] for name in builds}
    results = {name: [] for name in builds}
    for run in range(args.runs):
        for name, build in builds.items():  # interleaved: A B A B ..., each uninterrupted first
            clean_wall, _, clean_digests = run_job(build, args.nodes, base, world)
            clean[name].append(clean_wall)
            wall, path, digests = run_job(build, args.nodes, faults, world)
            results[name].append((wall, path, all(d == clean_digests[0] for d in digests)))
            print(f"run {run + 1} {name}: {wall:.2f} s ({path})", flush=True)
    print(f"\n{args.nodes} node(s), {world} workers, {args.steps} steps of {args.step_ms} ms, "
          f"{said}; {args.runs} runs each, interleaved")
    report(results, clean)


if __name__ == "__main__":
    main()
