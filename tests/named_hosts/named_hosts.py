"""Hosts with names for Python tests, over named-hosts.sh (see there): network namespaces, each with
its own host name, /etc/hosts and addresses on one private bridge.

    with NamedHosts(script, ["node-a", "node-b"], loopback_self="node-a") as hosts:
        proc = hosts.start("node-b", ["dist-launch", ...], env=..., log=path)

Every process started is killed by its PID and reaped, and the hosts removed, on leaving the block
(an exception included); hosts a crashed test left behind are swept by the next one.
"""
import itertools
import os
import secrets
import subprocess

SKIP = 77
_counter = itertools.count()


def unavailable(script):
    """Why hosts cannot be made here (not root, no network namespaces), or None."""
    probe = subprocess.run([script, "check"], capture_output=True, text=True)
    return None if probe.returncode == 0 else (probe.stderr.strip() or "named-hosts.sh check failed")


class NamedHosts:
    def __init__(self, script, names, loopback_self=None, domain=None):
        self.script = script
        self.run_id = f"dlh{os.getpid()}-{next(_counter)}{secrets.token_hex(2)}"
        self.procs = []
        self.logs = []
        subprocess.run([script, "sweep"], check=False)
        command = [script, "up", self.run_id]
        if loopback_self:
            command += ["--loopback-self", loopback_self]
        if domain:
            command += ["--domain", domain]
        up = subprocess.run(command + list(names), capture_output=True, text=True)
        if up.returncode != 0:
            self.close()
            raise RuntimeError(f"cannot make the named hosts: {up.stderr}")

    def start(self, host, argv, env=None, log=None, pipe=False):
        """argv as host `host`; stdout and stderr to the file `log` (or discarded), or with
        `pipe` to proc.stdout, read by the caller (the process then leads a session of its own)."""
        if pipe and log:
            raise ValueError("NamedHosts.start: a log file or a pipe, not both")
        out = subprocess.PIPE if pipe else open(log, "w") if log else subprocess.DEVNULL
        if log:
            self.logs.append(out)
        proc = subprocess.Popen([self.script, "exec", self.run_id, host, *argv], env=env,
                                stdout=out, stderr=subprocess.STDOUT, text=True,
                                errors="replace", start_new_session=pipe)
        self.procs.append(proc)
        return proc

    def close(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for log in self.logs:
            log.close()
        subprocess.run([self.script, "down", self.run_id], check=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
