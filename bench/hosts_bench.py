#!/usr/bin/env python3
"""dist-launch --hosts: how long a job over ssh takes to start, next to ssh alone.

    python3 bench/hosts_bench.py [--build build] [--runs 10] [--real 2,4,8] [--standin 8,16,32]

Started = every worker of the job has run its first instruction: each worker is
`dist-test-worker stamp DIR`, which writes the wall clock; the figure is the latest stamp minus
the clock just before dist-launch was started. The anchor is ssh alone: `ssh HOST true` to every
host at once, from start to the last exit (a connection, its key exchange and authentication,
a session, a remote command). Anchor and job alternate (A B A B ...); medians of --runs.

1. 2 hosts x 2 workers over real sshd (127.0.0.2 and 127.0.0.3; tests/ssh_hosts/sshd_hosts.py),
   then the same with ControlMaster multiplexing (a master per host opened beforehand: what
   `--ssh-option ControlMaster=auto --ssh-option ControlPath=... --ssh-option ControlPersist=...`
   gives every job after the first).
2. --standin hosts x 1 worker through the stand-in ssh client (tests/ssh_hosts/standin-ssh: runs
   the command here): the cost of dist-launch itself, connections in parallel.
3. --real hosts x 1 worker over real sshd, one per host on 127.0.0.2...: the curve.

Root and OpenSSH's sshd are needed for 1 and 3 (skipped otherwise). Every host is this machine:
its 2 cores run the launcher, every ssh client, every sshd and every agent.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "ssh_hosts"))
import sshd_hosts  # noqa: E402
from blocking_run import blocking_run, wait_all  # noqa: E402

JOB_TIMEOUT_S = 120


def ms(seconds):
    return f"{seconds * 1000:7.1f} ms"


def anchor(ssh_argv, hosts):
    """`ssh HOST true` to every host at once: seconds until the last one ended."""
    start = time.perf_counter()
    procs = [subprocess.Popen(ssh_argv + [h, "true"], stdin=subprocess.DEVNULL) for h in hosts]
    codes = wait_all(procs, JOB_TIMEOUT_S)
    if any(codes):
        raise RuntimeError(f"ssh failed: {codes}")
    return time.perf_counter() - start


def job(build, hosts, workers, ssh_options):
    """One job: (seconds until every worker started, seconds until dist-launch ended)."""
    out = tempfile.mkdtemp(prefix="dist-hosts-bench-")
    try:
        for node in range(len(hosts)):
            os.mkdir(os.path.join(out, str(node)))
        worker = os.path.join(build, "bin", "dist-test-worker")
        launcher = os.path.join(build, "bin", "dist-launch")
        argv = [launcher, "--hosts", ",".join(f"{h}:{workers}" for h in hosts), *ssh_options,
                "--remote-dist-launch", launcher, "--export", "JOB_OUT",
                "--no-python", "/bin/sh", "-c", f'exec {worker} stamp "$JOB_OUT/$GROUP_RANK"']
        env = dict(os.environ, JOB_OUT=out, OMP_NUM_THREADS="1", LOGLEVEL="WARNING")
        t0 = time.time_ns()
        with tempfile.TemporaryFile("w+") as err:
            total, code = blocking_run(argv, JOB_TIMEOUT_S, env=env, stdout=subprocess.DEVNULL,
                                       stderr=err)
            if code != 0:
                err.seek(0)
                raise RuntimeError(f"dist-launch failed ({code}): {err.read()}")
        stamps = []
        for node in range(len(hosts)):
            for name in os.listdir(os.path.join(out, str(node))):
                with open(os.path.join(out, str(node), name)) as f:
                    stamps.append(int(f.read()))
        if len(stamps) != len(hosts) * workers:
            raise RuntimeError(f"{len(stamps)} workers started, not {len(hosts) * workers}")
        return (max(stamps) - t0) / 1e9, total
    finally:
        shutil.rmtree(out, ignore_errors=True)


def compare(title, runs, ssh_argv, hosts, build, workers, ssh_options):
    anchors, starts, totals = [], [], []
    for _ in range(runs):  # A B A B
        anchors.append(anchor(ssh_argv, hosts))
        s, t = job(build, hosts, workers, ssh_options)
        starts.append(s)
        totals.append(t)
    a, s, t = (statistics.median(v) for v in (anchors, starts, totals))
    print(f"{title:<44} ssh alone {ms(a)}   job started {ms(s)}   (+{ms(s - a).strip()})"
          f"   job ended {ms(t)}")
    return a, s


def real_hosts(args, count, workers, multiplexed=False):
    with sshd_hosts.SshdHosts(count) as hosts:
        ssh_argv = ["ssh", "-F", hosts.ssh_config]
        options = ["--ssh-config", hosts.ssh_config]
        title = f"{count} hosts x {workers} workers, real sshd"
        if multiplexed:
            control = os.path.join(hosts.dir, "cm-%C")
            mux = ["ControlMaster=auto", f"ControlPath={control}", "ControlPersist=300"]
            for h in hosts.addresses:  # the masters, opened once
                subprocess.run(ssh_argv + sum((["-o", o] for o in mux), []) + [h, "true"],
                               check=True, timeout=JOB_TIMEOUT_S, stdin=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
            ssh_argv += ["-o", f"ControlPath={control}"]
            options += sum((["--ssh-option", o] for o in mux), [])
            title += ", ControlMaster"
        try:
            return compare(title, args.runs, ssh_argv, hosts.addresses, args.build, workers,
                           options)
        finally:
            if multiplexed:
                for h in hosts.addresses:
                    subprocess.run(ssh_argv + ["-O", "exit", h], timeout=JOB_TIMEOUT_S,
                                   stderr=subprocess.DEVNULL)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--real", default="2,4,8", help="host counts over real sshd")
    parser.add_argument("--standin", default="8,16,32", help="host counts over the stand-in")
    args = parser.parse_args()
    args.build = os.path.abspath(args.build)
    print(f"medians of {args.runs}; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores")

    why = sshd_hosts.unavailable()
    if why:
        print(f"real sshd skipped: {why}")
    else:
        real_hosts(args, 2, 2)
        real_hosts(args, 2, 2, multiplexed=True)

    standin = os.path.join(ROOT, "tests", "ssh_hosts", "standin-ssh")
    for count in (int(c) for c in args.standin.split(",") if c):
        hosts = [f"h{i}" for i in range(count)]
        compare(f"{count} hosts x 1 worker, stand-in ssh", args.runs, [standin], hosts,
                args.build, 1, ["--ssh", standin])

    if not why:
        for count in (int(c) for c in args.real.split(",") if c):
            real_hosts(args, count, 1)


if __name__ == "__main__":
    main()
