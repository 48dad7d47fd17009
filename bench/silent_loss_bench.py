#!/usr/bin/env python3
"""Silent losses under --restart-policy in-place: how long after the fault the survivors train
again, with the default settings (issue 43's target: within 10 s).

    python3 bench/silent_loss_bench.py [--build build] [--runs 5]
        [--kinds stop,partition,torch_stop,torch_stop_warm,torch_partition] [--python python3]

Two faults that close nothing, so no survivor's collective fails by itself:
  stop       one node, 2 dist-inplace-worker workers (an all-reduce every 20 ms step); worker 1 is
             SIGSTOPped mid-training. The agent finds it held stopped (proof after 3 s), ends it,
             and a replacement joins the survivor's next generation.
  partition  (root, iproute2) two network namespaces joined by a veth pair, an elastic in-place
             job of three agents (--nnodes 2:3, two on host A, one on host B); host B's link is
             taken down mid-training. The agents find B lost (TCP keepalive, about 8 s), regroup
             without it, and the survivors' recovery watcher aborts the collective they wait in.
  torch_stop the same stop with torch workers: examples/torch/elastic_train.py (dist_launch.elastic,
             gloo, 2 workers, steps paced at 20 ms) under --python (torch 2.x), in place;
             torch_stop_warm the same under --warm-restart (the replacement forked from a zygote
             that imported torch already).
  torch_partition  the partition with torch workers (elastic_train.py as above, each host's gloo on
             its veth: GLOO_SOCKET_IFNAME).
Measured from the fault (the moment the signal was sent or the link went down) to the survivor's
"recovered in place" line (its first step in the new generation follows at once), each output
line stamped as it arrives. Medians and the runs, one line per kind.
"""
import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RECOVERED = re.compile(r"rank 0 recovered in place|rank 0 joined generation")


class Stamped:
    """A process whose output lines are kept with the time each arrived."""

    def __init__(self, argv, **kwargs):
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True, **kwargs)
        self.lines = []  # (monotonic time, line)
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self.lock:
                self.lines.append((time.monotonic(), line))

    def first(self, pattern, after=0.0):
        with self.lock:
            for t, line in self.lines:
                if t >= after and re.search(pattern, line):
                    return t
        return None

    def wait_for(self, pattern, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            t = self.first(pattern)
            if t is not None:
                return t
            time.sleep(0.01)
        raise RuntimeError(f"no line matching {pattern!r} in {timeout} s:\n" + self.text())

    def text(self):
        with self.lock:
            return "".join(line for _, line in self.lines)

    def end(self, timeout=60):
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.reader.join(timeout=10)
        return self.proc.returncode


def worker(args, out, steps):
    return [os.path.join(args.build, "bin", "dist-inplace-worker"), "--steps", str(steps),
            "--step-ms", "20", "--out", out]


def stop_run(args, out):
    launch = [os.path.join(args.build, "bin", "dist-launch"), "--nproc-per-node", "2",
              "--restart-policy", "in-place", "--max-restarts", "3", "--no-python",
              *worker(args, out, 400)]
    job = Stamped(launch, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        job.wait_for(r"rank 1 step 20\n", 60)
        with open(os.path.join(out, "start_1_0_0")) as f:
            victim = int(f.read())
        fault = time.monotonic()
        os.kill(victim, signal.SIGSTOP)
        job.wait_for(RECOVERED.pattern, 60)
        took = job.first(RECOVERED.pattern, fault) - fault
    finally:
        code = job.end()
    if code != 0:
        raise RuntimeError(f"the job failed ({code}):\n{job.text()}")
    return took


def torch_stop_run(args, out, warm=False):
    launch = [os.path.join(args.build, "bin", "dist-launch"), "--nproc-per-node", "2",
              *(["--warm-restart"] if warm else []),
              "--restart-policy", "in-place", "--max-restarts", "3",
              os.path.join(ROOT, "examples", "torch", "elastic_train.py"), "--steps", "600",
              "--pause-ms", "20", "--timestamps"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHON_EXEC=args.python,
               PYTHONPATH=os.path.join(ROOT, "python"), GLOO_SOCKET_IFNAME="lo")
    job = Stamped(launch, env=env)
    try:
        job.wait_for(r"rank 1 pid \d+ step 20 done", 120)
        victim = int(re.search(r"rank 1 pid (\d+) started", job.text()).group(1))
        fault = time.monotonic()
        os.kill(victim, signal.SIGSTOP)
        job.wait_for(RECOVERED.pattern, 60)
        took = job.first(RECOVERED.pattern, fault) - fault
    finally:
        code = job.end(timeout=120)
    if code != 0:
        raise RuntimeError(f"the job failed ({code}):\n{job.text()}")
    return took


def sh(command):
    subprocess.run(command, shell=True, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def torch_partition_run(args, out):
    return partition_run(args, out, torch=True)


def partition_run(args, out, torch=False):
    tag = f"{os.getpid() % 100000}"
    ns, veth = [f"slb{tag}a", f"slb{tag}b"], [f"svb{tag}a", f"svb{tag}b"]
    subnet = os.getpid() % 250
    addr = [f"198.18.{subnet}.1", f"198.18.{subnet}.2"]
    jobs = []
    try:
        for n in ns:
            sh(f"ip netns add {n}")
        sh(f"ip link add {veth[0]} type veth peer name {veth[1]}")
        for i in range(2):
            sh(f"ip link set {veth[i]} netns {ns[i]}")
            sh(f"ip -n {ns[i]} addr add {addr[i]}/24 dev {veth[i]}")
            sh(f"ip -n {ns[i]} link set {veth[i]} up")
            sh(f"ip -n {ns[i]} link set lo up")

        def agent(host):
            env = dict(os.environ, OMP_NUM_THREADS="1")
            program = ["--no-python", *worker(args, out, 1000)]
            if torch:  # examples/torch/elastic_train.py; torch's gloo takes the host's veth
                env.update(PYTHON_EXEC=args.python, PYTHONPATH=os.path.join(ROOT, "python"),
                           GLOO_SOCKET_IFNAME=veth[host])
                program = [os.path.join(ROOT, "examples", "torch", "elastic_train.py"),
                           "--steps", "2000", "--pause-ms", "20", "--timestamps"]
            return Stamped(["ip", "netns", "exec", ns[host],
                            os.path.join(args.build, "bin", "dist-launch"), "--nnodes", "2:3",
                            "--rdzv-endpoint", f"{addr[0]}:29513", "--rdzv-id", "job",
                            "--local-addr", addr[host], "--nproc-per-node", "1",
                            "--restart-policy", "in-place", "--max-restarts", "1", *program],
                           env=env)

        jobs.append(agent(0))
        jobs[0].wait_for("hosting the rendezvous store", 30)
        jobs.append(agent(0))
        jobs.append(agent(1))
        jobs[2].wait_for(r" of 3, global ranks", 60)
        jobs[2].wait_for(r" step 20 done" if torch else r" step 20\n", 120)
        fault = time.monotonic()
        sh(f"ip -n {ns[1]} link set {veth[1]} down")
        jobs[0].wait_for(RECOVERED.pattern, 60)
        took = jobs[0].first(RECOVERED.pattern, fault) - fault
        for j in jobs[:2]:
            if j.end() != 0:
                raise RuntimeError("a survivor's agent failed:\n" + j.text())
        return took
    finally:
        for j in jobs:
            if j.proc.poll() is None:
                os.killpg(j.proc.pid, signal.SIGKILL)
                j.proc.wait()
        for n in ns:
            subprocess.run(["ip", "netns", "del", n], stderr=subprocess.DEVNULL)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--kinds", default="stop,partition,torch_stop")
    ap.add_argument("--python", default="python3", help="torch 2.x, for torch_stop")
    args = ap.parse_args()
    runs = {"stop": stop_run, "partition": partition_run, "torch_stop": torch_stop_run,
            "torch_stop_warm": lambda a, o: torch_stop_run(a, o, warm=True),
            "torch_partition": torch_partition_run}
    kinds = args.kinds.split(",")
    for kind in ("partition", "torch_partition"):
        if kind in kinds and (os.geteuid() != 0 or shutil.which("ip") is None):
            print(f"{kind}: needs root and iproute2; skipped", file=sys.stderr)
            kinds.remove(kind)
    results = {k: [] for k in kinds}
    for i in range(args.runs):
        for kind in kinds:  # interleaved
            out = tempfile.mkdtemp(prefix="silent-loss-")
            try:
                results[kind].append(runs[kind](args, out))
            finally:
                shutil.rmtree(out, ignore_errors=True)
            print(f"run {i} {kind}: {results[kind][-1]:.2f} s", file=sys.stderr)
    for kind in kinds:
        xs = results[kind]
        print(f"{kind}: the fault to the survivor training again, median {statistics.median(xs):.2f}"
              f" s over {len(xs)} runs ({', '.join(f'{x:.2f}' for x in xs)})")


if __name__ == "__main__":
    main()
