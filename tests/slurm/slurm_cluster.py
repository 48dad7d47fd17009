"""A real Slurm for tests, on this one machine: its own munged, slurmctld and three slurmd
(`slurmd -N`, nodes named 127.0.0.1 to 127.0.0.3 so that no /etc/hosts entry is needed), every file
in a temporary directory, every port one the kernel handed out, every daemon stopped by its PID.

    with SlurmCluster() as cluster:
        cluster.run(["srun", "-N2", "hostname"])

The munged is private (its own key and socket, named in slurm.conf's AuthInfo), so a munged already
running on the machine is left alone and two clusters can run at once.
"""
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time

NODES = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
DAEMONS = ["munged", "munge", "unmunge", "slurmctld", "slurmd", "srun", "sbatch", "salloc",
           "squeue", "scancel", "scontrol", "sinfo"]
# Job ids start at a random point: clusters of parallel tests then give their jobs different ids,
# so dist-launch's store ports (derived from job and step id) do not collide on 127.0.0.1.
FIRST_JOB_ID_RANGE = (1000, 60_000_000)
# The daemons' ports: above Linux's ephemeral range (32768-60999), so no outgoing connection takes
# one between the check that it is free and the daemon's bind; a clash with another cluster started
# at the same moment is retried with new ports.
DAEMON_PORTS = (61000, 65535)
START_ATTEMPTS = 3
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30
POLL_S = 0.1
KILL_WAIT_S = 5  # Slurm's SIGTERM-to-SIGKILL grace for a cancelled job step


class PortTaken(Exception):
    """A daemon's port was taken between the check and its bind: start again with new ports."""


class Unavailable(Exception):
    """Slurm cannot run here (not root, or a program missing): the tests skip."""


def unavailable():
    if os.geteuid() != 0:
        return "Slurm's daemons run as root here (SlurmUser=root); not root"
    missing = [d for d in DAEMONS if not shutil.which(d)]
    if missing:
        return f"missing {', '.join(missing)} (scripts/install-deps.sh installs them)"
    return None


def free_port(host):
    """A port free now on `host`, above the kernel's ephemeral ports (see DAEMON_PORTS)."""
    while True:
        port = random.randint(*DAEMON_PORTS)
        with socket.socket() as s:
            try:
                s.bind((host, port))
                return port
            except OSError:
                continue


def wait_until(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s} s")
        time.sleep(POLL_S)


class SlurmCluster:
    def __init__(self):
        why = unavailable()
        if why:
            raise Unavailable(why)
        self.dir = tempfile.mkdtemp(prefix="dist-slurm-")
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.munge_socket = os.path.join(self.dir, "munge.socket")
        self.daemons = []  # (name, Popen), stopped in reverse order
        try:
            self._start_munge()
            for attempt in range(START_ATTEMPTS):
                self._write_conf()
                try:
                    self._start_slurm()
                    break
                except PortTaken:
                    self._stop_daemons(keep=1)  # munged stays
            else:
                raise RuntimeError(f"Slurm's ports were taken {START_ATTEMPTS} times over")
        except BaseException:
            self.stop()
            raise

    def env(self, **extra):
        return dict(os.environ, SLURM_CONF=self.conf, **extra)

    def run(self, argv, timeout_s, **kwargs):
        """A Slurm command (srun, sbatch, ...) against this cluster, run to its end."""
        return subprocess.run(argv, env=kwargs.pop("env", self.env()), capture_output=True,
                              text=True, timeout=timeout_s, **kwargs)

    def job_state(self, job_id):
        out = self.run(["scontrol", "-o", "show", "job", str(job_id)], 30).stdout
        for field in out.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return "GONE"

    def wait_job_done(self, job_id, timeout_s):
        active = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"}
        wait_until(lambda: self.job_state(job_id) not in active, timeout_s, f"job {job_id} ends")
        wait_until(lambda: job_id not in self.active_jobs(), timeout_s,
                   f"job {job_id} leaves the queue")

    def active_jobs(self):
        out = self.run(["squeue", "-h", "-o", "%i"], 30).stdout
        return {line.strip() for line in out.splitlines() if line.strip()}

    def stop(self):
        for job in self.active_jobs() if self._controller_up() else ():
            self.run(["scancel", job], 30)
        if self._controller_up():
            try:
                wait_until(lambda: not self.active_jobs(), STOP_TIMEOUT_S, "every job ends")
            except TimeoutError:
                pass  # the daemons go anyway; their steps are killed with them below
        self._stop_daemons(keep=0)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _stop_daemons(self, keep):
        """SIGTERM (then SIGKILL) to every daemon started after the first `keep`, by PID."""
        stopping = self.daemons[keep:]
        for _, proc in reversed(stopping):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc in reversed(stopping):
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.daemons = self.daemons[:keep]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def log(self, name):
        try:
            with open(os.path.join(self.dir, name)) as f:
                return f.read()
        except OSError:
            return ""

    # -- starting --------------------------------------------------------------------------------

    def _spawn(self, name, argv):
        out = open(os.path.join(self.dir, name + ".out"), "w")
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env())
        out.close()
        self.daemons.append((name, proc))
        return proc

    def _alive(self, name, proc):
        if proc.poll() is not None:
            log = self.log(name + ".out")
            if "Address already in use" in log:
                raise PortTaken(name)
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log}")

    def _start_munge(self):
        key = os.path.join(self.dir, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        os.chmod(self.dir, 0o755)  # munged wants its socket's directory reachable by all
        proc = self._spawn("munged", [
            "munged", "--foreground", "--force", f"--socket={self.munge_socket}",
            f"--key-file={key}", f"--pid-file={self.dir}/munged.pid",
            f"--seed-file={self.dir}/munged.seed", f"--log-file={self.dir}/munged.log"])

        def answers():
            self._alive("munged", proc)
            cred = subprocess.run(["munge", "-S", self.munge_socket, "-n"], capture_output=True)
            return cred.returncode == 0 and subprocess.run(
                ["unmunge", "-S", self.munge_socket], input=cred.stdout,
                capture_output=True).returncode == 0
        wait_until(answers, START_TIMEOUT_S, "munged answers")

    def _write_conf(self):
        host = socket.gethostname()
        self.controller_port = free_port("127.0.0.1")
        lines = [
            "ClusterName=dist", f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={self.controller_port}", "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.munge_socket}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SwitchType=switch/none",
            "MpiDefault=none", "SchedulerType=sched/backfill", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU", "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none", "JobCompType=jobcomp/none",
            "ReturnToService=2", "SlurmdParameters=config_overrides", f"KillWait={KILL_WAIT_S}",
            "MinJobAge=60", f"FirstJobId={random.randint(*FIRST_JOB_ID_RANGE)}",
            f"StateSaveLocation={self.dir}/state",
            f"SlurmdSpoolDir={self.dir}/spool/%n", f"SlurmctldPidFile={self.dir}/slurmctld.pid",
            f"SlurmdPidFile={self.dir}/slurmd-%n.pid", f"SlurmctldLogFile={self.dir}/slurmctld.log",
            f"SlurmdLogFile={self.dir}/slurmd-%n.log",
        ]
        for node in NODES:
            lines.append(f"NodeName={node} NodeHostname={host} NodeAddr={node} "
                         f"Port={free_port(node)} CPUs=4 RealMemory=1000")
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        os.makedirs(os.path.join(self.dir, "state"), exist_ok=True)
        for node in NODES:
            os.makedirs(os.path.join(self.dir, "spool", node), exist_ok=True)
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")

    def _controller_up(self):
        return any(name == "slurmctld" and proc.poll() is None for name, proc in self.daemons)

    def _start_slurm(self):
        ctld = self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", self.conf])
        nodes = [self._spawn(f"slurmd-{n}", ["slurmd", "-D", "-N", n, "-f", self.conf])
                 for n in NODES]

        def all_idle():
            self._alive("slurmctld", ctld)
            for n, proc in zip(NODES, nodes):
                self._alive(f"slurmd-{n}", proc)
            out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], 30).stdout.split()
            return out.count("idle") == len(NODES)
        wait_until(all_idle, START_TIMEOUT_S, "three idle slurmd")
