#!/usr/bin/env python3
"""Goodput under chaos: an ordinary torch DDP job run to a fixed number of steps once uninterrupted
and once with a random worker SIGKILLed (or SIGSTOPped) every --interval seconds, launchers
interleaved:

    python3 bench/goodput_bench.py [--build build] [--python python3] [--rounds 2]
        [--steps 1500] [--hidden 1280] [--interval 6] [--signal KILL|STOP]
        [--checkpoint-every 100] [--timeout 300] [--modes torchrun,cold,warm,in-place] [--seed 1]
    python3 bench/goodput_bench.py --hosts --signal MIX [--cut-seconds 5] ...   # as root

With --hosts the job runs on two hosts known by name (network namespaces), one worker each, and
--signal MIX deals a mix of faults in turn: a worker SIGKILLed, a worker SIGSTOPped, node-b's
agent lost (started again at once, as an orchestrator would) and node-b's link cut for
--cut-seconds (goodput_hosts.py says how).

The job is bench/ttfs_train.py (gloo, CPU, 2 workers; each step's batch a function of the step
and the rank): for the restart launchers it checkpoints every --checkpoint-every steps (rank 0,
torch.save and rename) and resumes from the checkpoint, as an unmodified script does; in place it
runs with --in-place (dist_launch.elastic, its state committed every step). The modes:
  torchrun   torch's launcher in its default static rendezvous (--nnodes 1 --master-addr/-port)
  cold       dist-launch: the worker group restarted, cold
  warm       dist-launch --warm-restart: restarted from the zygote
  in-place   dist-launch --warm-restart --restart-policy in-place: the survivors keep training
each with --max-restarts large enough never to run out. Every round runs each mode uninterrupted,
then each under faults (A B C D, A B C D). The killer reads the workers' "rank R pid P" lines and,
every --interval s from the job's start, sends --signal (SIGKILL; or SIGSTOP: a frozen worker
that closes nothing, which only a launcher that looks at its workers finds) to one live worker
chosen at random (a seeded generator; the faults go on until the job ends, its teardown
included). A stopped worker is never continued: the launcher must end it.

Reported per mode (medians over the rounds): the uninterrupted and the faulted wall time, ETTR =
uninterrupted / faulted (each round's own pair), the kills, the jobs that did not finish (a failed
exit, or --timeout), and the jobs whose final weights differ from the uninterrupted run's (every
rank's SHA-256 of its weights, compared with the first uninterrupted run of the round). --json
appends one record per job.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import goodput_hosts
from ttfs_bench import (JOB_MARKER, become_subreaper, end_job, free_port, is_stopped, is_zombie,
                        reap_children)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TRAIN = os.path.join(HERE, "ttfs_train.py")
PID = re.compile(r"rank (\d+) pid (\d+) attempt")
FINAL = re.compile(r"rank (\d+) final weights sha256 (\w+)")
MODES = ("torchrun", "cold", "warm", "in-place")


def train_command(args, mode, checkpoints):
    """The worker's script and its flags."""
    train = [TRAIN, "--steps", str(args.steps), "--hidden", str(args.hidden), "--checkpoint-dir",
             checkpoints, "--checkpoint-every", str(args.checkpoint_every)]
    if mode != "in-place":
        return train
    # On two hosts a lost node of a static job restarts the whole group: the checkpoints too.
    return train + ["--in-place"] + (["--checkpoint-in-place"] if args.hosts else [])


def command(args, mode, checkpoints):
    train = train_command(args, mode, checkpoints)
    restarts = ["--max-restarts", str(args.max_restarts)]
    if mode == "torchrun":
        return [args.python, "-m", "torch.distributed.run", "--nnodes", "1", "--master-addr",
                "127.0.0.1", "--master-port", str(free_port()), "--nproc-per-node", "2",
                *restarts, *train]
    extra = {"cold": [], "warm": ["--warm-restart"],
             "in-place": ["--warm-restart", "--restart-policy", "in-place"]}[mode]
    return [os.path.join(args.build, "bin", "dist-launch"), "--nproc-per-node", "2", *restarts,
            *extra, *train]


class Killer:
    """Reads the job's output; every `interval` s sends `sig` to one live worker at random."""

    def __init__(self, proc, interval, rng, enabled, sig=signal.SIGKILL):
        self.proc, self.interval, self.rng, self.enabled = proc, interval, rng, enabled
        self.sig = sig
        self.pids = {}  # rank -> its newest process
        self.kills = 0
        self.lines = []
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self):
        for line in self.proc.stdout:
            with self.lock:
                self.lines.append(line)
                m = PID.search(line)
                if m:
                    self.pids[int(m.group(1))] = int(m.group(2))

    def live(self):
        with self.lock:
            pids = list(self.pids.values())
        return [p for p in pids if os.path.exists(f"/proc/{p}") and not is_zombie(p)
                and not is_stopped(p)]

    def run(self, deadline):
        """Until the job ends or the deadline: the kills. Returns the exit code, None on timeout."""
        next_kill = time.monotonic() + self.interval
        while time.monotonic() < deadline:
            try:
                return self.proc.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                pass
            if self.enabled and time.monotonic() >= next_kill:
                live = self.live()
                if live:
                    try:
                        os.kill(self.rng.choice(sorted(live)), self.sig)
                        self.kills += 1
                    except ProcessLookupError:
                        pass
                    next_kill = time.monotonic() + self.interval
        return None


def job(args, mode, faults, rng):
    checkpoints = tempfile.mkdtemp(prefix="goodput-bench-")
    marker = f"goodput-{os.getpid()}-{time.monotonic_ns()}"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHON_EXEC=args.python,
               PYTHONPATH=os.path.join(ROOT, "python"), **{JOB_MARKER: marker})
    if args.hosts:
        try:
            code, elapsed, dealt, relaunches, output = goodput_hosts.hosts_job(
                args, mode, faults, rng, train_command(args, mode, checkpoints),
                dict(env, GLOO_SOCKET_IFNAME="eth0"), marker)
        finally:
            shutil.rmtree(checkpoints, ignore_errors=True)
        keep_output(args, mode, faults, output)
        finals = dict((int(r), sha) for r, sha in FINAL.findall(output))
        return {"mode": mode, "faults": faults, "signal": args.signal, "seconds": elapsed,
                "exit": code, "kills": sum(dealt.values()), "dealt": dealt,
                "relaunches": relaunches, "hosts": 2, "finals": finals,
                "tail": output.strip().splitlines()[-6:]}
    start = time.monotonic()
    proc = subprocess.Popen(command(args, mode, checkpoints), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    killer = Killer(proc, args.interval, rng, faults, getattr(signal, "SIG" + args.signal))
    code = killer.run(start + args.timeout)
    elapsed = time.monotonic() - start
    if code is None:
        end_job(proc, marker)
    killer.reader.join(timeout=30)
    reap_children()
    shutil.rmtree(checkpoints, ignore_errors=True)
    output = "".join(killer.lines)
    keep_output(args, mode, faults, output)
    finals = dict((int(r), sha) for r, sha in FINAL.findall(output))
    return {"mode": mode, "faults": faults, "signal": args.signal, "seconds": elapsed, "exit": code,
            "kills": killer.kills, "finals": finals, "tail": output.strip().splitlines()[-6:]}


def keep_output(args, mode, faults, output):
    """With --output DIR, the job's whole output in DIR/<n>-<mode>-<clean|faulted>.log."""
    if args.output:
        os.makedirs(args.output, exist_ok=True)
        n = len(os.listdir(args.output))
        name = f"{n:03d}-{mode}-{'faulted' if faults else 'clean'}.log"
        with open(os.path.join(args.output, name), "w") as f:
            f.write(output)


def weights(record):
    """The job's final weights when it finished with every rank agreeing, else None."""
    finals = record["finals"]
    if record["exit"] != 0 or sorted(finals) != [0, 1] or len(set(finals.values())) != 1:
        return None
    return finals[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--python", default="python3")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--hidden", type=int, default=1280)
    ap.add_argument("--interval", type=float, default=6.0)
    ap.add_argument("--signal", choices=("KILL", "STOP", "MIX"), default="KILL",
                    help="MIX (with --hosts): SIGKILL, SIGSTOP, node-b's agent lost, its link cut")
    ap.add_argument("--hosts", action="store_true",
                    help="one worker on each of two named hosts (as root; goodput_hosts.py)")
    ap.add_argument("--rdzv", choices=("static", "elastic"), default="static",
                    help="--hosts: dist-launch's rendezvous (torchrun's stays its default, static)")
    ap.add_argument("--cut-seconds", type=float, default=5.0,
                    help="--signal MIX: how long node-b's link stays down")
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--max-restarts", type=int, default=1000)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="append one record per job to this file")
    ap.add_argument("--output", metavar="DIR", help="keep each job's whole output in DIR")
    ap.add_argument("--report", metavar="JSONL", help="only print the table of earlier records")
    args = ap.parse_args()
    if args.report:
        with open(args.report) as f:
            report([json.loads(line) for line in f if line.strip()])
        return
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        sys.exit(f"goodput_bench: unknown modes {unknown} (known: {', '.join(MODES)})")
    if args.signal == "MIX" and not args.hosts:
        sys.exit("goodput_bench: --signal MIX needs --hosts (an agent lost, a link cut)")
    why = goodput_hosts.why_not() if args.hosts else None
    if why:
        sys.exit(f"goodput_bench: --hosts: {why}")
    become_subreaper()
    rng = random.Random(args.seed)
    version = subprocess.run([args.python, "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    setting = {"torch": version, "steps": args.steps, "hidden": args.hidden,
               "interval": args.interval, "checkpoint_every": args.checkpoint_every,
               "cut_seconds": args.cut_seconds, "rdzv": args.rdzv}
    records = []
    for round_ in range(args.rounds):
        clean = {m: job(args, m, False, rng) for m in modes}
        reference = next((weights(r) for r in clean.values() if weights(r)), None)
        for m in modes:
            faulted = job(args, m, True, rng)
            for r in (clean[m], faulted):
                record = dict(r, round=round_, weights_ok=reference is not None
                              and weights(r) == reference, **setting)
                records.append(record)
                if args.json:
                    with open(args.json, "a") as f:
                        f.write(json.dumps(record) + "\n")
            print(f"round {round_} {m:9}: uninterrupted {clean[m]['seconds']:6.1f} s "
                  f"(exit {clean[m]['exit']}), faulted {faulted['seconds']:6.1f} s "
                  f"(exit {faulted['exit']}, faults {faulted.get('dealt') or faulted['kills']}"
                  f"{', relaunched ' + str(faulted['relaunches']) if args.hosts else ''}, weights "
                  f"{'as uninterrupted' if records[-1]['weights_ok'] else 'DIFFER or missing'})",
                  file=sys.stderr)
            if faulted["exit"] != 0:
                print("  " + "\n  ".join(faulted["tail"]), file=sys.stderr)
    report(records)


def report(records):
    """The table of the jobs' records: per mode, medians over the rounds. ETTR: each round's
    uninterrupted time over its faulted time (the launcher against itself); ETTR vs best: the
    fastest uninterrupted median of any mode over the faulted time (what a user's job gains)."""
    first = records[0]
    rounds = sorted({r["round"] for r in records})
    modes = [m for m in MODES if any(r["mode"] == m for r in records)]
    fault = {"STOP": "a random worker SIGSTOPped", "KILL": "a random worker SIGKILLed",
             "MIX": f"a fault of the mix (a worker SIGKILLed, a worker SIGSTOPped, node-b's agent "
                    f"lost, node-b's link cut for {first.get('cut_seconds', 5):g} s)"}
    print(f"torch {first['torch']}, 2 workers{' on two named hosts' if first.get('hosts') else ''}"
          f", bench/ttfs_train.py --steps {first['steps']} "
          f"--hidden {first['hidden']} (checkpoint every {first['checkpoint_every']} steps; in "
          f"place: committed every step), {fault[first.get('signal', 'KILL')]} every "
          f"{first['interval']:g} s,"
          f" {len(rounds)} rounds, medians")

    def of(mode, faults):
        return [r for r in records if r["mode"] == mode and r["faults"] == faults]

    def med(xs, fmt):
        return fmt.format(statistics.median(xs)) if xs else "-"

    best = min(statistics.median([r["seconds"] for r in of(m, False)]) for m in modes)
    print(f"| mode | uninterrupted s | faulted s | ETTR | ETTR vs best | "
          f"{'faults' if first.get('signal') == 'MIX' else 'kills'} | not finished "
          "| weights differ |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for m in modes:
        clean = {r["round"]: r for r in of(m, False)}
        faulted = of(m, True)
        done = [f for f in faulted if f["exit"] == 0]
        ettr = [clean[f["round"]]["seconds"] / f["seconds"] for f in done if f["round"] in clean]
        print(f"| {m} | {med([r['seconds'] for r in clean.values()], '{:.1f}')} | "
              f"{med([f['seconds'] for f in done], '{:.1f}')} | {med(ettr, '{:.2f}')} | "
              f"{med([best / f['seconds'] for f in done], '{:.2f}')} | "
              f"{med([f['kills'] for f in faulted], '{:.0f}')} | "
              f"{len(faulted) - len(done)}/{len(faulted)} | "
              f"{sum(1 for f in done if not f['weights_ok'])}/{len(faulted)} |")


if __name__ == "__main__":
    main()
