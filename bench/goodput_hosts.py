"""The goodput bench's job on two hosts known by name (tests/named_hosts/named-hosts.sh: network
namespaces on this machine), one worker each, under a mix of faults (goodput_bench.py --hosts):

  KILL   a random live worker SIGKILLed
  STOP   a random live worker SIGSTOPped (never continued: the launcher must end it)
  AGENT  node-b's launcher SIGKILLed (the agent lost; node-a's hosts the store and stays); its
         host starts the same command again at once, as Slurm's --requeue or a Kubernetes
         restart policy would
  CUT    node-b's link down for --cut-seconds, then up again (a partition that heals)

one every --interval s, in a seeded random order that deals each kind in turn (a shuffled cycle of
the four). Each host's launcher runs the same command with its own --node-rank (static: node-a
the master, as torchrun's default; a launcher that exits non-zero on node-b, or is killed there,
is started again while node-a's runs). The job's exit is node-a's launcher's.
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time

from ttfs_bench import end_job, is_stopped, is_zombie, reap_children

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "named_hosts"))
from named_hosts import NamedHosts, unavailable  # noqa: E402

SCRIPT = os.path.join(ROOT, "tests", "named_hosts", "named-hosts.sh")
HOSTS = ("node-a", "node-b")
STORE_PORT = "29500"  # fresh network namespaces: nothing else holds a port there
PID = re.compile(r"rank (\d+) pid (\d+) attempt")
KINDS = ("KILL", "STOP", "AGENT", "CUT")


def why_not():
    """Why the hosts cannot be made here, or None."""
    return unavailable(SCRIPT)


def host_command(args, mode, train, node_rank):
    """One host's launcher: `train` the worker's argv (script and its flags)."""
    static = ["--nnodes", "2", "--node-rank", str(node_rank), "--master-addr", HOSTS[0],
              "--master-port", STORE_PORT]
    common = ["--nproc-per-node", "1", "--max-restarts", str(args.max_restarts)]
    if mode == "torchrun":
        return [args.python, "-m", "torch.distributed.run", *static, *common, *train]
    # --rdzv elastic: two nodes always (a lost one waits for its replacement), node-a's agent
    # hosting the store.
    elastic = ["--nnodes", "2:2", "--rdzv-endpoint", f"{HOSTS[0]}:{STORE_PORT}", "--rdzv-id",
               "goodput"]
    rendezvous = (elastic if args.rdzv == "elastic" else static) + common
    extra = {"cold": [], "warm": ["--warm-restart"],
             "in-place": ["--warm-restart", "--restart-policy", "in-place"]}[mode]
    return [os.path.join(args.build, "bin", "dist-launch"), *rendezvous, *extra, *train]


class HostsJob:
    """The job's launchers on both hosts, their output, and the faults dealt to them."""

    def __init__(self, args, mode, train, env, faults, rng):
        self.args, self.mode, self.train, self.env = args, mode, train, env
        self.faults, self.rng = faults, rng
        self.kinds = list(KINDS) if args.signal == "MIX" else [args.signal]
        self.hosts = NamedHosts(SCRIPT, list(HOSTS))
        self.lock = threading.Lock()
        self.lines, self.pids = [], {}  # rank -> its newest worker's pid
        self.dealt = {kind: 0 for kind in self.kinds}
        self.agents = {}  # host -> its launcher now
        self.relaunches = 0
        self.relaunch_after = 0.0
        self.link_up_at = None
        self.cycle = []

    def start(self, host):
        argv = host_command(self.args, self.mode, self.train, HOSTS.index(host))
        proc = self.hosts.start(host, argv, env=self.env, pipe=True)
        threading.Thread(target=self.read, args=(host, proc), daemon=True).start()
        self.agents[host] = proc

    def read(self, host, proc):
        for line in proc.stdout:
            with self.lock:
                self.lines.append(f"[{host}] {line}")
                m = PID.search(line)
                if m:
                    self.pids[int(m.group(1))] = int(m.group(2))

    def live_workers(self):
        with self.lock:
            pids = list(self.pids.values())
        return sorted(p for p in pids if os.path.exists(f"/proc/{p}") and not is_zombie(p)
                      and not is_stopped(p))

    def link(self, state):
        subprocess.run(["ip", "-n", f"{self.hosts.run_id}-{HOSTS[1]}", "link", "set", "eth0",
                        state], check=True)

    def deal(self):
        """The next fault of the cycle; False when it found nothing to strike (tried again soon)."""
        if not self.cycle:
            self.cycle = list(self.kinds)
            self.rng.shuffle(self.cycle)
        kind = self.cycle[0]
        if kind in ("KILL", "STOP"):
            live = self.live_workers()
            if not live:
                return False
            try:
                os.kill(self.rng.choice(live), signal.SIGKILL if kind == "KILL" else signal.SIGSTOP)
            except ProcessLookupError:
                return False
        elif kind == "AGENT":
            agent = self.agents[HOSTS[1]]
            if agent.poll() is not None:
                return False
            agent.kill()
        elif self.link_up_at is None:  # CUT
            self.link("down")
            self.link_up_at = time.monotonic() + self.args.cut_seconds
        else:
            return False
        self.cycle.pop(0)
        self.dealt[kind] += 1
        with self.lock:
            self.lines.append(f"[bench] {kind} at {time.time():.6f}\n")
        return True

    def run(self, deadline):
        """Until node-a's launcher ends or the deadline: faults, node-b's relaunches. Returns
        node-a's exit code, None on timeout."""
        for host in HOSTS:
            self.start(host)
        next_fault = time.monotonic() + self.args.interval
        code = None
        while time.monotonic() < deadline:
            code = self.agents[HOSTS[0]].poll()
            if code is not None:
                break
            now = time.monotonic()
            if self.link_up_at is not None and now >= self.link_up_at:
                self.link("up")
                self.link_up_at = None
            b = self.agents[HOSTS[1]]
            if b.poll() not in (None, 0) and now >= self.relaunch_after:
                b.wait()
                b.stdout.close()
                self.start(HOSTS[1])
                self.relaunches += 1
                self.relaunch_after = now + 1.0  # an orchestrator's back-off
            if self.faults and now >= next_fault:
                if self.deal():
                    next_fault = now + self.args.interval
                else:
                    next_fault = now + 0.2
            time.sleep(0.05)
        if self.link_up_at is not None:
            self.link("up")
        return code

    def close(self, marker):
        try:
            self.agents[HOSTS[1]].wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        for proc in self.agents.values():
            end_job(proc, marker)
        self.hosts.close()
        reap_children()


def hosts_job(args, mode, faults, rng, train, env, marker):
    """One job on the two hosts: (exit code or None, seconds, faults dealt, relaunches, output)."""
    job = HostsJob(args, mode, train, env, faults, rng)
    start = time.monotonic()
    try:
        code = job.run(start + args.timeout)
        elapsed = time.monotonic() - start
    finally:
        job.close(marker)
    return code, elapsed, dict(job.dealt), job.relaunches, "".join(job.lines)

