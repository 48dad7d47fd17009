"""torch's own FileTimerClient (torch.distributed.elastic.timer) against dist-launch's file timer
server (TORCHELASTIC_ENABLE_FILE_TIMER=1): a worker whose timer expires is killed, reported with
the timer's scope, and the group restarts.

    python3 file_timer_test.py --launcher build/bin/dist-launch --python /path/to/python
Exits 77 (skip) when that interpreter has no torch (or not --require-major).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import launcher_test_main

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "file_timer_worker.py")
ARGS = None


class TorchFileTimer(unittest.TestCase):
    def launch(self, *extra, script_args=(), env_extra=None):
        env = dict(os.environ, PYTHON_EXEC=ARGS.python, TORCHELASTIC_ENABLE_FILE_TIMER="1")
        env.pop("TORCHELASTIC_TIMER_FILE", None)
        env.update(env_extra or {})
        cmd = [ARGS.launcher, "--nproc-per-node", "2", *extra, WORKER, *script_args]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)

    def test_an_expired_timer_restarts_the_group(self):
        proc = self.launch("--max-restarts", "1", script_args=["--hang-on-attempt", "0"])
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("timer expired (scope 'train_step')", proc.stderr)
        self.assertNotIn("scope 'released'", proc.stderr)
        self.assertIn("restarting the worker group (restart 1 of 1)", proc.stderr)
        # The agent chose the pipe, as torch's does: <temporary dir>/watchdog_timer_<id>.
        self.assertRegex(proc.stdout, r"attempt 1 done, timers at \S*/watchdog_timer_\w+")
        pipe = proc.stdout.split("timers at ")[1].split()[0]
        self.assertFalse(os.path.exists(pipe), "the pipe is removed when the agent ends")

    def test_the_report_names_the_timer(self):
        pipe_dir = tempfile.mkdtemp(prefix="dist-file-timer-")
        self.addCleanup(shutil.rmtree, pipe_dir, ignore_errors=True)
        pipe = os.path.join(pipe_dir, "timers")
        proc = self.launch(script_args=["--hang-on-attempt", "0"],
                           env_extra={"TORCHELASTIC_TIMER_FILE": pipe})
        self.assertEqual(proc.returncode, 128 + 9, proc.stdout + proc.stderr)
        self.assertIn("file_timer_worker.py FAILED", proc.stderr)
        self.assertIn("message   : timer expired (scope 'train_step')", proc.stderr)
        self.assertIn("(SIGKILL)", proc.stderr)
        self.assertIn(f"serving torch's file timer at {pipe}", proc.stderr)


if __name__ == "__main__":
    launcher_test_main.main(sys.modules[__name__])
