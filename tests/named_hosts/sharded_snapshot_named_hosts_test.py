"""Sharded snapshots across hosts known by name (issue 44, item 5): an FSDP2 job (torch 2.x, gloo,
CPU) of two hosts, node-a and node-b, two workers each (local ranks 0 and 1 on both hosts: only
the global rank tells their snapshots apart), saves each rank's shards every step into one
--snapshot-dir that both hosts share (this machine's disk). Its first run fails after
step 4 (no restarts left); the job started again on fresh agents (new shared memory) resumes every
rank from its own shards on that disk, mapped (load(mmap=True)), and ends with the weights of the
same job run uninterrupted. Another job's folder in the same --snapshot-dir, at a later step, is
never read.

    python3 sharded_snapshot_named_hosts_test.py --launcher build/bin/dist-launch \\
        --named-hosts named-hosts.sh --python python3
Exits 77 (skip) when that interpreter has no torch 2.x with FSDP2, or named hosts cannot be made.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

from named_hosts import SKIP, NamedHosts, unavailable

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "..", "torch", "sharded_snapshot_worker.py")
HOSTS = ["node-a", "node-b"]
STORE_PORT = "29500"  # fresh network namespaces: nothing else holds a port there
JOB_TIMEOUT_S = 240
ARGS = None


class ShardedSnapshotsOnNamedHosts(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dist-named-sharded-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.snapshots = os.path.join(self.dir, "snapshots")  # one folder, both hosts
        self.hosts = NamedHosts(ARGS.named_hosts, HOSTS, loopback_self="node-a")
        self.addCleanup(self.hosts.close)
        # torch's gloo device binds the address of the host's name, 127.0.1.1 on node-a: name the
        # interface instead.
        self.env = dict(os.environ, PYTHON_EXEC=ARGS.python, GLOO_SOCKET_IFNAME="eth0",
                        OMP_NUM_THREADS="1")
        self.runs = 0

    def job(self, job_id, flags=(), worker_flags=()):
        """One run of the job on both hosts: (exit codes, output of both, rank 0's digest)."""
        self.runs += 1
        out = os.path.join(self.dir, f"digest-{self.runs}")
        procs, logs = [], []
        for rank, host in enumerate(HOSTS):
            log = os.path.join(self.dir, f"run{self.runs}-{host}.log")
            argv = [ARGS.launcher, "--nnodes", "2", "--node-rank", str(rank), "--master-addr",
                    "node-a", "--master-port", STORE_PORT, "--nproc-per-node", "2",
                    "--rdzv-id", job_id, "--snapshot-memory", "64M",
                    *flags, WORKER, "--steps", "8", "--out", out, *worker_flags]
            procs.append(self.hosts.start(host, argv, env=self.env, log=log))
            logs.append(log)
        codes = [p.wait(timeout=JOB_TIMEOUT_S) for p in procs]
        text = ""
        for host, log in zip(HOSTS, logs):
            with open(log) as f:
                text += f"== {host}\n{f.read()}"
        digest = None
        if os.path.exists(out):
            with open(out) as f:
                digest = f.read()
        return codes, text, digest

    def test_a_job_resumes_each_ranks_shards_from_a_shared_snapshot_dir(self):
        codes, text, clean = self.job("sharded")
        self.assertEqual(codes, [0, 0], text)
        self.assertIsNotNone(clean, text)

        # Another job, in the same folder, runs to its end: its later steps are never this job's.
        codes, text, _ = self.job("another", ["--snapshot-dir", self.snapshots])
        self.assertEqual(codes, [0, 0], text)

        codes, text, _ = self.job("sharded", ["--snapshot-dir", self.snapshots],
                                  ["--crash-at", "4"])
        self.assertNotEqual(codes, [0, 0], text)
        self.assertIn("rank 1 fails after its save of step 4", text)
        for rank in range(4):  # each rank's folder of this job, on the shared disk
            folder = os.path.join(self.snapshots, "sharded", f"rank_{rank}")
            self.assertTrue(os.path.isdir(folder) and os.listdir(folder), text)

        codes, text, resumed = self.job("sharded", ["--snapshot-dir", self.snapshots],
                                        ["--mmap"])
        self.assertEqual(codes, [0, 0], text)
        loads = dict(re.findall(r"rank (\d) restart 0 loads step (\d+): model \['DTensor'\], "
                                r"moments \['DTensor'\]", text))
        self.assertEqual(sorted(loads), ["0", "1", "2", "3"], text)
        steps = set(loads.values())
        self.assertEqual(len(steps), 1, "the ranks resumed at different steps\n" + text)
        step = int(steps.pop())
        self.assertLessEqual(step, 4, text)
        self.assertIn("holds this job's snapshots from an earlier run (4 ranks", text)
        for rank in range(4):
            host = HOSTS[rank // 2]
            # Its own folder on the shared disk, saved by its own host's agent in the failed run.
            self.assertRegex(text, rf"rank {rank} \(local rank {rank % 2}\) resumes from step "
                                   rf"{step} \(job 'sharded', saved by {host}/\S+ in generation 0, "
                                   rf"world size 4\) from --snapshot-dir "
                                   rf"{re.escape(self.snapshots)}/sharded/rank_{rank}\n")
            self.assertIn(f"rank {rank} replicated load gives its own shards: True", text)
        self.assertNotIn("another", text)
        self.assertEqual(resumed, clean, "the resumed job's weights differ\n" + text)


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--launcher", required=True)
    parser.add_argument("--named-hosts", required=True)
    parser.add_argument("--python", default=sys.executable)
    ARGS, rest = parser.parse_known_args()
    ARGS.launcher = os.path.abspath(ARGS.launcher)
    probe = subprocess.run([ARGS.python, "-c", "from torch.distributed.fsdp import fully_shard; "
                            "from torch.distributed.tensor import DTensor"], capture_output=True)
    if probe.returncode != 0:
        print(f"SKIP: {ARGS.python} has no torch 2.x with FSDP2")
        sys.exit(SKIP)
    why = unavailable(ARGS.named_hosts)
    if why:
        print(f"SKIP: {why}")
        sys.exit(SKIP)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
