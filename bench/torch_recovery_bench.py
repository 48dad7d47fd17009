#!/usr/bin/env python3
"""Recovery of a torch DDP job from one worker's crash: torchrun's group restart, dist-launch's
group restart, and dist-launch's in-place recovery (dist_launch.elastic), cold and warm.

    python3 bench/torch_recovery_bench.py [--build build] [--python python3] [--runs 5]
        [--nproc 2] [--steps 60] [--crash-at-step 25] [--named-hosts tests/named_hosts/named-hosts.sh]
        [--rendezvous static|elastic] [--modes torchrun,group,group-warm,in-place,in-place-warm]

Each run is one job of --nproc workers of examples/torch/elastic_train.py (gloo, CPU, a commit
after every step, --max-restarts 1); rank 1 SIGKILLs itself as step --crash-at-step begins. The
modes alternate (A B C D A B C D ...). With --named-hosts each job runs on two hosts (network
namespaces node-a and node-b, --nproc/2 workers each, two agents or two torchruns; static
rendezvous at node-a, rank 1 on node-a, or --rendezvous elastic: --nnodes 1:2 through c10d at
node-a, ranks by the nodes' arrival):
  torchrun       torch's own launcher (`python -m torch.distributed.run`, its default static
                 rendezvous on a free port): every worker stops, the group restarts from step 0;
  group          dist-launch --max-restarts 1: the same, through dist-launch;
  group-warm     the same with --warm-restart: every worker of the new attempt forked from the
                 zygote;
  in-place       dist-launch --restart-policy in-place: rank 1 alone is started again; the
                 survivors keep their processes and give it their state; the crash step is redone;
  in-place-warm  the same with --warm-restart: the replacement is forked from the zygote.
From the wall clock the script prints (the crash; each step's completion):
  survivors training again = the latest survivor's first completed step after the crash
  replacement training     = the new rank 1's first completed step after the crash
  back at the crash step   = the latest rank to complete the crash step after the crash
Every run's final weights must be the same on every rank (checked), and for two workers the same
as an uninterrupted run's. A torchrun run that fails or does not finish in --timeout s counts as a
failure (torchrun 2.x's static agent has been seen to hang after a worker's death, and its
restarted workers to fail): reported, not timed. Debian's torch 1.13 torchrun does not run on
Python 3.11: leave torchrun out of --modes there.
"""
import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from ttfs_bench import JOB_MARKER, end_job, free_port, marked

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPT = os.path.join(ROOT, "examples", "torch", "elastic_train.py")
CRASH = re.compile(r"rank 1 crash at step (\d+) wall_ns (\d+)")
STEP = re.compile(r"rank (\d+) pid (\d+) step (\d+) done wall_ns (\d+)")
END = re.compile(r"rank (\d+) pid \d+ generation \d+ steps \d+ digest (\w+)")


_ports = iter(range(29500, 30500))  # fresh network namespaces: nothing else holds their ports


def command(args, mode, crash, node=None, port=None):
    """The job's command line; with node (0 or 1): that node's half of a two-host job."""
    train = [SCRIPT, "--steps", str(args.steps), "--timestamps"]
    if crash:
        train += ["--crash-at-step", str(args.crash_at_step)]
    per_node = args.nproc if node is None else args.nproc // 2
    master = "127.0.0.1" if node is None else "node-a"
    port = port or free_port()
    torchrun = mode == "torchrun"
    if node is None:  # one host: torchrun's static mode; dist-launch's own default
        nodes = (["--nnodes", "1", "--master_addr", master, "--master_port", str(port)]
                 if torchrun else [])
    elif args.rendezvous == "static":
        nodes = ["--nnodes", "2", "--node_rank", str(node), "--master_addr", master,
                 "--master_port", str(port)]
    else:  # c10d at node-a's name; ranks follow the nodes' arrival
        nodes = ["--nnodes", "1:2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                 f"{master}:{port}", "--rdzv_id", f"bench-{port}", "--rdzv_conf",
                 "last_call_timeout=30"]
    if torchrun:
        return [args.python, "-m", "torch.distributed.run", *nodes, "--nproc_per_node",
                str(per_node), "--max_restarts", "1", *train]
    extra = {"group": [], "group-warm": ["--warm-restart"],
             "in-place": ["--restart-policy", "in-place"],
             "in-place-warm": ["--restart-policy", "in-place", "--warm-restart"]}[mode]
    return [os.path.join(args.build, "bin", "dist-launch"), *nodes, "--nproc_per_node",
            str(per_node), "--max_restarts", "1", *extra, *train]


_jobs = iter(range(1, 1 << 30))


def launch(args, mode, crash):
    # Every process of the job carries ttfs_bench's marker: a hung torchrun's workers (in sessions
    # of their own, holding our pipes) are killed by it.
    job = f"{os.getpid()}-{next(_jobs)}"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHON_EXEC=args.python,
               PYTHONPATH=os.path.join(ROOT, "python"),  # torchrun's workers: dist_launch.elastic
               **{JOB_MARKER: job})
    if args.hosts is not None:
        try:
            return launch_on_hosts(args, mode, crash, env)
        finally:
            for pid in marked(job):
                os.kill(pid, signal.SIGKILL)
    proc = subprocess.Popen(command(args, mode, crash), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        end_job(proc, job)
        proc.communicate()
        return None
    output = out + err
    if proc.returncode != 0:
        if mode == "torchrun":  # counted, as a hang is
            print(f"{mode} failed ({proc.returncode}): {output.strip().splitlines()[-12:]}",
                  file=sys.stderr)
            return None
        sys.exit(f"{mode} failed ({proc.returncode}):\n{output}")
    return output


def launch_on_hosts(args, mode, crash, env):
    """One job on node-a and node-b (network namespaces), nproc/2 workers each; the two outputs
    together, or None when it did not end in time (both killed) or failed under torchrun."""
    env = dict(env, GLOO_SOCKET_IFNAME="eth0")  # (node-a's own name is 127.0.1.1, as on Debian)
    port = next(_ports)
    logs = [tempfile.NamedTemporaryFile("r", prefix=f"torch-recovery-{h}-", suffix=".log")
            for h in ("node-a", "node-b")]
    procs = [args.hosts.start(host, command(args, mode, crash, node, port), env=env, log=log.name)
             for node, (host, log) in enumerate(zip(("node-a", "node-b"), logs))]
    deadline = time.monotonic() + args.timeout
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = "".join(log.read() for log in logs)
    for log in logs:
        log.close()
    if None in codes or any(codes):
        if mode == "torchrun" or None in codes:
            print(f"{mode} on two hosts: exit codes {codes}: {output.strip().splitlines()[-8:]}",
                  file=sys.stderr)
            return None
        sys.exit(f"{mode} on two hosts failed ({codes}):\n{output}")
    return output


def digests(output, mode, nproc):
    found = dict((int(r), d) for r, d in END.findall(output))
    if sorted(found) != list(range(nproc)) or len(set(found.values())) != 1:
        if mode == "torchrun":  # counted as a failure
            print(f"torchrun: not every rank ended with the same weights: {found}",
                  file=sys.stderr)
            return None
        sys.exit(f"{mode}: not every rank ended with the same weights ({found}):\n{output}")
    return found[0]


def job(args, mode, clean):
    output = launch(args, mode, crash=True)
    if output is None:
        return None
    digest = digests(output, mode, args.nproc)
    if digest is None:
        return None
    if args.nproc == 2 and digest != clean:
        sys.exit(f"{mode}: ended with {digest}, not the uninterrupted run's {clean}")
    if mode.startswith("in-place") and "restarting the worker group" in output:
        sys.exit(f"{mode} fell back to a group restart:\n{output}")
    crash = CRASH.search(output)
    if not crash:
        sys.exit(f"{mode}: no crash line:\n{output}")
    fault = int(crash.group(2))
    steps = [(int(r), int(pid), int(s), int(ns)) for r, pid, s, ns in STEP.findall(output)]
    before = {pid for _, pid, _, ns in steps if ns <= fault}
    # After the kill: a new process's steps, or a survivor's from the crash step on (not the
    # step before it, which a survivor may finish just after the kill).
    after = [(r, s, ns) for r, pid, s, ns in steps
             if ns > fault and (pid not in before or s >= args.crash_at_step)]
    first = {}
    for rank, _, ns in after:
        first[rank] = min(first.get(rank, ns), ns)
    back = [ns for _, step, ns in after if step == args.crash_at_step]
    survivors = [first.get(r) for r in range(args.nproc) if r != 1]
    if None in survivors or 1 not in first or len(back) < args.nproc:
        sys.exit(f"{mode}: missing steps after the crash:\n{output}")
    return ((max(survivors) - fault) / 1e9, (first[1] - fault) / 1e9, (max(back) - fault) / 1e9)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--python", default="python3")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--crash-at-step", type=int, default=25)
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--modes", default="torchrun,group,in-place,in-place-warm")
    parser.add_argument("--named-hosts", metavar="SCRIPT", default=None,
                        help="run each job on two hosts (tests/named_hosts/named-hosts.sh: "
                             "node-a, node-b; root), --nproc/2 workers each")
    parser.add_argument("--rendezvous", choices=["static", "elastic"], default="static",
                        help="two hosts' rendezvous: static (--master-addr node-a) or elastic "
                             "(--nnodes 1:2, c10d at node-a)")
    args = parser.parse_args()
    args.hosts = None
    if args.named_hosts:
        sys.path.insert(0, os.path.join(ROOT, "tests", "named_hosts"))
        from named_hosts import NamedHosts, unavailable
        why = unavailable(os.path.abspath(args.named_hosts))
        if why:
            sys.exit(f"named hosts: {why}")
        args.hosts = NamedHosts(os.path.abspath(args.named_hosts), ["node-a", "node-b"],
                                loopback_self="node-a")
    try:
        bench(args)
    finally:
        if args.hosts is not None:
            args.hosts.close()


def bench(args):
    modes = args.modes.split(",")
    version = subprocess.run([args.python, "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    clean = digests(launch(args, "group", crash=False), "uninterrupted", args.nproc)
    results = {mode: [] for mode in modes}
    failures = {mode: 0 for mode in modes}
    for run in range(args.runs):
        for mode in modes:  # A B C D A B C D
            r = job(args, mode, clean)
            if r is None:
                failures[mode] += 1
                print(f"run {run} {mode:13}: failed, or did not finish in {args.timeout:.0f} s",
                      file=sys.stderr)
                continue
            results[mode].append(r)
            print(f"run {run} {mode:13}: survivors {r[0] * 1e3:7.1f} ms, replacement "
                  f"{r[1] * 1e3:7.1f} ms, back at the crash step {r[2] * 1e3:7.1f} ms",
                  file=sys.stderr)

    def ms(xs):
        if not xs:
            return "-"
        return (f"{statistics.median(xs) * 1e3:7.1f} ms ({min(xs) * 1e3:.0f}-"
                f"{max(xs) * 1e3:.0f})")

    where = (f" on two named hosts ({args.rendezvous} rendezvous)" if args.hosts is not None
             else "")
    print(f"torch {version}, {args.nproc} workers{where}, examples/torch/elastic_train.py --steps "
          f"{args.steps}, rank 1 killed at step {args.crash_at_step}, {args.runs} runs each, "
          f"medians (min-max) from the kill")
    print(f"{'mode':14} {'survivors training again':>28} {'replacement training':>28} "
          f"{'back at the crash step':>28}  finished")
    for mode in modes:
        rows = results[mode]
        print(f"{mode:14} {ms([r[0] for r in rows]):>28} {ms([r[1] for r in rows]):>28} "
              f"{ms([r[2] for r in rows]):>28}  {len(rows)}/{args.runs}")


if __name__ == "__main__":
    main()
