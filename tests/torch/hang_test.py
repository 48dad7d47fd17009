"""Hangs and stragglers in unmodified torch DDP jobs (tests/torch/hang_worker.py) under
dist-launch, found without a line of our code in the script. With an explicit --hang-timeout each
injected hang (a sleep, a C call deadlocked with the GIL held, a busy loop, SIGSTOP, a blocked FIFO
read, a skipped collective) is found, the report names rank 1 and the line it hung on, the hung
rank is killed and the group restarts. With the defaults (--hang-timeout auto) a hang is reported
within 90 s, with its rank, line and what it is doing, and nothing is ended; a proven one (a
stopped rank, a skipped collective: collectives that can never match) is ended within 90 s. A
healthy job is left alone; a slower rank is flagged a straggler; --no-step-hook loads nothing; an
explicit dist_launch.progress.step() takes over from the optimizer hook.

    python3 hang_test.py --launcher build/bin/dist-launch --python /usr/bin/python3
Exits 77 (skip) when that interpreter has no torch (or not --require-major).
"""
import ctypes
import json
import mmap
import os
import re
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

import launcher_test_main

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "hang_worker.py")
REPO_PYTHON = os.path.join(HERE, "..", "..", "python")
ARGS = None
STACKS_ASKED_OFFSET = 728  # worker_contract.h: heartbeat_slot::Slot::stacks_asked
PENDING_SINCE_OFFSET = 56  # ... pending_since_ns
SETUP_SINCE_OFFSET = 736  # ... setup_since_ns


LIBC = ctypes.CDLL(None, use_errno=True)  # tgkill: the agent signals a main thread, not a process


def main_thread_run(pid):
    """(state, ns on a CPU, when) of a process's main thread, as the agent reads it
    (process_activity.cc: read_thread_run); None when it is gone."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
            on_cpu = int(f.read().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return state, on_cpu, time.monotonic_ns()


def main_thread_waited_in_kernel(before, now):
    """The agent's rule for a stack signal to a Python worker (thread_waited_in_kernel): at most
    1% of the time since the ask on a CPU, and waiting in the kernel now."""
    return now[0] in "SD" and 0 <= now[1] - before[1] <= (now[2] - before[2]) / 100


def fault_line(name):
    """The line of hang_worker.py marked '# FAULT: name'."""
    with open(WORKER) as f:
        for number, line in enumerate(f, 1):
            if line.rstrip().endswith(f"# FAULT: {name}"):
                return number
    raise AssertionError(f"no '# FAULT: {name}' in {WORKER}")


class Hangs(unittest.TestCase):
    def command(self, *extra, script_args=(), env_extra=None, nproc=2):
        self.dir = tempfile.mkdtemp(prefix="dist-hang-test-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        env = dict(os.environ, PYTHON_EXEC=ARGS.python, GLOO_SOCKET_IFNAME="lo")
        env.update(env_extra or {})
        self.events = os.path.join(self.dir, "events.jsonl")
        cmd = [ARGS.launcher, "--nproc-per-node", str(nproc), "--event-log", self.events,
               "--log-dir", os.path.join(self.dir, "logs"), *extra, WORKER, *script_args]
        return cmd, env

    def launch(self, *extra, script_args=(), timeout=240, env_extra=None, nproc=2):
        cmd, env = self.command(*extra, script_args=script_args, env_extra=env_extra, nproc=nproc)
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)

    def launch_until(self, pattern, *extra, script_args=(), timeout=150):
        """Starts a job, reads its log until `pattern` (a regex) appears, then stops it (SIGTERM,
        as Ctrl-C would) and waits for it. Returns (seconds until the line, the whole log, the
        launcher's exit code); fails when the line never came within `timeout`."""
        cmd, env = self.command(*extra, script_args=script_args)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        start = time.monotonic()
        log, found = b"", None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stderr, selectors.EVENT_READ)
            while found is None and time.monotonic() - start < timeout:
                if not sel.select(timeout=1):
                    continue
                chunk = os.read(proc.stderr.fileno(), 65536)
                if not chunk:
                    break
                log += chunk
                if re.search(pattern, log.decode(errors="replace"), re.M):
                    found = time.monotonic() - start
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=60)
        log = (log + rest).decode(errors="replace")
        self.assertIsNotNone(found, f"no line matching {pattern!r} in {timeout} s:\n{log}")
        return found, log, proc.returncode

    def read_events(self, name):
        with open(self.events) as f:
            return [e for e in map(json.loads, f) if e["event"] == name]

    def hang_lines(self, stderr):
        """The report's lines: {rank: where} and the hung ranks."""
        where, hung = {}, set()
        for m in re.finditer(r"^  rank (\d+) \(local rank \d+, pid \d+\): (.*?)(   <- hung)?$",
                             stderr, re.M):
            where[int(m.group(1))] = m.group(2)
            if m.group(3):
                hung.add(int(m.group(1)))
        return where, hung

    def assert_found(self, fault, expected_where, *extra, nproc=2,
                     reason=r"no progress for [0-9.]+ s \(hang timeout 5\.0 s\)"):
        proc = self.launch("--max-restarts", "1", "--hang-timeout", "5", *extra,
                           script_args=["--fault", fault], nproc=nproc)
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 0, out)
        self.assertRegex(proc.stderr, r"hang on \S+: " + reason)
        where, hung = self.hang_lines(proc.stderr)
        self.assertEqual(hung, {1}, out)
        self.assertIn(expected_where, where[1], out)
        self.assertIn("restarting the worker group (restart 1 of 1)", proc.stderr)
        self.assertIn("rank 0 steps 40", proc.stdout)
        self.assertIn("rank 1 steps 40", proc.stdout)
        # The event log: the investigation's finding, then rank 1 killed for it.
        (hang,) = self.read_events("hang")
        self.assertEqual([r["rank"] for r in hang["ranks"] if r["cause"]], [1])
        exits = [e for e in self.read_events("worker_exit") if e["round"] == 0 and e["rank"] == 1]
        self.assertEqual(exits[0]["signal"], "SIGKILL")
        self.assertTrue(exits[0]["reason"].startswith("hung: "), exits[0])
        # The stacks it dumped are kept.
        stacks = os.path.join(self.dir, "logs")
        found = [os.path.join(d, f) for d, _, fs in os.walk(stacks) for f in fs if f == "stacks.txt"]
        self.assertTrue(found, "no stacks.txt under the log dir")
        return proc

    def test_a_sleep(self):
        self.assert_found("sleep", f"hang_worker.py:{fault_line('sleep')} in stall_sleep")

    def test_a_c_call_deadlocked_with_the_gil_held(self):
        self.assert_found("gil", f"hang_worker.py:{fault_line('gil')} in stall_gil")

    def test_a_busy_loop(self):
        self.assert_found("spin", "in stall_spin")

    def test_a_stopped_process(self):
        # A stopped process is proof once it stood 3 s: before the hang timeout (5 s here).
        self.assert_found("sigstop", "stopped (state T: SIGSTOP)",
                          reason=r"a rank held stopped for [0-9.]+ s \(proof after 3 s\)")

    def test_a_blocked_fifo_read(self):
        self.assert_found("io", f"hang_worker.py:{fault_line('io')} in stall_io")

    def test_a_skipped_collective(self):
        # Proven: ranks 0 and 2 wait in the loss all_reduce rank 1 skipped (its metrics group, 1),
        # rank 1 in its next backward's, of the default group (0), which they never reach. Three
        # ranks: the two that agree tell which one went past.
        proc = self.assert_found("skip", "waiting in all_reduce #", nproc=3)
        where, _ = self.hang_lines(proc.stderr)
        self.assertRegex(where[0], r"^waiting in all_reduce #\d+ of process group 1 for [0-9.]+ s")
        self.assertRegex(where[1], r"^waiting in all_reduce #\d+ of process group 0 for [0-9.]+ s")
        self.assertIn("collectives that can never match", proc.stderr)
        self.assertIn("rank 1 went past a collective the others wait in", proc.stderr)

    def test_a_warm_worker_is_hooked_too(self):
        # Forked from the zygote, which imported torch before any worker: the hook counts its steps
        # and its stacks still name the line.
        proc = self.assert_found("sleep", f"hang_worker.py:{fault_line('sleep')} in stall_sleep",
                                 "--warm-restart")
        self.assertIn("rank 0 steps 40 hook 40 ", proc.stdout)

    def test_by_default_a_hang_is_reported_within_90_seconds_and_nothing_is_ended(self):
        # Rank 1 sleeps forever at step 10 while rank 0 waits for it: seen (its rank, its line,
        # what it does), not proven (a sleep may end), so nothing is killed.
        line = fault_line("sleep")
        seconds, log, _ = self.launch_until(
            r"^  rank 1 \(local rank 1, pid \d+\): .*hang_worker\.py:%d in stall_sleep.*idle" % line,
            script_args=["--fault", "sleep"])
        self.assertLessEqual(seconds, 90, log)
        self.assertRegex(log, r"hang suspected on \S+: no progress for [0-9.]+ s \(hang timeout "
                              r"30\.0 s\); suspected hang: the others wait for rank 1, which does "
                              r"nothing")
        self.assertNotIn("SIGKILL", log)
        (suspected,) = self.read_events("hang_suspected")
        self.assertEqual([r["rank"] for r in suspected["ranks"] if r["suspect"]], [1])
        self.assertEqual([r["rank"] for r in suspected["ranks"] if r["cause"]], [])
        self.assertEqual(self.read_events("hang"), [])
        self.assertEqual([e for e in self.read_events("worker_exit") if e["reason"]], [])

    def assert_ended_by_default(self, fault, proof, nproc=2):
        proc = self.launch("--max-restarts", "1", script_args=["--fault", fault], timeout=300,
                           nproc=nproc)
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 0, out)
        self.assertIn(proof, proc.stderr)
        _, hung = self.hang_lines(proc.stderr)
        self.assertEqual(hung, {1}, out)
        (hang,) = self.read_events("hang")
        self.assertEqual([r["rank"] for r in hang["ranks"] if r["cause"]], [1])
        self.assertIn(proof, hang["proof"])
        # From rank 1's last progress to its kill, within 90 s.
        killed = [e for e in self.read_events("worker_exit") if e["round"] == 0 and e["rank"] == 1]
        self.assertEqual(killed[0]["signal"], "SIGKILL")
        self.assertLessEqual(hang["silent_ms"], 90_000)
        self.assertIn("restarting the worker group (restart 1 of 1)", proc.stderr)
        self.assertIn("rank 1 steps 40", proc.stdout)

    def test_by_default_a_skipped_collective_is_proven_and_ended_within_90_seconds(self):
        self.assert_ended_by_default("skip", "collectives that can never match", nproc=3)

    def test_by_default_a_stopped_rank_is_proven_and_ended_within_90_seconds(self):
        self.assert_ended_by_default("sigstop", "rank 1 stopped (SIGSTOP or SIGTSTP)")

    def test_a_healthy_job_is_left_alone(self):
        proc = self.launch("--hang-timeout", "3", script_args=["--seconds", "12"])
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 0, out)
        self.assertNotIn("looking at where every rank is", proc.stderr)
        self.assertNotIn("straggler", proc.stderr)
        self.assertEqual(self.read_events("hang"), [])

    def test_a_healthy_job_lives_through_many_asks_for_its_stacks(self):
        # Every look at a suspected hang asks each rank for its stacks; a false alarm must cost a
        # healthy rank nothing. For 10 s, every 10 ms, each of 3 DDP ranks is asked in its slot
        # (its sampler answers with every thread's) and signalled the way the agent signals a
        # rank that cannot answer: at its main thread, when that thread has waited in the kernel
        # since the ask (main_thread_waited_in_kernel). A signal handler that dumped every thread
        # crashed such ranks within seconds (torch's autograd and DDP threads come and go at
        # every step); faulthandler's dump of a main thread caught running Python code crashed
        # 3 runs in 39 (CPython 3.11: a frame being pushed or popped; SIGSEGV). About 1500 are
        # signalled, 5000-8000 withheld.
        cmd, env = self.command(script_args=["--seconds", "10", "--work", "0.01"], nproc=3)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        try:
            # From each worker's start on (the stack signal is caught before torch is imported):
            # process groups and DDP coming up start threads too.
            workers = []
            while len(workers) < 3 and proc.poll() is None:
                workers = [w for w in self.workers_of_this_test() if self.catches(w)]
                time.sleep(0.01)
            slots = [(w, self.map_slot(w)) for w in workers]
            # Until each has exited: a signal after the interpreter's finalization must not end a
            # worker that succeeded either.
            signals = withheld = 0
            asked_at = {}
            end = time.monotonic() + 90
            while slots and time.monotonic() < end:
                for w, slot in list(slots):
                    before = asked_at.get(w["pid"])
                    now = main_thread_run(w["pid"])
                    if now is None:
                        slots.remove((w, slot))
                        continue
                    asked, = struct.unpack_from("=I", slot, STACKS_ASKED_OFFSET)
                    struct.pack_into("=I", slot, STACKS_ASKED_OFFSET, asked + 1)
                    asked_at[w["pid"]] = now
                    if before is None or not main_thread_waited_in_kernel(before, now):
                        withheld += 1
                        continue
                    if LIBC.tgkill(w["pid"], w["pid"], int(w["env"]["DIST_STACK_SIGNAL"])) == 0:
                        signals += 1
                    else:
                        slots.remove((w, slot))
                time.sleep(0.005)
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        self.assertEqual(proc.returncode, 0, f"after {signals} signals:\n{out}{err}")
        self.assertGreater(signals, 300, f"{withheld} withheld")
        for w in workers:
            with open(w["env"]["DIST_STACK_FILE"]) as f:
                text = f.read()
            # The sampler's answers: every thread, the main thread last, in the training loop.
            answers = text.count("Thread 0x")
            self.assertGreater(answers, 5, text[-2000:])
            self.assertRegex(text, r'Thread 0x[0-9a-f]+ \(most recent call first\):\n(  File .*\n)*'
                                   r'  File ".*hang_worker\.py", line \d+ in <module>\n\n')
            # The signal's: the interrupted thread's own stack, nothing of the others'.
            self.assertIn("Stack (most recent call first):", text)
        self.assertEqual(self.read_events("hang"), [])

    def workers_of_this_test(self):
        """The running workers of this test's job: [{"pid", "env"}], by their stack file."""
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = dict(v.split("=", 1) for v in f.read().decode(errors="replace")
                               .split("\0") if "=" in v)
            except OSError:
                continue
            if env.get("DIST_STACK_FILE", "").startswith(self.dir) and "DIST_HEARTBEAT_FD" in env:
                found.append({"pid": int(pid), "env": env})
        return found

    @staticmethod
    def catches(worker):
        """Whether the worker catches its stack signal yet (/proc/PID/status SigCgt)."""
        try:
            with open(f"/proc/{worker['pid']}/status") as f:
                mask = int(next(line for line in f if line.startswith("SigCgt:")).split()[1], 16)
        except (OSError, StopIteration):
            return False
        return bool(mask >> (int(worker["env"]["DIST_STACK_SIGNAL"]) - 1) & 1)

    def map_slot(self, worker):
        """The worker's slot (worker_contract.h), mapped through its descriptor."""
        fd = os.open(f"/proc/{worker['pid']}/fd/{worker['env']['DIST_HEARTBEAT_FD']}", os.O_RDWR)
        try:
            area = mmap.mmap(fd, 4096)
        finally:
            os.close(fd)
        self.addCleanup(area.close)
        return area

    def test_a_rank_waiting_for_its_peers_in_init_process_group_is_in_its_groups_set_up(self):
        # Rank 1 joins late: rank 0 waits for it in init_process_group, which its slot says as a
        # wait in its group's set-up (the agents publish it: a node whose workers are all held
        # stopped is waited on), not as a collective; once the group is built, no more.
        go = os.path.join(tempfile.mkdtemp(prefix="dist-hang-go-"), "go")
        self.addCleanup(shutil.rmtree, os.path.dirname(go), ignore_errors=True)
        cmd, env = self.command(script_args=["--start-after", go, "--steps", "30"])
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        try:
            def field(area, offset):
                return struct.unpack_from("<Q", area, offset)[0]

            rank0, deadline = None, time.monotonic() + 120
            while time.monotonic() < deadline:
                found = [w for w in self.workers_of_this_test() if w["env"].get("RANK") == "0"]
                if found:
                    area = self.map_slot(found[0])
                    if field(area, SETUP_SINCE_OFFSET) != 0:
                        rank0 = area
                        break
                time.sleep(0.05)
            self.assertIsNotNone(rank0, "rank 0's slot never said it waits in its group's set-up")
            since = field(rank0, SETUP_SINCE_OFFSET)
            self.assertLessEqual(since, time.monotonic_ns())
            self.assertEqual(field(rank0, PENDING_SINCE_OFFSET), 0, "taken for a collective")
            with open(go, "w"):
                pass
            out, err = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        self.assertEqual(proc.returncode, 0, err)
        self.assertIn("rank 0 steps 30", out)
        self.assertEqual(field(rank0, SETUP_SINCE_OFFSET), 0, "the set-up is over")
        self.assertEqual(self.read_events("hang"), [])

    def test_a_slower_rank_is_flagged_a_straggler(self):
        proc = self.launch(script_args=["--fault", "slow", "--slow-factor", "1.4", "--work",
                                        "0.05", "--seconds", "25"])
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 0, out)
        self.assertRegex(proc.stderr, r"rank 1 \(local rank 1, pid \d+\) is a straggler: its work "
                                      r"per step is 1\.[2-6]\dx the other ranks' median")
        self.assertNotRegex(proc.stderr, r"rank 0 \(local rank 0, pid \d+\) is a straggler")
        self.assertIn("rank 1 was a straggler", proc.stderr)
        flagged = [e for e in self.read_events("straggler") if e["straggler"]]
        self.assertEqual({e["rank"] for e in flagged}, {1})
        self.assertEqual(self.read_events("job_end")[0]["stragglers"], [1])

    def test_the_optimizer_hook_counts_every_step_and_no_step_hook_loads_nothing(self):
        proc = self.launch(script_args=["--steps", "25"])
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("rank 0 steps 25 hook 25 ", proc.stdout)
        self.assertIn("rank 1 steps 25 hook 25 ", proc.stdout)
        proc = self.launch("--no-step-hook", script_args=["--steps", "25"])
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("rank 0 steps 25 hook off", proc.stdout)
        self.assertIn("rank 1 steps 25 hook off", proc.stdout)

    def test_an_explicit_step_takes_over_from_the_optimizer_hook(self):
        path = os.pathsep.join(p for p in (REPO_PYTHON, os.environ.get("PYTHONPATH")) if p)
        proc = self.launch(script_args=["--steps", "25", "--explicit-step"],
                           env_extra={"PYTHONPATH": path})
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        # The hook counted the first optimizer step, before the script's first step() call; from
        # then on only the script's two a step count.
        self.assertIn("rank 0 steps 25 hook 51 ", proc.stdout)
        self.assertIn("rank 1 steps 25 hook 51 ", proc.stdout)


if __name__ == "__main__":
    launcher_test_main.main(sys.modules[__name__])
