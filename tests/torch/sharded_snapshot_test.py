#!/usr/bin/env python3
"""Sharded state in dist_launch.snapshot (issue 44, item 3): an FSDP2 job of two ranks (torch 2.x,
gloo, CPU) saves each rank's shards (DTensors: its parameters and Adam's moments) every step;
rank 1 fails after step 4's save, the group restarts and every rank loads its own shards back as
DTensors on the job's mesh. The job ends with the weights of the same job uninterrupted. The same
with FSDP1, whose sharded state dict holds ShardedTensors.

    python3 tests/torch/sharded_snapshot_test.py --launcher build/bin/dist-launch [--python python3]
Exits 77 (skip) when that interpreter has no torch 2.x with FSDP2.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "sharded_snapshot_worker.py")
ARGS = None


class ShardedSnapshots(unittest.TestCase):
    def run_job(self, out, flags, worker_flags=()):
        env = dict(os.environ, PYTHON_EXEC=ARGS.python, OMP_NUM_THREADS="1")
        proc = subprocess.run([ARGS.launcher, "--nproc-per-node", "2", "--snapshot-memory", "64M",
                               *flags, WORKER, "--steps", "8", "--out", out, *worker_flags],
                              capture_output=True, text=True, env=env, timeout=300)
        return proc.returncode, proc.stdout + proc.stderr

    def crash_and_resume(self, kind, worker_flags=(), crash_flags=()):
        """A clean run, then one whose rank 1 fails after step 4's save: the restarted group
        loads each rank's own shards (as `kind`: DTensor or ShardedTensor), not before
        init_process_group, and ends with the clean run's weights."""
        with tempfile.TemporaryDirectory() as d:
            clean, crashed = os.path.join(d, "clean"), os.path.join(d, "crashed")
            code, output = self.run_job(clean, [], worker_flags)
            self.assertEqual(code, 0, output)
            self.assertNotIn("loads step", output)
            code, output = self.run_job(crashed, ["--max-restarts", "1"],
                                        [*worker_flags, "--crash-at", "4", *crash_flags])
            self.assertEqual(code, 0, output)
            self.assertIn("rank 1 fails after its save of step 4", output)
            self.assertIn(f"before init_process_group: this snapshot holds {kind} shards", output)
            self.assertNotIn("loaded sharded state without a process group", output)
            for rank in (0, 1):
                self.assertIn(f"rank {rank} replicated load gives its own shards: True", output)
                self.assertRegex(output, rf"rank {rank} restart 1 loads step 4: model "
                                         rf"\['{kind}'\], moments \['{kind}'\]")
            with open(clean) as a, open(crashed) as b:
                self.assertEqual(a.read(), b.read(), "the resumed job's weights differ\n" + output)

    def test_views_and_every_kind_of_tensor_come_back_as_saved(self):
        # (a lazily conjugated view came back as its conjugate: its bytes are the value's before)
        probe = """if True:
            import torch
            from dist_launch import snapshot
            c = torch.randn(4, dtype=torch.complex64)
            saved = {"conj": c.conj(), "neg": c.conj().imag, "bool": torch.tensor([True, False]),
                     "bf16": torch.randn(3).bfloat16(), "empty": torch.zeros(0, 3),
                     "offset": torch.arange(10.)[3:7], "expanded": torch.ones(1, 3).expand(4, 3),
                     "transposed": torch.arange(6.).view(2, 3).t(),
                     "scalar": torch.tensor(3), "parameter": torch.nn.Parameter(torch.ones(2))}
            assert snapshot.save(1, saved)
            step, back = snapshot.load()
            for name, value in saved.items():
                same = torch.equal(value.resolve_conj().resolve_neg(), back[name])
                print(name, "as saved" if same else "DIFFERENT", flush=True)
        """
        with tempfile.TemporaryDirectory() as d:
            script = os.path.join(d, "probe.py")
            with open(script, "w") as f:
                f.write(probe)
            env = dict(os.environ, PYTHON_EXEC=ARGS.python, OMP_NUM_THREADS="1")
            proc = subprocess.run([ARGS.launcher, "--nproc-per-node", "1", "--snapshot-dir",
                                   os.path.join(d, "snapshots"), script],
                                  capture_output=True, text=True, env=env, timeout=120)
            output = proc.stdout + proc.stderr
            self.assertEqual(proc.returncode, 0, output)
            self.assertEqual(output.count(" as saved"), 10, output)
            self.assertNotIn("DIFFERENT", output)

    def test_an_fsdp2_job_resumes_from_its_shards_with_the_uninterrupted_weights(self):
        self.crash_and_resume("DTensor")

    def test_an_fsdp1_job_resumes_from_its_sharded_tensors_with_the_uninterrupted_weights(self):
        # FSDP1's sharded state dict (and its optimizer's) holds ShardedTensors: each rank's local
        # shards, with every rank's offsets; loaded mapped here.
        self.crash_and_resume("ShardedTensor", ["--fsdp1"], ["--mmap"])


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--launcher", required=True)
    parser.add_argument("--python", default=sys.executable)
    ARGS, rest = parser.parse_known_args()
    probe = subprocess.run([ARGS.python, "-c", "from torch.distributed.fsdp import fully_shard; "
                            "from torch.distributed.tensor import DTensor"], capture_output=True)
    if probe.returncode != 0:
        print(f"SKIP: {ARGS.python} has no torch 2.x with FSDP2")
        sys.exit(77)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
