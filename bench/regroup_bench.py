#!/usr/bin/env python3
"""A lost node's survivors: regrouped in place against a group restart (C++ SDK workers).

    python3 bench/regroup_bench.py [--build build] [--runs 7] [--nodes 3] [--nproc 2]
                                   [--torch PYTHON]

Each run is one elastic job (--nnodes 2:NODES, c10d, the rendezvous store hosted by the first
agent on 127.0.0.2) of NODES agents of --nproc workers each, --max-restarts 1: the C++ SDK's
dist-inplace-worker (--step-ms 10: a step of about 10 ms), or with --torch PYTHON
examples/torch/elastic_train.py (torch DDP, gloo, dist_launch.elastic; --pause-ms 10). Once node 1's workers have taken 20 steps, its
agent is SIGKILLed (its workers die with it, as with a lost machine). The policies alternate
(A B A B ...):
  A, group (--restart-policy group, today's and torchrun's behaviour): the survivors' workers are
     stopped and the group starts again, from step 0, in a new round of the surviving nodes;
  B, in-place: the survivors' workers keep their processes and regroup in a smaller world.
Measured from the kill (this script's clock, as it sends SIGKILL) to the first step line each
survivor's agent prints afterwards (read through its pipe: the console's own latency included):
  survivors training again = the latest survivor's first step after the kill
  steps trained again      = the last step any rank completed before the kill + 1 - the first
                             step completed after it (a group restart starts over at step 0: no
                             checkpoint here; in place, the step in flight is redone)
Medians of --runs, with min and max. The issue's targets for in-place: C++ SDK <= 0.5 s, torch
<= 1 s.
"""
import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

# dist-inplace-worker: "rank R step S" (S steps done); elastic_train.py --timestamps: "rank R pid P
# step S done wall_ns W" (step S done: S + 1 steps done).
HERE = os.path.dirname(os.path.abspath(__file__))
STEP = re.compile(r"\]:rank \d+ (?:pid \d+ )?step (\d+)( done|$)")


def free_port(host):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Agent:
    """One dist-launch agent; every line it prints, with the time it was read."""

    def __init__(self, cmd, env):
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines = []  # (monotonic seconds, line)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def text(self):
        return "\n".join(line for _, line in list(self.lines))

    def steps_done(self, line):
        m = STEP.search(line)
        return None if not m else int(m.group(1)) + (1 if m.group(2) else 0)

    def first_step_after(self, t):
        """When the first step after t was read, and how many steps were done then."""
        for when, line in list(self.lines):
            if when > t and self.steps_done(line) is not None:
                return when, self.steps_done(line)
        return None

    def last_steps_before(self, t):
        done = [self.steps_done(line) for when, line in list(self.lines) if when <= t]
        return max((d for d in done if d is not None), default=0)


def job(args, policy, workdir):
    port = free_port("127.0.0.2")
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if args.torch:
        env.update(PYTHON_EXEC=args.torch, GLOO_SOCKET_IFNAME="lo")
    agents = []
    for i in range(args.nodes):
        out = os.path.join(workdir, f"{policy}-{i}")
        os.makedirs(out, exist_ok=True)
        cmd = [os.path.join(args.build, "bin", "dist-launch"), "--nnodes", f"2:{args.nodes}",
               "--rdzv-endpoint", f"127.0.0.2:{port}", "--rdzv-id", "regroup",
               "--nproc-per-node", str(args.nproc), "--max-restarts", "1", "--restart-policy",
               policy]
        if args.torch:
            cmd += [os.path.join(HERE, "..", "examples", "torch", "elastic_train.py"),
                    "--steps", str(args.steps), "--pause-ms", "10", "--timestamps"]
        else:
            cmd += ["--no-python", os.path.join(args.build, "bin", "dist-inplace-worker"),
                    "--out", out, "--steps", str(args.steps), "--step-ms", "10"]
        agents.append(Agent(cmd, env))
        if i == 0:
            deadline = time.monotonic() + 30
            while "hosting the rendezvous store" not in agents[0].text():
                if time.monotonic() > deadline:
                    sys.exit(f"the first agent did not host the store:\n{agents[0].text()}")
                time.sleep(0.01)
    lost = None
    deadline = time.monotonic() + 60
    while lost is None:
        if time.monotonic() > deadline:
            sys.exit("no node 1 took 20 steps:\n" + "\n".join(a.text() for a in agents))
        for agent in agents:
            text = agent.text()
            if "round 0: node 1 of" in text and re.search(r"\]:rank \d+ (pid \d+ )?step 20( |$)",
                                                         text, re.M):
                lost = agent
        time.sleep(0.002)
    killed_at = time.monotonic()
    lost.proc.send_signal(signal.SIGKILL)
    survivors = [a for a in agents if a is not lost]
    for agent in agents:
        agent.proc.wait(timeout=180)
        agent.thread.join(timeout=10)
    for agent in survivors:
        if agent.proc.returncode != 0:
            sys.exit(f"{policy}: a surviving agent exited {agent.proc.returncode}:\n{agent.text()}")
    firsts = [a.first_step_after(killed_at) for a in survivors]
    if None in firsts:
        sys.exit(f"{policy}: a survivor trained no step after the kill")
    before = max(a.last_steps_before(killed_at) for a in agents)
    again = before + 1 - min(done for _, done in firsts)
    regrouped = all("in-place: regrouped in round" in a.text() for a in survivors)
    if (policy == "in-place") != regrouped:
        sys.exit(f"{policy}: regrouped={regrouped}:\n" + "\n".join(a.text() for a in survivors))
    return max(when for when, _ in firsts) - killed_at, again


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--torch", metavar="PYTHON",
                        help="torch workers (examples/torch/elastic_train.py) on this interpreter")
    args = parser.parse_args()
    if args.nodes < 3:
        sys.exit("--nodes: at least 3 (node 0 hosts the workers' store; node 1 is lost)")
    results = {"group": [], "in-place": []}
    with tempfile.TemporaryDirectory(prefix="regroup-bench-") as workdir:
        for run in range(args.runs):
            for policy in results:
                results[policy].append(job(args, policy, os.path.join(workdir, str(run))))
                seconds, again = results[policy][-1]
                print(f"run {run + 1}/{args.runs} {policy}: {seconds * 1000:.0f} ms, {again} "
                      f"step(s) trained again", file=sys.stderr)
    workers = "torch" if args.torch else "C++ SDK"
    print(f"| {args.nodes} nodes x {args.nproc} {workers} workers, node 1 lost at step 20 | "
          f"survivors training again, median ms (min-max) | steps trained again (median) | runs |")
    print("|---|---:|---:|---:|")
    for policy, values in results.items():
        ms = [v[0] * 1000 for v in values]
        print(f"| {policy} | {statistics.median(ms):.0f} ({min(ms):.0f}-{max(ms):.0f}) | "
              f"{statistics.median(v[1] for v in values):.0f} | {len(ms)} |")


if __name__ == "__main__":
    main()
