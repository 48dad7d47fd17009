"""Hosts reached over real ssh, on this one machine: one OpenSSH sshd per host, on 127.0.0.2,
127.0.0.3, ... (every 127.x address is this machine's loopback), each started by the test and
stopped by the PID it recorded. Key-only root login; host and client keys, the sshd configs and
the client's ssh config (passed to dist-launch with --ssh-config) all live in a temporary
directory.

    with SshdHosts(2) as hosts:
        hosts.addresses            # ["127.0.0.2", "127.0.0.3"]
        hosts.ssh_config           # for ssh -F / dist-launch --ssh-config
        hosts.processes_of(0)      # what runs below the first host's sshd (its sessions)

Port 2222 (or the next free one, should another program hold it). The hosts share this machine's
process table: a job's processes are told apart by a marker in their environment, and a host's by
their place below its sshd.
"""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

SSHD = "/usr/sbin/sshd"
FIRST_PORT = 2222
PORT_ATTEMPTS = 20
START_TIMEOUT_S = 20
STOP_TIMEOUT_S = 10
POLL_S = 0.02


class Unavailable(Exception):
    """sshd cannot run here (not root, not installed, no port): the tests skip."""


def unavailable():
    if os.geteuid() != 0:
        return "the test sshd logs in as root (PermitRootLogin prohibit-password); not root"
    for program in (SSHD, shutil.which("ssh"), shutil.which("ssh-keygen")):
        if not program or not os.path.exists(program):
            return "OpenSSH is not installed (scripts/install-deps.sh installs openssh-server)"
    return None


def read(path):
    with open(path) as f:
        return f.read()


def wait_until(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s} s")
        time.sleep(POLL_S)


def children_map():
    """ppid -> [pid] for every live process (zombies left out)."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    return children


def descendants(pid):
    """The live processes below `pid`."""
    children = children_map()
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def port_is_free(address, port):
    """Whether sshd could listen there: nothing listens (connections of earlier tests still in
    TIME_WAIT do not count: sshd binds with SO_REUSEADDR, and so does this probe)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
            return True
        except OSError:
            return False


class SshdHosts:
    def __init__(self, count=2, first_address=2):
        why = unavailable()
        if why:
            raise Unavailable(why)
        self.addresses = [f"127.0.0.{first_address + i}" for i in range(count)]
        self.dir = tempfile.mkdtemp(prefix="dist-sshd-")
        self.daemons = []  # Popen, one per address
        try:
            self._make_keys()
            for port in range(FIRST_PORT, FIRST_PORT + PORT_ATTEMPTS):
                if all(port_is_free(a, port) for a in self.addresses) and self._start(port):
                    break
            else:
                raise Unavailable(f"no port from {FIRST_PORT} on was free for sshd on "
                                  f"{', '.join(self.addresses)}")
        except BaseException:
            self.stop()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def path(self, name):
        return os.path.join(self.dir, name)

    def _make_keys(self):
        for key in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", self.path(key)],
                           check=True, timeout=30)
        shutil.copy(self.path("client_key.pub"), self.path("authorized_keys"))
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory

    def _start(self, port):
        """Starts every host's sshd on `port`; False (none left running) if one could not bind."""
        self.port = port
        host_key = read(self.path("host_key.pub")).split()
        with open(self.path("known_hosts"), "w") as f:
            for address in self.addresses:
                f.write(f"[{address}]:{port} {host_key[0]} {host_key[1]}\n")
        self.ssh_config = self.path("ssh_config")
        with open(self.ssh_config, "w") as f:
            f.write(f"Host {' '.join(self.addresses)}\n"
                    f"  Port {port}\n  User root\n  IdentityFile {self.path('client_key')}\n"
                    f"  IdentitiesOnly yes\n  UserKnownHostsFile {self.path('known_hosts')}\n"
                    f"  StrictHostKeyChecking yes\n  BatchMode yes\n  LogLevel ERROR\n")
        for address in self.addresses:
            config = self.path(f"sshd_{address}.conf")
            with open(config, "w") as f:
                f.write(f"ListenAddress {address}:{port}\nHostKey {self.path('host_key')}\n"
                        f"PidFile {self.path(f'sshd_{address}.pid')}\n"
                        f"AuthorizedKeysFile {self.path('authorized_keys')}\n"
                        "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                        "MaxStartups 100:30:200\nMaxSessions 100\n")
            with open(self.path(f"sshd_{address}.log"), "w") as log:
                self.daemons.append(subprocess.Popen([SSHD, "-D", "-e", "-f", config],
                                                     stdout=log, stderr=subprocess.STDOUT))
        for address, daemon in zip(self.addresses, self.daemons):
            log = self.path(f"sshd_{address}.log")
            try:
                wait_until(lambda: "Server listening" in read(log) or daemon.poll() is not None,
                           START_TIMEOUT_S, f"sshd on {address}")
            except TimeoutError:
                self._stop_daemons()
                raise
            if daemon.poll() is not None:
                said = read(log)
                self._stop_daemons()
                if "Address already in use" in said or "Cannot bind" in said:
                    return False
                raise Unavailable(f"sshd on {address}:{port} did not start: {said.strip()}")
        return True

    def pid(self, host):
        return self.daemons[host].pid

    def processes_of(self, host):
        """What runs below host `host`'s sshd: its ssh sessions and what they started."""
        return descendants(self.pid(host))

    def _stop_daemons(self):
        for daemon in self.daemons:
            for pid in descendants(daemon.pid):  # sessions outlive their listener otherwise
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if daemon.poll() is None:
                daemon.terminate()
            try:
                daemon.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        self.daemons = []

    def stop(self):
        self._stop_daemons()
        shutil.rmtree(self.dir, ignore_errors=True)
