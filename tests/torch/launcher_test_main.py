"""The command line the tests of dist-launch with torch workers share (launch_torch_test.py,
file_timer_test.py, hang_test.py, elastic_test.py), and free_port:

    python3 TEST.py --launcher build/bin/dist-launch [--python P] [--require-major N] [unittest args]

Exits 77 (skip) when P has no torch, or not torch N.x; otherwise sets the test module's ARGS and
runs its tests.
"""
import argparse
import atexit
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

SKIP = 77


def free_port(host="127.0.0.1"):
    """A port free now on `host`, for an agent to bind, drawn below the kernel's ephemeral ports:
    one the kernel just handed out (bind to port 0) can go to any connection's source port before
    the agent binds it. Below that range only another test drawing the same number can take it."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        high = int(f.read().split()[0])
    low = high - 10000 if high > 12000 else 1024
    for _ in range(1000):
        port = random.randrange(low, high)
        with socket.socket() as s:
            try:
                s.bind((host, port))
                return port
            except OSError:
                continue
    raise RuntimeError(f"no free port on {host} in [{low}, {high})")


def on_cpus(cpus, cmd):
    """`cmd` run on the CPUs `cpus` only (its affinity, inherited by what it starts): through an
    interpreter that sets it and execs the command (subprocess's preexec_fn is not safe in a
    process with threads, as the tests that run jobs side by side are)."""
    return [sys.executable, "-c",
            "import os, sys; os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(',')}); "
            "os.execvp(sys.argv[2], sys.argv[2:])", ",".join(map(str, sorted(cpus))), *cmd]


def wait_for_listener(host, port, proc, timeout=60):
    """Until something accepts on host:port (the agent that hosts the store), or proc ends."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.02)
    raise AssertionError(f"nothing listens on {host}:{port}")


def main(test_module):
    parser = argparse.ArgumentParser()
    parser.add_argument("--launcher", required=True)
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("--require-major", type=int, default=None)
    args, rest = parser.parse_known_args()
    args.launcher = os.path.abspath(args.launcher)
    try:
        probe = subprocess.run([args.python, "-c", "import torch; print(torch.__version__)"],
                               capture_output=True, text=True)
    except OSError as e:
        print(f"SKIP: cannot run {args.python}: {e.strerror}")
        sys.exit(SKIP)
    if probe.returncode != 0:
        print(f"SKIP: {args.python} has no torch")
        sys.exit(SKIP)
    version = probe.stdout.strip()
    if args.require_major is not None and int(version.split(".")[0]) != args.require_major:
        print(f"SKIP: {args.python} has torch {version}, not {args.require_major}.x")
        sys.exit(SKIP)
    print(f"torch {version} at {args.python}", flush=True)
    args.version = version
    test_module.ARGS = args
    # The jobs' temporary directories (a run without --log-dir keeps its own where a worker
    # failed or hung: its error files and stacks, in /dev/shm) in one of this run's, removed at
    # its end: the tests leave none behind.
    scratch = tempfile.mkdtemp(prefix="dl-tests-")
    atexit.register(shutil.rmtree, scratch, True)
    os.environ["TMPDIR"] = scratch
    unittest.main(module=test_module, argv=[sys.argv[0]] + rest, verbosity=2)
