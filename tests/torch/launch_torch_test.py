"""PyTorch workers (Debian's torch 1.13 by default) under dist-launch: a DDP job, the same job
recovering from an injected crash with --max-restarts 1, and an elastic job that scales from one node
to two (a new round with the same restart count: the store must be clean for torch's workers).

    python3 launch_torch_test.py --launcher build/bin/dist-launch [--python /usr/bin/python3]
Exits 77 (skip) when that interpreter has no torch.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import launcher_test_main

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "torch", "ddp_train.py")
ARGS = None


class TorchUnderDistLaunch(unittest.TestCase):
    def launch(self, *extra, script_args=()):
        out_dir = tempfile.mkdtemp(prefix="dist-launch-torch-")
        self.addCleanup(shutil.rmtree, out_dir, ignore_errors=True)
        env = dict(os.environ, PYTHON_EXEC=ARGS.python, GLOO_SOCKET_IFNAME="lo")
        cmd = [ARGS.launcher, "--nproc-per-node", "2", *extra, EXAMPLE,
               "--out", out_dir, *script_args]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        return proc, out_dir

    def done_attempts(self, out_dir):
        attempts = {}
        for rank in range(2):
            path = os.path.join(out_dir, f"done_{rank}")
            if os.path.exists(path):
                with open(path) as f:
                    attempts[rank] = int(f.read())
        return attempts

    def test_ddp_job_succeeds(self):
        proc, out_dir = self.launch()
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(self.done_attempts(out_dir), {0: 0, 1: 0})
        self.assertIn("[default0]:rank 0/2 attempt 0", proc.stdout)
        self.assertIn("[default1]:rank 1/2 attempt 0", proc.stdout)
        self.assertIn("weights in sync", proc.stdout)

    def test_crash_on_attempt_zero_recovers_with_one_restart(self):
        proc, out_dir = self.launch("--max-restarts", "1", script_args=["--crash-on-attempt", "0"])
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(self.done_attempts(out_dir), {0: 1, 1: 1})
        self.assertIn("restarting the worker group (restart 1 of 1)", proc.stderr)

    def test_crash_without_restarts_reports_the_python_exception(self):
        proc, _ = self.launch(script_args=["--crash-on-attempt", "0"])
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertIn("ddp_train.py FAILED", proc.stderr)
        self.assertIn("rank      : 1 (local_rank: 1)", proc.stderr)
        self.assertIn("injected failure on attempt 0", proc.stderr)
        self.assertIn("Traceback", proc.stderr)

    def test_elastic_job_scales_up_and_torch_workers_form_the_larger_group(self):
        out_dir = tempfile.mkdtemp(prefix="dist-launch-torch-")
        self.addCleanup(shutil.rmtree, out_dir, ignore_errors=True)
        port = launcher_test_main.free_port()
        env = dict(os.environ, PYTHON_EXEC=ARGS.python, GLOO_SOCKET_IFNAME="lo")
        cmd = [ARGS.launcher, "--nproc-per-node", "2", "--nnodes", "1:2",
               "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "torch-elastic",
               "--rdzv-conf", "last_call_timeout=1", EXAMPLE, "--out", out_dir,
               "--wait-for-world", "4"]
        logs = [tempfile.TemporaryFile("w+") for _ in range(2)]
        first = subprocess.Popen(cmd, env=env, stdout=logs[0], stderr=subprocess.STDOUT, text=True)
        procs = [first]
        try:
            deadline = time.time() + 120  # the first node runs alone: a world of 2, waiting
            while time.time() < deadline:
                logs[0].seek(0)
                if "rank 1/2 attempt 0: process group up" in logs[0].read():
                    break
                time.sleep(0.1)
            procs.append(subprocess.Popen(cmd, env=env, stdout=logs[1],
                                          stderr=subprocess.STDOUT, text=True))
            codes = [p.wait(timeout=180) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for log in logs:
                self.addCleanup(log.close)
        outputs = []
        for log in logs:
            log.seek(0)
            outputs.append(log.read())
        self.assertEqual(codes, [0, 0], "\n".join(outputs))
        self.assertIn("rank 1/2 attempt 0: process group up", outputs[0])
        self.assertIn("a new node is waiting to join", outputs[0])
        # The larger round keeps restart count 0: torch keys its store by it, so only a cleaned
        # store lets the four workers form their group.
        done = {}
        for r in range(4):
            with open(os.path.join(out_dir, f"done_{r}")) as f:
                done[r] = f.read().strip()
        self.assertEqual(done, {0: "0", 1: "0", 2: "0", 3: "0"})
        self.assertIn("rank 3/4 attempt 0", "".join(outputs))


if __name__ == "__main__":
    launcher_test_main.main(sys.modules[__name__])
