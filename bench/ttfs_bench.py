#!/usr/bin/env python3
"""Time to first step after a failure ("TTFS"): a PyTorch DDP job (bench/ttfs_train.py: gloo, 2
workers, a checkpoint every 10 steps, 60 steps of at least 20 ms) loses rank 1 to SIGKILL at
step 25; TTFS is the time from
that kill to the moment every rank has completed its first step of the new attempt. Per launcher:

    dist-launch                      cold restart (every worker imports torch again)
    dist-launch --warm-restart       workers forked from the zygote
    dist-launch --warm-restart, snapshots   ... resuming from dist_launch.snapshot, not the disk
    torchrun (torch 2.x), static     python -m torch.distributed.run --nnodes 1 --master-port P
    torchrun (torch 2.x), standalone python -m torch.distributed.run --standalone

interleaved (one run of each in turn, --runs rounds; the --warm-restart rows get --warm-runs),
medians over the runs whose restart worked. A restart worked when the job exited 0 within
--timeout, both ranks completed a step of the second attempt, and both ended with the weights of
an uninterrupted run (which this bench runs first). Also measured, interleaved the same way: the
first launch (launcher start to every rank's first completed step) of dist-launch cold and
--warm-restart, and the time dist_launch.snapshot.save takes for a 100 MB state under the agent,
beside a memcpy of the same 100 MB in the same process.

No job outlives its run: each one's processes carry a marker in their environment, and its end
kills every process that has it (torchrun's workers run in sessions of their own, which a kill of
torchrun's process group misses) and reaps them (the bench is a child subreaper); a launcher that
exited leaving processes behind is said in a warning.

    python3 bench/ttfs_bench.py [--build build] [--python python3] [--runs 10] [--warm-runs 20]
"""
import argparse
import ctypes
import itertools
import os
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "ttfs_train.py")
KILL_STEP = 25
# 60 steps of at least 20 ms each: the kill at step 25 lands long before rank 1 could finish.
TRAIN_ARGS = ["--steps", "60", "--step-seconds", "0.02"]
LINE = re.compile(r"rank (\d+) (?:step (\d+) done at ([\d.]+)|pid (\d+) attempt (\d+)|"
                  r"final weights sha256 ([0-9a-f]+))")


# Every job's processes carry JOB_MARKER=<this bench's pid>-<n> in their environment, so that the
# end of a job finds them all: torchrun starts each worker in a session of its own
# (start_new_session), out of reach of a kill of torchrun's process group, and a torchrun killed
# at the timeout cannot stop them itself.
JOB_MARKER = "TTFS_BENCH_JOB"
_jobs = itertools.count()
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper():
    """Orphans of the jobs become this process's children, to be killed and reaped here."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"warning: PR_SET_CHILD_SUBREAPER: {os.strerror(ctypes.get_errno())}",
              file=sys.stderr)


def marked(marker):
    """The pids of the processes whose environment holds `marker`."""
    needle = b"\0" + f"{JOB_MARKER}={marker}".encode() + b"\0"
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in b"\0" + f.read() + b"\0":
                    pids.append(int(entry))
        except OSError:  # gone, or another user's
            pass
    return pids


def reap_children():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def end_job(proc, marker):
    """Kills whatever the job left: its launcher's process group while the launcher runs (it is
    a session leader), then every process carrying the job's marker, until none is left; reaps
    what became this process's children. Returns how many processes outlived the launcher."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    left = set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = [pid for pid in marked(marker) if not is_zombie(pid)]
        if not pids:
            break
        left.update(pids)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        reap_children()
        time.sleep(0.05)
    else:
        print(f"warning: processes of job {marker} survive SIGKILL: {marked(marker)}",
              file=sys.stderr)
    reap_children()
    return len(left)


def is_zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def is_stopped(pid):
    """Whether the kernel holds `pid` stopped (state T): a fault already dealt."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Launcher:
    def __init__(self, name, command, script_args=(), warm=False):
        self.name = name
        self.command = command  # a function: () -> argv before the script
        self.script_args = list(script_args)
        self.warm = warm
        self.ttfs, self.first, self.tries, self.failures = [], [], 0, []


def launchers(build, python):
    dl = os.path.join(build, "bin", "dist-launch")
    common = ["--nproc-per-node", "2", "--max-restarts", "1"]
    rows = [
        Launcher("dist-launch (cold)", lambda: [dl, *common]),
        Launcher("dist-launch --warm-restart", lambda: [dl, *common, "--warm-restart"], warm=True),
        Launcher("dist-launch --warm-restart, snapshots",
                 lambda: [dl, *common, "--warm-restart", "--snapshot-memory", "1G"],
                 ["--snapshots"], warm=True),
    ]
    torchrun = [python, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--max-restarts", "1"]
    rows.append(Launcher("torchrun, static", lambda: [
        *torchrun, "--nnodes", "1", "--master-addr", "127.0.0.1", "--master-port",
        str(free_port())]))
    rows.append(Launcher("torchrun, --standalone", lambda: [*torchrun, "--standalone"]))
    return rows


def run_job(argv, env, timeout, kill_step):
    """Runs one job; kills rank 1 of attempt 0 when it reports `kill_step` (None: no kill).
    Returns (exit code or None on timeout, start time, kill time, {(rank, attempt): first step
    time}, {rank: final sha})."""
    started = time.time()
    marker = f"{os.getpid()}-{next(_jobs)}"
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=dict(env, **{JOB_MARKER: marker}), start_new_session=True)
    pids, attempt_of, first, sha = {}, {}, {}, {}
    killed_at = None
    buffer = b""
    deadline = started + timeout
    code = None
    try:
        while True:
            left = deadline - time.time()
            if left <= 0:
                break
            ready, _, _ = select.select([proc.stdout], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                code = proc.wait(timeout=max(1.0, deadline - time.time()))
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for m in (m for raw in lines for m in LINE.finditer(raw.decode(errors="replace"))):
                rank = int(m.group(1))
                if m.group(4):
                    pids[rank], attempt_of[rank] = int(m.group(4)), int(m.group(5))
                elif m.group(6):
                    sha[rank] = m.group(6)
                elif m.group(2):
                    attempt = attempt_of.get(rank, 0)
                    first.setdefault((rank, attempt), float(m.group(3)))
                    if (kill_step is not None and killed_at is None and rank == 1 and
                            attempt == 0 and int(m.group(2)) >= kill_step and 1 in pids):
                        killed_at = time.time()
                        try:
                            os.kill(pids[1], signal.SIGKILL)
                        except ProcessLookupError:  # it had finished: the kill missed
                            killed_at = None
                            kill_step = None
    except subprocess.TimeoutExpired:
        code = None
    finally:
        running = proc.poll() is None
        left = end_job(proc, marker)
        proc.stdout.close()
        if running:
            code = None
        if left and not running:
            print(f"warning: {os.path.basename(argv[0])} exited ({code}) and left {left} "
                  f"process(es), killed", file=sys.stderr)
    return code, started, killed_at, first, sha


def measure(launcher, env, python, timeout, reference):
    ckpt = tempfile.mkdtemp(prefix="ttfs-bench-")
    try:
        argv = launcher.command() + [TRAIN, "--checkpoint-dir", ckpt, *TRAIN_ARGS,
                                     *launcher.script_args]
        code, started, killed, first, sha = run_job(argv, env, timeout, KILL_STEP)
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)
    launcher.tries += 1
    if (0, 0) in first and (1, 0) in first:
        launcher.first.append(max(first[(0, 0)], first[(1, 0)]) - started)
    why = None
    if killed is None and code == 0:  # rank 1 finished before the kill reached it: not a run
        launcher.tries -= 1
        return
    if code != 0:
        why = "timed out (hung)" if code is None else f"exit code {code}"
    elif killed is None or (0, 1) not in first or (1, 1) not in first:
        why = "no second attempt"
    elif sha != {0: reference, 1: reference}:
        why = "final weights differ from an uninterrupted run's"
    if why:
        launcher.failures.append(why)
        return
    launcher.ttfs.append(max(first[(0, 1)], first[(1, 1)]) - killed)


def first_launch(argv, env, timeout):
    ckpt = tempfile.mkdtemp(prefix="ttfs-bench-")
    try:
        code, started, _, first, _ = run_job(argv + [TRAIN, "--checkpoint-dir", ckpt,
                                                     "--steps", "1"], env, timeout, None)
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)
    if code != 0 or (0, 0) not in first or (1, 0) not in first:
        return None
    return max(first[(0, 0)], first[(1, 0)]) - started


SAVE_WORKER = r"""
import os, sys, time
import torch
from dist_launch import snapshot
state = {"w": torch.randn(25_000_000)}  # 100 MB of float32
copy = torch.empty_like(state["w"])
for i in range(1, 7):
    t0 = time.perf_counter(); snapshot.save(i, state); t1 = time.perf_counter()
    copy.copy_(state["w"]); t2 = time.perf_counter()
    print(f"save {i} {1e3 * (t1 - t0):.1f} memcpy {1e3 * (t2 - t1):.1f}", flush=True)
t0 = time.perf_counter(); step, loaded = snapshot.load(); t1 = time.perf_counter()
assert step == 6 and torch.equal(loaded["w"], state["w"])
print(f"load {1e3 * (t1 - t0):.1f}", flush=True)
"""


def snapshot_save(build, env, runs):
    """Medians over `runs` jobs of: the first save (fresh memory), the later saves (the oldest
    snapshot's memory reused), a memcpy of the same bytes, a load."""
    results = {"first": [], "steady": [], "memcpy": [], "load": []}
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "save_100mb.py")
        with open(script, "w") as f:
            f.write(SAVE_WORKER)
        for _ in range(runs):
            marker = f"{os.getpid()}-{next(_jobs)}"
            proc = subprocess.Popen([os.path.join(build, "bin", "dist-launch"),
                                     "--snapshot-memory", "1G", script],
                                    env=dict(env, **{JOB_MARKER: marker}), stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True, start_new_session=True)
            try:
                out = proc.communicate(timeout=300)[0]
            except subprocess.TimeoutExpired:
                out = ""
            finally:
                end_job(proc, marker)
            saves = [tuple(map(float, m)) for m in re.findall(r"save \d+ ([\d.]+) memcpy ([\d.]+)",
                                                               out)]
            load = re.search(r"load ([\d.]+)", out)
            if len(saves) != 6 or not load:
                print(f"snapshot save run failed:\n{out}", file=sys.stderr)
                continue
            results["first"].append(saves[0][0])
            results["steady"].append(statistics.median(s for s, _ in saves[2:]))
            results["memcpy"].append(statistics.median(m for _, m in saves))
            results["load"].append(float(load.group(1)))
    return {k: statistics.median(v) for k, v in results.items() if v}


def fmt(values, unit="s"):
    if not values:
        return "-"
    return f"{statistics.median(values):.3f} {unit}" if unit == "s" else f"{values:.1f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--python", default="python3", help="the workers' and torchrun's Python")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--warm-runs", type=int, default=20)
    ap.add_argument("--first-launch-runs", type=int, default=10)
    ap.add_argument("--save-runs", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=120)
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    become_subreaper()
    probe = subprocess.run([args.python, "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        sys.exit(f"{args.python} has no torch")
    env = dict(os.environ, PYTHON_EXEC=shutil.which(args.python) or args.python,
               GLOO_SOCKET_IFNAME="lo")
    env.pop("OMP_NUM_THREADS", None)
    print(f"torch {probe.stdout.strip()} at {args.python}; {os.cpu_count()} CPUs; kill at step "
          f"{KILL_STEP}", flush=True)

    # The reference: an uninterrupted run's final weights.
    ckpt = tempfile.mkdtemp(prefix="ttfs-bench-")
    code, _, _, _, sha = run_job([os.path.join(args.build, "bin", "dist-launch"),
                                  "--nproc-per-node", "2", TRAIN, "--checkpoint-dir", ckpt,
                                  *TRAIN_ARGS], env, args.timeout, None)
    shutil.rmtree(ckpt, ignore_errors=True)
    if code != 0 or len(set(sha.values())) != 1:
        sys.exit(f"the uninterrupted reference run failed (exit {code}, {sha})")
    reference = sha[0]

    rows = launchers(args.build, args.python)
    for i in range(max(args.runs, args.warm_runs)):
        for row in rows:
            if i < (args.warm_runs if row.warm else args.runs):
                measure(row, env, args.python, args.timeout, reference)
        print(f"round {i + 1}: " + ", ".join(
            f"{r.name} {r.ttfs[-1]:.2f}s" if r.ttfs else f"{r.name} -" for r in rows), flush=True)

    print("\n| launcher | TTFS median | min | max | restarts that worked | first launch median |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        ok = len(r.ttfs)
        extremes = f"{min(r.ttfs):.3f} s | {max(r.ttfs):.3f} s" if r.ttfs else "- | -"
        print(f"| {r.name} | {fmt(r.ttfs)} | {extremes} | {ok}/{r.tries} | {fmt(r.first)} |")
        if r.failures:
            print(f"|  failures: {', '.join(sorted(set(r.failures)))} | | | | | |")
    cold = statistics.median(rows[0].ttfs) if rows[0].ttfs else None
    if cold:
        for r in rows[1:3]:
            if r.ttfs:
                print(f"{r.name}: {statistics.median(r.ttfs) / cold:.2f}x the cold restart")

    dl = os.path.join(args.build, "bin", "dist-launch")
    cold_first, warm_first = [], []
    for _ in range(args.first_launch_runs):
        for argv, out in (([dl, "--nproc-per-node", "2"], cold_first),
                          ([dl, "--nproc-per-node", "2", "--warm-restart"], warm_first)):
            t = first_launch(argv, env, args.timeout)
            if t is not None:
                out.append(t)
    if cold_first and warm_first:
        ratio = statistics.median(warm_first) / statistics.median(cold_first)
        print(f"\nfirst launch (start to every rank's first step), {len(cold_first)} and "
              f"{len(warm_first)} runs: cold {fmt(cold_first)}, --warm-restart "
              f"{fmt(warm_first)} ({(ratio - 1) * 100:+.1f}%)")

    saves = snapshot_save(args.build, env, args.save_runs)
    if saves:
        print(f"\n100 MB snapshot (median of {args.save_runs} jobs): first save "
              f"{saves['first']:.1f} ms, later saves {saves['steady']:.1f} ms (a memcpy of the "
              f"same bytes: {saves['memcpy']:.1f} ms), load {saves['load']:.1f} ms")


if __name__ == "__main__":
    main()
