"""A rank stopped for its user under dist-launch, as under torchrun: the workers' stdin is the
launcher's (a terminal or a pipe), a worker that reads its terminal is not stopped by SIGTTIN (each
worker has a session of its own, as torchrun's have: the terminal is not its controlling one), a
prompt without a newline ("(Pdb) ", "x? ") reaches the console before it is answered, and a rank
held at a prompt past the automatic hang timeout is reported, never ended
(tests/torch/debugger_worker.py).

    python3 debugger_test.py --launcher build/bin/dist-launch [--python P] [--require-major N]
Exits 77 (skip) when P has no torch.
"""
import os
import select
import subprocess
import sys
import time
import unittest

import launcher_test_main

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "debugger_worker.py")
ARGS = None

# Runs its arguments as the foreground job of the terminal on its stdin (a session of its own
# that the terminal controls), as a shell runs a command.
FOREGROUND = ("import fcntl, os, sys, termios; os.setsid(); fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
              "os.execvp(sys.argv[1], sys.argv[1:])")


def syscalls_readable():
    """Whether a child's /proc/<pid>/syscall can be read here (the agent reads its workers')."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        with open(f"/proc/{child.pid}/syscall") as f:
            return bool(f.read().strip())
    except OSError:
        return False
    finally:
        child.kill()
        child.wait()


class Console:
    """What a process wrote to the terminal or pipe `fd`, read as it comes."""

    def __init__(self, proc, fd):
        self.proc = proc
        self.fd = fd
        self.text = ""

    def wait_for(self, token, timeout=120):
        deadline = time.monotonic() + timeout
        while token not in self.text and time.monotonic() < deadline:
            if select.select([self.fd], [], [], 0.5)[0]:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:  # EIO: the terminal's last process closed it
                    data = b""
                if not data:
                    break
                self.text += data.decode(errors="replace")
        if token not in self.text:
            raise AssertionError(f"{token!r} never came; so far:\n{self.text}")

    def finish(self, timeout=120):
        """The exit code, once everything written was read."""
        try:
            self.wait_for("\0never\0", timeout)
        except AssertionError:
            pass
        return self.proc.wait(timeout=30)


class Debugger(unittest.TestCase):
    def launch(self, stop, *flags, terminal=True):
        env = dict(os.environ, PYTHON_EXEC=ARGS.python, GLOO_SOCKET_IFNAME="lo")
        cmd = [ARGS.launcher, "--nproc-per-node", "2", *flags, WORKER, "--stop", stop]
        if terminal:
            ours, theirs = os.openpty()
            proc = subprocess.Popen([sys.executable, "-c", FOREGROUND, *cmd], stdin=theirs,
                                    stdout=theirs, stderr=theirs, env=env)
            os.close(theirs)
            write_end = ours
        else:
            ours, out = os.pipe()
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out,
                                    stderr=subprocess.STDOUT, env=env)
            os.close(out)
            write_end = proc.stdin.fileno()

        def end():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdin:
                proc.stdin.close()
            os.close(ours)
        self.addCleanup(end)
        return Console(proc, ours), (lambda text: os.write(write_end, text.encode()))

    def check_done(self, console, x):
        code = console.finish()
        self.assertEqual(code, 0, console.text)
        self.assertIn(f"rank 0 done x={x} weight=", console.text)
        self.assertIn("rank 1 done x=41 weight=", console.text)
        weights = {line.split("weight=")[1].split()[0] for line in console.text.splitlines()
                   if " done x=" in line}
        self.assertEqual(len(weights), 1, console.text)  # the replicas agree
        self.assertNotIn("stopped (SIGSTOP", console.text)
        self.assertNotIn("SIGKILL", console.text)

    def debug(self, console, type_in):
        console.wait_for("(Pdb) ")  # the prompt, before its line ends
        type_in("p x * 1000 + 1\n")
        console.wait_for("41001")
        type_in("x = 7\nc\n")

    def test_breakpoint_at_a_terminal(self):
        console, type_in = self.launch("breakpoint")
        self.debug(console, type_in)
        self.check_done(console, 7)

    def test_breakpoint_in_a_warm_worker(self):
        console, type_in = self.launch("breakpoint", "--warm-restart")
        self.debug(console, type_in)
        self.check_done(console, 7)

    def test_torch_distributed_breakpoint(self):
        major, minor = (int(v) for v in ARGS.version.split("+")[0].split(".")[:2])
        if (major, minor) < (2, 2):
            self.skipTest(f"torch {ARGS.version} has no torch.distributed.breakpoint")
        console, type_in = self.launch("dist-breakpoint")
        console.wait_for("(Pdb) ")
        type_in("p 41 * 1000 + 1\n")
        console.wait_for("41001")
        type_in("c\n")
        self.check_done(console, 41)

    def test_a_prompt_answered_through_a_pipe(self):
        console, type_in = self.launch("input", terminal=False)
        console.wait_for("x? ")  # no newline after it: shown once nothing more came
        type_in("7\n")
        self.check_done(console, 7)

    def test_a_rank_held_at_its_prompt_past_the_hang_timeout_is_reported_not_ended(self):
        console, type_in = self.launch("breakpoint")
        console.wait_for("(Pdb) ")
        console.wait_for("stacks: ", timeout=180)  # the report's last line
        self.assertIn("hang suspected", console.text)
        self.assertIn("nothing is ended", console.text)
        rank_0 = [line for line in console.text.splitlines() if "rank 0 (local rank 0" in line]
        self.assertEqual(len(rank_0), 1, console.text)
        # where: the script's line, in pdb's loop
        self.assertRegex(rank_0[0], r"at \S+debugger_worker\.py:\d+ in \w+, in the standard "
                         r"library \(cmdloop, ")
        # The agent's lines (stderr, the same terminal) start on a line of their own.
        self.assertNotIn("(Pdb) [dist-launch]", console.text)
        if syscalls_readable():  # (what the rank waits in: not under Yama's ptrace_scope 2, 3)
            self.assertIn("the others wait for rank 0, which waits for input (a debugger's "
                          "prompt", console.text)
            self.assertIn("waiting for input at its terminal (/dev/pts/", rank_0[0])
        type_in("x = 7\nc\n")
        self.check_done(console, 7)


if __name__ == "__main__":
    launcher_test_main.main(sys.modules[__name__])
