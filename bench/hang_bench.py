#!/usr/bin/env python3
"""Hangs, stragglers and root causes found by default (issues 22 and 41): a fault suite against
dist-launch's hang detector, with unmodified torch DDP workers (tests/torch/hang_worker.py) and
C++ ones (examples/ddp_train).

    python3 bench/hang_bench.py [--build build] [--python python3] [--runs 3]
        [--healthy-seconds 600] [--overhead-runs 8] [--root-cause-runs 50] [--only PART,...]

Parts (--only): detection, auto, straggler, healthy, overhead, hookcost, graphs, rootcause.
  detection  each injected hang (torch: sleep, a C call deadlocked with the GIL held, a busy loop,
             SIGSTOP, a blocked FIFO read, a skipped collective (three ranks); C++: ddp_train
             --hang-at-step) with --hang-timeout 10, faults interleaved round by round: the time
             from the hung rank's last progress to its kill (the event log: the hang event's time
             minus its silent_ms, to the killed worker's worker_exit), and whether the report named
             rank 1 (and, for the torch faults, the script line it hung on) as the only cause; then
             the restart must succeed.
  auto       the defaults (--hang-timeout auto: 10 x p99, >= 30 s; a rank is ended only on proof):
             for each torch fault, the time from rank 1's last progress to the report naming it
             (hang_suspected, or hang when proven), whether it was ended, and for the proven ones
             (SIGSTOP, the skipped collective) the time to the kill. Unproven ones are reported
             and left running: the job is stopped once the report is out.
  straggler  rank 1 doing 1.3x the work of rank 0 each step (20 ms against 26 ms): the time from
             the job's first worker start to the straggler event; and rank 0 never flagged.
  healthy    one healthy job of --healthy-seconds with the default settings: hangs suspected,
             hangs and straggler flags (all false positives).
  overhead   the training loop's time per step with the agent's hook and with --no-step-hook,
             interleaved, for a bare step (--work 0: a 32x32 DDP step, the worst case) and a 20 ms
             one; medians over --overhead-runs.
  hookcost   what the hook costs in-process: the optimizer hook per step (nanoseconds, best of 5
             loops of 200000) and one pass of the sampler (a gloo group of one, the main thread
             in a loop), that pass's share of a core, and a loop of 3 ms steps (torch ops) with
             the sampler running against without it, alternated (what the main thread loses to
             it, GIL hand-overs included).
  graphs     torch.compile(fullgraph=True) of a function with dist.all_reduce under dist-launch's
             hook and with --no-step-hook: the FX graphs Dynamo hands its backend, compared.
  rootcause  ddp_train whose rank 0 cannot write its checkpoint (rank 1 then fails in its next
             collective, "connection reset"): the report's root cause must be rank 0, rank 1 listed.
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "torch", "hang_worker.py")
DIGITS = os.path.join(ROOT, "examples", "data", "digits.csv.gz")
TORCH_FAULTS = ["sleep", "gil", "spin", "sigstop", "io", "skip"]


def fault_line(name):
    with open(WORKER) as f:
        for number, line in enumerate(f, 1):
            if line.rstrip().endswith(f"# FAULT: {name}"):
                return number
    return None


def expected_where(fault):
    if fault == "sigstop":
        return "stopped (state T"
    if fault == "skip":
        return "waiting in all_reduce #"
    if fault == "cpp":
        return "not in a collective"
    if fault == "spin":  # the loop's two lines: either may be the one running
        return "in stall_spin"
    return f"hang_worker.py:{fault_line(fault)} in stall_{fault}"


class Job:
    """One dist-launch job in its own directory, with its event log."""

    def __init__(self, args, launcher_args, worker, timeout=900, no_python=False, nproc=2,
                 stop_at_event=None):
        """`stop_at_event`: SIGTERM the job once its event log has an event of this name."""
        self.dir = tempfile.mkdtemp(prefix="hang-bench-")
        self.events_path = os.path.join(self.dir, "events.jsonl")
        cmd = [os.path.join(args.build, "bin", "dist-launch"), "--nproc-per-node", str(nproc),
               "--event-log", self.events_path, *launcher_args]
        if no_python:
            cmd += ["--no-python"]
        cmd += worker
        env = dict(os.environ, PYTHON_EXEC=args.python, GLOO_SOCKET_IFNAME="lo",
                   OMP_NUM_THREADS="1")
        self.started = time.monotonic()
        try:
            if stop_at_event is None:
                self.proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                           timeout=timeout, start_new_session=True)
            else:
                self.proc = self.run_until(cmd, env, stop_at_event, timeout)
        finally:
            self.wall = time.monotonic() - self.started
        self.events = self.read_events()
        shutil.rmtree(self.dir, ignore_errors=True)

    def read_events(self):
        if not os.path.exists(self.events_path):
            return []
        with open(self.events_path) as f:
            return [json.loads(line) for line in f if line.strip()]

    def run_until(self, cmd, env, event, timeout):
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True,
                                    start_new_session=True)
            deadline = time.monotonic() + timeout
            while proc.poll() is None and time.monotonic() < deadline:
                if any(e["event"] == event for e in self.read_events()):
                    break
                time.sleep(0.5)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
            out.seek(0)
            err.seek(0)
            return subprocess.CompletedProcess(cmd, proc.returncode, out.read(), err.read())

    def of(self, name):
        return [e for e in self.events if e["event"] == name]


def detection(args, fault, launcher_args):
    if fault == "cpp":
        worker = [os.path.join(args.build, "bin", "ddp_train"), "--data", DIGITS, "--epochs", "3",
                  "--hang-at-step", "60"]
        job = Job(args, ["--max-restarts", "1", *launcher_args], worker, no_python=True)
    else:
        job = Job(args, ["--max-restarts", "1", *launcher_args],
                  [WORKER, "--fault", fault, "--steps", "40"], nproc=3 if fault == "skip" else 2)
    result = {"fault": fault, "ok": False, "named": False, "seconds": None, "rc": job.proc.returncode}
    hangs = job.of("hang")
    if len(hangs) != 1:
        result["why"] = f"{len(hangs)} hang events"
        return result
    hang = hangs[0]
    causes = [r for r in hang["ranks"] if r["cause"]]
    result["named"] = [r["rank"] for r in causes] == [1] and expected_where(fault) in causes[0]["where"]
    result["where"] = causes[0]["where"] if causes else None
    last_progress = hang["ts_ms"] - hang["silent_ms"]
    killed = [e for e in job.of("worker_exit") if e["round"] == 0 and e["rank"] == 1]
    if killed:
        result["seconds"] = (killed[0]["ts_ms"] - last_progress) / 1e3
    result["ok"] = job.proc.returncode == 0 and result["named"] and result["seconds"] is not None
    return result


PROVEN = ("sigstop", "skip")


def auto(args, fault):
    """The defaults: the report's time and content; the kill's, for a proven fault."""
    proven = fault in PROVEN
    job = Job(args, ["--max-restarts", "1"], [WORKER, "--fault", fault, "--steps", "40"],
              nproc=3 if fault == "skip" else 2, timeout=600,
              stop_at_event=None if proven else "hang_suspected")
    reports = job.of("hang") + job.of("hang_suspected")
    result = {"fault": fault, "rc": job.proc.returncode, "reported": None, "ended": None,
              "named": False}
    if not reports:
        return result
    report = min(reports, key=lambda e: e["ts_ms"])
    last_progress = report["ts_ms"] - report["silent_ms"]
    result["reported"] = report["silent_ms"] / 1e3
    named = [r for r in report["ranks"] if r["cause"] or r["suspect"]]
    result["named"] = [r["rank"] for r in named] == [1]
    killed = [e for e in job.of("worker_exit") if e["round"] == 0 and e["signal"] == "SIGKILL"]
    if killed:
        result["ended"] = (killed[0]["ts_ms"] - last_progress) / 1e3
    return result


def straggler(args):
    job = Job(args, [], [WORKER, "--fault", "slow", "--slow-factor", "1.3", "--work", "0.02",
                         "--seconds", "75"])
    starts = job.of("worker_start")
    flagged = [e for e in job.of("straggler") if e["straggler"]]
    first = starts[0]["ts_ms"] if starts else None
    r1 = [e for e in flagged if e["rank"] == 1]
    return {"rc": job.proc.returncode,
            "seconds": (r1[0]["ts_ms"] - first) / 1e3 if r1 and first else None,
            "ratio": r1[0]["ratio"] if r1 else None,
            "wrong": sorted({e["rank"] for e in flagged if e["rank"] != 1})}


def healthy(args):
    job = Job(args, [], [WORKER, "--work", "0.02", "--seconds", str(args.healthy_seconds)],
              timeout=args.healthy_seconds + 300)
    steps = [int(m) for m in re.findall(r"rank \d steps (\d+)", job.proc.stdout)]
    return {"rc": job.proc.returncode, "seconds": job.wall, "steps": steps,
            "suspected": len(job.of("hang_suspected")),
            "hangs": len(job.of("hang")),
            "stragglers": len([e for e in job.of("straggler") if e["straggler"]])}


def loop_seconds_per_step(job):
    found = re.findall(r"rank (\d) steps (\d+) hook \S+ seconds ([0-9.]+)", job.proc.stdout)
    if job.proc.returncode != 0 or len(found) != 2:
        raise SystemExit(f"overhead job failed ({job.proc.returncode}):\n{job.proc.stderr[-2000:]}")
    return max(float(t) / int(n) for _, n, t in found)


def overhead(args, work, steps):
    on, off = [], []
    for _ in range(args.overhead_runs):
        for flags, into in (([], on), (["--no-step-hook"], off)):  # A B A B
            job = Job(args, flags, [WORKER, "--work", str(work), "--steps", str(steps)])
            into.append(loop_seconds_per_step(job))
    return statistics.median(on), statistics.median(off)


HOOK_COST = r"""
import importlib.util, mmap, os, sys, tempfile, threading, time
spec = importlib.util.spec_from_file_location("_dist_launch_progress", sys.argv[1])
prog = importlib.util.module_from_spec(spec)
sys.modules["_dist_launch_progress"] = prog
spec.loader.exec_module(prog)
area = mmap.mmap(-1, 4096)
prog._words, prog._halves = memoryview(area).cast("Q"), memoryview(area).cast("I")
def noop(*a, **k): return None
def per(f, n=200000):
    best = 1e18
    for _ in range(5):
        t = time.perf_counter_ns()
        for _ in range(n): f()
        best = min(best, (time.perf_counter_ns() - t) / n)
    return best
step = per(prog._optimizer_stepped) - per(noop)
import torch, torch.distributed as dist
store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
dist.all_reduce(torch.ones(4))
sampler = prog._Sampler(torch, prog._words, prog._halves)
sampler.main = threading.get_ident()  # this thread's frames: the worst case, the sampler's own
def busy():
    def deep(n):
        return deep(n - 1) if n else sampler.sample()
    deep(40)
per_pass = per(busy, 20000) - per(lambda: (lambda n: None)(0), 20000)
# The main thread's steps of about 3 ms (a fixed amount of torch work each) with the sampler
# thread running against without it, alternated: what the process spends (CPU time, the sampler's
# own and the GIL's hand-overs) and the loop's wall time.
torch.set_num_threads(1)  # the process's CPU time is then this thread's and the sampler's
x = torch.randn(96, 96)
def one_step():
    for _ in range(100):
        torch.relu(x @ x).sum()
def loop(steps=300):
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        one_step()
    return (time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps
def timed(with_sampler):
    prog._sampler = sampler if with_sampler else None
    thread = None
    if with_sampler:
        sampler.main = threading.main_thread().ident
        thread = threading.Thread(target=sampler.run, daemon=True)
        thread.start()
    try:
        return loop()
    finally:
        prog._sampler = None
        if thread:
            thread.join()
walls, cpus, step_s = [], [], []
for i in range(7):  # A B B A ...: a trend in the machine's load falls on both
    off, on = (timed(False), timed(True)) if i % 2 == 0 else reversed((timed(True), timed(False)))
    walls.append(on[0] / off[0])
    cpus.append(on[1] / off[1])
    step_s.append(off[0])
walls.sort(); cpus.sort(); step_s.sort()
print(step, per_pass, walls[3], cpus[3], step_s[3], prog._SAMPLE_SECONDS)
"""


def hook_cost(args):
    """Nanoseconds the optimizer hook adds to a step, and one sampler pass, in-process."""
    module = os.path.join(ROOT, "python", "dist_launch", "progress.py")
    out = subprocess.run([args.python, "-c", HOOK_COST, module], capture_output=True, text=True,
                         check=True).stdout
    return tuple(float(v) for v in out.split())


GRAPHS = r"""
import hashlib, torch, torch.distributed as dist
dist.init_process_group("gloo")
graphs = []
def backend(gm, inputs):
    graphs.append(gm.code)
    return gm.forward
def f(x):
    dist.all_reduce(x)
    return torch.relu(x * 2 + 1)
out = torch.compile(f, fullgraph=True, backend=backend)(torch.ones(8))
if dist.get_rank() == 0:
    print("graph", len(graphs), hashlib.sha256("\n".join(graphs).encode()).hexdigest()[:16])
dist.destroy_process_group()
"""


def graphs(args):
    """The FX graph of a compiled function with a collective, hook on and off."""
    script = os.path.join(tempfile.mkdtemp(prefix="hang-bench-graphs-"), "graphs.py")
    with open(script, "w") as f:
        f.write(GRAPHS)
    found = {}
    for name, flags in (("hook", []), ("no hook", ["--no-step-hook"])):
        job = Job(args, flags, [script])
        m = re.search(r"graph (\d+) (\w+)", job.proc.stdout)
        found[name] = m.groups() if job.proc.returncode == 0 and m else (
            f"failed ({job.proc.returncode}): {job.proc.stderr[-300:]}")
    shutil.rmtree(os.path.dirname(script), ignore_errors=True)
    return found


def root_cause(args):
    bad = os.path.join(tempfile.mkdtemp(prefix="hang-bench-rc-"), "not-a-directory")
    open(bad, "w").close()
    right = listed = 0
    for _ in range(args.root_cause_runs):
        job = Job(args, [], [os.path.join(args.build, "bin", "ddp_train"), "--data", DIGITS,
                             "--epochs", "2", "--checkpoint-dir", bad, "--checkpoint-every", "20"],
                  no_python=True, timeout=120)
        err = job.proc.stderr
        root = err.find("Root Cause (first observed failure):")
        if root >= 0 and "rank      : 0 (local_rank: 0)" in err[root:]:
            right += 1
        if root >= 0 and "rank      : 1 (local_rank: 1)" in err[:root]:
            listed += 1
    shutil.rmtree(os.path.dirname(bad), ignore_errors=True)
    return right, listed


def spread(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "n/a"
    return f"median {statistics.median(xs):.1f} s (min {min(xs):.1f}, max {max(xs):.1f})"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--python", default="python3", help="the workers' interpreter (with torch)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--healthy-seconds", type=int, default=600)
    p.add_argument("--overhead-runs", type=int, default=8)
    p.add_argument("--root-cause-runs", type=int, default=50)
    p.add_argument("--only",
                   default="detection,auto,straggler,healthy,overhead,hookcost,graphs,rootcause")
    args = p.parse_args()
    args.build = os.path.abspath(args.build)
    parts = set(args.only.split(","))
    version = subprocess.run([args.python, "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True).stdout.strip()
    print(f"torch {version or 'absent'} at {args.python}; {os.cpu_count()} cores; "
          f"load {os.getloadavg()[0]:.1f}", flush=True)

    if "detection" in parts:
        results = {f: [] for f in TORCH_FAULTS + ["cpp"]}
        for run in range(args.runs):
            for fault in results:  # every fault once per round
                r = detection(args, fault, ["--hang-timeout", "10"])
                results[fault].append(r)
                print(f"  detection run {run} {fault}: {r}", file=sys.stderr, flush=True)
        print("\nDetection, --hang-timeout 10 (last progress -> hung rank killed), report right:")
        for fault, rs in results.items():
            named = sum(r["named"] for r in rs)
            ok = sum(r["ok"] for r in rs)
            print(f"  {fault:8} {spread([r['seconds'] for r in rs])}; rank 1 and its place named "
                  f"{named}/{len(rs)}; restarted and succeeded {ok}/{len(rs)}")
    if "auto" in parts:
        results = {f: [] for f in TORCH_FAULTS}
        for run in range(args.runs):
            for fault in results:
                r = auto(args, fault)
                results[fault].append(r)
                print(f"  auto run {run} {fault}: {r}", file=sys.stderr, flush=True)
        print("\nThe defaults (last progress -> report; -> kill, proven faults only):")
        for fault, rs in results.items():
            ended = [r["ended"] for r in rs if r["ended"] is not None]
            print(f"  {fault:8} reported {spread([r['reported'] for r in rs])}; rank 1 named "
                  f"{sum(r['named'] for r in rs)}/{len(rs)}; ended {len(ended)}/{len(rs)}"
                  + (f" {spread(ended)}" if ended else ""))
    if "straggler" in parts:
        rs = [straggler(args) for _ in range(args.runs)]
        for r in rs:
            print(f"  straggler: {r}", file=sys.stderr)
        print(f"\nStraggler 1.3x flagged after the first worker start: "
              f"{spread([r['seconds'] for r in rs])}; flagged {sum(r['seconds'] is not None for r in rs)}"
              f"/{len(rs)}; ratios {[round(r['ratio'], 2) for r in rs if r['ratio']]}; "
              f"other ranks flagged: {sum(len(r['wrong']) for r in rs)}")
    if "healthy" in parts:
        r = healthy(args)
        print(f"\nHealthy {args.healthy_seconds} s job (default settings): exit {r['rc']}, "
              f"steps {r['steps']}, hangs suspected {r['suspected']}, hangs {r['hangs']}, "
              f"straggler flags {r['stragglers']}")
    if "overhead" in parts:
        print("\nStep-time overhead of the hook (median loop time per step, hook on / off):")
        for work, steps in ((0, 2000), (0.003, 1500), (0.02, 300)):
            on, off = overhead(args, work, steps)
            print(f"  --work {work}: {on * 1e3:.3f} ms / {off * 1e3:.3f} ms = "
                  f"{(on / off - 1) * 100:+.2f}%")
    if "hookcost" in parts:
        step, per_pass, wall, cpu, step_s, period = hook_cost(args)
        print(f"\nThe hook in-process: the optimizer hook {step:.0f} ns a step; a sampler pass "
              f"{per_pass / 1e3:.1f} us (40 frames deep, one group), "
              f"{per_pass / 1e9 / period * 100:.3f}% of a core at a pass every {period * 1e3:.0f} "
              f"ms; a loop of {step_s * 1e3:.1f} ms steps (torch ops) with the sampler running "
              f"against without it, medians of 7 alternations: CPU time {(cpu - 1) * 100:+.2f}%, "
              f"wall time {(wall - 1) * 100:+.2f}% (load {os.getloadavg()[0]:.1f})")
    if "graphs" in parts:
        found = graphs(args)
        same = found["hook"] == found["no hook"]
        print(f"\ntorch.compile(fullgraph=True) with dist.all_reduce: hook {found['hook']}, "
              f"--no-step-hook {found['no hook']}: {'the same graph' if same else 'DIFFERENT'}")
    if "rootcause" in parts:
        right, listed = root_cause(args)
        print(f"\nRoot cause: rank 0 (its checkpoint write failed) named {right}/"
              f"{args.root_cause_runs}; rank 1's consequent failure listed {listed}/"
              f"{args.root_cause_runs}")


if __name__ == "__main__":
    main()
