"""A PyTorch gloo DDP job (examples/torch/ddp_train.py, Debian's torch 1.13) on three hosts known by
name ends with the same weights as the same job on one host. The master's host maps its own name to
127.0.1.1, as Debian does; the commands hold names and an interface name, never an address. And
in-place recovery across two of them (dist_launch.elastic, examples/torch/elastic_train.py), with
static and with elastic (c10d) rendezvous: only the failed host's worker is replaced, the other
keeps its process, the weights are one host's. And a third host joining a running in-place job:
its worker is taken in at a step boundary, the running workers keep their processes.

    python3 torch_named_hosts_test.py --launcher build/bin/dist-launch --named-hosts named-hosts.sh
Exits 77 (skip) when that interpreter has no torch, or named hosts cannot be made here.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

from named_hosts import SKIP, NamedHosts, unavailable

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "torch", "ddp_train.py")
ELASTIC = os.path.join(HERE, "..", "..", "examples", "torch", "elastic_train.py")
HOSTS = ["node-a", "node-b", "node-c"]
STORE_PORT = "29500"  # the hosts are fresh network namespaces: nothing else holds a port there
JOB_TIMEOUT_S = 300
ARGS = None


def digests(output):
    return set(re.findall(r"weights in sync sha256 ([0-9a-f]{64})", output))


class TorchOnNamedHosts(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dist-named-torch-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.hosts = NamedHosts(ARGS.named_hosts, HOSTS, loopback_self="node-a")
        self.addCleanup(self.hosts.close)
        # torch's gloo device binds the address of the host's name, which is 127.0.1.1 on node-a:
        # name the interface instead (as on any Debian machine).
        self.env = dict(os.environ, PYTHON_EXEC=ARGS.python, GLOO_SOCKET_IFNAME="eth0")

    def run_nodes(self, commands):
        """Starts (host, argv) pairs at once; their exit codes and outputs."""
        logs = [os.path.join(self.dir, f"{i}.log") for i in range(len(commands))]
        procs = [self.hosts.start(host, argv, env=self.env, log=log)
                 for (host, argv), log in zip(commands, logs)]
        codes = [p.wait(timeout=JOB_TIMEOUT_S) for p in procs]
        outputs = []
        for log in logs:
            with open(log) as f:
                outputs.append(f.read())
        return codes, outputs

    def test_three_hosts_end_with_the_weights_of_one_host(self):
        three = [(host, [ARGS.launcher, "--nnodes", "3", "--node-rank", str(rank),
                         "--master-addr", "node-a", "--master-port", STORE_PORT,
                         "--nproc-per-node", "1", EXAMPLE])
                 for rank, host in enumerate(HOSTS)]
        codes, outputs = self.run_nodes(three)
        self.assertEqual(codes, [0, 0, 0], "\n".join(outputs))
        for rank, out in enumerate(outputs):
            self.assertIn(f"rank {rank}/3 attempt 0: process group up", out)
        spread = set().union(*(digests(out) for out in outputs))
        self.assertEqual(len(spread), 1, "\n".join(outputs))

        codes, outputs = self.run_nodes(
            [("node-b", [ARGS.launcher, "--nproc-per-node", "3", EXAMPLE])])
        self.assertEqual(codes, [0], outputs[0])
        self.assertEqual(digests(outputs[0]), spread, outputs[0])

    def in_place_on_two_hosts(self, rendezvous):
        """--restart-policy in-place, one worker on each of node-a and node-b, `rendezvous` their
        flags for host h: rank 1 is SIGKILLed at step 12 and replaced on its host alone; the
        other host's worker keeps its process; both end with the weights of the same job run
        uninterrupted on one host."""
        train = [ELASTIC, "--steps", "30", "--crash-at-step", "12"]
        two = [(host, [ARGS.launcher, *rendezvous(rank, host), "--nproc-per-node", "1",
                       "--restart-policy", "in-place", "--max-restarts", "1", *train])
               for rank, host in enumerate(HOSTS[:2])]
        codes, outputs = self.run_nodes(two)
        self.assertEqual(codes, [0, 0], "\n".join(outputs))
        # An elastic job ranks its nodes by arrival: find the survivor's host by its output.
        survivor = next(out for out in outputs if "rank 0 pid" in out)
        failed = next(out for out in outputs if "rank 1 pid" in out)
        self.assertEqual(len(re.findall(r"rank 0 pid \d+ started", survivor)), 1, survivor)
        self.assertRegex(survivor, r"rank 0 recovered in place: generation 1, state from rank 0")
        self.assertEqual(len(re.findall(r"rank 1 pid \d+ started", failed)), 2, failed)
        self.assertIn("replaced in place", failed)
        self.assertNotIn("restarting the worker group", survivor + failed)
        ends = re.findall(r"steps 30 digest (\w+)", survivor + failed)
        self.assertEqual(len(ends), 2, survivor + failed)

        codes, outputs = self.run_nodes(
            [("node-b", [ARGS.launcher, "--nproc-per-node", "2", ELASTIC, "--steps", "30"])])
        self.assertEqual(codes, [0], outputs[0])
        self.assertEqual(set(re.findall(r"steps 30 digest (\w+)", outputs[0])), set(ends),
                         outputs[0])

    def test_in_place_across_two_hosts_replaces_only_the_failed_hosts_worker(self):
        self.in_place_on_two_hosts(lambda rank, host: [
            "--nnodes", "2", "--node-rank", str(rank), "--master-addr", "node-a",
            "--master-port", STORE_PORT])

    def test_in_place_across_two_hosts_of_an_elastic_job(self):
        """The same over c10d rendezvous at node-a's name (--nnodes 1:2 --rdzv-endpoint), the
        way most multi-node torchrun jobs are launched."""
        self.in_place_on_two_hosts(lambda rank, host: [
            "--nnodes", "1:2", "--rdzv-endpoint", f"node-a:{STORE_PORT}", "--rdzv-id",
            "named-inplace", "--rdzv-backend", "c10d", "--rdzv-conf", "last_call_timeout=30"])

    def test_a_newcomer_host_joins_the_running_workers_at_a_step_boundary(self):
        """--nnodes 2:3 in place over c10d at node-a's name: node-a and node-b train, node-c
        starts midway. Its worker joins the running two as rank 2 of three; theirs keep their
        processes; all three end with one digest. The two hold at step 40 until it is in."""
        steps = "60"
        argv = [ARGS.launcher, "--nnodes", "2:3", "--rdzv-endpoint", f"node-a:{STORE_PORT}",
                "--rdzv-id", "named-newcomer", "--rdzv-backend", "c10d", "--rdzv-conf",
                "last_call_timeout=1", "--nproc-per-node", "1", "--restart-policy", "in-place",
                "--max-restarts", "1", ELASTIC, "--steps", steps, "--pause-ms", "100",
                "--timestamps", "--hold-at-step", "40", "--hold-until-world", "3"]
        logs = [os.path.join(self.dir, f"{host}.log") for host in HOSTS]
        procs = [self.hosts.start(host, argv, env=self.env, log=log)
                 for host, log in zip(HOSTS[:2], logs)]
        self.wait_for_line(logs[:2], r"rank 1 pid \d+ step 3 done", procs)
        procs.append(self.hosts.start("node-c", argv, env=self.env, log=logs[2]))
        codes = [p.wait(timeout=JOB_TIMEOUT_S) for p in procs]
        outputs = [read(log) for log in logs]
        out = "\n".join(outputs)
        self.assertEqual(codes, [0, 0, 0], out)
        ends = {int(m.group(1)): (int(m.group(2)), m.group(3)) for m in re.finditer(
            r"rank (\d+) pid (\d+) generation \d+ steps " + steps + r" digest (\w+)", out)}
        self.assertEqual(sorted(ends), [0, 1, 2], out)
        self.assertEqual(len({digest for _, digest in ends.values()}), 1, out)
        # One process each, from start to end; the newcomer's started as generation 1.
        for rank, (pid, _) in ends.items():
            self.assertEqual(re.findall(rf"rank {rank} pid (\d+) started", out), [str(pid)], out)
        self.assertIn("rank 2 pid %d started (generation 1)" % ends[2][0], outputs[2])
        self.assertIn("round 1: this node's workers joined the running workers as generation 1",
                      outputs[2])
        self.assertIn("regrouped in round 1 (a node is waiting to join): world 3, 1 node(s) new",
                      out)
        self.assertNotIn("restarting", out)

    def wait_for_line(self, logs, pattern, procs, timeout=120):
        """Until one of `logs` has a line matching `pattern` (or a process has ended)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(re.search(pattern, read(log)) for log in logs):
                return
            if any(p.poll() is not None for p in procs):
                break
            time.sleep(0.05)
        self.fail(f"no '{pattern}' in time:\n" + "\n".join(read(log) for log in logs))


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--launcher", required=True)
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("--named-hosts", required=True)
    ARGS, rest = parser.parse_known_args()
    ARGS.launcher = os.path.abspath(ARGS.launcher)
    probe = subprocess.run([ARGS.python, "-c", "import torch"], capture_output=True, text=True)
    if probe.returncode != 0:
        print(f"skipping: {ARGS.python} has no torch", file=sys.stderr)
        sys.exit(SKIP)
    why = unavailable(ARGS.named_hosts)
    if why:
        print(f"skipping: {why}", file=sys.stderr)
        sys.exit(SKIP)
    unittest.main(argv=[sys.argv[0], *rest])
