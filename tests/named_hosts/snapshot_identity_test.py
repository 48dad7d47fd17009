"""Snapshots are never another rank's, on hosts known by name (issue 44, item 5): a static job of
two hosts, node-a and node-b, two Python workers each under --virtual-local-rank (every worker of
the job is LOCAL_RANK=0: only the global rank tells their snapshots apart), all four saving their
state with dist_launch.snapshot every step into one --snapshot-dir that both hosts share (this
machine's disk).

- Its first run loses rank 3 at step 5; the group restarts on both hosts, and every rank loads its
  own state from its node's memory.
- The job started again on fresh agents (new shared memory) resumes every rank from its own
  state on the shared disk, said in the log.

    python3 snapshot_identity_test.py --launcher build/bin/dist-launch \\
        --named-hosts named-hosts.sh [--python python3]
Exits 77 (skip) when named hosts cannot be made here.
"""
import argparse
import os
import re
import shutil
import sys
import tempfile
import unittest

from named_hosts import SKIP, NamedHosts, unavailable

HOSTS = ["node-a", "node-b"]
STORE_PORT = "29500"  # fresh network namespaces: nothing else holds a port there
JOB_TIMEOUT_S = 120
STEPS = 10
ARGS = None

WORKER = r'''
import os, sys, time
from dist_launch import snapshot
rank, local_rank = int(os.environ["RANK"]), os.environ["LOCAL_RANK"]
restart, run = os.environ["TORCHELASTIC_RESTART_COUNT"], sys.argv[1]
found = snapshot.load()
loaded = "nothing" if found is None else f"step {found[0]} of rank {found[1]['rank']}"
print(f"run {run} rank {rank} restart {restart} local rank {local_rank} loads {loaded}", flush=True)
start = 0 if found is None else found[0] + 1
saved = sys.argv[3]  # a folder: each rank's mark that its first save is whole
for step in range(start, int(sys.argv[2])):
    # Every rank saves the same steps at about the same time: the moment two workers of one
    # node, both local rank 0, would recycle each other's files.
    snapshot.save(step, {"rank": rank, "step": step, "payload": bytes([rank]) * (1 << 20)})
    open(os.path.join(saved, f"rank_{rank}"), "w").close()
    time.sleep(0.02)
    if run == "1" and restart == "0" and rank == 3 and step == 5:
        # Fails once every rank has a snapshot to come back to.
        deadline = time.monotonic() + 60
        while len(os.listdir(saved)) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        sys.exit(1)
'''


class SnapshotIdentityOnNamedHosts(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dist-named-identity-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.script = os.path.join(self.dir, "worker.py")
        with open(self.script, "w") as f:
            f.write(WORKER)
        self.snapshots = os.path.join(self.dir, "snapshots")  # one folder, both hosts
        self.saved = os.path.join(self.dir, "saved")
        os.makedirs(self.saved)
        self.hosts = NamedHosts(ARGS.named_hosts, HOSTS, loopback_self="node-a")
        self.addCleanup(self.hosts.close)
        self.env = dict(os.environ, PYTHON_EXEC=ARGS.python)

    def job(self, run, steps):
        """One run of the job on both hosts: every output in one text, after asserting exit 0."""
        procs, logs = [], []
        for node_rank, host in enumerate(HOSTS):
            log = os.path.join(self.dir, f"run{run}-{host}.log")
            argv = [ARGS.launcher, "--nnodes", "2", "--node-rank", str(node_rank),
                    "--master-addr", "node-a", "--master-port", STORE_PORT,
                    "--nproc-per-node", "2", "--virtual-local-rank", "--rdzv-id", "identity",
                    "--snapshot-dir", self.snapshots, "--snapshot-memory", "32M",
                    "--max-restarts", "1", self.script, str(run), str(steps), self.saved]
            procs.append(self.hosts.start(host, argv, env=self.env, log=log))
            logs.append(log)
        codes = [p.wait(timeout=JOB_TIMEOUT_S) for p in procs]
        text = ""
        for host, log in zip(HOSTS, logs):
            with open(log) as f:
                text += f"== {host}\n{f.read()}"
        self.assertEqual(codes, [0, 0], text)
        self.assertNotIn("Traceback", text)
        return text

    @staticmethod
    def loads(text, run, restart):
        """rank -> (local rank, step, whose) or None, for one run and restart."""
        found = {}
        for m in re.finditer(rf"run {run} rank (\d) restart {restart} local rank (\d+) loads "
                             r"(?:step (\d+) of rank (\d)|nothing)", text):
            found[int(m.group(1))] = (m.group(2), int(m.group(3)), int(m.group(4))) \
                if m.group(3) else (m.group(2), None, None)
        return found

    def test_virtual_local_ranks_of_two_hosts_load_only_their_own_state(self):
        first = self.job(1, STEPS)
        self.assertIn("--virtual-local-rank: no CUDA or ROCm GPU found on this node; every "
                      "worker is LOCAL_RANK=0", first)
        self.assertEqual(self.loads(first, 1, 0),
                         {rank: ("0", None, None) for rank in range(4)}, first)
        after_failure = self.loads(first, 1, 1)
        self.assertEqual(sorted(after_failure), [0, 1, 2, 3], first)
        for rank, (local_rank, step, whose) in after_failure.items():
            self.assertEqual(local_rank, "0", first)
            self.assertEqual(whose, rank, f"rank {rank} loaded another rank's state\n{first}")
            self.assertIsNotNone(step, first)

        # Fresh agents, fresh memory: every rank's newest save comes back from the shared disk.
        second = self.job(2, 0)
        resumed = self.loads(second, 2, 0)
        self.assertEqual(resumed, {rank: ("0", STEPS - 1, rank) for rank in range(4)}, second)
        for rank in range(4):
            self.assertRegex(second, rf"rank {rank} \(local rank 0\) resumes from step "
                                     rf"{STEPS - 1} \(job 'identity'")


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
