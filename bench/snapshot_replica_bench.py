#!/usr/bin/env python3
"""Snapshots that outlive their node (issue 44, item 4): --snapshot-replicas against --snapshot-dir,
on named hosts (network namespaces on one bridge, tests/named_hosts/named-hosts.sh).

    python3 bench/snapshot_replica_bench.py [--build build] [--runs 3] [--mb 100]
        [--parts recovery,overhead] [--rate 1gbit] [--out results.jsonl]

recovery: an elastic job of three hosts (3:3, one worker each, every worker saving a --mb state
with dist_launch.snapshot every 0.2 s) loses node-b's agent (SIGKILL, its worker with it); a
replacement starts on node-d. The next round renumbers the nodes, so node-d's worker is a rank
whose state is on another host. Measured: from the replacement's start to its worker holding its
loaded state (the worker's clock after load() returns), and the agent's restore alone. Modes:
  replicas       --snapshot-replicas 1 (the state comes from another node's agent's memory)
  replicas-slow  the same, every host's eth0 limited to --rate (tc tbf)
  disk           --snapshot-dir on this machine's disk, which the hosts share (the state comes
                 from the file the lost node's agent persisted; the page cache may hold it)
overhead: two hosts, one worker each, steps of about 1 s of Python compute followed by a save of
the --mb state; the mean step time with snapshots in memory alone and with --snapshot-replicas 1
(the agents send every save to the other host in the background), the bytes each host's eth0
sent per save, and the memory the replicas hold. Modes interleave in each round (A B A B ...), the
table gives medians over --runs rounds. Needs root; exits 77 when named hosts cannot be made.
"""
import argparse
import json
import os
import resource
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "named_hosts"))
from named_hosts import SKIP, NamedHosts, unavailable  # noqa: E402

NAMED_HOSTS = os.path.join(ROOT, "tests", "named_hosts", "named-hosts.sh")
STORE_PORT = "29500"
JOB_TIMEOUT_S = 300

RECOVERY_WORKER = r'''
import os, sys, time
from dist_launch import snapshot
rank, restart = int(os.environ["RANK"]), os.environ["TORCHELASTIC_RESTART_COUNT"]
mb, go = int(sys.argv[1]), sys.argv[2]
found = snapshot.load()
print(f"rank {rank} restart {restart} loaded {found[0] if found else None} at {time.time():.6f}",
      flush=True)
payload = bytearray(os.urandom(1 << 20)) * mb
step = found[0] + 1 if found else 0
while True:
    snapshot.save(step, {"rank": rank, "step": step, "payload": payload})
    if step % 5 == 0:
        print(f"rank {rank} saved {step}", flush=True)
    step += 1
    if restart != "0" and os.path.exists(go + ".end"):
        break
    time.sleep(0.2)
'''

OVERHEAD_WORKER = r'''
import os, sys, time
from dist_launch import snapshot
rank = int(os.environ["RANK"])
mb, steps, work, pause = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
payload = bytearray(os.urandom(1 << 20)) * mb
times = []
for step in range(steps):
    began = time.perf_counter()
    x = 0
    for i in range(work):
        x += i * i
    time.sleep(pause)
    snapshot.save(step, {"rank": rank, "step": step, "payload": payload})
    times.append(time.perf_counter() - began)
print(f"rank {rank} step times " + " ".join(f"{t:.4f}" for t in times), flush=True)
'''


def shape_links(hosts, names, rate):
    for name in names:
        subprocess.run(["ip", "netns", "exec", f"{hosts.run_id}-{name}", "tc", "qdisc", "replace",
                        "dev", "eth0", "root", "tbf", "rate", rate, "burst", "256kb", "latency",
                        "200ms"], check=True)


def tx_bytes(hosts, name):
    out = subprocess.run(["ip", "netns", "exec", f"{hosts.run_id}-{name}", "cat",
                          "/sys/class/net/eth0/statistics/tx_bytes"], capture_output=True,
                         text=True, check=True)
    return int(out.stdout)


def read(path):
    with open(path) as f:
        return f.read()


def wait_for(path, pattern, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and re.search(pattern, read(path)):
            return
        time.sleep(0.02)
    raise RuntimeError(f"no {pattern!r} in {path}:\n{read(path) if os.path.exists(path) else ''}")


def recovery(args, mode, work):
    names = ["node-a", "node-b", "node-c", "node-d"]
    script = os.path.join(work, "recovery.py")
    with open(script, "w") as f:
        f.write(RECOVERY_WORKER)
    go = os.path.join(work, f"go-{mode}-{time.monotonic_ns()}")
    flags = {"replicas": ["--snapshot-replicas", "1"],
             "replicas-slow": ["--snapshot-replicas", "1"],
             "disk": ["--snapshot-dir", os.path.join(work, f"disk-{time.monotonic_ns()}")]}[mode]
    with NamedHosts(NAMED_HOSTS, names, loopback_self="node-a") as hosts:
        if mode == "replicas-slow":
            shape_links(hosts, names, args.rate)
        env = dict(os.environ, PYTHON_EXEC=sys.executable)

        def agent(name):
            log = os.path.join(work, f"{mode}-{name}.log")
            argv = [args.launcher, "--nnodes", "3:3", "--nproc-per-node", "1",
                    "--rdzv-endpoint", f"node-a:{STORE_PORT}", "--rdzv-id", "bench",
                    "--max-restarts", "1", *flags, script, str(args.mb), go]
            return hosts.start(name, argv, env=env, log=log), log

        nodes = {name: agent(name) for name in names[:3]}
        for name in names[:3]:
            wait_for(nodes[name][1], r"saved 10\b")
        # Whatever a save is persisting or sending now is left to finish: the lost node's last
        # save is in its peers' hands (the persister: each interval, 5 s), as in steady state.
        time.sleep(6 if mode == "disk" else 1)
        nodes["node-b"][0].kill()
        nodes["node-b"][0].wait()
        started = time.time()
        nodes["node-d"] = agent("node-d")
        wait_for(nodes["node-d"][1], r"restart 1 loaded")
        open(go + ".end", "w").close()
        for name in ["node-a", "node-c", "node-d"]:
            nodes[name][0].wait(timeout=JOB_TIMEOUT_S)
        out = read(nodes["node-d"][1])
        m = re.search(r"rank (\d) restart 1 loaded (\S+) at ([\d.]+)", out)
        restore = re.search(r"restored from the agent at \S+ in (\d+) ms", out)
        return {"part": "recovery", "mode": mode, "mb": args.mb, "rank": int(m.group(1)),
                "loaded_step": None if m.group(2) == "None" else int(m.group(2)),
                "seconds": float(m.group(3)) - started,
                "restore_ms": int(restore.group(1)) if restore else None}


def overhead(args, mode, work):
    names = ["node-a", "node-b"]
    script = os.path.join(work, "overhead.py")
    with open(script, "w") as f:
        f.write(OVERHEAD_WORKER)
    flags = {"memory": [], "replicas": ["--snapshot-replicas", "1"]}[mode]
    with NamedHosts(NAMED_HOSTS, names, loopback_self="node-a") as hosts:
        env = dict(os.environ, PYTHON_EXEC=sys.executable)
        before = {n: tx_bytes(hosts, n) for n in names}
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_before = usage.ru_utime + usage.ru_stime
        procs = []
        for rank, name in enumerate(names):
            log = os.path.join(work, f"overhead-{mode}-{name}.log")
            argv = [args.launcher, "--nnodes", "2", "--node-rank", str(rank), "--master-addr",
                    "node-a", "--master-port", STORE_PORT, "--nproc-per-node", "1",
                    "--snapshot-memory", f"{3 * args.mb + 64}M", *flags, script, str(args.mb),
                    str(args.steps), str(args.work), str(args.pause)]
            procs.append((hosts.start(name, argv, env=env, log=log), log))
        for proc, log in procs:
            if proc.wait(timeout=JOB_TIMEOUT_S) != 0:
                raise RuntimeError(read(log))
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = usage.ru_utime + usage.ru_stime - cpu_before  # agents and workers, both hosts
        sent = sum(tx_bytes(hosts, n) - before[n] for n in names)
        times, replicated = [], 0
        for _, log in procs:
            m = re.search(r"step times ([\d. ]+)", read(log))
            times += [float(t) for t in m.group(1).split()[1:]]  # the first: warming up
            m = re.search(r"snapshot replicas: (\d+) saves sent", read(log))
            replicated += int(m.group(1)) if m else 0
            if os.environ.get("BENCH_DEBUG"):
                print(read(log)[-3000:], file=sys.stderr)
        return {"part": "overhead", "mode": mode, "mb": args.mb, "step_s": statistics.mean(times),
                "sent_mb_per_save": sent / 1e6 / (2 * args.steps),
                "replicated": replicated / (2 * args.steps), "cpu_s_per_save": cpu / (2 * args.steps)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--parts", default="recovery,overhead")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--work", type=int, default=12_000_000, help="Python loop iterations a step")
    ap.add_argument("--pause", type=float, default=0.0,
                    help="seconds a step sleeps after its compute (an accelerator's step)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    args.launcher = os.path.join(os.path.abspath(args.build), "bin", "dist-launch")
    why = unavailable(NAMED_HOSTS)
    if why:
        print(f"SKIP: {why}")
        return SKIP
    parts = args.parts.split(",")
    results = []
    with tempfile.TemporaryDirectory(prefix="dist-replica-bench-") as work:
        for run in range(args.runs):
            plan = []
            if "recovery" in parts:
                plan += [(recovery, m) for m in ("replicas", "disk", "replicas-slow")]
            if "overhead" in parts:
                plan += [(overhead, m) for m in ("memory", "replicas")]
            for part, mode in plan:
                r = part(args, mode, work)
                r["run"] = run
                results.append(r)
                print(json.dumps(r), flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(r) + "\n")
    print()
    for part, key in (("recovery", "seconds"), ("overhead", "step_s")):
        rows = [r for r in results if r["part"] == part]
        for mode in dict.fromkeys(r["mode"] for r in rows):
            mine = [r for r in rows if r["mode"] == mode]
            extra = ""
            if part == "recovery":
                restores = [r["restore_ms"] for r in mine if r["restore_ms"] is not None]
                extra = (f", restore {statistics.median(restores):.0f} ms" if restores else "") + \
                    f", loaded steps {[r['loaded_step'] for r in mine]}"
            else:
                extra = (f", {statistics.median(r['sent_mb_per_save'] for r in mine):.1f} MB sent "
                         f"per save, {statistics.median(r['replicated'] for r in mine):.0%} of the "
                         "saves replicated, CPU "
                         f"{statistics.median(r['cpu_s_per_save'] for r in mine):.3f} s per save "
                         "(workers and agents)")
            print(f"{part:9s} {mode:14s} median {statistics.median(r[key] for r in mine):.3f} s "
                  f"over {len(mine)}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
