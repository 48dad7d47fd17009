"""dist-launch --hosts over real ssh: one sshd per host on 127.0.0.2 and 127.0.0.3 (sshd_hosts.py;
root only, skipped with exit 77 elsewhere), and over a stand-in ssh client that runs the command
on this machine (standin-ssh; no root needed).

Every job's processes carry a marker in their environment (exported with --export), every host's
are below its sshd: "nothing left on any host" is checked both ways, after the launcher ended,
was stopped (SIGTERM) or was killed (SIGKILL). Nothing is ordered by sleeping: the tests wait for
files the workers write.

    ssh_hosts_test.py --launcher build/bin/dist-launch --standin tests/ssh_hosts/standin-ssh \
        [SshHosts.test_sigkill_of_the_launcher_leaves_no_process_on_any_host]
"""
import argparse
import fcntl
import os
import pty
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
import unittest
import uuid

import sshd_hosts

SKIP = 77
JOB_TIMEOUT_S = 90
# A stopped job: the agents' grace period (--shutdown-timeout) plus room for a loaded machine.
SHUTDOWN_TIMEOUT_S = 5
GONE_TIMEOUT_S = 30
MARKER = "DIST_SSH_TEST_MARKER"
ARGS = None  # the command line's --launcher and --standin


def marked_processes(marker):
    """Live processes whose environment holds MARKER=marker."""
    entry = f"{MARKER}={marker}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if entry in f.read().split(b"\0"):
                    with open(f"/proc/{name}/stat") as s:
                        if s.read().rsplit(")", 1)[1].split()[0] != "Z":
                            found.append(int(name))
        except OSError:
            continue
    return found


def all_command_lines_and_environments():
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        for what in ("cmdline", "environ"):
            try:
                with open(f"/proc/{name}/{what}", "rb") as f:
                    yield int(name), what, f.read()
            except OSError:
                continue


def describe(pids):
    """pid, parent and command line of each process, for a failure message."""
    lines = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                command = f.read().replace("\0", " ")
            with open(f"/proc/{pid}/stat") as f:
                parent = f.read().rsplit(")", 1)[1].split()[1]
        except OSError:
            continue
        lines.append(f"{pid} (parent {parent}): {command}")
    return "\n".join(lines)


class Job:
    """One dist-launch --hosts run; its output in a file, its workers' files in `out`."""

    def __init__(self, test, hosts, worker_script, options=(), env=None, ssh=(),
                 remote_dist_launch=None, terminal=None):
        self.test = test
        self.out = tempfile.mkdtemp(prefix="dist-ssh-job-")
        self.process = None
        test.addCleanup(self.clean_up)
        self.marker = uuid.uuid4().hex
        self.log_path = os.path.join(self.out, "launcher.log")
        environment = dict(os.environ, **(env or {}))
        environment[MARKER] = self.marker
        environment["JOB_OUT"] = self.out
        environment["OMP_NUM_THREADS"] = "1"
        argv = [ARGS.launcher, "--hosts", hosts, *ssh,
                "--remote-dist-launch", remote_dist_launch or ARGS.launcher,
                "--export", MARKER, "--export", "JOB_OUT", "--export", "OMP_NUM_THREADS",
                "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S), *options,
                "--no-python", "/bin/sh", "-c", worker_script]
        self.reader = None
        if terminal:  # (columns, lines): its stdout and stderr a terminal of that size
            self.start_on_terminal(argv, environment, terminal)
            return
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                            env=environment, cwd=self.out)

    def start_on_terminal(self, argv, environment, size):
        columns, lines = size
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
        try:
            self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave,
                                            stderr=slave, env=environment, cwd=self.out)
        finally:
            os.close(slave)

        def copy():  # the terminal's output into the log, until every writer closed it (EIO)
            with open(self.log_path, "wb") as log:
                while True:
                    try:
                        data = os.read(master, 65536)
                    except OSError:
                        data = b""
                    if not data:
                        break
                    log.write(data)
                    log.flush()
            os.close(master)

        self.reader = threading.Thread(target=copy, daemon=True)
        self.reader.start()

    def clean_up(self):
        """A job a failed test left running is killed; its files go."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.out, ignore_errors=True)

    def wait(self, timeout_s=JOB_TIMEOUT_S):
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            self.test.fail(f"dist-launch did not end within {timeout_s} s:\n{self.output()}")
        if self.reader:
            self.reader.join(timeout=GONE_TIMEOUT_S)
        return code

    def output(self):
        with open(self.log_path) as f:
            text = f.read()
        return text.replace("\r\n", "\n") if self.reader else text  # (a terminal's line ends)

    def file(self, name):
        with open(os.path.join(self.out, name)) as f:
            return f.read()

    def files(self, prefix):
        return sorted(n for n in os.listdir(self.out) if n.startswith(prefix))

    def wait_for_files(self, prefix, count, timeout_s=JOB_TIMEOUT_S):
        deadline = time.monotonic() + timeout_s
        while len(self.files(prefix)) < count:
            if self.process.poll() is not None:
                self.test.fail(f"dist-launch ended ({self.process.returncode}) before {count} "
                               f"{prefix}* files:\n{self.output()}")
            if time.monotonic() > deadline:
                self.process.kill()
                self.process.wait()
                self.test.fail(f"no {count} {prefix}* files within {timeout_s} s:\n"
                               f"{self.output()}")
            time.sleep(sshd_hosts.POLL_S)


def announce(what):
    """Shell: writes `what` (a line) into $JOB_OUT/started_$RANK whole: written beside it, then
    renamed, so that a test that sees the file (wait_for_files) never reads it half written."""
    return (f'echo "{what}" > "$JOB_OUT/.started_$RANK" && '
            'mv "$JOB_OUT/.started_$RANK" "$JOB_OUT/started_$RANK"')


# A worker that says who it is, then waits for a signal.
WORKER_STARTS_AND_WAITS = (
    announce("$RANK $WORLD_SIZE $LOCAL_RANK $GROUP_RANK $TORCHELASTIC_RESTART_COUNT") +
    '; exec sleep 1000')


class HostsTestCase(unittest.TestCase):
    def assert_nothing_left(self, job, hosts=None):
        """No process of the job anywhere (by its marker), nothing below any host's sshd."""
        def left():
            found = marked_processes(job.marker)
            if hosts:
                for i in range(len(hosts.addresses)):
                    found += hosts.processes_of(i)
            return found
        deadline = time.monotonic() + GONE_TIMEOUT_S
        while left():
            if time.monotonic() > deadline:
                self.fail(f"still running {GONE_TIMEOUT_S} s after the job: {describe(left())}\n"
                          f"{job.output()}")
            time.sleep(sshd_hosts.POLL_S)

    def assert_four_ranks(self, job, attempt=0):
        lines = [job.file(f"started_{r}").split() for r in range(4)]
        self.assertEqual([int(l[0]) for l in lines], [0, 1, 2, 3], job.output())
        self.assertEqual({l[1] for l in lines}, {"4"})                   # WORLD_SIZE
        self.assertEqual([l[2] for l in lines], ["0", "1", "0", "1"])     # LOCAL_RANK
        self.assertEqual([l[3] for l in lines], ["0", "0", "1", "1"])     # GROUP_RANK
        self.assertEqual({l[4] for l in lines}, {str(attempt)})           # restart count


class SshHosts(HostsTestCase):
    """Over real sshd."""

    def setUp(self):
        try:
            self.hosts = sshd_hosts.SshdHosts(2)
        except sshd_hosts.Unavailable as e:
            self.skipTest(str(e))
        self.addCleanup(self.hosts.stop)
        self.ssh = ["--ssh-config", self.hosts.ssh_config]

    def job(self, script, options=(), env=None, hosts=None, ssh=None):
        a, b = self.hosts.addresses
        return Job(self, hosts or f"{a}:2,{b}:2", script, options, env,
                   self.ssh if ssh is None else ssh)

    def test_two_hosts_of_two_workers_give_four_unique_ranks(self):
        job = self.job('echo "$RANK $WORLD_SIZE $LOCAL_RANK $GROUP_RANK '
                       '$TORCHELASTIC_RESTART_COUNT" > "$JOB_OUT/started_$RANK"; echo hi from $RANK')
        self.assertEqual(job.wait(), 0, job.output())
        self.assert_four_ranks(job)
        a, b = self.hosts.addresses
        for rank, host in enumerate([a, a, b, b]):  # every host's lines, host and rank first
            self.assertIn(f"[default{rank}@{host}]:hi from {rank}\n", job.output())
        self.assertIn(f"[dist-launch@{b}] info: round 0: node 1 of 2", job.output())
        self.assert_nothing_left(job, self.hosts)

    def test_variables_working_directory_and_token_reach_every_worker(self):
        job = self.job('env > "$JOB_OUT/env_$RANK"; pwd > "$JOB_OUT/pwd_$RANK"; '
                       'readlink /proc/self/fd/0 > "$JOB_OUT/stdin_$RANK"; '
                       'cp "$DIST_LAUNCH_TOKEN_FILE" "$JOB_OUT/token_$RANK"; '
                       'stat -c %a "$DIST_LAUNCH_TOKEN_FILE" > "$JOB_OUT/mode_$RANK"; '
                       'touch "$JOB_OUT/started_$RANK"; exec sleep 1000',
                       options=["--export", "SSH_TEST_ONE", "--export-prefix", "SSH_TEST_NCCL_"],
                       env={"SSH_TEST_ONE": "one value", "SSH_TEST_NCCL_A": "a",
                            "SSH_TEST_NCCL_B": "b", "PYTHON_EXEC": "/usr/bin/python3",
                            "SSH_TEST_NOT_EXPORTED": "x"})
        job.wait_for_files("started_", 4)
        token = job.file("token_0")
        self.assertRegex(token, r"^[0-9a-f]{64}$")
        # The token is in no command line and no environment of any process, while the job runs;
        # an exported value is in no command line either (the workers' environments have it).
        for pid, what, content in all_command_lines_and_environments():
            self.assertNotIn(token.encode(), content, f"the token is in {pid}'s {what}")
            if what == "cmdline":
                self.assertNotIn(b"one value", content, f"an exported value is in {pid}'s {what}")
        job.process.send_signal(signal.SIGTERM)
        self.assertEqual(job.wait(), 128 + signal.SIGTERM, job.output())
        for rank in range(4):
            env = dict(l.split("=", 1) for l in job.file(f"env_{rank}").splitlines() if "=" in l)
            self.assertEqual(env.get("SSH_TEST_ONE"), "one value")
            self.assertEqual((env.get("SSH_TEST_NCCL_A"), env.get("SSH_TEST_NCCL_B")), ("a", "b"))
            self.assertEqual(env.get("PYTHON_EXEC"), "/usr/bin/python3")
            self.assertNotIn("SSH_TEST_NOT_EXPORTED", env)
            self.assertEqual(job.file(f"pwd_{rank}").strip(), job.out)
            self.assertEqual(job.file(f"mode_{rank}").strip(), "600")
            self.assertEqual(job.file(f"token_{rank}"), token)
            # An agent --hosts started reads its job on its stdin: its workers' is /dev/null.
            self.assertEqual(job.file(f"stdin_{rank}").strip(), "/dev/null")
        self.assert_nothing_left(job, self.hosts)

    def test_the_users_token_file_is_the_jobs_token(self):
        tmp = tempfile.mkdtemp(prefix="dist-ssh-token-")
        self.addCleanup(shutil.rmtree, tmp, True)
        token_file = os.path.join(tmp, "job.token")
        with open(os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write("the-users-own-token\n")
        job = self.job('cp "$DIST_LAUNCH_TOKEN_FILE" "$JOB_OUT/token_$RANK"',
                       options=["--token-file", token_file])
        self.assertEqual(job.wait(), 0, job.output())
        for rank in range(4):
            self.assertEqual(job.file(f"token_{rank}").strip(), "the-users-own-token")
        self.assert_nothing_left(job, self.hosts)

    def test_a_worker_failure_restarts_every_host(self):
        job = self.job('echo "$RANK $WORLD_SIZE $LOCAL_RANK $GROUP_RANK '
                       '$TORCHELASTIC_RESTART_COUNT" > "$JOB_OUT/started_$RANK"; '
                       'cp "$JOB_OUT/started_$RANK" "$JOB_OUT/attempt${TORCHELASTIC_RESTART_COUNT}'
                       '_$RANK"; if [ "$RANK$TORCHELASTIC_RESTART_COUNT" = 30 ]; then exit 3; fi; '
                       'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then exec sleep 1000; fi',
                       options=["--max-restarts", "1"])
        self.assertEqual(job.wait(), 0, job.output())
        self.assertEqual(len(job.files("attempt1_")), 4, job.output())  # every rank, again
        self.assert_four_ranks(job, attempt=1)
        a, b = self.hosts.addresses
        for host in (a, b):
            self.assertIn(f"[dist-launch@{host}] warning: restarting the worker group", job.output())
        self.assert_nothing_left(job, self.hosts)

    def test_a_failure_gives_the_job_one_report_and_its_exit_code(self):
        job = self.job('touch "$JOB_OUT/started_$RANK"; if [ "$RANK" = 2 ]; then exit 7; fi; '
                       'exec sleep 1000')
        self.assertEqual(job.wait(), 7, job.output())
        self.assertEqual(job.output().count("sh FAILED"), 1, job.output())
        self.assertIn("rank      : 2 (local_rank: 0)", job.output())
        # The launcher read from its store (with the job's token) that the job is over, and left
        # every agent to end and report by itself.
        self.assertNotIn("stopping the other hosts", job.output())
        self.assert_nothing_left(job, self.hosts)

    def stop_the_launcher(self, sig):
        job = self.job(WORKER_STARTS_AND_WAITS)
        job.wait_for_files("started_", 4)
        job.process.send_signal(sig)
        code = job.wait()
        self.assert_nothing_left(job, self.hosts)
        return job, code

    def test_sigterm_of_the_launcher_leaves_no_process_on_any_host(self):
        job, code = self.stop_the_launcher(signal.SIGTERM)
        self.assertEqual(code, 128 + signal.SIGTERM, job.output())
        for host in self.hosts.addresses:
            self.assertIn(f"[dist-launch@{host}] warning: stopped by SIGTERM", job.output())

    def test_a_host_that_sees_another_stop_first_stops_for_the_launchers_signal(self):
        # The launcher's SIGTERM reaches host b first (host a's ssh client is held stopped, the
        # line for it waiting in its pipe): a's agent sees b's leave, reads the launcher's stop
        # in the store and stops its workers for SIGTERM before its own copy comes, rather than
        # fail the job for "a node that left no failure record".
        job = self.job(announce("$RANK") + '; trap \'touch "$JOB_OUT/term_$RANK"; exit 143\' '
                       'TERM; sleep 1000 & wait')
        job.wait_for_files("started_", 4)
        a, _ = self.hosts.addresses
        ssh_to_a = [p for p in sshd_hosts.descendants(job.process.pid)
                    if f" -- {a} " in " ".join(open(f"/proc/{p}/cmdline").read().split("\0"))]
        self.assertEqual(len(ssh_to_a), 1, job.output())
        os.kill(ssh_to_a[0], signal.SIGSTOP)
        try:
            job.process.send_signal(signal.SIGTERM)
            job.wait_for_files("term_", 4)  # a's workers too, while its signal still waits
        finally:
            os.kill(ssh_to_a[0], signal.SIGCONT)
        self.assertEqual(job.wait(), 128 + signal.SIGTERM, job.output())
        self.assertIn(f"[dist-launch@{a}] info: the launcher stops the job (SIGTERM), another "
                      "host's agent has left already", job.output())
        for host in self.hosts.addresses:
            self.assertIn(f"[dist-launch@{host}] warning: stopped by SIGTERM", job.output())
        self.assertNotIn("error", job.output())
        self.assertNotIn("again", job.output())  # the signal that came after is no second one
        self.assert_nothing_left(job, self.hosts)

    def test_sigkill_of_the_launcher_leaves_no_process_on_any_host(self):
        job, code = self.stop_the_launcher(signal.SIGKILL)
        self.assertEqual(code, -signal.SIGKILL)

    def test_a_dropped_ssh_connection_stops_its_host_and_the_job(self):
        job = self.job(WORKER_STARTS_AND_WAITS)
        job.wait_for_files("started_", 4)
        b = self.hosts.addresses[1]
        ssh_to_b = [p for p in sshd_hosts.descendants(job.process.pid)
                    if f" -- {b} " in " ".join(open(f"/proc/{p}/cmdline").read().split("\0"))]
        self.assertEqual(len(ssh_to_b), 1, job.output())
        os.kill(ssh_to_b[0], signal.SIGKILL)  # no tty: sshd's side only sees its stdin end
        self.assertEqual(job.wait(), 1, job.output())
        self.assertIn(f"error: lost host {b}: its ssh client was killed by SIGKILL", job.output())
        self.assert_nothing_left(job, self.hosts)

    def test_an_unreachable_host_is_named(self):
        a = self.hosts.addresses[0]
        unreachable = "127.0.0.9"  # no sshd there
        self.assertTrue(sshd_hosts.port_is_free(unreachable, self.hosts.port))
        job = self.job(WORKER_STARTS_AND_WAITS, hosts=f"{a}:2,{unreachable}:2",
                       ssh=["--ssh-port", str(self.hosts.port), "--ssh-config",
                            self.hosts.ssh_config])
        self.assertEqual(job.wait(), 1, job.output())
        self.assertRegex(job.output(), f"error: host {unreachable} is unreachable over ssh: "
                         f"ssh: connect to host {unreachable} port {self.hosts.port}: "
                         "Connection refused")
        self.assert_nothing_left(job, self.hosts)

    def test_a_refused_key_is_named(self):
        other_key = os.path.join(self.hosts.dir, "other_key")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", other_key],
                       check=True, timeout=30)
        config = os.path.join(self.hosts.dir, "ssh_config_other_key")
        with open(self.hosts.ssh_config) as f, open(config, "w") as out:
            out.write(f.read().replace(os.path.join(self.hosts.dir, "client_key"), other_key))
        a, b = self.hosts.addresses
        job = self.job(WORKER_STARTS_AND_WAITS, ssh=["--ssh-config", config])
        self.assertEqual(job.wait(), 1, job.output())
        for host in (a, b):
            self.assertIn(f"error: host {host} refused the ssh key", job.output())
        self.assertIn("Permission denied (publickey)", job.output())
        self.assert_nothing_left(job, self.hosts)

    def test_a_host_without_dist_launch_is_named(self):
        a = self.hosts.addresses[0]
        job = Job(self, f"{a}:1", WORKER_STARTS_AND_WAITS, ssh=self.ssh,
                  remote_dist_launch="dist-launch-not-installed")
        self.assertEqual(job.wait(), 1, job.output())
        self.assertIn(f"error: host {a} has no `dist-launch-not-installed` on its PATH",
                      job.output())
        self.assertRegex(job.output(), "dist-launch-not-installed: (command )?not found")
        self.assert_nothing_left(job, self.hosts)

    def test_this_host_runs_its_agent_next_to_ssh_ones(self):
        # The local agent is a child of the launcher, not the launcher itself: the ssh clients are
        # no agent's leftovers, and the local agent's workers are its own. SIGUSR1 reaches every
        # worker and the job goes on; SIGINT stops it.
        a, b = self.hosts.addresses
        job = self.job('trap \'touch "$JOB_OUT/usr1_$RANK"\' USR1; ' +
                       announce("$RANK $WORLD_SIZE $LOCAL_RANK $GROUP_RANK") +
                       '; sleep 1000 & while :; do wait; done', hosts=f"localhost:1,{a}:2,{b}:1",
                       options=["--signals-to-handle", "SIGINT,SIGTERM,SIGUSR1"])
        job.wait_for_files("started_", 4)
        ranks = [job.file(f"started_{r}").split() for r in range(4)]
        self.assertEqual([r[3] for r in ranks], ["0", "1", "1", "2"])  # GROUP_RANK
        job.process.send_signal(signal.SIGUSR1)
        job.wait_for_files("usr1_", 4)
        job.process.send_signal(signal.SIGINT)
        self.assertEqual(job.wait(), 128 + signal.SIGINT, job.output())
        self.assertIn("[dist-launch@localhost] warning: stopped by SIGINT", job.output())
        self.assert_nothing_left(job, self.hosts)


    def test_every_hosts_workers_keep_their_lines_order_and_get_the_terminals_size(self):
        # The launcher on a terminal (stdout and stderr one file): each worker's stdout and stderr
        # lines, alternating, reach it in the order written, from this host's agent and over ssh
        # (the remote agent writes its workers' both streams to its stdout); every worker gets the
        # launcher's terminal size, less its line prefix, as COLUMNS and LINES.
        a = self.hosts.addresses[0]
        job = Job(self, f"localhost:1,{a}:1",
                  'i=0; while [ $i -lt 300 ]; do echo "out $RANK $i"; echo "err $RANK $i" >&2; '
                  'i=$((i+1)); done; echo "size $RANK $COLUMNS $LINES"', ssh=self.ssh,
                  terminal=(131, 41))
        self.assertEqual(job.wait(), 0, job.output())
        output = job.output()
        for rank, host in enumerate(["localhost", a]):
            prefix = f"[default{rank}@{host}]:"
            mine = [line[len(prefix):] for line in output.splitlines() if line.startswith(prefix)]
            written = [f"{stream} {rank} {i}" for i in range(300) for stream in ("out", "err")]
            self.assertEqual([line for line in mine if not line.startswith("size")], written,
                             output[-3000:])
            self.assertIn(f"size {rank} {131 - len(prefix)} 41", mine, output[-3000:])
        self.assert_nothing_left(job, self.hosts)


class StandinHosts(HostsTestCase):
    """Over the stand-in ssh client: every host is this machine, no sshd, no root."""

    def job(self, hosts, script):
        return Job(self, hosts, script, ssh=["--ssh", ARGS.standin])

    def test_four_hosts_of_one_worker_then_sigkill_of_the_launcher(self):
        job = self.job("h1,h2,h3,h4",
                       announce("$RANK $STANDIN_SSH_HOST") + '; exec sleep 1000')
        job.wait_for_files("started_", 4)
        self.assertEqual([job.file(f"started_{r}").split() for r in range(4)],
                         [["0", "h1"], ["1", "h2"], ["2", "h3"], ["3", "h4"]])
        job.process.kill()
        job.wait()
        self.assert_nothing_left(job)


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--launcher", required=True)
    parser.add_argument("--standin", required=True)
    ARGS, rest = parser.parse_known_args()
    result = unittest.main(argv=[sys.argv[0], *rest], exit=False).result
    if not result.wasSuccessful():
        sys.exit(1)
    if result.skipped and result.testsRun == len(result.skipped):
        for _, why in result.skipped:
            print(f"skipped: {why}")
        sys.exit(SKIP)


if __name__ == "__main__":
    main()
