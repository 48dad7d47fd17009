#!/usr/bin/env python3
"""A lost node's survivors, or a node joining: regrouped in place against a group restart.

    python3 bench/regroup_bench.py [--build build] [--runs 7] [--nodes 3] [--nproc 2]
                                   [--torch PYTHON] [--event lost|join|spare|relaunch] [--warm]
                                   [--named-hosts tests/named_hosts/named-hosts.sh]
                                   [--torchrun PYTHON]

Each run is one elastic job (--nnodes 2:NODES, c10d, the rendezvous store hosted by the first
agent on 127.0.0.2) of NODES agents of --nproc workers each, --max-restarts 1: the C++ SDK's
dist-inplace-worker (--step-ms 10: a step of about 10 ms), or with --torch PYTHON
examples/torch/elastic_train.py (torch DDP, gloo, dist_launch.elastic; --pause-ms 10). Once node 1's workers have taken 20 steps, its
agent is SIGKILLed (its workers die with it, as with a lost machine). The policies alternate
(A B A B ...):
  A, group (--restart-policy group, today's and torchrun's behaviour): the survivors' workers are
     stopped and the group starts again, from step 0, in a new round of the surviving nodes;
  B, in-place: the survivors' workers keep their processes and regroup in a smaller world.
Measured from the kill (this script's clock, as it sends SIGKILL) to the first step each survivor
completes afterwards: the time its worker stamped on the step line (elastic_train.py's wall_ns,
on this script's clock), or for the C++ workers, which stamp none, the time the line was read
through the agent's pipe (the console's own latency included). Torchrun's step lines come from
its tee of the workers' log files, read late: steps done before the kill were read after it.
  survivors training again = the latest survivor's first step after its pause (its longest gap
                             between two steps from the kill on: a step in flight may still
                             complete after the kill)
  steps trained again      = the last step completed before the pause + 1 - the first step
                             completed after it (a group restart starts over at step 0: no
                             checkpoint here; in place, the step in flight is redone)
Medians of --runs, with min and max. The issue's targets for in-place: C++ SDK <= 0.5 s, torch
<= 1 s.

--torchrun PYTHON (with --torch): a third policy in the interleave (A B C A B C ...), torchrun
itself (PYTHON -m torch.distributed.run, torch 2.x: c10d rendezvous at the same endpoint, its
defaults otherwise, --tee 3 for the step lines; the same script, which under torchrun restarts from
step 0 as under the group policy). A lost torchrun node is its agent and every process below it
SIGKILLed, each worker's own session included (torchrun starts each worker in a session of its
own, and its workers outlive a SIGKILLed agent); its steps are read from torchrun's tee of the
workers' logs (their own time stamps, as above). Torchrun runs with
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with torch 2.x's default (the agents share one TCPStore with
the workers) a job that changes its nodes fails. For --event join the running agents, which built
their workers' store address in their first round, do not write it again for the next round, and
the newcomer, rank 1 or 2 of that round, waits 60 s for it and fails the job (torch 2.15 here,
every run); for a lost node the survivors' restarted workers could not connect their gloo group
(connection refused by addresses of the round before) and the job failed (the one run tried).
--torchrun-shared-store keeps that default. For --event spare, torchrun's spare (torch 2.2 on)
waits in the running round's redundancy list, past its join timeout; it is ready once the
rendezvous state in the store lists it there (torch says so only at DEBUG).

--warm: dist-launch's agents run with --warm-restart (torch workers forked from a zygote that
imported torch as the agent started: a spare's too, while it waits; --event spare then loses node 1
once the spare's zygote is ready).

--named-hosts SCRIPT: each agent on a host of its own (network namespaces node-0, node-1, ...: root
only), the rendezvous endpoint node-0's name, the workers' Gloo on the hosts' eth0.

--event join: NODES - 1 agents start (round 0 closes after a 1 s last call); once a worker has
taken 20 steps, the NODES-th agent starts and joins. Group: every worker stops and the group
starts again in a round with the newcomer; in-place: the running workers take it in at a step
boundary (they stall while its workers start). Measured, from the newcomer's start:
  running workers' longest pause = the longest gap between two step lines of a running agent
                                   (the stall; a group restart's includes its start-up)
  newcomer training              = to the newcomer's first step line
  steps trained again            = as above, at that pause

--event spare: a hot spare. The job is --nnodes 2:NODES-1: NODES - 1 agents train, the NODES-th
starts once a worker has taken 20 steps and, the job full, waits for a place; then node 1 is lost
as above and the spare takes its place (group: every worker starts again in a round with it;
in-place: the survivors keep their processes and the spare's workers join them at a step
boundary). Measured from the kill: survivors training again, as above, and
  spare training                 = to the spare's first step line

--event relaunch: the lost node's agent started again (an orchestrator's restart). The job is
--nnodes 2:NODES-1 and NODES - 1 agents train, MIN = MAX when NODES is 3: too few without it.
Node 1 is lost as above and, --relaunch-after seconds later (1 s: an orchestrator's back-off), its
agent starts again (group: every worker starts again in a round with it; in-place: the survivors'
workers wait in place, their agents in the next round, and the relaunched node's workers join
them at a step boundary). Measured from the kill: survivors training again, steps trained again,
  relaunched training            = to the relaunched node's first step line
"""
import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "named_hosts"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "ssh_hosts"))
from sshd_hosts import descendants  # noqa: E402 (the processes below a pid, from /proc)

WALL = re.compile(r" wall_ns (\d+)")
# This script's clock (monotonic) minus the wall clock: a worker's wall-clock stamp, read on it.
CLOCK_OFFSET = time.monotonic() - time.time()
# dist-inplace-worker: "rank R step S" (S steps done); elastic_train.py --timestamps: "rank R pid P
# step S done wall_ns W" (step S done: S + 1 steps done).
STEP = re.compile(r"\]:rank \d+ (?:pid \d+ )?step (\d+)( done|$)")


def free_port(host):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


_named_ports = iter(range(29500, 31500))  # fresh network namespaces: nothing else holds them


def store_endpoint(args):
    """Where this run's rendezvous store will be: 127.0.0.2, or node-0 on named hosts."""
    if args.hosts:
        return "node-0", next(_named_ports)
    return "127.0.0.2", free_port("127.0.0.2")


STARTED = []  # every agent, so that none outlives the bench


class Agent:
    """One agent (dist-launch, or torchrun's); every line it prints, with the time it was read."""

    def __init__(self, cmd, env):
        self.torchrun = "torch.distributed.run" in cmd
        self.hosted = False  # the first agent, which hosts the store
        # A session of its own: a lost torchrun node is its whole session killed.
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=self.torchrun)
        STARTED.append(self)
        self.lines = []  # (monotonic seconds: the worker's stamp, else when read; line)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            stamp = WALL.search(line)
            when = int(stamp.group(1)) / 1e9 + CLOCK_OFFSET if stamp else time.monotonic()
            self.lines.append((when, line.rstrip("\n")))

    def timeline(self):
        """The lines in the order of their times (stamped lines may be read out of order)."""
        return sorted(list(self.lines), key=lambda entry: entry[0])

    def text(self):
        return "\n".join(line for _, line in list(self.lines))

    def hosts_the_store(self, endpoint):
        """Whether this (first) agent serves the rendezvous store yet."""
        if not self.torchrun:
            return "hosting the rendezvous store" in self.text()
        try:
            socket.create_connection(endpoint, timeout=1).close()
            return True
        except OSError:
            return False

    def may_be_lost(self):
        """Whether losing this agent leaves the job its rendezvous store: dist-launch's node 1 of
        round 0; any torchrun agent but the first (its TCPStore's host, whatever its rank)."""
        if self.torchrun:
            return not self.hosted
        return "round 0: node 1 of" in self.text()

    def lose(self):
        """As a lost machine: the agent SIGKILLed (dist-launch's workers die with it), or a
        torchrun node's agent with every process below it, in whatever session (torchrun puts
        each worker in one of its own, and they would outlive the agent)."""
        if self.torchrun:
            below = descendants(self.proc.pid)  # before the kill: then they are reparented
            os.killpg(self.proc.pid, signal.SIGKILL)
            for pid in below:
                try:
                    os.killpg(os.getpgid(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        else:
            self.proc.send_signal(signal.SIGKILL)

    def steps_done(self, line):
        m = STEP.search(line)
        return None if not m else int(m.group(1)) + (1 if m.group(2) else 0)

    def first_step_after(self, t):
        """When the first step after t was done, and how many steps were done then."""
        for when, line in self.timeline():
            if when > t and self.steps_done(line) is not None:
                return when, self.steps_done(line)
        return None


def torchrun_command(args, endpoint, extra):
    """torchrun's agent for the same job: its c10d rendezvous, its defaults otherwise."""
    host, port = endpoint
    conf = [value for flag, value in zip(extra[::2], extra[1::2]) if flag == "--rdzv-conf"]
    return [args.torchrun, "-m", "torch.distributed.run", "--nnodes", f"2:{args.max_nodes}",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{host}:{port}", "--rdzv-id", "regroup",
            "--nproc-per-node", str(args.nproc), "--max-restarts", "1", "--tee", "3",
            *(["--rdzv-conf", ",".join(conf)] if conf else [])]


def start_agent(args, policy, workdir, endpoint, i, extra=()):
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if args.torch:
        env.update(PYTHON_EXEC=args.torch)
    env["GLOO_SOCKET_IFNAME"] = "eth0" if args.hosts else "lo"
    out = os.path.join(workdir, f"{policy}-{i}")
    os.makedirs(out, exist_ok=True)
    host, port = endpoint
    if policy == "torchrun":
        # dist_launch.elastic from the source tree (dist-launch embeds it); OMP as dist-launch sets it
        env.update(PYTHONPATH=os.path.join(HERE, "..", "python"), OMP_NUM_THREADS="1")
        if not args.torchrun_shared_store:
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        cmd = torchrun_command(args, endpoint, extra)
    else:
        cmd = [os.path.abspath(os.path.join(args.build, "bin", "dist-launch")), "--nnodes",
               f"2:{args.max_nodes}", "--rdzv-endpoint", f"{host}:{port}", "--rdzv-id", "regroup",
               "--nproc-per-node", str(args.nproc), "--max-restarts", "1", "--restart-policy",
               policy, *(["--warm-restart"] if args.warm else []), *extra]
    if args.torch:
        cmd += [os.path.join(HERE, "..", "examples", "torch", "elastic_train.py"),
                "--steps", str(args.steps), "--pause-ms", "10", "--timestamps"]
    else:
        cmd += ["--no-python", os.path.abspath(os.path.join(args.build, "bin",
                                                             "dist-inplace-worker")),
                "--out", out, "--steps", str(args.steps), "--step-ms", "10"]
    if args.hosts:  # named-hosts.sh exec: the agent replaces it (the same PID, for SIGKILL)
        cmd = [args.hosts.script, "exec", args.hosts.run_id, f"node-{i}", *cmd]
    agent = Agent(cmd, env)
    if i == 0:
        deadline = time.monotonic() + 30
        agent.hosted = True
        while not agent.hosts_the_store(endpoint):
            if time.monotonic() > deadline:
                sys.exit(f"the first agent did not host the store:\n{agent.text()}")
            time.sleep(0.01)
    return agent


def wait_all(policy, agents):
    for agent in agents:
        agent.proc.wait(timeout=180)
        agent.thread.join(timeout=10)
        if agent.proc.returncode != 0:
            sys.exit(f"{policy}: an agent exited {agent.proc.returncode}:\n{agent.text()}")


def longest_pause(agent, t):
    """The longest gap between two steps from t on (the first from the last before t), the
    steps done before it and at its end, and when it ended."""
    steps = [(when, agent.steps_done(line)) for when, line in agent.timeline()
             if agent.steps_done(line) is not None]
    before = [s for s in steps if s[0] <= t]
    previous = before[-1] if before else (t, 0)
    best = (0.0, 0, 0, t)
    for when, done in steps:
        if when <= t:
            continue
        if when - previous[0] > best[0]:
            best = (when - previous[0], previous[1], done, when)
        previous = (when, done)
    return best


def wait_for_step_20(agents):
    """Returns once a worker of `agents` has taken 20 steps (at most 60 s)."""
    deadline = time.monotonic() + 60
    while not any(re.search(r"\]:rank \d+ (pid \d+ )?step 20( |$)", a.text(), re.M)
                  for a in agents):
        if time.monotonic() > deadline:
            sys.exit("no worker took 20 steps:\n" + "\n".join(a.text() for a in agents))
        time.sleep(0.002)


def join_job(args, policy, workdir):
    endpoint = store_endpoint(args)
    conf = ("--rdzv-conf", "last_call_timeout=1")
    running = [start_agent(args, policy, workdir, endpoint, i, conf)
               for i in range(args.nodes - 1)]
    wait_for_step_20(running)
    joined_at = time.monotonic()
    newcomer = start_agent(args, policy, workdir, endpoint, args.nodes - 1, conf)
    wait_all(policy, running + [newcomer])
    pauses = [longest_pause(a, joined_at) for a in running]
    pause, before, after, _ = max(pauses)
    first = newcomer.first_step_after(joined_at)
    if first is None:
        sys.exit(f"{policy}: the newcomer trained no step:\n{newcomer.text()}")
    regrouped = all("in-place: regrouped in round" in a.text() for a in running)
    if (policy == "in-place") != regrouped:
        sys.exit(f"{policy}: regrouped={regrouped}:\n" + "\n".join(a.text() for a in running))
    return pause, before + 1 - after, first[0] - joined_at


def in_redundancy_list(endpoint):
    """Whether a torchrun node waits in the running round's redundancy list (torch 2.2 on: a node
    that found the job full, kept past its join timeout). Torch logs it only at DEBUG; the
    rendezvous state in the store says it."""
    import base64
    import pickle
    from datetime import timedelta

    import torch.distributed as tdist
    store = tdist.TCPStore(endpoint[0], endpoint[1], is_master=False,
                           timeout=timedelta(seconds=10), wait_for_workers=False)
    state = pickle.loads(base64.b64decode(store.get("torch.rendezvous.regroup")))
    return len(state.redundancy_list) > 0


def start_spare(args, policy, workdir, endpoint, agents):
    """The spare, once a worker took 20 steps; returns when it waits for a place."""
    wait_for_step_20(agents)
    deadline = time.monotonic() + 60
    spare = start_agent(args, policy, workdir, endpoint, args.nodes - 1)
    # Ready: waiting for a place, and under --warm with its zygote's imports done (a spare waits
    # for as long as the job runs: its imports are long done when a node is lost).
    ready = re.compile(r"waiting for a place" +
                       (r"(.|\n)*zygote pid \d+ ready" if args.warm and args.torch else ""))
    while not (in_redundancy_list(endpoint) if spare.torchrun else ready.search(spare.text())):
        if time.monotonic() > deadline:
            sys.exit(f"{policy}: the spare was not ready:\n{spare.text()}")
        # (Torchrun's readiness is a connection to its store: a few a second, not hundreds.)
        time.sleep(0.1 if spare.torchrun else 0.002)
    return spare


def job(args, policy, workdir):
    if args.event == "join":
        return join_job(args, policy, workdir)
    endpoint = store_endpoint(args)
    training = args.nodes - 1 if args.event in ("spare", "relaunch") else args.nodes
    agents = [start_agent(args, policy, workdir, endpoint, i) for i in range(training)]
    spare = start_spare(args, policy, workdir, endpoint, agents) if args.event == "spare" else None
    if spare:
        agents.append(spare)
    lost = None
    deadline = time.monotonic() + 60
    while lost is None:
        if time.monotonic() > deadline:
            sys.exit("no node 1 took 20 steps:\n" + "\n".join(a.text() for a in agents))
        for agent in agents:
            if agent.may_be_lost() and re.search(r"\]:rank \d+ (pid \d+ )?step 20( |$)",
                                              agent.text(), re.M):
                lost = agent
        time.sleep(0.002)
    killed_at = time.monotonic()
    lost.lose()
    if args.event == "relaunch":  # measured as a spare is
        time.sleep(args.relaunch_after)
        spare = start_agent(args, policy, workdir, endpoint, args.nodes - 1)
        agents.append(spare)
    survivors = [a for a in agents if a is not lost and a is not spare]
    for agent in agents:
        agent.proc.wait(timeout=180)
        agent.thread.join(timeout=10)
    for agent in survivors + ([spare] if spare else []):
        if agent.proc.returncode != 0:
            sys.exit(f"{policy}: a surviving agent exited {agent.proc.returncode}:\n{agent.text()}")
    # Each survivor's pause: its longest gap between two steps from the kill on (a step in flight
    # may still be done after the kill), and the steps it did again after it.
    pauses = [longest_pause(a, killed_at) for a in survivors]
    if any(ended <= killed_at for _, _, _, ended in pauses):
        sys.exit(f"{policy}: a survivor trained no step after the kill")
    before = max(done for _, done, _, _ in pauses)
    again = before + 1 - min(after for _, _, after, _ in pauses)
    regrouped = all("in-place: regrouped in round" in a.text() for a in survivors)
    if (policy == "in-place") != regrouped:
        sys.exit(f"{policy}: regrouped={regrouped}:\n" + "\n".join(a.text() for a in survivors))
    spare_first = None
    if spare:
        first = spare.first_step_after(killed_at)
        if first is None:
            sys.exit(f"{policy}: the spare trained no step:\n{spare.text()}")
        spare_first = first[0] - killed_at
    return max(ended for _, _, _, ended in pauses) - killed_at, again, spare_first


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--torch", metavar="PYTHON",
                        help="torch workers (examples/torch/elastic_train.py) on this interpreter")
    parser.add_argument("--event", choices=("lost", "join", "spare", "relaunch"), default="lost",
                        help="node 1 lost (default), a node joining, node 1 lost with a hot "
                             "spare waiting, or node 1 lost and its agent started again")
    parser.add_argument("--relaunch-after", type=float, default=1.0,
                        help="--event relaunch: seconds from the loss to the agent's new start")
    parser.add_argument("--warm", action="store_true",
                        help="dist-launch's agents with --warm-restart")
    parser.add_argument("--named-hosts", metavar="SCRIPT",
                        help="each agent on a named host (tests/named_hosts/named-hosts.sh)")
    parser.add_argument("--torchrun", metavar="PYTHON",
                        help="also torchrun (PYTHON -m torch.distributed.run, torch 2.x), "
                             "interleaved with the two policies; needs --torch")
    parser.add_argument("--torchrun-shared-store", action="store_true",
                        help="torchrun with torch's default TCPStore sharing (a job that "
                             "changes its nodes fails there: see above)")
    args = parser.parse_args()
    if args.torchrun and (not args.torch or args.named_hosts):
        sys.exit("--torchrun: with --torch, and not on --named-hosts")
    if args.nodes < 3:
        sys.exit("--nodes: at least 3 (node 0 hosts the workers' store; node 1 is lost)")
    args.max_nodes = args.nodes - 1 if args.event in ("spare", "relaunch") else args.nodes
    args.hosts = None
    if args.named_hosts:
        from named_hosts import NamedHosts, unavailable
        why = unavailable(args.named_hosts)
        if why:
            sys.exit(f"--named-hosts: {why}")
        args.hosts = NamedHosts(os.path.abspath(args.named_hosts),
                                [f"node-{i}" for i in range(args.nodes)])
    try:
        measure(args)
    finally:
        for agent in STARTED:  # a run that failed or timed out leaves its agents behind
            if agent.proc.poll() is None:
                agent.lose()
                agent.proc.wait()
        if args.hosts:
            args.hosts.close()


def measure(args):
    results = {"group": [], "in-place": []}
    if args.torchrun:
        results["torchrun"] = []
    with tempfile.TemporaryDirectory(prefix="regroup-bench-") as workdir:
        for run in range(args.runs):
            for policy in results:
                results[policy].append(job(args, policy, os.path.join(workdir, str(run))))
                seconds, again, newcomer = results[policy][-1]
                joined = "" if newcomer is None else f", newcomer training {newcomer * 1000:.0f} ms"
                if args.event in ("spare", "relaunch"):
                    joined = f", {args.event} training {newcomer * 1000:.0f} ms"
                print(f"run {run + 1}/{args.runs} {policy}: {seconds * 1000:.0f} ms, {again} "
                      f"step(s) trained again{joined}", file=sys.stderr)
    workers = ("warm " if args.warm and args.torch else "") + ("torch" if args.torch else "C++ SDK")
    where = " on named hosts" if args.hosts else ""

    def span(values):
        ms = [v * 1000 for v in values]
        return f"{statistics.median(ms):.0f} ({min(ms):.0f}-{max(ms):.0f})"

    if args.event == "join":
        print(f"| {args.nodes - 1}+1 nodes x {args.nproc} {workers} workers{where}, a node "
              f"joins at step 20 | running workers' longest pause, median ms (min-max) | newcomer "
              f"training, ms | steps trained again (median) | runs |")
        print("|---|---:|---:|---:|---:|")
    elif args.event == "spare":
        ready = " (its zygote ready)" if args.warm and args.torch else ""
        print(f"| {args.nodes - 1} nodes x {args.nproc} {workers} workers{where} and a hot spare, "
              f"node 1 lost once the spare waits{ready} | survivors training again, median ms "
              f"(min-max) | spare "
              f"training, ms | steps trained again (median) | runs |")
        print("|---|---:|---:|---:|---:|")
    elif args.event == "relaunch":
        print(f"| {args.nodes - 1} nodes x {args.nproc} {workers} workers{where} (--nnodes "
              f"2:{args.max_nodes}), node 1 lost at step 20 and its agent started again "
              f"{args.relaunch_after:g} s later | survivors training again, median ms (min-max) | "
              f"relaunched training, ms | steps trained again (median) | runs |")
        print("|---|---:|---:|---:|---:|")
    else:
        print(f"| {args.nodes} nodes x {args.nproc} {workers} workers{where}, node 1 lost at "
              f"step 20 | survivors training again, median ms (min-max) | steps trained again "
              f"(median) | runs |")
        print("|---|---:|---:|---:|")
    for policy, values in results.items():
        joined = "" if args.event == "lost" else f"{span(v[2] for v in values)} | "
        print(f"| {policy} | {span(v[0] for v in values)} | {joined}"
              f"{statistics.median(v[1] for v in values):.0f} | {len(values)} |")


if __name__ == "__main__":
    main()
