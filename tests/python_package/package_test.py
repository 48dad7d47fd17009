"""The Python package as a user gets it, then the installed dist-launch, `python -m dist_launch`
and the Python API, with no PYTHON_EXEC: workers must run on the venv's interpreter, as torchrun's
run on torchrun's.

    python3 package_test.py --source REPO --build-cache DIR          # from source
    python3 package_test.py --source REPO --wheel-from BUILD         # the binary wheel
    python3 package_test.py --source REPO --wheel-from BUILD --torch-python P  # P: a torch 2.x

From source, README.md's block `install-source` runs as written (`python3 -m venv .venv && .
.venv/bin/activate`, `pip install .`) in a fresh copy of the working tree at DIR/source, with
--python first on PATH; pip's build tree is kept in DIR/tree (SKBUILD_BUILD_DIR), so a second
run rebuilds only what changed, and the build is unoptimised (SKBUILD_CMAKE_DEFINE): what this
tests is the packaging, and the optimiser is most of the build's time.

The wheel: scripts/wheel.sh packs BUILD's programs (built already: nothing is compiled) and the
wheel goes into a fresh venv with `pip install --no-index --only-binary :all:` (no compiler could
run). With --torch-python, the venv sees P's packages (its torch) and the README's torch example
runs in it.

Exits 77 (skip) when a venv cannot be made or PyPI cannot be reached (pip needs
scikit-build-core, wheel.sh its tools), with --wheel-from when BUILD is not a Release build, and
with --torch-python when P has no torch 2.x.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

# A port free now for an agent to bind: the torch tests' helper (drawn below the ephemeral range).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))
from launcher_test_main import free_port  # noqa: E402

import readme_blocks  # noqa: E402

SKIP = 77
VENV_TIMEOUT_S = 120
PIP_INSTALL_TIMEOUT_S = 1500  # a first build on a loaded 2-core machine
WHEEL_TIMEOUT_S = 600  # scripts/wheel.sh: its tools from PyPI the first time, the build up to date
JOB_TIMEOUT_S = 240
QUICK_FLAGS = "-O0 -DNDEBUG -Wno-mismatched-new-delete"
WAIT_STEP_S = 0.05
ARGS = None
VENV = None  # the venv dist-launch was installed into
WORK = None  # this run's scratch directory

# A worker that proves which interpreter runs it, then does what its arguments say.
WORKER = textwrap.dedent("""\
    import json, os, sys, time
    out, venv = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    assert sys.prefix == venv, f"rank {rank}: sys.prefix is {sys.prefix}, not the venv {venv}"
    assert os.path.dirname(sys.executable) == os.path.join(venv, "bin"), sys.executable
    print(f"rank {rank} of {os.environ['WORLD_SIZE']} runs {sys.executable}", flush=True)
    with open(os.path.join(out, f"pid_{rank}"), "w") as f:
        f.write(str(os.getpid()))
    action = sys.argv[3] if len(sys.argv) > 3 else ""
    if action == "fail-rank-1" and rank == 1 and attempt == 0:
        with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:  # torch's @record format
            json.dump({"message": {"message": "RuntimeError: rank 1 gives up",
                                   "extraInfo": {"py_callstack": "Traceback: line 1\\nline 2",
                                                 "timestamp": str(int(time.time()))}}}, f)
        sys.exit(3)
    if action == "kill-rank-0" and rank == 0:
        os.kill(os.getpid(), 9)
    if action == "wait":
        while True:
            time.sleep(1)
""")

# The Python API from the venv's interpreter, as torchx or Lightning would drive it.
API_DRIVER = textwrap.dedent("""\
    import json, sys
    import dist_launch
    from dist_launch import LaunchConfig, ChildFailedError, launch
    worker, out, venv, case = sys.argv[1:5]
    if case == "ok":
        print(json.dumps(launch(LaunchConfig(nproc_per_node=2), worker, out, venv)))
    elif case == "restart":
        results = dist_launch.elastic_launch(
            LaunchConfig(nproc_per_node=2, max_restarts=1), worker)(out, venv, "fail-rank-1")
        print(json.dumps(results))
    elif case == "elastic":
        config = LaunchConfig(min_nodes=1, max_nodes=2, nproc_per_node=2, rdzv_backend="c10d",
                              rdzv_endpoint=sys.argv[5], run_id="api-elastic",
                              rdzv_configs={"last_call_timeout": 0.5})
        print(json.dumps(launch(config, worker, out, venv)))
    elif case in ("fail-rank-1", "kill-rank-0"):
        try:
            launch(LaunchConfig(nproc_per_node=2), worker, out, venv, case)
        except ChildFailedError as e:
            rank, root = e.get_first_failure()
            print(json.dumps({"exit_code": e.exit_code, "root_rank": rank,
                              "exitcode": root.exitcode, "signal": root.signal_name(),
                              "local_rank": root.local_rank, "message": root.message,
                              "error_file": root.error_file, "traceback": root.traceback,
                              "failed_ranks": sorted(e.failures), "name": e.name,
                              "report_has_root": "Root Cause" in e.format_msg()}))
    elif case == "usage":
        try:
            launch(LaunchConfig(nproc_per_node=0), worker, out, venv)
        except dist_launch.UsageError as e:
            print(json.dumps({"usage": str(e), "exit_code": e.exit_code}))
    elif case == "run":
        dist_launch.run(["--nproc-per-node", "2", worker, out, venv])
        try:
            dist_launch.run(["--nproc-per-node", "2", worker, out, venv, "fail-rank-1"])
        except ChildFailedError as e:
            print(json.dumps({"root_rank": e.get_first_failure()[0], "exit_code": e.exit_code}))
    elif case == "signal":
        try:
            launch(LaunchConfig(nproc_per_node=2, shutdown_timeout=10), worker, out, venv, "wait")
        except dist_launch.SignalException as e:
            print(json.dumps({"sigval": e.sigval, "exit_code": e.exit_code}))
""")

# A Python function as the entrypoint, from the installed package: its workers run the package's
# worker script on the venv's interpreter.
FUNCTION_DRIVER = textwrap.dedent("""\
    import json, sys
    from dist_launch import LaunchConfig, elastic_launch
    def where(tag):
        return [tag, sys.prefix]
    if __name__ == "__main__":
        print(json.dumps(elastic_launch(LaunchConfig(nproc_per_node=2), where)("from a function")))
""")


def log(message):
    print(f"package_test: {message}", flush=True)


def skip(message):
    log(f"SKIP: {message}")
    sys.exit(SKIP)


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHON_EXEC", "PYTHONPATH", "VIRTUAL_ENV", "DIST_LAUNCH_COMPRESSION_LIB")
           and not k.startswith("PIP_")}
    env.update(extra)
    return env


def make_venv(python, path, site_packages_of=None):
    """A fresh venv from `python`; with `site_packages_of`, that interpreter's packages (torch)
    are visible in it through a .pth file, which leaves that interpreter's environment as it is."""
    proc = subprocess.run([python, "-m", "venv", path], capture_output=True, text=True,
                          timeout=VENV_TIMEOUT_S)
    if proc.returncode != 0:
        skip(f"`{python} -m venv` does not work here (Debian: apt-get install python3-venv): "
             f"{proc.stderr.strip()}")
    venv_python = os.path.join(path, "bin", "python")
    if site_packages_of:
        paths = subprocess.run(
            [site_packages_of, "-c",
             "import site, sys; print('\\n'.join(p for p in sys.path if p.endswith('-packages')))"],
            capture_output=True, text=True, check=True).stdout
        purelib = subprocess.run([venv_python, "-c", "import sysconfig; "
                                  "print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        with open(os.path.join(purelib, "outer_site_packages.pth"), "w") as f:
            f.write(paths)
    return venv_python


def install_from_source():
    """README.md's block install-source, as written, in a fresh copy of the working tree; returns
    the venv it made."""
    reach = subprocess.run([ARGS.python, "-m", "pip", "download", "--no-deps", "--quiet",
                            "--dest", os.path.join(WORK, "probe"), "scikit-build-core"],
                           capture_output=True, text=True, timeout=VENV_TIMEOUT_S)
    if reach.returncode != 0:
        last = (reach.stderr.strip().splitlines() or [""])[-1]
        skip(f"pip cannot fetch scikit-build-core (no network to PyPI?): {last}")
    block = readme_blocks.block(os.path.join(ARGS.source, "README.md"), "install-source")
    clone = os.path.join(ARGS.build_cache, "source")
    why = readme_blocks.fresh_copy(ARGS.source, clone)
    if why:
        skip(why)
    started = time.monotonic()
    # GCC 12 warns falsely about Asio's recycling allocator once the inlining changes, hence
    # -Wno-mismatched-new-delete.
    env = clean_env(PATH=newcomer_path(), TMPDIR=WORK,
                    SKBUILD_BUILD_DIR=os.path.join(ARGS.build_cache, "tree"),
                    SKBUILD_CMAKE_DEFINE=f"CMAKE_CXX_FLAGS_RELEASE={QUICK_FLAGS}")
    code, out, err = readme_blocks.run_session([block], clone, env, PIP_INSTALL_TIMEOUT_S)
    log(f"README.md's install-source block (line {block.line}) took "
        f"{time.monotonic() - started:.1f} s")
    if code != 0:
        sys.exit(f"{out[-6000:]}\n{err[-6000:]}\nREADME.md's install-source block "
                 f"{'timed out' if code is None else f'exited {code}'}")
    return os.path.join(clone, ".venv")


def install_wheel():
    """scripts/wheel.sh's wheel of --wheel-from's programs, installed into a fresh venv with no
    index and no source build allowed; returns the venv."""
    why = readme_blocks.release_build(ARGS.wheel_from)
    if why:
        skip(why)
    out = os.path.join(WORK, "dist")
    started = time.monotonic()
    proc = subprocess.run([os.path.join(ARGS.source, "scripts", "wheel.sh"), out],
                          capture_output=True, text=True, timeout=WHEEL_TIMEOUT_S,
                          env=clean_env(BUILD_DIR=ARGS.wheel_from, TMPDIR=WORK,
                                        DIST_WHEEL_TOOLS=os.path.join(ARGS.wheel_from,
                                                                      "wheel-tools")))
    print(proc.stdout + proc.stderr, end="", flush=True)
    if proc.returncode == SKIP:
        skip("scripts/wheel.sh could not install its tools")
    if proc.returncode != 0:
        sys.exit(f"scripts/wheel.sh exited {proc.returncode}")
    wheels = [os.path.join(out, f) for f in os.listdir(out) if f.endswith(".whl")]
    log(f"scripts/wheel.sh took {time.monotonic() - started:.1f} s: {wheels}")
    venv = os.path.join(WORK, "venv")
    python = make_venv(ARGS.torch_python or ARGS.python, venv,
                       site_packages_of=ARGS.torch_python)
    started = time.monotonic()
    proc = subprocess.run([python, "-m", "pip", "install", "--no-index", "--only-binary", ":all:",
                           "--disable-pip-version-check", *wheels],
                          capture_output=True, text=True, timeout=PIP_INSTALL_TIMEOUT_S,
                          env=clean_env())
    log(f"pip install of the wheel took {time.monotonic() - started:.1f} s")
    if proc.returncode != 0:
        sys.exit(f"pip install of the wheel failed:\n{proc.stdout}\n{proc.stderr}")
    return venv


def newcomer_path():
    """PATH with --python as the first python3, as a newcomer's shell finds it."""
    bin_dir = os.path.join(WORK, "bin")
    if not os.path.isdir(bin_dir):
        os.makedirs(bin_dir)
        os.symlink(ARGS.python, os.path.join(bin_dir, "python3"))
    return bin_dir + os.pathsep + os.environ.get("PATH", "")


def process_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def reap(proc):
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


class Job(unittest.TestCase):
    def setUp(self):
        self.out = tempfile.mkdtemp(prefix="dist-package-test-")
        self.addCleanup(shutil.rmtree, self.out, ignore_errors=True)
        self.worker = os.path.join(self.out, "worker.py")
        with open(self.worker, "w") as f:
            f.write(WORKER)

    def run_in_venv(self, argv, **kwargs):
        return subprocess.run(argv, capture_output=True, text=True, timeout=JOB_TIMEOUT_S,
                              cwd=self.out, env=self.env(), **kwargs)

    def env(self, **extra):
        # dist-launch keeps a failed job's logs in a temporary directory: this test's.
        return clean_env(GLOO_SOCKET_IFNAME="lo", TMPDIR=self.out, **extra)

    def api(self, case, *extra):
        driver = os.path.join(self.out, "driver.py")
        with open(driver, "w") as f:
            f.write(API_DRIVER)
        proc = self.run_in_venv([os.path.join(VENV, "bin", "python"), driver, self.worker,
                                 self.out, VENV, case, *extra])
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        return json.loads(proc.stdout.strip().splitlines()[-1]), proc


class InstalledPackage(Job):
    def test_the_programs_on_path_are_the_binaries(self):
        for name in ("dist-launch", "dist-rendezvous"):
            with open(os.path.join(VENV, "bin", name), "rb") as f:
                self.assertEqual(f.read(4), b"\x7fELF", f"{name} is not the program itself")

    def test_every_version_is_the_packages(self):
        with open(os.path.join(ARGS.source, "CMakeLists.txt")) as f:
            version = re.search(r"project\(dist_launch VERSION ([0-9.]+)", f.read()).group(1)
        python = os.path.join(VENV, "bin", "python")
        said = {}
        for name, argv in (("dist-launch --version", ["dist-launch", "--version"]),
                           ("dist-rendezvous --version", ["dist-rendezvous", "--version"]),
                           ("python -m dist_launch --version",
                            [python, "-m", "dist_launch", "--version"])):
            if not argv[0].startswith("/"):
                argv[0] = os.path.join(VENV, "bin", argv[0])
            proc = self.run_in_venv(argv)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            said[name] = proc.stdout.strip()
        proc = self.run_in_venv([python, "-c", "import dist_launch, importlib.metadata as m; "
                                 "print(dist_launch.__version__, m.version('dist-launch'))"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        said["dist_launch.__version__"], said["pip's metadata"] = proc.stdout.split()
        self.assertEqual(said, {"dist-launch --version": f"dist-launch {version}",
                                "dist-rendezvous --version": f"dist-rendezvous {version}",
                                "python -m dist_launch --version": f"dist-launch {version}",
                                "dist_launch.__version__": version, "pip's metadata": version})

    def test_the_compression_hooks_library_comes_with_the_package(self):
        proc = self.run_in_venv([os.path.join(VENV, "bin", "python"), "-c",
                                 "import dist_launch.compression as c; print(c.parse('topk:0.5'))"])
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(proc.stdout.strip(), "('topk:0.5', True)")

    def test_the_package_brings_no_torch(self):
        proc = self.run_in_venv([os.path.join(VENV, "bin", "python"), "-c", "import torch"])
        self.assertNotEqual(proc.returncode, 0, "torch came with dist-launch")

    def test_workers_run_on_the_venvs_python_without_python_exec(self):
        proc = self.run_in_venv([os.path.join(VENV, "bin", "dist-launch"), "--nproc-per-node",
                                 "2", self.worker, self.out, VENV])
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        for rank in (0, 1):
            self.assertIn(f"[default{rank}]:rank {rank} of 2 runs {VENV}/bin/python3\n",
                          proc.stdout)

    def test_python_exec_still_wins(self):
        other = os.path.join(self.out, "other-python")
        with open(other, "w") as f:
            f.write("#!/bin/sh\necho \"PYTHON_EXEC ran $*\"\n")
        os.chmod(other, 0o755)
        proc = subprocess.run([os.path.join(VENV, "bin", "dist-launch"), self.worker],
                              env=self.env(PYTHON_EXEC=other),
                              capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn(f"[default0]:PYTHON_EXEC ran -u {self.worker}", proc.stdout)

    def test_python_m_dist_launch(self):
        proc = self.run_in_venv([os.path.join(VENV, "bin", "python"), "-m", "dist_launch",
                                 "--nproc-per-node", "2", self.worker, self.out, VENV])
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        for rank in (0, 1):  # sys.executable: the interpreter python -m ran on
            self.assertIn(f"[default{rank}]:rank {rank} of 2 runs {VENV}/bin/python\n",
                          proc.stdout)
        proc = self.run_in_venv([os.path.join(VENV, "bin", "python"), "-m", "dist_launch",
                                 "--nproc-per-node", "2", self.worker, self.out, VENV,
                                 "fail-rank-1"])
        self.assertEqual(proc.returncode, 3, "dist-launch's own exit code: the root cause's")
        self.assertIn("worker.py FAILED", proc.stderr)


class PythonApi(Job):
    def test_the_example_launcher(self):
        example = os.path.join(ARGS.source, "examples", "python", "launch.py")
        python = os.path.join(VENV, "bin", "python")
        proc = self.run_in_venv([python, example, "-j", "1x2", self.worker, self.out, VENV])
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("every worker of this node succeeded: exit codes by rank {0: 0, 1: 0}",
                      proc.stdout)
        proc = self.run_in_venv([python, example, "-j", "1x2", self.worker, self.out, VENV,
                                 "fail-rank-1"])
        self.assertEqual(proc.returncode, 3, proc.stdout + proc.stderr)
        self.assertRegex(proc.stderr, r"launch.py: worker.py failed on rank 1 \(.+\): "
                                      r"RuntimeError: rank 1 gives up")

    def test_launch_returns_exit_codes_by_global_rank(self):
        results, proc = self.api("ok")
        self.assertEqual(results, {"0": 0, "1": 0})
        self.assertIn(f"[default1]:rank 1 of 2 runs {VENV}/bin/python", proc.stdout)

    def test_a_function_returns_its_values_by_global_rank_from_the_venv(self):
        driver = os.path.join(self.out, "function_driver.py")
        with open(driver, "w") as f:
            f.write(FUNCTION_DRIVER)
        proc = self.run_in_venv([os.path.join(VENV, "bin", "python"), driver])
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        results = json.loads(proc.stdout.strip().splitlines()[-1])
        self.assertEqual(results, {"0": ["from a function", VENV], "1": ["from a function", VENV]})

    def test_a_restart_that_succeeds_returns_the_results(self):
        results, proc = self.api("restart")
        self.assertEqual(results, {"0": 0, "1": 0})
        self.assertIn("restarting the worker group (restart 1 of 1)", proc.stderr)

    def test_an_elastic_job_returns_the_ranks_its_round_gave_this_node(self):
        results, _ = self.api("elastic", f"127.0.0.1:{free_port()}")
        self.assertEqual(results, {"0": 0, "1": 0})

    def test_a_failure_raises_with_the_root_cause_and_the_error_file(self):
        r, proc = self.api("fail-rank-1")
        self.assertEqual(r["exit_code"], 3)
        self.assertEqual((r["root_rank"], r["local_rank"], r["exitcode"]), (1, 1, 3))
        self.assertEqual(r["message"], "RuntimeError: rank 1 gives up")
        self.assertEqual(r["traceback"], "Traceback: line 1\nline 2")
        self.assertTrue(r["error_file"].endswith("/1/error.json"), r["error_file"])
        self.assertEqual(r["failed_ranks"], [1])
        self.assertEqual(r["name"], "worker.py")
        self.assertTrue(r["report_has_root"])
        self.assertIn("worker.py FAILED", proc.stderr, "the report still reaches the console")

    def test_a_worker_killed_by_a_signal_is_reported_with_the_signal(self):
        r, _ = self.api("kill-rank-0")
        self.assertEqual((r["root_rank"], r["exitcode"], r["signal"]), (0, -9, "SIGKILL"))
        self.assertEqual(r["exit_code"], 128 + 9)

    def test_a_refused_configuration_raises_a_usage_error(self):
        r, _ = self.api("usage")
        self.assertEqual(r["exit_code"], 2)
        self.assertIn("--nproc-per-node must be a positive integer", r["usage"])

    def test_run_is_the_command_line(self):
        r, proc = self.api("run")
        self.assertEqual((r["root_rank"], r["exit_code"]), (1, 3))
        self.assertIn(f"[default0]:rank 0 of 2 runs {VENV}/bin/python", proc.stdout)

    def start_waiting_job(self):
        """A caller whose launch() runs until a signal stops it, and its workers' pids once
        both run."""
        driver = os.path.join(self.out, "driver.py")
        with open(driver, "w") as f:
            f.write(API_DRIVER)
        caller = subprocess.Popen([os.path.join(VENV, "bin", "python"), driver, self.worker,
                                   self.out, VENV, "signal"], cwd=self.out,
                                  env=self.env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        self.addCleanup(reap, caller)
        pid_files = [os.path.join(self.out, f"pid_{rank}") for rank in (0, 1)]
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while not all(os.path.exists(p) and os.path.getsize(p) for p in pid_files):
            self.assertIsNone(caller.poll(), "the caller ended before its workers started")
            self.assertLess(time.monotonic(), deadline, "the workers never started")
            time.sleep(WAIT_STEP_S)
        return caller, [int(open(p).read()) for p in pid_files]

    def test_a_caller_killed_outright_takes_the_job_with_it(self):
        caller, pids = self.start_waiting_job()
        with open(f"/proc/{pids[0]}/stat") as f:
            agent = int(f.read().split(")")[-1].split()[1])
        caller.kill()
        caller.communicate(timeout=JOB_TIMEOUT_S)
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while any(process_alive(p) for p in [agent, *pids]):
            self.assertLess(time.monotonic(), deadline, "dist-launch or a worker outlived it")
            time.sleep(WAIT_STEP_S)

    def test_a_signal_to_the_caller_stops_the_job_once_and_raises(self):
        caller, pids = self.start_waiting_job()
        caller.send_signal(signal.SIGINT)  # to the caller only, not its process group
        out, err = caller.communicate(timeout=JOB_TIMEOUT_S)
        self.assertEqual(caller.returncode, 0, out + err)
        self.assertEqual(json.loads(out.strip().splitlines()[-1]),
                         {"sigval": int(signal.SIGINT), "exit_code": 128 + signal.SIGINT})
        self.assertIn("SIGINT received", err)
        self.assertNotIn("again: killing the workers now", err, "the signal arrived twice")
        self.assertEqual([p for p in pids if process_alive(p)], [], "workers outlived the job")


class InstalledWheel(Job):
    """What only the binary wheel promises: programs that run wherever manylinux's libraries are."""

    ANYWHERE = {"linux-vdso.so.1", "libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2",
                "/lib64/ld-linux-x86-64.so.2"}

    def test_the_programs_need_only_libc_and_libm(self):
        for name in ("dist-launch", "dist-rendezvous"):
            proc = self.run_in_venv(["ldd", os.path.join(VENV, "bin", name)])
            self.assertEqual(proc.returncode, 0, proc.stderr)
            needed = {line.split()[0] for line in proc.stdout.splitlines() if line.strip()}
            self.assertLessEqual(needed, self.ANYWHERE, f"{name} needs more:\n{proc.stdout}")
            proc = self.run_in_venv(["readelf", "-d", os.path.join(VENV, "bin", name)])
            self.assertNotRegex(proc.stdout, r"R(UN)?PATH", f"{name} has a run-time search path")

    def test_the_compression_library_needs_only_libc_and_libm(self):
        proc = self.run_in_venv([os.path.join(VENV, "bin", "python"), "-c",
                                 "import dist_launch.compression as c; print(c._library()._name)"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        library = proc.stdout.strip()
        self.assertTrue(library.startswith(VENV), library)
        proc = self.run_in_venv(["ldd", library])
        needed = {line.split()[0] for line in proc.stdout.splitlines() if line.strip()}
        self.assertLessEqual(needed, self.ANYWHERE, f"{library} needs more:\n{proc.stdout}")

    def test_dist_rendezvous_runs(self):
        proc = self.run_in_venv([os.path.join(VENV, "bin", "dist-rendezvous"), "--help"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("TCPStore", proc.stdout)


class TorchExample(Job):
    """The README's torch example from a venv with dist-launch and a torch 2.x, no PYTHON_EXEC."""

    EXAMPLE = None

    def test_the_readme_torch_example_runs_on_the_venvs_torch(self):
        probe = os.path.join(self.out, "probe.py")
        with open(probe, "w") as f:
            f.write("import os, sys, torch\n"
                    "print(f'rank {os.environ[\"RANK\"]} prefix {sys.prefix} torch "
                    "{torch.__version__}', flush=True)\n")
        dist_launch = os.path.join(VENV, "bin", "dist-launch")
        proc = self.run_in_venv([dist_launch, "--nproc-per-node", "2", probe])
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn(f"[default1]:rank 1 prefix {VENV} torch 2.", proc.stdout)

        proc = self.run_in_venv([dist_launch, "--nproc-per-node", "2", self.EXAMPLE,
                                 "--out", self.out])
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(proc.stdout.count("weights in sync"), 2, proc.stdout)

    def test_the_example_launcher_restarts_the_torch_job(self):
        example = os.path.join(ARGS.source, "examples", "python", "launch.py")
        proc = self.run_in_venv([os.path.join(VENV, "bin", "python"), example, "-j", "1x2",
                                 "--max-restarts", "1", self.EXAMPLE, "--crash-on-attempt", "0"])
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("restarting the worker group (restart 1 of 1)", proc.stderr)
        self.assertIn("exit codes by rank {0: 0, 1: 0}", proc.stdout)

    def test_the_api_reports_torchs_error_file(self):
        driver = os.path.join(self.out, "driver.py")
        with open(driver, "w") as f:
            f.write(textwrap.dedent("""\
                import json, sys
                from dist_launch import ChildFailedError, LaunchConfig, launch
                example, out = sys.argv[1:3]
                restarted = launch(LaunchConfig(nproc_per_node=2, max_restarts=1), example,
                                   "--crash-on-attempt", "0", "--out", out)
                try:
                    launch(LaunchConfig(nproc_per_node=2), example, "--crash-on-attempt", "0")
                except ChildFailedError as e:
                    rank, root = e.get_first_failure()
                    print(json.dumps({"restarted": restarted, "rank": rank,
                                      "exitcode": root.exitcode, "message": root.message,
                                      "traceback": root.traceback}))
                """))
        proc = self.run_in_venv([os.path.join(VENV, "bin", "python"), driver, self.EXAMPLE,
                                 self.out])
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        self.assertEqual(r["restarted"], {"0": 0, "1": 0})
        self.assertEqual((r["rank"], r["exitcode"]), (1, 1))
        self.assertEqual(r["message"], "RuntimeError: injected failure on attempt 0")
        self.assertIn("Traceback", r["traceback"])


def main():
    global ARGS, VENV, WORK
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True, help="the repository root")
    ap.add_argument("--build-cache", help="from source: the copy and pip's build tree")
    ap.add_argument("--wheel-from", help="the wheel: a Release build tree with the two programs")
    ap.add_argument("--python", default=sys.executable, help="makes the venv")
    ap.add_argument("--torch-python", help="an interpreter with torch 2.x: run the torch tests")
    ARGS = ap.parse_args()
    if bool(ARGS.build_cache) == bool(ARGS.wheel_from) or (ARGS.torch_python and
                                                           not ARGS.wheel_from):
        ap.error("one of --build-cache (from source) and --wheel-from (the wheel); "
                 "--torch-python goes with --wheel-from")
    ARGS.source = os.path.abspath(ARGS.source)
    for name in ("build_cache", "wheel_from"):
        if getattr(ARGS, name):
            setattr(ARGS, name, os.path.abspath(getattr(ARGS, name)))
    WORK = tempfile.mkdtemp(prefix="dist-package-test-")
    try:
        if ARGS.torch_python:
            version = subprocess.run(
                [ARGS.torch_python, "-c", "import torch; print(torch.__version__)"],
                capture_output=True, text=True)
            if version.returncode != 0 or not version.stdout.startswith("2."):
                skip(f"{ARGS.torch_python} has no torch 2.x "
                     "(scripts/install-torch2.sh installs one)")
            TorchExample.EXAMPLE = os.path.join(ARGS.source, "examples", "torch", "ddp_train.py")
            tests = [TorchExample]
        else:
            tests = [InstalledPackage, PythonApi] + ([InstalledWheel] if ARGS.wheel_from else [])
        VENV = install_wheel() if ARGS.wheel_from else install_from_source()
        suite = unittest.TestSuite(unittest.defaultTestLoader.loadTestsFromTestCase(t)
                                   for t in tests)
        result = unittest.TextTestRunner(verbosity=2).run(suite)
        return 0 if result.wasSuccessful() else 1
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
        if ARGS.build_cache:  # the copy and its venv; pip's build tree stays
            shutil.rmtree(os.path.join(ARGS.build_cache, "source"), ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
