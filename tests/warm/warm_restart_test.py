"""dist-launch --warm-restart and snapshots with real interpreters and real processes.

    python3 warm_restart_test.py --launcher build/bin/dist-launch --python /usr/bin/python3 \
        --suite workers|torch [--require-major 1|2] [unittest args]

workers: what a worker forked from the zygote is (compared with a cold one, field by field: argv,
__main__, sys.path, environment, signals, descriptors, process group...), -m, a function
entrypoint, a venv, exit codes and tracebacks, a worker that forks, SIGKILL of the agent, the
zygote dying between attempts, a zygote that cannot import, snapshots (a save torn by a crash,
the memory bound, --snapshot-dir, the stand-in dist_launch module), and the C++ SDK's snapshots in
examples/ddp_train (--ddp-train). Needs numpy only.
torch: a torch DDP job (gloo) restarted warm ends with the weights of an uninterrupted cold run,
with the error file in the report; the same job resuming from snapshots after a SIGKILL.
Exits 77 (skip) when the interpreter lacks numpy (workers) or torch of --require-major (torch).
"""
import argparse
import fcntl
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
PROBE = os.path.join(HERE, "probe.py")
DDP_EXAMPLE = os.path.join(SOURCE, "examples", "torch", "ddp_train.py")
TTFS_TRAIN = os.path.join(SOURCE, "bench", "ttfs_train.py")
sys.path.insert(0, os.path.join(SOURCE, "tests", "torch"))
from launcher_test_main import free_port, wait_for_listener  # noqa: E402

ARGS = None
JOB_TIMEOUT_S = 240
FORKED = re.compile(r"round (\d+): (\d+) of (\d+) workers forked from the zygote")
# The values that differ between any two runs of one job, cold or warm.
PER_RUN = {"MASTER_PORT", "DIST_LAUNCH_AGENT_ID", "TORCHELASTIC_ERROR_FILE"}
# The run directory (where the stand-in dist_launch package on PYTHONPATH lives) is per run too.
RUN_DIR = re.compile(r"/dist-launch-[A-Za-z0-9]+/")


def unrun(value):
    return RUN_DIR.sub("/dist-launch-<run>/", value)


def environment(**extra):
    env = dict(os.environ, PYTHON_EXEC=ARGS.python, GLOO_SOCKET_IFNAME="lo")
    for name in ("OMP_NUM_THREADS", "PYTHONPATH", "LOGLEVEL"):
        env.pop(name, None)
    env.update(extra)
    return env


def launch(*args, env=None, cwd=None, timeout=JOB_TIMEOUT_S, stdin=None):
    return subprocess.run([ARGS.launcher, *args], env=env or environment(), cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, stdin=stdin)


def worker_lines(text, rank=0):
    prefix = f"[default{rank}]:"
    return [line[len(prefix):] for line in text.splitlines() if line.startswith(prefix)]


def probes(proc):
    found = {}
    for rank in (0, 1):
        for line in worker_lines(proc.stdout, rank):
            if line.startswith("PROBE "):
                found[rank] = json.loads(line[len("PROBE "):])
    return found


def forked_rounds(proc):
    """{round: (workers forked, workers)} from the agent's lines."""
    return {int(m.group(1)): (int(m.group(2)), int(m.group(3)))
            for m in FORKED.finditer(proc.stderr or proc.stdout)}


def write(directory, name, code):
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(textwrap.dedent(code))
    return path


def wait_until(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


def marked_processes(agent_id):
    """Every process whose environment carries the job's marker."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                entries = f.read().split(b"\0")
        except OSError:
            continue
        for entry in entries:
            if entry.startswith(b"DIST_LAUNCH_AGENT_ID=") and \
                    agent_id.encode() in entry.split(b"=", 1)[1].split(b":"):
                found.append(int(pid))
    return found


class Temp(unittest.TestCase):
    def temp(self):
        d = tempfile.mkdtemp(prefix="dist-warm-test-")
        self.addCleanup(shutil.rmtree, d, ignore_errors=True)
        return d


class WarmWorkers(Temp):
    """No torch needed: the zygote preloads numpy, or nothing."""

    def compare(self, cold, warm, ranks=(0, 1)):
        for rank in ranks:
            c, w = dict(cold[rank]), dict(warm[rank])
            for state in (c, w):
                for key in ("env", "child_env"):
                    state[key] = {k: (unrun(v) if k not in PER_RUN else "<per run>")
                                  for k, v in state[key].items()}
                state["path"] = [unrun(entry) for entry in state["path"]]
                for key in ("random", "numpy_random", "torch_seed"):
                    state.pop(key)
                # A warm worker has exactly the descriptors the agent passes; a cold one, today,
                # also inherits one the agent leaves inheritable (its store's listening socket,
                # which asio opens without FD_CLOEXEC): not a difference to keep.
                state["fds"] = [fd for fd in state.pop("fds") if fd <= 2]
            self.assertEqual(w["fds"], [0, 1, 2])
            for key in c:
                self.assertEqual(c[key], w[key], f"rank {rank}: '{key}' differs cold/warm")
            self.assertEqual(w["env"], w["child_env"], "the C environ is os.environ")

    def run_probe(self, *target, warm, cwd=None, env=None):
        # Without the progress hook and its slot (their descriptors and the hook's directory on
        # sys.path are the worker's own, not the zygote's): tests/torch/hang_test.py checks the
        # hook in warm workers.
        flags = ["--no-step-hook", "--hang-timeout", "0"]
        flags += ["--warm-restart", "--preload", "numpy"] if warm else []
        # A long argument: the zygote's own command line is shorter than the workers'.
        # The workers' stdin is the launcher's, cold or warm (as torchrun's): a pipe of its own
        # (not seekable, as the zygote's /dev/null was).
        stdin, keyboard = os.pipe()
        os.close(keyboard)
        stdin_name = f"pipe:[{os.fstat(stdin).st_ino}]"
        try:
            proc = launch("--nproc-per-node", "2", *flags, *target, "an arg",
                          "--x=${local_rank}", "y" * 300, cwd=cwd, env=env, stdin=stdin)
        finally:
            os.close(stdin)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        if warm:
            self.assertEqual(forked_rounds(proc), {0: (2, 2)}, proc.stderr)
        else:
            self.assertEqual(forked_rounds(proc), {})
        found = probes(proc)
        self.assertEqual(set(found), {0, 1}, proc.stdout)
        for rank in (0, 1):
            self.assertEqual(found[rank]["stdin"], stdin_name)
            self.assertFalse(found[rank]["stdin_object"][6], "a pipe is not seekable")
            found[rank]["stdin"] = "<the launcher's>"  # (a file of this run's own)
        return found

    def test_a_warm_worker_is_what_a_cold_one_is(self):
        cold = self.run_probe(PROBE, warm=False)
        warm = self.run_probe(PROBE, warm=True)
        self.compare(cold, warm)
        self.assertEqual(warm[0]["argv"], [PROBE, "an arg", "--x=0", "y" * 300])
        self.assertEqual(warm[1]["argv"], [PROBE, "an arg", "--x=1", "y" * 300])
        self.assertEqual(warm[0]["path"][0], HERE)
        self.assertEqual(warm[0]["fds"], [0, 1, 2], "no descriptor but the agent's")
        self.assertTrue(warm[0]["pgid_is_pid"])
        self.assertFalse(warm[0]["same_session_as_parent"])  # a session of its own
        self.assertEqual(warm[0]["parent"], "dist-launch")
        self.assertEqual(warm[0]["pdeathsig"], signal.SIGKILL)
        self.assertEqual(warm[0]["cmdline"][1:], ["-u", PROBE, "an arg", "--x=0", "y" * 300])
        self.assertEqual(warm[0]["threads"], 1)
        # Fresh per worker, as in a fresh interpreter.
        self.assertNotEqual(warm[0]["random"], warm[1]["random"])
        self.assertNotEqual(warm[0]["numpy_random"], warm[1]["numpy_random"])

    def test_dash_m_module(self):
        cold = self.run_probe("-m", "probe", warm=False, cwd=HERE)
        warm = self.run_probe("-m", "probe", warm=True, cwd=HERE)
        self.compare(cold, warm)
        self.assertEqual(warm[0]["argv"], [PROBE, "an arg", "--x=0", "y" * 300])
        self.assertEqual(warm[0]["spec"], "probe")
        self.assertEqual(warm[0]["path"][0], HERE)

    def test_a_venv(self):
        venv = os.path.join(self.temp(), "venv")
        subprocess.run([ARGS.python, "-m", "venv", "--without-pip", "--system-site-packages",
                        venv], check=True, timeout=120)
        python = os.path.join(venv, "bin", "python")
        env = environment(PYTHON_EXEC=python)
        cold = self.run_probe(PROBE, warm=False, env=env)
        warm = self.run_probe(PROBE, warm=True, env=env)
        self.compare(cold, warm)
        self.assertEqual(os.path.realpath(warm[0]["prefix"]), os.path.realpath(venv))
        self.assertEqual(warm[0]["executable"], python)

    def test_an_interpreter_behind_a_wrapper_script(self):
        # As pyenv's shims are: the wrapper changes the environment, then runs the interpreter.
        d = self.temp()
        wrapper = write(d, "python-wrapper", f"""\
            #!/bin/sh
            export WRAPPED=yes
            export PATH="/wrapper/bin:$PATH"
            unset DIST_WARM_TEST_UNSET
            exec {ARGS.python} "$@"
        """)
        os.chmod(wrapper, 0o755)
        env = environment(PYTHON_EXEC=wrapper, DIST_WARM_TEST_UNSET="1")
        cold = self.run_probe(PROBE, warm=False, env=env)
        warm = self.run_probe(PROBE, warm=True, env=env)
        self.compare(cold, warm)
        self.assertEqual(warm[1]["env"]["WRAPPED"], "yes")
        self.assertIn("/wrapper/bin:", warm[1]["env"]["PATH"])
        self.assertNotIn("DIST_WARM_TEST_UNSET", warm[1]["env"])
        self.assertEqual(warm[1]["env"]["RANK"], "1")

    def test_a_function_entrypoint(self):
        d = self.temp()
        driver = write(d, "driver.py", f"""
            import os, sys
            sys.path.insert(0, {os.path.join(SOURCE, "python")!r})
            from dist_launch import LaunchConfig, launch

            def where(base):
                # numpy is in a warm worker before anything imported it: the zygote preloaded it
                return base + int(os.environ["RANK"]), "numpy" in sys.modules

            if __name__ == "__main__":
                config = LaunchConfig(nproc_per_node=2, warm_restart=True, preload=["numpy"])
                print("RESULT", sorted(launch(config, where, 10).items()), flush=True)
        """)
        env = environment(PATH=os.path.dirname(ARGS.launcher) + os.pathsep + os.environ["PATH"])
        proc = subprocess.run([ARGS.python, driver], env=env, capture_output=True, text=True,
                              timeout=JOB_TIMEOUT_S)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("RESULT [(0, (10, True)), (1, (11, True))]", proc.stdout)
        self.assertIn("round 0: 2 of 2 workers forked from the zygote", proc.stderr)

    def test_redirects_and_tee_write_a_warm_workers_logs(self):
        d = self.temp()
        script = write(d, "talk.py", """
            import sys
            print("to stdout", flush=True)
            print("to stderr", file=sys.stderr, flush=True)
        """)
        logs = os.path.join(d, "logs")
        proc = launch("--nproc-per-node", "1", "--warm-restart", "--preload", "", "--log-dir", logs,
                      "--redirects", "1", "--tee", "2", "--rdzv-id", "talk", script)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(forked_rounds(proc), {0: (1, 1)}, proc.stderr)
        self.assertNotIn("to stdout", proc.stdout)  # redirected: the file only
        self.assertIn("[default0]:to stderr", proc.stderr)  # tee'd: the file and the console
        (run,) = os.listdir(logs)
        worker = os.path.join(logs, run, "attempt_0", "0")
        self.assertEqual(open(os.path.join(worker, "stdout.log")).read(), "to stdout\n")
        self.assertEqual(open(os.path.join(worker, "stderr.log")).read(), "to stderr\n")

    def test_exit_codes_output_and_tracebacks_are_a_cold_workers(self):
        d = self.temp()
        scripts = {
            "raises": "def inner():\n    raise ValueError('boom')\ninner()\n",
            "exits_3": "import sys\nprint('bye', flush=True)\nsys.exit(3)\n",
            "exits_message": "import sys\nsys.exit('a message')\n",
            "os_exit": "import os\nos._exit(7)\n",
            "segv": "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n",
            "interrupted": "raise KeyboardInterrupt\n",
            "syntax_error": "print('fine')\ndef broken(:\n",
            "unwinds": textwrap.dedent("""
                import atexit, threading, time
                atexit.register(lambda: print('atexit ran', flush=True))
                def late():
                    time.sleep(0.2)
                    print('thread done', flush=True)
                threading.Thread(target=late).start()
                print('main done', flush=True)
            """),
        }
        for name, code in scripts.items():
            path = write(d, name + ".py", code)
            runs = {}
            for warm in (False, True):
                flags = ["--warm-restart", "--preload", ""] if warm else []
                proc = launch("--nproc-per-node", "1", *flags, path)
                runs[warm] = (proc.returncode, worker_lines(proc.stdout),
                              [ln for ln in worker_lines(proc.stderr)])
                self.assertEqual(bool(forked_rounds(proc)), warm, proc.stderr)
            with self.subTest(script=name):
                self.assertEqual(runs[False], runs[True])
        self.assertEqual(runs[True][1], ["main done", "thread done", "atexit ran"])

    def test_the_failure_report_and_signals_reach_a_warm_worker(self):
        d = self.temp()
        script = write(d, "usr1.py", """
            import os, signal, time
            got = []
            signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
            fd = int(os.environ["DIST_HEARTBEAT_FD"])
            print("heartbeat", os.readlink(f"/proc/self/fd/{fd}"), flush=True)
            print("waiting", flush=True)
            while not got:
                time.sleep(0.01)
            raise RuntimeError(f"rank {os.environ['RANK']} got signal {got[0]}")
        """)
        proc = subprocess.Popen([ARGS.launcher, "--nproc-per-node", "1", "--warm-restart",
                                 "--preload", "", "--signals-to-handle", "SIGTERM,SIGUSR1",
                                 "--worker-heartbeat-timeout", "60", script],
                                env=environment(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            for line in proc.stdout:
                if "waiting" in line:
                    break
            proc.send_signal(signal.SIGUSR1)
            out, err = proc.communicate(timeout=JOB_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.assertEqual(proc.returncode, 1, err)
        self.assertIn("round 0: 1 of 1 workers forked from the zygote", err)
        self.assertIn("RuntimeError: rank 0 got signal 10", err)
        self.assertIn("usr1.py FAILED", err)

    def test_a_worker_that_forks_and_the_next_attempt_is_warm_again(self):
        d = self.temp()
        script = write(d, "forks.py", f"""
            import os, subprocess, sys, time
            attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
            if attempt == 0 and os.environ["RANK"] == "0":
                child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
                pid = os.fork()
                if pid == 0:
                    os.setsid()
                    time.sleep(600)
                    os._exit(0)
                with open({os.path.join(d, "children")!r}, "w") as f:
                    f.write(f"{{child.pid}} {{pid}}")
                raise SystemExit(5)
            print("attempt", attempt, flush=True)
        """)
        proc = launch("--nproc-per-node", "2", "--max-restarts", "1", "--warm-restart",
                      "--preload", "numpy", script)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(forked_rounds(proc), {0: (2, 2), 1: (2, 2)}, proc.stderr)
        self.assertIn("attempt 1", worker_lines(proc.stdout, 0))
        for pid in map(int, open(os.path.join(d, "children")).read().split()):
            self.assertFalse(os.path.exists(f"/proc/{pid}"), f"child {pid} outlived its job")

    def test_sigkill_of_the_agent_leaves_no_process_and_no_shared_memory(self):
        d = self.temp()
        script = write(d, "forever.py", """
            import os, subprocess, sys, time
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            if os.fork() == 0:
                os.setsid()
                time.sleep(600)
                os._exit(0)
            print("ids", os.environ["DIST_LAUNCH_AGENT_ID"].split(":")[-1],
                  os.environ["DIST_LAUNCH_SNAPSHOT_DIR"], flush=True)
            time.sleep(600)
        """)
        proc = subprocess.Popen([ARGS.launcher, "--nproc-per-node", "2", "--warm-restart",
                                 "--preload", "numpy", "--snapshot-memory", "16M", script],
                                env=environment(), stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        try:
            seen = 0
            for line in proc.stdout:
                if "ids " in line:
                    agent_id, snapshots = line.split("ids ", 1)[1].split()
                    seen += 1
                if seen == 2:
                    break
            self.assertEqual(seen, 2)
            scratch = os.path.dirname(snapshots)
            self.assertTrue(os.path.isdir(scratch))
            self.assertGreaterEqual(len(marked_processes(agent_id)), 5)  # zygote, workers, ...
            proc.kill()
            proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        wait_until(lambda: not marked_processes(agent_id), 30, "every marked process gone")
        wait_until(lambda: not os.path.exists(scratch), 30, f"{scratch} removed")

    def test_the_zygote_dying_between_attempts_is_replaced(self):
        d = self.temp()
        script = write(d, "the_job.py", """
            import os, signal, time
            attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
            started = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank1_started")
            if attempt == 0 and os.environ["RANK"] == "1":
                open(started, "w").close()
            if attempt == 0 and os.environ["RANK"] == "0":
                deadline = time.monotonic() + 60  # both forked before the zygote goes
                while not os.path.exists(started) and time.monotonic() < deadline:
                    time.sleep(0.01)
                me = os.environ["DIST_LAUNCH_AGENT_ID"].encode()
                for pid in filter(str.isdigit, os.listdir("/proc")):
                    try:
                        cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
                        environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\\0")
                    except OSError:
                        continue
                    named = any(os.path.basename(a) == b"_zygote.py" for a in cmdline.split(b"\\0"))
                    if named and b"DIST_LAUNCH_AGENT_ID=" + me in environ:
                        os.kill(int(pid), signal.SIGKILL)
                        print("killed the zygote", pid, flush=True)
                raise SystemExit(3)
            print("attempt", attempt, flush=True)
        """)
        proc = launch("--nproc-per-node", "2", "--max-restarts", "1", "--warm-restart",
                      "--preload", "numpy", script)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("killed the zygote", proc.stdout)
        self.assertIn("this attempt gets a new zygote", proc.stderr)
        self.assertEqual(forked_rounds(proc), {0: (2, 2), 1: (2, 2)}, proc.stderr)

    def test_a_zygote_that_cannot_import_falls_back_cold_with_one_warning(self):
        d = self.temp()
        script = write(d, "flaky.py", """
            import os
            if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "1":
                raise SystemExit(4)
            print("ran", flush=True)
        """)
        proc = launch("--nproc-per-node", "2", "--max-restarts", "1", "--warm-restart",
                      "--preload", "no_such_module_here", script)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        warnings = [ln for ln in proc.stderr.splitlines() if "--warm-restart:" in ln]
        self.assertEqual(len(warnings), 1, proc.stderr)
        self.assertIn("no_such_module_here", warnings[0])
        self.assertEqual(forked_rounds(proc), {})
        self.assertIn("restarting the worker group (restart 1 of 1)", proc.stderr)

    def test_no_python_workers_are_unaffected(self):
        proc = launch("--nproc-per-node", "1", "--warm-restart", "--no-python", "/bin/echo",
                      "plain")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("[default0]:plain", proc.stdout)
        self.assertIn("--warm-restart forks Python workers only", proc.stderr)
        self.assertEqual(forked_rounds(proc), {})


class Snapshots(Temp):
    """dist_launch.snapshot in workers (numpy arrays; torch in the torch suite)."""

    def test_a_save_torn_by_a_crash_is_never_loaded(self):
        d = self.temp()
        script = write(d, "torn.py", """
            import os, signal, sys
            import numpy as np
            from dist_launch import snapshot
            attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
            if attempt == 0:
                assert snapshot.save(10, {"w": np.full(1000, 10.0), "step": 10})
                real = os.pwrite
                def die_midway(fd, data, offset):
                    real(fd, data, offset)
                    os.kill(os.getpid(), signal.SIGKILL)  # after the header, before the rest
                os.pwrite = die_midway
                snapshot.save(20, {"w": np.full(1000, 20.0), "step": 20})
            step, state = snapshot.load()
            folder = os.path.join(os.environ["DIST_LAUNCH_SNAPSHOT_DIR"], "rank_0")
            print("loaded", step, state["step"], float(state["w"][0]), sorted(os.listdir(folder)),
                  "torch" in sys.modules, flush=True)
        """)
        proc = launch("--nproc-per-node", "1", "--max-restarts", "1", "--snapshot-memory", "64M",
                      "--warm-restart", "--preload", "numpy", script)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("failed: SIGKILL", proc.stderr)
        line = [ln for ln in worker_lines(proc.stdout) if ln.startswith("loaded")]
        self.assertEqual(line, ["loaded 10 10 10.0 ['step_00000000000000000010.snap'] False"],
                         "the torn step-20 save neither loaded nor left behind")

    def test_past_the_memory_bound_a_save_fails_clearly(self):
        d = self.temp()
        script = write(d, "big.py", """
            import numpy as np
            from dist_launch import snapshot
            snapshot.save(1, {"w": np.zeros(2 * 1024 * 1024 // 8)})  # 2 MiB
        """)
        proc = launch("--nproc-per-node", "1", "--snapshot-memory", "1M", script)
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertIn("SnapshotMemoryError: snapshot of rank 0 (local rank 0) at step 1 needs "
                      "2.0 MiB",
                      proc.stderr)
        self.assertIn("raise --snapshot-memory or save less", proc.stderr)

    def test_a_step_that_is_not_a_whole_number_is_refused(self):
        # save(1.5) was stored as step 1 (int() cut it): a later save(1) replaced it, and load(1.5)
        # loaded step 1. An integer of numpy's is a step.
        d = self.temp()
        script = write(d, "steps.py", """
            import numpy as np
            from dist_launch import snapshot
            for bad in (1.5, "2", True, -1):
                try:
                    snapshot.save(bad, {"w": 1})
                    print("saved", repr(bad))
                except (TypeError, ValueError) as e:
                    print("refused:", e)
            assert snapshot.save(np.int64(3), {"w": 3})
            assert snapshot.save(4.0, {"w": 4})  # a whole number, as a float
            print("loaded", snapshot.load(step=3), snapshot.load(step=4))
        """)
        proc = launch("--nproc-per-node", "1", "--snapshot-memory", "16M", script)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        said = worker_lines(proc.stdout)
        self.assertEqual(said, ["refused: snapshot step must be an integer, got 1.5",
                                "refused: snapshot step must be an integer, got '2'",
                                "refused: snapshot step must be an integer, got True",
                                "refused: snapshot step must be >= 0, got -1",
                                "loaded (3, {'w': 3}) (4, {'w': 4})"],
                         proc.stdout + proc.stderr)

    def test_snapshot_dir_keeps_them_for_a_restarted_node(self):
        d = self.temp()
        persisted = os.path.join(d, "persisted")
        script = write(d, "persist.py", """
            import os, sys
            import numpy as np
            from dist_launch import snapshot
            found = snapshot.load()
            if found is None:
                for step in (10, 20):
                    snapshot.save(step, {"w": np.full(4, float(step))})
                raise SystemExit("the node goes down")
            print("resumed", found[0], found[1]["w"].tolist(), flush=True)
        """)
        first = launch("--nproc-per-node", "1", "--snapshot-dir", persisted, script)
        self.assertEqual(first.returncode, 1, first.stdout + first.stderr)
        # No --rdzv-id: the job is "none", as torchrun names it.
        self.assertEqual(sorted(os.listdir(os.path.join(persisted, "none", "rank_0"))),
                         ["step_00000000000000000020.snap"],
                         "persisted at once when the worker failed")
        second = launch("--nproc-per-node", "1", "--snapshot-dir", persisted, script)
        self.assertEqual(second.returncode, 0, second.stdout + second.stderr)
        self.assertIn("resumed 20 [20.0, 20.0, 20.0, 20.0]", worker_lines(second.stdout))
        self.assertIn("holds this job's snapshots from an earlier run (1 rank, the newest "
                      "rank_0/step_00000000000000000020.snap)", second.stderr)
        self.assertIn("rank 0 (local rank 0) resumes from step 20 (job 'none'", second.stderr)

    def test_virtual_local_ranks_never_load_each_others_state(self):
        # Under --virtual-local-rank every worker of a node is local rank 0 in one snapshot
        # store. The workers here are run as the agent runs them, one after the other: the real
        # module in two processes, one store, LOCAL_RANK=0 both, RANK 0 and 1. Both save step 5;
        # each then loads its own state. (named_hosts.snapshot_identity runs the flag itself.)
        d = self.temp()
        store = os.path.join(d, "store")
        os.makedirs(store)
        script = write(d, "virtual.py", """
            import sys
            from dist_launch import snapshot
            if sys.argv[1] == "save":
                assert snapshot.save(5, {"rank": int(sys.argv[2])})
            else:
                print("loaded", sys.argv[2], snapshot.load(), flush=True)
        """)

        def worker(action, rank):
            return self.as_a_worker(store, script, action, str(rank), RANK=str(rank),
                                    LOCAL_RANK="0", WORLD_SIZE="2").stdout.strip()

        worker("save", 0)
        worker("save", 1)
        self.assertEqual(worker("load", 0), "loaded 0 (5, {'rank': 0})")
        self.assertEqual(worker("load", 1), "loaded 1 (5, {'rank': 1})")

    def as_a_worker(self, store, script, *args, memory=8 << 20, **env):
        """Runs `script` as the agent runs a worker with snapshots in `store` (the real module;
        for what needs more than this machine has, a GPU or a reshaped elastic job)."""
        env = environment(DIST_LAUNCH_SNAPSHOT_DIR=store, DIST_LAUNCH_SNAPSHOT_MEMORY=str(memory),
                          TORCHELASTIC_RUN_ID="job", PYTHONPATH=os.path.join(SOURCE, "python"),
                          **env)
        proc = subprocess.run([ARGS.python, script, *args], env=env, capture_output=True,
                              text=True, timeout=JOB_TIMEOUT_S)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        return proc

    def test_a_rank_whose_world_changed_loads_its_peers_state_only_when_replicated(self):
        # An elastic job reshaped: rank 1 of 2 saved; now this node's worker is rank 0 of 1.
        # Sharded state must not be taken from another rank or world; DDP's may (replicated).
        d = self.temp()
        store = os.path.join(d, "store")
        os.makedirs(store)
        script = write(d, "reshaped.py", """
            import sys
            from dist_launch import snapshot
            if sys.argv[1] == "save":
                snapshot.save(5, {"saved by": "rank 1 of 2"})
            else:
                print("own", snapshot.load(), flush=True)
                print("replicated", snapshot.load(replicated=True), flush=True)
        """)
        self.as_a_worker(store, script, "save", RANK="1", LOCAL_RANK="0", WORLD_SIZE="2")
        proc = self.as_a_worker(store, script, "load", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        self.assertEqual(proc.stdout.splitlines(),
                         ["own None", "replicated (5, {'saved by': 'rank 1 of 2'})"])
        self.assertIn("no snapshot of rank 0 (local rank 0) in world size 1 here; ranks [1] of "
                      "job 'job' have some (world size 2): if the state is the same on every "
                      "rank (DDP), load(replicated=True) resumes from theirs", proc.stderr)
        self.assertIn("rank 0 (local rank 0) resumes from step 5 of rank 1", proc.stderr)

    def test_a_step_every_rank_has_from_an_earlier_run_never_beats_this_runs_save(self):
        # Ranks 0 and 1 of an earlier run both saved step 5000; this run's rank 0 saved step 110,
        # rank 1 not yet: rank 0 resumes from 110. Within one run, the step every rank has wins.
        d = self.temp()
        store = os.path.join(d, "store")
        os.makedirs(store)
        script = write(d, "runs.py", """
            import sys
            from dist_launch import snapshot
            if sys.argv[1] == "save":
                snapshot.save(int(sys.argv[2]), {"step": int(sys.argv[2])})
            else:
                print(snapshot.load()[0], snapshot.steps(), flush=True)
        """)

        def as_rank(rank, run, *args):
            return self.as_a_worker(store, script, *args, RANK=str(rank), LOCAL_RANK=str(rank),
                                    WORLD_SIZE="2", DIST_LAUNCH_SNAPSHOT_RUN=run).stdout

        for rank in (0, 1):
            as_rank(rank, "earlier", "save", "5000")
        as_rank(0, "this", "save", "110")
        self.assertEqual(as_rank(0, "this", "load"), "110 [5000, 110]\n")
        as_rank(0, "this", "save", "120")
        as_rank(1, "this", "save", "110")
        self.assertEqual(as_rank(0, "this", "load"), "110 [110, 120]\n",
                         "this run's step that both ranks have: replicas resume together")

    def test_a_full_store_evicts_the_ranks_this_node_no_longer_runs(self):
        # After a reshape the node runs rank 0 only (the agent's .ranks): rank 3's old snapshots
        # give way to rank 0's save; while rank 3 is this node's too, the save fails clearly.
        d = self.temp()
        store = os.path.join(d, "store")
        os.makedirs(store)
        script = write(d, "full.py", """
            import sys
            from dist_launch import snapshot
            try:
                snapshot.save(int(sys.argv[1]), {"w": bytes(700 * 1024)})
                print("saved", flush=True)
            except snapshot.SnapshotMemoryError as e:
                print("refused", e, flush=True)
        """)
        old = dict(RANK="3", LOCAL_RANK="0", WORLD_SIZE="4")
        new = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        for step in ("1", "2"):
            self.as_a_worker(store, script, step, memory=2 << 20, **old)
        with open(os.path.join(store, ".ranks"), "w") as f:
            f.write("0\n3\n")
        refused = self.as_a_worker(store, script, "10", memory=2 << 20, **new).stdout
        self.assertIn("refused snapshot of rank 0 (local rank 0) at step 10 needs", refused)
        with open(os.path.join(store, ".ranks"), "w") as f:
            f.write("0\n")
        self.assertEqual(self.as_a_worker(store, script, "10", memory=2 << 20, **new).stdout,
                         "saved\n")
        self.assertEqual(sorted(os.listdir(os.path.join(store, "rank_3"))),
                         ["step_00000000000000000002.snap"], "the oldest saved went first")
        # A .ranks that does not list this rank (written before a regroup renumbered it): its
        # own snapshots are never evicted; its next save reuses its oldest.
        with open(os.path.join(store, ".ranks"), "w") as f:
            f.write("5\n")
        self.assertEqual(self.as_a_worker(store, script, "11", memory=2 << 20, **new).stdout,
                         "saved\n")
        self.assertEqual(self.as_a_worker(store, script, "12", memory=2 << 20, **new).stdout,
                         "saved\n")
        self.assertEqual(sorted(os.listdir(os.path.join(store, "rank_0"))),
                         ["step_00000000000000000011.snap", "step_00000000000000000012.snap"])

    def test_a_shared_snapshot_dir_keeps_each_nodes_ranks_apart(self):
        # Two agents (nodes) of one worker each, one --rdzv-id, one --snapshot-dir: each rank's
        # state is its own when the job runs again, though both are local rank 0.
        d = self.temp()
        shared = os.path.join(d, "shared")
        script = write(d, "nodes.py", """
            import os
            from dist_launch import snapshot
            rank = int(os.environ["RANK"])
            found = snapshot.load()
            if found is None:
                snapshot.save(7, {"rank": rank})
            else:
                print("loaded", rank, found[0], found[1], flush=True)
        """)

        def job():
            port = free_port("127.0.0.2")
            procs = []
            for _ in range(2):
                procs.append(subprocess.Popen(
                    [ARGS.launcher, "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.2:{port}",
                     "--rdzv-id", "shared-job", "--nproc-per-node", "1", "--snapshot-dir",
                     shared, script], env=environment(), stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, text=True))
                if len(procs) == 1:  # it hosts the store: the second joins as its client
                    wait_for_listener("127.0.0.2", port, procs[0])
            try:
                outputs = [p.communicate(timeout=JOB_TIMEOUT_S)[0] for p in procs]
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                        p.wait()
            for p, out in zip(procs, outputs):
                self.assertEqual(p.returncode, 0, out)
            return outputs[0] + outputs[1]

        job()
        self.assertEqual(sorted(os.listdir(os.path.join(shared, "shared-job"))),
                         ["rank_0", "rank_1"])
        out = job()
        self.assertIn("loaded 0 7 {'rank': 0}", worker_lines(out, 0))
        self.assertIn("loaded 1 7 {'rank': 1}", worker_lines(out, 0))

    def test_another_jobs_snapshots_are_never_loaded(self):
        # A --snapshot-dir another job saved into: its files are in its own folder, and a copy of
        # one put in this job's folder is read as foreign (its header names the other job).
        d = self.temp()
        shared = os.path.join(d, "shared")
        script = write(d, "jobs.py", """
            import sys
            from dist_launch import snapshot
            print("found", snapshot.load(), flush=True)
            snapshot.save(int(sys.argv[1]), {"job": sys.argv[2]})
        """)
        first = launch("--nproc-per-node", "1", "--rdzv-id", "job-a", "--snapshot-dir", shared,
                       script, "5000", "a")
        self.assertEqual(first.returncode, 0, first.stdout + first.stderr)
        self.assertIn("found None", worker_lines(first.stdout))
        planted = os.path.join(shared, "job-b", "rank_0")
        os.makedirs(planted)
        shutil.copy(os.path.join(shared, "job-a", "rank_0", "step_00000000000000005000.snap"),
                    planted)
        second = launch("--nproc-per-node", "1", "--rdzv-id", "job-b", "--snapshot-dir", shared,
                        script, "10", "b")
        self.assertEqual(second.returncode, 0, second.stdout + second.stderr)
        self.assertIn("found None", worker_lines(second.stdout))
        third = launch("--nproc-per-node", "1", "--rdzv-id", "job-b", "--snapshot-dir", shared,
                       script, "11", "b")
        self.assertIn("found (10, {'job': 'b'})", worker_lines(third.stdout))

    def test_this_runs_saves_beat_a_higher_step_an_earlier_run_left(self):
        # An earlier run of the job left step 5000 on disk; this run started afresh (it did not
        # load), saved steps 110 and 120 and its worker failed: the next run resumes from 120
        # (newest saved), not from 5000 (highest step).
        d = self.temp()
        shared = os.path.join(d, "shared")
        script = write(d, "fresh.py", """
            import sys
            from dist_launch import snapshot
            if sys.argv[1] == "load":
                print("resumed", snapshot.load(), flush=True)
                raise SystemExit(0)
            for step in map(int, sys.argv[2:]):
                snapshot.save(step, {"step": step})
            raise SystemExit(sys.argv[1] == "fail")
        """)
        for args in (["ok", "4990", "5000"], ["fail", "110", "120"], ["load"]):
            proc = launch("--nproc-per-node", "1", "--rdzv-id", "j", "--snapshot-dir", shared,
                          script, *args)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("resumed (120, {'step': 120})", worker_lines(proc.stdout))
        # Each rank keeps its two newest saves on disk: the earlier run's newest, and this run's
        # (persisted when its worker failed); an earlier run's 4990 went when 5000 came.
        self.assertEqual(sorted(os.listdir(os.path.join(shared, "j", "rank_0"))),
                         ["step_00000000000000000120.snap", "step_00000000000000005000.snap"])

    def test_a_read_that_overlaps_a_rewrite_is_never_taken_for_a_snapshot(self):
        # A reader holds step 1's file open when the writer recycles it for step 3 (its third
        # save) and has rewritten half its data: the reader must see it torn, though the header
        # is still step 1's.
        d = self.temp()
        script = write(d, "overlap.py", """
            import os
            import numpy as np
            from dist_launch import snapshot
            folder = os.path.join(os.environ["DIST_LAUNCH_SNAPSHOT_DIR"], "rank_0")
            snapshot.save(1, {"w": np.full(100000, 1.0)})
            snapshot.save(2, {"w": np.full(100000, 2.0)})
            reader = os.open(os.path.join(folder, "step_00000000000000000001.snap"), os.O_RDONLY)
            real, calls = os.pwrite, []
            def stop_in_the_data(fd, data, offset):
                calls.append(offset)
                if len(calls) == 4:  # the footers zeroed, the skeleton written: half the tensor
                    real(fd, bytes(data)[:len(data) // 2], offset)
                    raise OSError("the writer stops here")
                return real(fd, data, offset)
            os.pwrite = stop_in_the_data
            try:
                snapshot.save(3, {"w": np.full(100000, 3.0)})
            except snapshot.SnapshotError:
                pass
            os.pwrite = real
            try:
                snapshot._read(f"/proc/self/fd/{reader}")
                print("read a torn file as whole", flush=True)
            except snapshot.SnapshotError as e:
                print("rejected", "not a complete" in str(e) or "torn" in str(e), flush=True)
            print("loaded", snapshot.load()[0], flush=True)
        """)
        proc = launch("--nproc-per-node", "1", "--snapshot-memory", "8M", script)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual([ln for ln in worker_lines(proc.stdout) if not ln.startswith("dist_")],
                         ["rejected True", "loaded 2"])

    def test_a_mapped_load_is_never_rewritten_under_its_arrays(self):
        # A restarted worker loads with mmap=True: its arrays are the snapshot file's memory, no
        # private copy. Its later saves would recycle that file: they must leave it alone while
        # the arrays live (held aside, unchanged), and free it once they are dropped.
        d = self.temp()
        script = write(d, "mapped.py", """
            import gc, os, sys
            import numpy as np
            from dist_launch import snapshot
            folder = os.path.join(os.environ["DIST_LAUNCH_SNAPSHOT_DIR"], "rank_0")
            if int(os.environ["TORCHELASTIC_RESTART_COUNT"]) == 0:
                snapshot.save(1, {"w": np.full(100000, 1.0)})
                snapshot.save(2, {"w": np.full(100000, 2.0)})
                sys.exit(3)
            step, state = snapshot.load(mmap=True)
            w = state["w"]
            maps = open("/proc/self/maps").read()
            print("mapped", step, "step_00000000000000000002.snap" in maps, flush=True)
            w[0] = 9.0  # copy-on-write: this process's page, not the file's
            print("file unchanged", float(snapshot.load(2)[1]["w"][0]), flush=True)
            for k in (3, 4, 5):
                snapshot.save(k, {"w": np.full(100000, float(k))})
            print("arrays", float(w[0]), float(w[1]), float(w[-1]), flush=True)
            print("held", [n for n in sorted(os.listdir(folder)) if not n.startswith("step_")],
                  snapshot.steps(), flush=True)
            del w, state
            gc.collect()
            snapshot.save(6, {"w": np.full(100000, 6.0)})
            print("after", sorted(os.listdir(folder)), flush=True)
        """)
        proc = launch("--nproc-per-node", "1", "--max-restarts", "1", "--snapshot-memory", "8M",
                      script)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(
            [ln for ln in worker_lines(proc.stdout) if not ln.startswith("dist_")],
            ["mapped 2 True", "file unchanged 2.0", "arrays 9.0 2.0 2.0",
             "held ['.held.step_00000000000000000002.snap'] [4, 5]",
             "after ['step_00000000000000000005.snap', 'step_00000000000000000006.snap']"])

    def test_a_mapping_that_outgrows_the_snapshot_memory_is_named_in_the_error(self):
        # Two 800 KB saves fit in 2 MiB (a save reuses the oldest one's memory); a third file,
        # the one a mapped load holds, does not: the error says so and what to do.
        d = self.temp()
        script = write(d, "held.py", """
            import numpy as np
            from dist_launch import snapshot
            snapshot.save(1, {"w": np.full(100000, 1.0)})
            snapshot.save(2, {"w": np.full(100000, 2.0)})
            step, state = snapshot.load(mmap=True)
            snapshot.save(3, {"w": np.full(100000, 3.0)})  # reuses step 1's memory
            try:
                snapshot.save(4, {"w": np.full(100000, 4.0)})  # step 2's is mapped
            except snapshot.SnapshotMemoryError as e:
                print("refused", "still mapped by load(mmap=True)" in str(e), flush=True)
            del state
            print("saved", snapshot.save(4, {"w": np.full(100000, 4.0)}), snapshot.steps(),
                  flush=True)
        """)
        proc = launch("--nproc-per-node", "1", "--snapshot-memory", "2M", script)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual([ln for ln in worker_lines(proc.stdout) if not ln.startswith("dist_")],
                         ["refused True", "saved True [3, 4]"])

    def test_the_status_shows_the_snapshots_memory_and_each_ranks_newest(self):
        d = self.temp()
        script = write(d, "status.py", f"""
            import os, time
            from dist_launch import snapshot
            for step in (3, 4):
                snapshot.save(step, {{"w": bytes(100000)}})
            open(os.path.join({d!r}, "saved"), "w").close()
            while not os.path.exists(os.path.join({d!r}, "done")):
                time.sleep(0.05)
        """)
        proc = subprocess.Popen([ARGS.launcher, "--nproc-per-node", "1", "--snapshot-memory",
                                 "8M", "--metrics-port", "0", script], env=environment(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            lines = []
            reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
            reader.start()
            served = re.compile(r"serving the status page at (http://[^/ ]+)")
            wait_until(lambda: any(served.search(ln) for ln in lines), 60, "the status page")
            wait_until(lambda: os.path.exists(os.path.join(d, "saved")), 60, "the saves")
            base = next(served.search(ln).group(1) for ln in lines if served.search(ln))
            with urllib.request.urlopen(base + "/status.json", timeout=30) as answer:
                snapshots = json.load(answer)["snapshots"]
            self.assertEqual(snapshots["memory_limit_bytes"], 8 << 20)
            self.assertGreater(snapshots["memory_used_bytes"], 200000)
            self.assertIsNone(snapshots["persisted_to"])
            self.assertEqual([(r["rank"], r["step"]) for r in snapshots["ranks"]], [(0, 4)])
        finally:
            open(os.path.join(d, "done"), "w").close()
            try:
                proc.wait(timeout=JOB_TIMEOUT_S)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        self.assertEqual(proc.returncode, 0, "".join(lines))

    def test_a_snapshot_memory_the_machine_cannot_hold_is_a_clear_error(self):
        shm = os.statvfs("/dev/shm")
        too_much = shm.f_blocks * shm.f_frsize * 2
        proc = launch("--nproc-per-node", "1", "--snapshot-memory", str(too_much), "--no-python",
                      "/bin/true")
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertIn("is more than /dev/shm's file system holds", proc.stderr)
        self.assertIn("lower --snapshot-memory", proc.stderr)
        self.assertEqual(proc.stderr.count("error"), 1, proc.stderr)

    def test_shared_memory_of_agents_that_are_gone_is_swept_at_start(self):
        # An agent killed with its guardian (Slurm after KillWait, an OOM kill of the group)
        # leaves its directory, and its snapshots' memory, in /dev/shm: the next agent removes
        # it, its .alive file being locked by nobody. A directory whose .alive is locked (a
        # living agent, in whatever pid namespace), one without .alive (being made) and a kept
        # run directory (not a scratch one) stay.
        name = f"dist-launch-{os.getpid()}-0123456789ab-"
        left = os.path.join("/dev/shm", name + "Xy12Z9")
        living = os.path.join("/dev/shm", name + "Ab34C5")
        unmarked = os.path.join("/dev/shm", name + "Nm56P7")
        kept_run = os.path.join("/dev/shm", "dist-launch-Kp78Q1")
        for d in (left, living, unmarked, kept_run):
            os.makedirs(os.path.join(d, "snapshots", "rank_0"))
            self.addCleanup(shutil.rmtree, d, True)
            with open(os.path.join(d, "snapshots", "rank_0", "step_1.snap"), "wb") as f:
                f.write(b"x" * 4096)
        for d in (left, living):
            open(os.path.join(d, ".alive"), "w").close()
        lock = open(os.path.join(living, ".alive"))
        self.addCleanup(lock.close)
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = launch("--nproc-per-node", "1", "--snapshot-memory", "8M", "--no-python",
                      "/bin/true")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertFalse(os.path.exists(left))
        self.assertTrue(os.path.exists(living))
        self.assertTrue(os.path.exists(unmarked))
        self.assertTrue(os.path.exists(kept_run))
        self.assertIn("shared-memory director", proc.stderr)

    def test_the_module_needs_no_installed_dist_launch_and_shadows_none(self):
        d = self.temp()
        script = write(d, "which.py", """
            import sys
            from dist_launch import snapshot
            import dist_launch
            print("which", getattr(dist_launch, "MARK", "the stand-in"), "torch" in sys.modules,
                  snapshot.save(1, {"n": 1}), snapshot.load(), flush=True)
            # Every module of the package's directory imports only modules that are there (the
            # stand-in holds a few of the package's: elastic.py's error file once was not).
            import ast, os
            here = os.path.dirname(dist_launch.__file__)
            missing = []
            for name in sorted(os.listdir(here)):
                if name.endswith(".py"):
                    with open(os.path.join(here, name)) as f:
                        tree = ast.parse(f.read())
                    for node in ast.walk(tree):
                        if isinstance(node, ast.ImportFrom) and node.level == 1:
                            wanted = [node.module] if node.module else [a.name for a in node.names]
                            missing += [f"{name} imports {w}" for w in wanted if not
                                        os.path.exists(os.path.join(here, w.split(".")[0] + ".py"))]
            print("unresolved", missing, flush=True)
        """)
        # An interpreter without dist_launch: the stand-in module the agent puts on the path.
        if not has(ARGS.python, "import dist_launch"):
            proc = launch("--nproc-per-node", "1", "--snapshot-memory", "8M", script)
            self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
            self.assertIn("which the stand-in False True (1, {'n': 1})",
                          worker_lines(proc.stdout))
            self.assertIn("unresolved []", worker_lines(proc.stdout))
        # A venv where a dist_launch (without snapshot.py) is installed: that one is imported.
        venv = os.path.join(d, "venv")
        subprocess.run([ARGS.python, "-m", "venv", "--without-pip", "--system-site-packages",
                        venv], check=True, timeout=120)
        python = os.path.join(venv, "bin", "python")
        site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                               "['purelib'])"], capture_output=True, text=True,
                              check=True).stdout.strip()
        os.makedirs(os.path.join(site, "dist_launch"))
        write(os.path.join(site, "dist_launch"), "__init__.py", "MARK = 'the installed one'\n")
        for warm in ([], ["--warm-restart", "--preload", ""]):
            proc = launch("--nproc-per-node", "1", "--snapshot-memory", "8M", *warm, script,
                          env=environment(PYTHON_EXEC=python))
            self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
            self.assertIn("which the installed one False True (1, {'n': 1})",
                          worker_lines(proc.stdout))


class CppSnapshots(Temp):
    """dist::sdk::save_snapshot / load_snapshot in examples/ddp_train (--snapshots)."""

    def test_ddp_train_resumes_from_a_snapshot_with_an_uninterrupted_runs_weights(self):
        if not ARGS.ddp_train or not os.access(ARGS.ddp_train, os.X_OK):
            self.skipTest("examples/ddp_train is not built here")

        def sha(proc):
            return set(re.findall(r"rank \d weights sha256 ([0-9a-f]+)", proc.stdout))

        reference = launch("--nproc-per-node", "2", "--no-python", ARGS.ddp_train, "--epochs",
                           "3")
        self.assertEqual(reference.returncode, 0, reference.stderr)
        proc = launch("--nproc-per-node", "2", "--max-restarts", "1", "--snapshot-memory", "64M",
                      "--no-python", ARGS.ddp_train, "--epochs", "3", "--snapshots",
                      "--crash-at-step", "120")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("injected crash at step 120", proc.stdout + proc.stderr)
        self.assertIn("resumed from a snapshot at step 100", proc.stdout)
        self.assertEqual(len(sha(reference)), 1)
        self.assertEqual(sha(proc), sha(reference))

    def test_ddp_train_refuses_snapshots_with_per_rank_state(self):
        # Snapshots hold the weights only: a lossy compression's residuals and local-sgd's own
        # weights would be lost, so ddp_train says so at once (one line, exit 2).
        if not ARGS.ddp_train or not os.access(ARGS.ddp_train, os.X_OK):
            self.skipTest("examples/ddp_train is not built here")
        for extra in (["--compression", "fp16"], ["--sync", "local-sgd:4"]):
            proc = subprocess.run([ARGS.ddp_train, "--snapshots", *extra], capture_output=True,
                                  text=True, timeout=60)
            self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
            self.assertEqual(proc.stderr.count("\n"), 1, proc.stderr)
            self.assertIn("--snapshots keeps the weights only", proc.stderr)


def kill_rank1_at(argv, step, env, timeout=JOB_TIMEOUT_S):
    """Runs a bench/ttfs_train.py job, SIGKILLs rank 1 of attempt 0 once it completed `step`;
    returns (exit code, output lines)."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines, pid1, killed, buffer = [], None, False, b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if not ready:
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for raw in complete:
                line = raw.decode(errors="replace")
                lines.append(line)
                m = re.search(r"rank 1 pid (\d+) attempt 0", line)
                if m:
                    pid1 = int(m.group(1))
                m = re.search(r"rank 1 step (\d+) done", line)
                if m and step is not None and not killed and pid1 and int(m.group(1)) >= step:
                    os.kill(pid1, signal.SIGKILL)
                    killed = True
        return proc.wait(timeout=max(1, deadline - time.monotonic())), lines
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class WarmTorch(Temp):
    def test_ddp_restarted_warm_trains_to_an_uninterrupted_runs_weights(self):
        def sha(proc):
            return set(re.findall(r"weights in sync sha256 ([0-9a-f]+)", proc.stdout))

        reference = launch("--nproc-per-node", "2", DDP_EXAMPLE)
        self.assertEqual(reference.returncode, 0, reference.stdout + reference.stderr)
        out = self.temp()
        warm = launch("--nproc-per-node", "2", "--max-restarts", "1", "--warm-restart",
                      DDP_EXAMPLE, "--crash-on-attempt", "0", "--out", out)
        self.assertEqual(warm.returncode, 0, warm.stdout + warm.stderr)
        self.assertEqual(forked_rounds(warm), {0: (2, 2), 1: (2, 2)}, warm.stderr)
        self.assertEqual(len(sha(reference)), 1)
        self.assertEqual(sha(warm), sha(reference))
        self.assertIn("injected failure on attempt 0", warm.stdout + warm.stderr)

    def test_a_warm_worker_ends_as_quietly_as_a_cold_one(self):
        # The zygote freezes the preloaded objects (gc.freeze); a worker's shutdown must see them
        # as a cold worker's does. Triton's nanobind (torch 2.x imports triton with
        # torch._dynamo) reported every frozen one as leaked: about 30 lines at each exit.
        cold = launch("--nproc-per-node", "2", PROBE)
        warm = launch("--nproc-per-node", "2", "--warm-restart", PROBE)
        for proc in (cold, warm):
            self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(forked_rounds(warm), {0: (2, 2)}, warm.stderr)
        for proc in (cold, warm):
            said = [line for line in (proc.stdout + proc.stderr).splitlines() if "leaked" in line]
            self.assertEqual(said, [])

    def test_torchs_generator_is_seeded_afresh_in_each_warm_worker(self):
        proc = launch("--nproc-per-node", "2", "--max-restarts", "0", "--warm-restart", PROBE)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(forked_rounds(proc), {0: (2, 2)}, proc.stderr)
        found = probes(proc)
        seeds = {found[0]["torch_seed"], found[1]["torch_seed"]}
        self.assertNotIn(None, seeds, "torch preloaded by default")
        self.assertEqual(len(seeds), 2, "as torch seeds a fresh interpreter's from the OS")

    def test_the_error_file_of_a_warm_worker_reaches_the_report(self):
        proc = launch("--nproc-per-node", "2", "--warm-restart", DDP_EXAMPLE,
                      "--crash-on-attempt", "0")
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertEqual(forked_rounds(proc), {0: (2, 2)}, proc.stderr)
        report = proc.stderr[proc.stderr.index("ddp_train.py FAILED"):]
        self.assertIn("rank      : 1 (local_rank: 1)", report)
        self.assertIn("message   : RuntimeError: injected failure on attempt 0", report)
        self.assertRegex(report, r"error_file: \S+/error.json")

    def test_resumes_from_snapshots_after_a_sigkill_with_the_same_weights(self):
        ckpt = self.temp()
        code, lines = kill_rank1_at([ARGS.launcher, "--nproc-per-node", "2", TTFS_TRAIN,
                                     "--checkpoint-dir", ckpt], None, environment())
        self.assertEqual(code, 0, "\n".join(lines))
        reference = set(re.findall(r"final weights sha256 ([0-9a-f]+)", "\n".join(lines)))
        self.assertEqual(len(reference), 1)
        # Then mapped (load(mmap=True)): SGD's momentum keeps the mapped tensors and writes
        # them, copy-on-write; the saves after it leave the mapped file alone.
        for mapped, source in ((False, "snapshot"), (True, "mapped snapshot")):
            with self.subTest(mapped=mapped):
                ckpt = self.temp()
                code, lines = kill_rank1_at(
                    [ARGS.launcher, "--nproc-per-node", "2", "--max-restarts", "1",
                     "--warm-restart", "--snapshot-memory", "256M", TTFS_TRAIN, "--checkpoint-dir",
                     ckpt, "--snapshots"] + (["--snapshots-mmap"] if mapped else []), 25,
                    environment())
                text = "\n".join(lines)
                self.assertEqual(code, 0, text)
                # The kill lands after rank 1 said step 25; it may have run on past the next
                # snapshot (step 30) by then. Both ranks resume from the newest snapshot that
                # rank 1 could have saved before it died: 20 or later, at most its last step.
                last = max(int(n) for n in re.findall(r"rank 1 step (\d+) done", text.split(
                    "rank 1 pid", 2)[1]))
                resumed = {int(rank): int(step) for rank, step in re.findall(
                    rf"rank (\d) attempt 1 resumes after step (\d+) from {source}\n", text + "\n")}
                self.assertEqual(set(resumed), {0, 1}, text)
                self.assertEqual(len(set(resumed.values())), 1, text)
                self.assertIn(resumed[0], range(20, last + 1, 10), text)
                self.assertEqual(set(re.findall(r"final weights sha256 ([0-9a-f]+)", text)),
                                 reference)
                self.assertEqual(forked_rounds(subprocess.CompletedProcess([], 0, "", text)),
                                 {0: (2, 2), 1: (2, 2)})


def has(python, statement):
    return subprocess.run([python, "-c", statement], capture_output=True).returncode == 0


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--launcher", required=True)
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("--suite", choices=("workers", "torch"), required=True)
    parser.add_argument("--require-major", type=int, default=None)
    parser.add_argument("--ddp-train", default=None, help="examples/ddp_train's binary")
    ARGS, rest = parser.parse_known_args()
    ARGS.launcher = os.path.abspath(ARGS.launcher)
    ARGS.python = shutil.which(ARGS.python) or ARGS.python
    if ARGS.suite == "workers":
        if not has(ARGS.python, "import numpy"):
            print(f"SKIP: {ARGS.python} has no numpy")
            sys.exit(77)
        cases = [WarmWorkers, Snapshots, CppSnapshots]
    else:
        probe = subprocess.run([ARGS.python, "-c", "import torch; print(torch.__version__)"],
                               capture_output=True, text=True)
        if probe.returncode != 0:
            print(f"SKIP: {ARGS.python} has no torch")
            sys.exit(77)
        version = probe.stdout.strip()
        if ARGS.require_major is not None and int(version.split(".")[0]) != ARGS.require_major:
            print(f"SKIP: {ARGS.python} has torch {version}, not {ARGS.require_major}.x")
            sys.exit(77)
        print(f"torch {version} at {ARGS.python}", flush=True)
        cases = [WarmTorch]
    loader = unittest.TestLoader()
    suite = unittest.TestSuite(loader.loadTestsFromTestCase(c) for c in cases)
    if rest:
        suite = loader.loadTestsFromNames(rest, sys.modules[__name__])
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
