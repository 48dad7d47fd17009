#!/usr/bin/env python3
"""Dead node to survivors restarted: an elastic job of three agents (--nnodes 2:3, default
settings: no --rdzv-conf), one node lost while the job runs, and the time until the last
survivor's worker has started in the job's next round (a world of two).

    python3 bench/elastic_bench.py [--build build] [--runs 5] [--torchrun]

Scenarios:
  agent-killed  SIGKILL of one agent on loopback; its workers die with it (PR_SET_PDEATHSIG). The
                store sees the connection close at once: this is a crashed or OOM-killed agent.
  host-lost     (root, iproute2) the third agent runs in a network namespace whose link goes down:
                no FIN, nothing more arrives. The store drops the connection after TCP keepalive
                (keep_alive_interval 1 s x keep_alive_max_attempt 3 by default).

Workers are build/bin/dist-test-worker: each appends "RANK WORLD_SIZE ... wall-clock-ns" when it
starts, so the restart time is the last survivor's start in the new round minus the moment of the
kill (or of the link going down), both on this machine's wall clock.

  etcd          (--etcd, Debian's etcd) the same job over a 3-member etcd on 127.0.0.1-3
                (--rdzv-backend etcd-v3, default settings): SIGKILL of the agent whose node hosts
                the workers' store (node rank 0: the survivors' next round hosts a new one), and of
                one that does not. A dead agent is noticed through its lease (2 s TTL), not a
                closed connection.

--torchrun repeats agent-killed with torch 2.x's torchrun (c10d, the same 2:3 job, its default
settings, Python workers writing the same line), waiting up to 90 s for its survivors to restart.
"""
import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

TORCH_WORKER = """
import os, sys, time
line = " ".join(os.environ.get(k, "?") for k in
                ("RANK", "WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                 "TORCHELASTIC_RESTART_COUNT"))
with open(sys.argv[1], "a") as f:
    f.write(f"{line} {time.time_ns()}\\n")
if os.environ.get("WORLD_SIZE") == "2":
    sys.exit(0)
while True:
    time.sleep(1)
"""


def free_port(host):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rounds(path):
    """[(rank, world_size, start_ns)] from a worker's history file."""
    seen = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 6:
                    seen.append((int(parts[0]), int(parts[1]), int(parts[5])))
    return seen


def wait_for(predicate, timeout):
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return False


class Job:
    """Three agents of one 2:3 elastic job; `prefix` runs an agent (e.g. inside a namespace)."""

    def __init__(self, launcher_cmd, workdir, endpoint, prefixes):
        self.dir = workdir
        self.procs = []
        for i, prefix in enumerate(prefixes):
            history = os.path.join(workdir, f"node{i}.rounds")
            log = open(os.path.join(workdir, f"node{i}.log"), "w")
            cmd = prefix + launcher_cmd(endpoint, history)
            self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True))
            if i == 0:
                time.sleep(0.3)  # the first agent hosts the store (it holds the endpoint)

    def history(self, i):
        return rounds(os.path.join(self.dir, f"node{i}.rounds"))

    def all_in_world(self, size, nodes):
        return all(self.history(i) and self.history(i)[-1][1] == size for i in nodes)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def measure(job, victim, cut, timeout):
    """Seconds from cut() to the last survivor's worker starting in a world of two, or None."""
    survivors = [i for i in range(3) if i != victim]
    if not wait_for(lambda: job.all_in_world(3, range(3)), 60):
        raise RuntimeError("the job never formed a world of three:\n" +
                           open(os.path.join(job.dir, "node0.log")).read())
    time.sleep(0.5)  # running
    t0 = time.time_ns()
    cut()
    if not wait_for(lambda: job.all_in_world(2, survivors), timeout):
        return None
    return (max(job.history(i)[-1][2] for i in survivors) - t0) / 1e9


def dist_launch_cmd(build):
    launcher = os.path.join(build, "bin", "dist-launch")
    worker = os.path.join(build, "bin", "dist-test-worker")

    def cmd(endpoint, history):
        return [launcher, "--nnodes", "2:3", "--rdzv-endpoint", endpoint, "--rdzv-id", "bench",
                "--nproc-per-node", "1", "--no-python", worker, "append", history,
                "exit-if-world", "2", "0", "forever"]
    return cmd


def agent_killed(cmd, runs, timeout=30):
    times = []
    for _ in range(runs):
        workdir = tempfile.mkdtemp(prefix="elastic-bench-")
        endpoint = f"127.0.0.2:{free_port('127.0.0.2')}"
        job = Job(cmd, workdir, endpoint, [[], [], []])
        try:
            victim = 2  # not the store's host
            t = measure(job, victim, lambda: os.kill(job.procs[victim].pid, signal.SIGKILL),
                        timeout)
            times.append(t)
        finally:
            job.stop()
            shutil.rmtree(workdir, ignore_errors=True)
    return times


def sh(command):
    return subprocess.run(command, shell=True, capture_output=True).returncode


def host_lost(cmd, runs):
    """Nodes 0 and 1 (and the store) in namespace A, node 2 in namespace B; B's link goes down."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("host-lost: skipped (needs root and iproute2)")
        return []
    times = []
    for run in range(runs):
        tag = f"eb{os.getpid() % 10000}{run}"
        ns = [f"{tag}a", f"{tag}b"]
        veth = [f"{tag}va", f"{tag}vb"]
        addr = ["198.19.7.1", "198.19.7.2"]
        workdir = tempfile.mkdtemp(prefix="elastic-bench-")
        job = None
        try:
            for n in ns:
                assert sh(f"ip netns add {n}") == 0
            assert sh(f"ip link add {veth[0]} type veth peer name {veth[1]}") == 0
            for i in range(2):
                sh(f"ip link set {veth[i]} netns {ns[i]}")
                sh(f"ip -n {ns[i]} addr add {addr[i]}/24 dev {veth[i]}")
                sh(f"ip -n {ns[i]} link set {veth[i]} up")
                sh(f"ip -n {ns[i]} link set lo up")
            inside = [["ip", "netns", "exec", ns[0]], ["ip", "netns", "exec", ns[0]],
                      ["ip", "netns", "exec", ns[1]]]
            job = Job(cmd, workdir, f"{addr[0]}:29400", inside)
            t = measure(job, 2, lambda: sh(f"ip -n {ns[1]} link set {veth[1]} down"), 30)
            times.append(t)
        finally:
            if job:
                job.stop()
            for n in ns:
                sh(f"ip netns del {n}")
            shutil.rmtree(workdir, ignore_errors=True)
    return times


def torchrun_killed(python, runs):
    r = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                       capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.startswith("2."):
        print(f"torchrun: skipped ({python} has no torch 2.x)")
        return None, ""
    version = r.stdout.strip()
    script = os.path.join(tempfile.mkdtemp(prefix="elastic-bench-"), "worker.py")
    with open(script, "w") as f:
        f.write(TORCH_WORKER)

    def cmd(endpoint, history):
        return [python, "-m", "torch.distributed.run", "--nnodes", "2:3", "--rdzv_backend",
                "c10d", "--rdzv_endpoint", endpoint, "--rdzv_id", "bench",
                "--nproc_per_node", "1", script, history]
    return agent_killed(cmd, runs, timeout=90), version


class EtcdCluster:
    """Three etcd members on 127.0.0.1-3, started and stopped by PID (as the tests do)."""

    def __init__(self, workdir):
        self.procs = []
        ips = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
        ports = [(free_port(ip), free_port(ip)) for ip in ips]
        peers = ",".join(f"m{i}=http://{ip}:{peer}" for i, (ip, (_, peer)) in
                         enumerate(zip(ips, ports)))
        self.endpoints = [f"{ip}:{client}" for ip, (client, _) in zip(ips, ports)]
        token = uuid.uuid4().hex  # one per cluster: members of another refuse to talk
        for i, (ip, (client, peer)) in enumerate(zip(ips, ports)):
            log = open(os.path.join(workdir, f"etcd{i}.log"), "w")
            self.procs.append(subprocess.Popen(
                ["etcd", f"--name=m{i}", f"--data-dir={os.path.join(workdir, f'm{i}')}",
                 f"--listen-client-urls=http://{ip}:{client}",
                 f"--advertise-client-urls=http://{ip}:{client}",
                 f"--listen-peer-urls=http://{ip}:{peer}",
                 f"--initial-advertise-peer-urls=http://{ip}:{peer}",
                 f"--initial-cluster={peers}", "--initial-cluster-state=new",
                 f"--initial-cluster-token={token}"],
                stdout=log, stderr=subprocess.STDOUT))
        if not wait_for(self.healthy, 30):
            self.stop()
            raise RuntimeError(f"etcd did not become healthy (logs in {workdir})")

    def healthy(self):
        for endpoint in self.endpoints:
            try:
                with urllib.request.urlopen(f"http://{endpoint}/health", timeout=1) as r:
                    if b'"health":"true"' not in r.read():
                        return False
            except OSError:
                return False
        return True

    def stop(self):
        for p in self.procs:
            p.kill()
            p.wait()


def etcd_node_lost(build, runs, hosting):
    """SIGKILL of the agent whose worker has RANK 0 (its node hosts the workers' store), or of
    one whose worker has RANK 2."""
    if shutil.which("etcd") is None:
        print("etcd: skipped (no etcd on PATH: apt-get install etcd-server)")
        return []
    launcher = os.path.join(build, "bin", "dist-launch")
    worker = os.path.join(build, "bin", "dist-test-worker")
    times = []
    for _ in range(runs):
        workdir = tempfile.mkdtemp(prefix="elastic-bench-etcd-")
        cluster = EtcdCluster(workdir)
        run_id = f"bench-{uuid.uuid4().hex[:8]}"

        def cmd(endpoint, history):
            return [launcher, "--nnodes", "2:3", "--rdzv-backend", "etcd-v3", "--rdzv-endpoint",
                    endpoint, "--rdzv-id", run_id, "--nproc-per-node", "1", "--no-python",
                    worker, "append", history, "exit-if-world", "2", "0", "forever"]
        job = Job(cmd, workdir, ",".join(cluster.endpoints), [[], [], []])
        try:
            if not wait_for(lambda: job.all_in_world(3, range(3)), 60):
                raise RuntimeError(f"no world of three (logs in {workdir})")
            rank = 0 if hosting else 2
            victim = next(i for i in range(3) if job.history(i)[-1][0] == rank)
            times.append(measure(job, victim,
                                 lambda: os.kill(job.procs[victim].pid, signal.SIGKILL), 30))
        finally:
            job.stop()
            cluster.stop()
            shutil.rmtree(workdir, ignore_errors=True)
    return times


def summary(times):
    done = [t for t in times if t is not None]
    if not done:
        return "never (within the wait)"
    text = f"median {statistics.median(done) * 1000:.0f} ms, max {max(done) * 1000:.0f} ms"
    if len(done) < len(times):
        text += f"; {len(times) - len(done)} of {len(times)} never restarted"
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--torchrun", action="store_true",
                    help="also torch 2.x's torchrun (python3 -m torch.distributed.run)")
    ap.add_argument("--python", default="python3", help="the Python with torch 2.x")
    ap.add_argument("--etcd", action="store_true", help="also over a 3-member etcd (etcd-v3)")
    args = ap.parse_args()
    cmd = dist_launch_cmd(args.build)

    print(f"dist-launch, agent killed ({args.runs} runs): {summary(agent_killed(cmd, args.runs))}")
    lost = host_lost(cmd, args.runs)
    if lost:
        print(f"dist-launch, host lost ({args.runs} runs): {summary(lost)}")
    if args.etcd:
        for hosting, what in ((True, "the workers' store host"), (False, "another node")):
            print(f"dist-launch over etcd, {what} killed ({args.runs} runs): "
                  f"{summary(etcd_node_lost(args.build, args.runs, hosting))}", flush=True)
    if args.torchrun:
        times, version = torchrun_killed(args.python, 1)
        if times is not None:
            print(f"torchrun {version}, agent killed (1 run): {summary(times)}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
