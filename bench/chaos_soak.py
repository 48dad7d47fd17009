"""The chaos soak (issue 12): real training jobs under random faults drawn from a seed; after each
run, no orphan process, no hung agent, and the final weights equal to a clean run's whenever the
job finishes, with a clear report when it does not.

    sudo /usr/bin/python3 bench/chaos_soak.py --build build --faults 100 --seed 1 \
        --report /tmp/chaos.jsonl

Every run is one elastic job on hosts known by name (network namespaces, tests/named_hosts): two
nodes (node-a, node-b: --nnodes 2:2, two workers each) whose rendezvous store is an external
dist-rendezvous on a third host (node-s), everything authenticated with one token file, the
workers' logs on a small tmpfs (--log-dir, --tee 3). The job is either examples/torch/ddp_train.py
(Debian's torch 1.13, gloo DDP) or the C++ ddp_train (the SDK's Gloo group, checkpointing, so a
restart resumes). Each run gets one or two faults at random times within a clean run's duration:

  worker-kill     SIGKILL of a worker (the job restarts it)
  agent-kill      SIGKILL of an agent (elastic: its janitor kills its workers; the node manager
                  below starts a new agent, which rejoins)
  worker-stop     SIGSTOP of a worker, SIGCONT after 1-8 s
  partition       an agent host's link down for 1-10 s, then up
  store-loss      the store's host lost: its link down, then dist-rendezvous SIGKILLed (no FIN
                  reaches anyone); 2-8 s later, once every agent noticed (it left, or it waits
                  to rejoin, saying so), the host is back with a fresh dist-rendezvous
  log-fs-full     the workers' log file system filled up for 2-8 s

Like a cluster's node manager, the soak starts a new agent on a host whose agent exited non-zero
(at most --relaunches per run). A run ends when every current agent exited 0 (the job finished),
when the relaunches are spent (the job failed: reported with each agent's last error lines), or
after --run-timeout-s (the agents still running are hung: reported, then killed).

After each run, with the store stopped:
  orphans   processes still alive --orphan-grace-s later that carry the run's marker in
            DIST_LAUNCH_AGENT_ID (the soak starts every agent under its own id, which the agents
            put before theirs), or that sit below this process in the tree (it is a subreaper, so
            what a killed agent leaves behind comes here): each is reported, then killed
  hangs     agents still running at the run's deadline, or that took longer than
            --store-loss-exit-s to leave after losing the store
  digests   every "weights ... sha256" a worker printed must equal the clean run's

Prints one line per run and a summary; --report writes both as JSON lines. Exits 1 when any run had
an orphan, a hang or a wrong digest (or, with --require-finish, did not finish), 77 (skip) when
named hosts cannot be made here, 2 when the clean runs do not work.
"""
import argparse
import ctypes
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "named_hosts"))
from named_hosts import SKIP, NamedHosts, unavailable  # noqa: E402

TORCH_EXAMPLE = os.path.join(ROOT, "examples", "torch", "ddp_train.py")
NAMED_HOSTS = os.path.join(ROOT, "tests", "named_hosts", "named-hosts.sh")
STORE_HOST, AGENT_HOSTS = "node-s", ["node-a", "node-b"]
STORE_PORT = 29400  # the hosts are fresh network namespaces: nothing else holds a port there
DIGEST = re.compile(r"weights (?:in sync )?sha256 ([0-9a-f]{64})")
RESTART = re.compile(r"restarting the worker group \(restart (\d+) of")
# What an agent cut off from the store says when it stays to rejoin the job.
REJOINS = "rejoins the job when the store answers again"
FAULTS = ["worker-kill", "agent-kill", "worker-stop", "partition", "store-loss", "log-fs-full"]
# How long each fault lasts (seconds): drawn uniformly from these ranges.
FAULT_SECONDS = {"worker-stop": (1, 8), "partition": (1, 10), "store-loss": (2, 8),
                 "log-fs-full": (2, 8)}
POLL_S = 0.05
RELAUNCH_BACKOFF_MAX_S = 8
PLAN_RETRIES = 2
TARGET_RETRY_S = 0.5  # a worker fault with no worker to hit (between rounds) tries again
STORE_START_TIMEOUT_S = 30
PR_SET_CHILD_SUBREAPER = 36
WAIT_ALL = 0x40000000  # __WALL: the janitor is a clone child without an exit signal
LOG_TAIL_LINES = 6
# Each worker runs under this: a process of its own that prints a progress line every 50 ms for
# as long as the worker lives (so a full log file system is hit within the fault's window, and
# the job has a process its workers started, for the agent to clean up), then the worker itself
# (exec: the same pid).
CHATTER = ('w=$$; (while kill -0 "$w" 2>/dev/null; do echo "progress of $w: '
           'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"; sleep 0.05; done) & '
           'exec "$@"')
JANITOR = "dist-janitor"


def now():
    return time.monotonic()


class Process:
    """A program run as a named host, stdout and stderr in a log file."""

    def __init__(self, soak, host, name, argv, log, env):
        self.host, self.name, self.log, self.started = host, name, log, now()
        with open(log, "w") as out:
            self.popen = subprocess.Popen(
                [NAMED_HOSTS, "exec", soak.hosts.run_id, host, *argv], env=env, stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.exit_code, self.ended = None, None

    @property
    def pid(self):
        return self.popen.pid

    def poll(self):
        if self.exit_code is None:
            code = self.popen.poll()
            if code is not None:
                self.exit_code, self.ended = code, now()
        return self.exit_code

    def signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill_and_reap(self):
        self.signal(signal.SIGKILL)
        self.popen.wait()
        self.poll()

    def output(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def tail(self, lines=LOG_TAIL_LINES):
        return self.output().splitlines()[-lines:]


def proc_stat(pid):
    """(state, ppid) from /proc/<pid>/stat, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1])
    except (OSError, IndexError):
        return None


def proc_cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def proc_comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def live_pids():
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = proc_stat(int(name))
            if stat and stat[0] != "Z":
                yield int(name), stat[1]


def marked(marker):
    """Live processes whose DIST_LAUNCH_AGENT_ID lists `marker` (process_helpers.h's check)."""
    found = []
    for pid, _ in live_pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                entries = f.read().split(b"\0")
        except OSError:
            continue
        for entry in entries:
            if entry.startswith(b"DIST_LAUNCH_AGENT_ID=") and \
                    marker.encode() in entry.split(b"=", 1)[1].split(b":"):
                found.append(pid)
    return found


def descendants(root):
    children = {}
    for pid, ppid in live_pids():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def reap_adopted(known):
    """Reaps the zombies this subreaper inherited (a killed agent's janitor, its orphans)."""
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in known:
            continue
        stat = proc_stat(int(name))
        if stat and stat[0] == "Z" and stat[1] == os.getpid():
            try:
                os.waitpid(int(name), os.WNOHANG | WAIT_ALL)
            except ChildProcessError:
                pass


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.dir = tempfile.mkdtemp(prefix="dist-chaos-")
        self.hosts = NamedHosts(NAMED_HOSTS, [STORE_HOST, *AGENT_HOSTS])
        self.logs_fs = os.path.join(self.dir, "logs")
        os.makedirs(self.logs_fs)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={args.log_fs_mib}m", "tmpfs",
                        self.logs_fs], check=True)
        self.token = os.path.join(self.dir, "token")
        fd = os.open(self.token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        self.clean = {}  # kind -> {"digest", "seconds"}
        self.run_number = 0

    def close(self):
        subprocess.run(["umount", "-l", self.logs_fs], check=False)
        self.hosts.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- the job ---------------------------------------------------------------------------------

    def agent_argv(self, kind, run_dir):
        argv = [self.args.launcher, "--nnodes", "2:2", "--nproc-per-node",
                str(self.args.workers_per_node),
                "--rdzv-endpoint", f"{STORE_HOST}:{STORE_PORT}", "--rdzv-id",
                f"chaos{self.run_number}", "--token-file", self.token, "--max-restarts", "50",
                "--rdzv-conf", "join_timeout=120,last_call_timeout=1,keep_alive_interval=1,"
                "keep_alive_max_attempt=3", "--log-dir", self.logs_fs, "--tee", "3",
                "--shutdown-timeout", "5", "--exit-barrier-timeout", "60"]
        argv += ["--no-python", "/bin/sh", "-c", CHATTER, "worker"]
        if kind == "torch":
            return argv + [self.args.python, "-u", TORCH_EXAMPLE, "--steps",
                           str(self.args.torch_steps)]
        return argv + [self.args.ddp_train, "--epochs", str(self.args.cpp_epochs),
                       "--global-batch", "48", "--checkpoint-dir", os.path.join(run_dir, "ckpt"),
                       "--checkpoint-every", "20"]

    def worker_program(self, kind):
        return TORCH_EXAMPLE if kind == "torch" else self.args.ddp_train

    def env(self, marker):
        return dict(os.environ, DIST_LAUNCH_AGENT_ID=marker, PYTHON_EXEC=self.args.python)

    def netns(self, host):
        return f"{self.hosts.run_id}-{host}"

    def link(self, host, up):
        subprocess.run(["ip", "-n", self.netns(host), "link", "set", "eth0",
                        "up" if up else "down"], check=True)

    def start_store(self, run):
        log = os.path.join(run["dir"], f"store{len(run['stores'])}.log")
        store = Process(self, STORE_HOST, f"store{len(run['stores'])}", [
            self.args.rendezvous, "--host", "0.0.0.0", "--port", str(STORE_PORT), "--token-file",
            self.token, "--keep-alive-interval", "1", "--keep-alive-max-attempt", "3"],
            log, self.env(run["marker"]))
        deadline = now() + STORE_START_TIMEOUT_S
        while "listening on" not in store.output():
            if store.poll() is not None or now() > deadline:
                raise RuntimeError("dist-rendezvous did not start: " + store.output())
            time.sleep(POLL_S)
        run["stores"].append(store)
        return store

    def start_agent(self, run, host):
        name = f"{host}.{sum(1 for a in run['agents'] if a.host == host)}"
        agent = Process(self, host, name, self.agent_argv(run["kind"], run["dir"]),
                        os.path.join(run["dir"], name + ".log"), self.env(run["marker"]))
        run["agents"].append(agent)
        return agent

    def current_agents(self, run):
        latest = {}
        for agent in run["agents"]:
            latest[agent.host] = agent
        return list(latest.values())

    def workers(self, run):
        """The job's live workers: children of a live agent running the worker program (not the
        agent's janitor, a child that still has the agent's command line)."""
        agents = {a.pid for a in self.current_agents(run) if a.poll() is None}
        program = self.worker_program(run["kind"])
        return [pid for pid, ppid in live_pids() if ppid in agents and
                proc_comm(pid) != JANITOR and program in proc_cmdline(pid)]

    # -- faults ----------------------------------------------------------------------------------

    def draw_faults(self, kind, fault_kinds=None):
        """One or two distinct faults (or `fault_kinds`) at random times of a clean run."""
        seconds = self.clean[kind]["seconds"]
        if fault_kinds is None:
            fault_kinds = self.rng.sample(FAULTS, self.rng.choice([1, 1, 2]))
        faults = []
        for kind_of_fault in fault_kinds:
            low, high = FAULT_SECONDS.get(kind_of_fault, (0, 0))
            faults.append({"fault": kind_of_fault,
                           "at_s": round(self.rng.uniform(0.1, 0.75) * seconds, 2),
                           "for_s": round(self.rng.uniform(low, high), 2),
                           "target": self.rng.choice(AGENT_HOSTS),
                           "pick": self.rng.random()})
        return sorted(faults, key=lambda f: f["at_s"])

    def inject(self, run, fault):
        """Starts `fault`; returns False when it has nothing to hit yet (try again later)."""
        kind, target = fault["fault"], fault["target"]
        if kind in ("worker-kill", "worker-stop"):
            workers = sorted(self.workers(run))
            if not workers:
                return False
            pid = workers[int(fault["pick"] * len(workers))]
            fault["pid"] = pid
            os.kill(pid, signal.SIGKILL if kind == "worker-kill" else signal.SIGSTOP)
        elif kind == "agent-kill":
            agent = next(a for a in self.current_agents(run) if a.host == target)
            if agent.poll() is not None:
                return False
            fault["pid"] = agent.pid
            agent.signal(signal.SIGKILL)
        elif kind == "partition":
            self.link(target, up=False)
            fault["agents_then"] = [a for a in self.current_agents(run)
                                    if a.host == target and a.poll() is None]
        elif kind == "store-loss":
            self.link(STORE_HOST, up=False)
            run["stores"][-1].kill_and_reap()
            fault["agents_then"] = [a for a in self.current_agents(run) if a.poll() is None]
            fault["rejoins_said"] = {a.name: a.output().count(REJOINS) for a in fault["agents_then"]}
        elif kind == "log-fs-full":
            filler = os.path.join(self.logs_fs, "filler")
            subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        fault["injected_s"] = round(now() - run["started"], 2)
        return True

    def undo(self, run, fault):
        kind = fault["fault"]
        if kind == "worker-stop":
            stat = proc_stat(fault["pid"])
            if stat and stat[0] != "Z":
                os.kill(fault["pid"], signal.SIGCONT)
        elif kind == "partition":
            self.link(fault["target"], up=True)
        elif kind == "store-loss":
            self.link(STORE_HOST, up=True)
            self.start_store(run)
        elif kind == "log-fs-full":
            try:
                os.remove(os.path.join(self.logs_fs, "filler"))
            except FileNotFoundError:
                pass
        fault["undone"] = True

    # -- a run -----------------------------------------------------------------------------------

    def run(self, kind, faults):
        self.run_number += 1
        run = {"number": self.run_number, "kind": kind, "faults": faults, "agents": [],
               "stores": [], "dir": os.path.join(self.dir, f"run{self.run_number}"),
               "marker": f"chaos{os.getpid()}-{self.run_number}", "relaunches": 0,
               "relaunch_at": {}}
        os.makedirs(os.path.join(run["dir"], "ckpt"))
        self.start_store(run)
        run["started"] = now()
        for host in AGENT_HOSTS:
            self.start_agent(run, host)
        outcome = self.supervise(run)
        for fault in faults:  # whatever a run left behind is put back
            if "injected_s" in fault and not fault.get("undone"):
                self.undo(run, fault)
        report = {"run": run["number"], "kind": kind, "seconds": round(now() - run["started"], 1),
                  "faults": [{k: v for k, v in f.items() if k not in ("pick", "agents_then")}
                             for f in faults], **outcome}
        for store in run["stores"]:
            store.signal(signal.SIGTERM)
        for store in run["stores"]:
            try:
                store.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                store.kill_and_reap()
            store.poll()
        report["orphans"] = self.orphans(run)
        report.update(self.digests(run, outcome["finished"]))
        report["agent_starts"] = len(run["agents"])
        report["restarts"] = max((int(n) for a in run["agents"] for n in RESTART.findall(a.output())),
                                 default=0)
        report["store_lost_notices"] = sum(a.output().count("lost the rendezvous store")
                                           for a in run["agents"])
        report["incomplete_log_warnings"] = sum(a.output().count("worker logs are incomplete")
                                                for a in run["agents"])
        if self.args.keep_logs:
            shutil.copytree(run["dir"], os.path.join(self.args.keep_logs, f"run{run['number']}"),
                            ignore=shutil.ignore_patterns("ckpt"))
        shutil.rmtree(run["dir"], ignore_errors=True)
        for entry in os.listdir(self.logs_fs):
            shutil.rmtree(os.path.join(self.logs_fs, entry), ignore_errors=True)
        return report

    def supervise(self, run):
        deadline = run["started"] + self.args.run_timeout_s
        pending, active = list(run["faults"]), []
        hangs = []
        while True:
            t = now() - run["started"]
            while pending and pending[0]["at_s"] <= t:
                fault = pending[0]
                if not self.inject(run, fault):
                    fault["at_s"] = round(t + TARGET_RETRY_S, 2)
                    break
                pending.pop(0)
                active.append(fault)
            for fault in list(active):
                if t < fault["injected_s"] + fault["for_s"]:
                    continue
                if fault["fault"] == "store-loss":
                    # The host comes back only once every agent noticed it was gone: it left, or
                    # it waits to rejoin the job when the store answers again (said); an agent
                    # that does neither is a hang, not a survivor.
                    stuck = [a for a in fault["agents_then"] if a.poll() is None and
                             a.output().count(REJOINS) <= fault["rejoins_said"][a.name]]
                    waited = t - fault["injected_s"]
                    if stuck and waited <= self.args.store_loss_exit_s:
                        continue
                    if stuck:
                        hangs.append({"agents": [a.name for a in stuck],
                                      "why": f"still running {waited:.0f} s after losing the "
                                             "store", "tails": {a.name: a.tail() for a in stuck}})
                        for a in stuck:
                            a.kill_and_reap()
                self.undo(run, fault)
                active.remove(fault)
            agents = self.current_agents(run)
            codes = [a.poll() for a in agents]
            if all(code == 0 for code in codes) and not active:
                return self.outcome(run, True, "every agent exited 0", hangs, pending)
            for agent, code in zip(agents, codes):
                if code in (None, 0):
                    continue
                if run["relaunches"] >= self.args.relaunches:
                    if all(c is not None for c in codes):
                        return self.outcome(run, False, "the relaunches are spent", hangs,
                                            pending)
                    continue
                # A node manager's back-off (1, 2, 4, 8 s...): an agent that cannot start yet (a
                # full log file system) does not spend every relaunch at once.
                earlier = int(agent.name.rsplit(".", 1)[1])  # agents this host had before it
                at = run["relaunch_at"].setdefault(
                    agent.name, agent.ended + min(RELAUNCH_BACKOFF_MAX_S, 2 ** earlier))
                if now() >= at:
                    run["relaunches"] += 1
                    self.start_agent(run, agent.host)
            if now() > deadline:
                stuck = [a for a in self.current_agents(run) if a.poll() is None]
                hangs.append({"agents": [a.name for a in stuck],
                              "why": f"still running at the run's deadline "
                                     f"({self.args.run_timeout_s} s)",
                              "tails": {a.name: a.tail() for a in stuck}})
                for a in stuck:
                    a.kill_and_reap()
                return self.outcome(run, False, "deadline", hangs, pending)
            reap_adopted({a.pid for a in run["agents"]} | {s.pid for s in run["stores"]})
            time.sleep(POLL_S)

    def note_agents_left(self, run, fault):
        """How long after `fault` the agents it cut off (store-loss: all, partition: the
        target's) had left, once all of them have, with an error."""
        then = fault.get("agents_then")
        if not then or "agents_left_s" in fault or any(a.poll() in (None, 0) for a in then):
            return
        fault["agents_left_s"] = round(max(a.ended for a in then) - run["started"] -
                                       fault["injected_s"], 2)

    def outcome(self, run, finished, why, hangs, pending):
        for fault in run["faults"]:
            if "injected_s" in fault:
                self.note_agents_left(run, fault)
        for fault in pending:
            fault["skipped"] = "the job ended before its time"
        out = {"finished": finished, "why": why, "hangs": hangs,
               "exit_codes": {a.name: a.poll() for a in run["agents"]}}
        if not finished:
            out["last_lines"] = {a.name: a.tail() for a in self.current_agents(run)}
        return out

    def orphans(self, run):
        known = {a.pid for a in run["agents"]} | {s.pid for s in run["stores"]}
        deadline = now() + self.args.orphan_grace_s
        while True:
            reap_adopted(known)
            left = sorted(set(marked(run["marker"])) | set(descendants(os.getpid())))
            if not left or now() > deadline:
                break
            time.sleep(POLL_S)
        found = [{"pid": pid, "cmdline": proc_cmdline(pid)[:200]} for pid in left]
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return found

    def digests(self, run, finished):
        seen = {}
        for agent in run["agents"]:
            for digest in DIGEST.findall(agent.output()):
                seen[digest] = seen.get(digest, 0) + 1
        clean = self.clean.get(run["kind"], {}).get("digest")
        wrong = sorted(d for d in seen if clean and d != clean)
        if finished and clean and clean not in seen:
            wrong.append("(no digest from a finished job)")
        return {"digest_lines": sum(seen.values()), "seen_digests": sorted(seen),
                "wrong_digests": wrong}


def summarize(reports, args, started, clean):
    faults = [f for r in reports for f in r["faults"] if "injected_s" in f]
    by_fault = {}
    for f in faults:
        by_fault[f["fault"]] = by_fault.get(f["fault"], 0) + 1
    def spread(values):
        values = sorted(values)
        return {"n": len(values), "median": values[len(values) // 2] if values else None,
                "max": values[-1] if values else None}
    return {
        "summary": True, "seed": args.seed, "kinds": args.kinds, "runs": len(reports),
        "faults": len(faults), "faults_by_kind": by_fault,
        "finished": sum(r["finished"] for r in reports),
        "not_finished": [{"run": r["run"], "why": r["why"], "last_lines": r.get("last_lines")}
                         for r in reports if not r["finished"]],
        "orphans": sum(len(r["orphans"]) for r in reports),
        "hangs": sum(len(r["hangs"]) for r in reports),
        "wrong_digests": sum(len(r["wrong_digests"]) for r in reports),
        "restarts": sum(r["restarts"] for r in reports),
        "agent_relaunches": sum(r["agent_starts"] - len(AGENT_HOSTS) for r in reports),
        "store_loss_agents_left_s": spread(f["agents_left_s"] for f in faults
                                           if f["fault"] == "store-loss" and
                                           "agents_left_s" in f),
        "partitioned_agent_left_s": spread(f["agents_left_s"] for f in faults
                                           if f["fault"] == "partition" and
                                           "agents_left_s" in f),
        "run_seconds": {kind: spread(r["seconds"] for r in reports if r["kind"] == kind)
                        for kind in args.kinds.split(",")},
        "clean": clean, "seconds": round(now() - started, 1),
        "command": " ".join(sys.argv),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"),
                    help="where bin/dist-launch, bin/dist-rendezvous and bin/ddp_train are")
    ap.add_argument("--launcher", help="dist-launch (default: in --build)")
    ap.add_argument("--rendezvous", help="dist-rendezvous (default: in --build)")
    ap.add_argument("--ddp-train", help="ddp_train (default: in --build)")
    ap.add_argument("--python", default="/usr/bin/python3", help="an interpreter with torch")
    ap.add_argument("--faults", type=int, default=100, help="faults to inject in all")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kinds", default="torch,cpp", help="jobs to run: torch, cpp or both")
    ap.add_argument("--runs", help="the runs instead of a random draw: KIND:FAULT[+FAULT] ..., e.g. "
                    "'cpp:agent-kill torch:worker-kill+partition' (times, durations and targets "
                    "still come from the seed)")
    ap.add_argument("--workers-per-node", type=int, default=2)
    ap.add_argument("--torch-steps", type=int, default=1500)
    ap.add_argument("--cpp-epochs", type=int, default=30)
    ap.add_argument("--relaunches", type=int, default=6, help="new agents per run, at most")
    ap.add_argument("--run-timeout-s", type=float, default=300)
    ap.add_argument("--store-loss-exit-s", type=float, default=45,
                    help="an agent still running this long after losing its store is hung")
    ap.add_argument("--orphan-grace-s", type=float, default=5)
    ap.add_argument("--log-fs-mib", type=int, default=8)
    ap.add_argument("--budget-s", type=float, default=0,
                    help="stop starting runs after this many seconds (0: no limit)")
    ap.add_argument("--require-finish", action="store_true",
                    help="a run whose job did not finish fails the soak too")
    ap.add_argument("--report", help="write every run and the summary here as JSON lines")
    ap.add_argument("--keep-logs", help="copy each run's agent and store logs into this directory")
    args = ap.parse_args()
    bin_dir = os.path.join(os.path.abspath(args.build), "bin")
    for name, program in (("launcher", "dist-launch"), ("rendezvous", "dist-rendezvous"),
                          ("ddp_train", "ddp_train")):
        setattr(args, name, os.path.abspath(getattr(args, name) or os.path.join(bin_dir, program)))
    kinds = args.kinds.split(",")
    plan = None
    if args.runs:
        plan = [(spec.split(":", 1)[0], spec.split(":", 1)[1].split("+"))
                for spec in args.runs.split()]
        kinds = sorted({kind for kind, _ in plan})
        for kind, faults in plan:
            if kind not in ("torch", "cpp") or not set(faults) <= set(FAULTS):
                ap.error(f"--runs: '{kind}:{'+'.join(faults)}' is not KIND:FAULT[+FAULT] with "
                         f"KIND torch or cpp and FAULT in {', '.join(FAULTS)}")
    why = unavailable(NAMED_HOSTS)
    if why:
        print(f"skipping: {why}", file=sys.stderr)
        return SKIP
    if "torch" in kinds and subprocess.run([args.python, "-c", "import torch"],
                                           capture_output=True).returncode != 0:
        print(f"skipping: {args.python} has no torch", file=sys.stderr)
        return SKIP
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    started = now()
    soak = Soak(args)
    out = open(args.report, "w") if args.report else None
    reports = []
    try:
        for kind in kinds:
            clean = soak.run(kind, [])
            if not clean["finished"] or clean["orphans"] or clean["hangs"] or \
                    len(clean["seen_digests"]) != 1:
                print(f"the clean {kind} run did not work: {json.dumps(clean, indent=1)}")
                return 2
            soak.clean[kind] = {"digest": clean["seen_digests"][0], "seconds": clean["seconds"]}
        print(json.dumps({"clean": soak.clean}), flush=True)
        injected, step, tries = 0, 0, 0
        while (plan and step < len(plan)) or (not plan and injected < args.faults):
            if args.budget_s and now() - started > args.budget_s:
                break
            if plan:
                kind, fault_kinds = plan[step]
            else:
                kind, fault_kinds = soak.rng.choice(kinds), None
            report = soak.run(kind, soak.draw_faults(kind, fault_kinds))
            injected += sum(1 for f in report["faults"] if "injected_s" in f)
            # A planned run whose fault came after the job's end is run again (new times).
            tries += 1
            if not plan or tries > PLAN_RETRIES or \
                    all("injected_s" in f for f in report["faults"]):
                step, tries = step + 1, 0
            reports.append(report)
            line = json.dumps(report)
            print(line, flush=True)
            if out:
                out.write(line + "\n")
        summary = summarize(reports, args, started, soak.clean)
        print(json.dumps(summary, indent=1), flush=True)
        if out:
            out.write(json.dumps(summary) + "\n")
    finally:
        soak.close()
        if out:
            out.close()
    bad = summary["orphans"] + summary["hangs"] + summary["wrong_digests"]
    if args.require_finish:
        bad += len(summary["not_finished"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
