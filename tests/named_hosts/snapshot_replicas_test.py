"""Snapshots that outlive their node (--snapshot-replicas), on hosts known by name: an elastic job of
three nodes (node-a, node-b, node-c; one Python worker each, saving its state with
dist_launch.snapshot every step, no --snapshot-dir) loses node-b's agent, SIGKILLed with its
worker; a replacement starts on a fourth host, node-d. The next round renumbers the nodes, so
ranks move: every worker of it loads its own rank's state from the previous round, whether its
node kept it, or another node's agent held a replica of it. Without replicas, the lost node's rank
starts over (the check that fails before the feature).

    python3 snapshot_replicas_test.py --launcher build/bin/dist-launch \\
        --named-hosts named-hosts.sh [--python python3]
Exits 77 (skip) when named hosts cannot be made here.
"""
import argparse
import os
import re
import shutil
import sys
import tempfile
import time
import unittest

from named_hosts import SKIP, NamedHosts, unavailable

HOSTS = ["node-a", "node-b", "node-c", "node-d"]
STORE_PORT = "29500"  # fresh network namespaces: nothing else holds a port there
JOB_TIMEOUT_S = 240
ARGS = None

WORKER = r'''
import os, sys, time
from dist_launch import snapshot
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
steps, kill_file = int(sys.argv[1]), sys.argv[2]
# The round after node-b's loss: started once the test killed it (a restart when the loss is seen
# before node-d waits, a new round of the same size, not a restart, when after).
phase = 1 if os.path.exists(kill_file) else 0
found = snapshot.load()
start = 0
if found is None:
    print(f"rank {rank} phase {phase} loads nothing", flush=True)
else:
    step, state = found
    print(f"rank {rank} phase {phase} loads step {step} of rank {state['rank']} "
          f"payload {len(state['payload'])}", flush=True)
    start = step + 1
payload = bytes([rank]) * (8 << 20)
for step in range(start, steps):
    snapshot.save(step, {"rank": rank, "step": step, "payload": payload})
    if step % 5 == 0:
        print(f"rank {rank} saved {step}", flush=True)
    # The first round runs until the test has killed a node; the next one to the end.
    time.sleep(0.05 if phase else 0.1)
    if not phase and step >= 20:
        while not os.path.exists(kill_file):
            time.sleep(0.05)
'''


class SnapshotReplicasOnNamedHosts(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dist-named-replicas-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.script = os.path.join(self.dir, "worker.py")
        with open(self.script, "w") as f:
            f.write(WORKER)
        self.hosts = NamedHosts(ARGS.named_hosts, HOSTS, loopback_self="node-a")
        self.addCleanup(self.hosts.close)
        self.env = dict(os.environ, PYTHON_EXEC=ARGS.python)

    def agent(self, host, flags, kill_file):
        log = os.path.join(self.dir, f"{host}.log")
        argv = [ARGS.launcher, "--nnodes", "3:3", "--nproc-per-node", "1", "--rdzv-endpoint",
                f"node-a:{STORE_PORT}", "--rdzv-id", "replicas", "--max-restarts", "1",
                *flags, self.script, "60", kill_file]
        return self.hosts.start(host, argv, env=self.env, log=log), log

    @staticmethod
    def read(log):
        with open(log) as f:
            return f.read()

    def wait_for(self, log, pattern, procs):
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if re.search(pattern, self.read(log)):
                return
            for proc, plog in procs:
                self.assertIsNone(proc.poll(), self.read(plog))
            time.sleep(0.05)
        self.fail(f"no {pattern!r} in {log}:\n{self.read(log)}")

    def lose_node_b_and_replace_it(self, flags):
        """node-b's agent SIGKILLed once its worker saved step 20; node-d joins; every agent left
        finishes. Every output (node-b's left out) in one text, and what each rank of the next
        round loaded: rank -> (step, whose) or None."""
        kill_file = os.path.join(self.dir, "killed")
        nodes = {host: self.agent(host, flags, kill_file) for host in HOSTS[:3]}
        procs = list(nodes.values())
        for host in HOSTS[:3]:
            self.wait_for(nodes[host][1], r"rank \d saved 20", procs)
        nodes["node-b"][0].kill()
        nodes["node-b"][0].wait()
        open(kill_file, "w").close()
        nodes["node-d"] = self.agent("node-d", flags, kill_file)
        codes, outputs = {}, {}
        for host in ["node-a", "node-c", "node-d"]:
            proc, log = nodes[host]
            codes[host] = proc.wait(timeout=JOB_TIMEOUT_S)
            outputs[host] = self.read(log)
        everything = "\n".join(f"== {h}\n{o}" for h, o in outputs.items())
        self.assertEqual(codes, {"node-a": 0, "node-c": 0, "node-d": 0}, everything)
        after = {}
        for output in outputs.values():
            after.update({rank: load for (rank, phase), load in self.loads(output).items()
                          if phase == 1})
        self.assertEqual(sorted(after), [0, 1, 2], everything)
        return everything, after

    @staticmethod
    def loads(output):
        """(rank, phase) -> (step, whose) or None, from the workers' lines."""
        found = {}
        for m in re.finditer(r"rank (\d) phase (\d) loads (?:step (\d+) of rank (\d)|nothing)",
                             output):
            key = (int(m.group(1)), int(m.group(2)))
            found[key] = (int(m.group(3)), int(m.group(4))) if m.group(3) else None
        return found

    def test_a_lost_nodes_rank_resumes_from_a_peers_replica(self):
        everything, after = self.lose_node_b_and_replace_it(["--snapshot-replicas", "1"])
        for rank, load in after.items():
            self.assertIsNotNone(load, f"rank {rank} lost its state\n{everything}")
            step, whose = load
            self.assertEqual(whose, rank, f"rank {rank} loaded another rank's state\n{everything}")
            self.assertGreaterEqual(step, 15, everything)
        restored = re.findall(r"rank (\d): its snapshot of step \d+ \([\d.]+ MB\) restored from "
                              r"the agent at \S+ in (\d+) ms", everything)
        self.assertTrue(restored, everything)
        for rank, ms in restored:
            print(f"replicas: rank {rank} restored from a peer in {ms} ms", file=sys.stderr)
        self.assertNotIn("Traceback", everything)

    def test_without_replicas_the_lost_nodes_rank_starts_over(self):
        everything, after = self.lose_node_b_and_replace_it([])
        self.assertIn(None, after.values(), "a rank no node kept starts over\n" + everything)
        for rank, load in after.items():
            self.assertTrue(load is None or load[1] == rank, everything)


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--launcher", required=True)
    parser.add_argument("--named-hosts", required=True)
    parser.add_argument("--python", default=sys.executable)
    ARGS, rest = parser.parse_known_args()
    ARGS.launcher = os.path.abspath(ARGS.launcher)
    why = unavailable(ARGS.named_hosts)
    if why:
        print(f"SKIP: {why}")
        sys.exit(SKIP)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
