"""A job's token across hosts known by name (docs/STORE.md, Authentication):

- a job with a token and --unauthenticated deny: strangers anywhere are closed at their first
  request, while the C++ SDK's workers (which read DIST_LAUNCH_TOKEN_FILE) train to the weights of
  the same job on one host without a token;
- the default policy (known-hosts): a stranger on a host whose agent authenticated gets PyTorch's
  operations on the workers' keys, never the agents' (rdzv/): no read, no write, no delete, no
  DELETE_ALL_EXCEPT, and they are not even counted; on a host without an agent, nothing;
- a wrong token, or none, is a clear error naming the store and what to do;
- dist-launch status takes the token;
- unmodified PyTorch workers (Debian's torch 1.13) still train in a job with a token, with the
  agents' store (c10d) or with etcd-v3 (node rank 0's agent hosts the workers' store, which the
  agents never use otherwise: each introduces its host to it).

    python3 token_test.py --launcher build/bin/dist-launch --worker build/bin/dist-test-worker \
        --ddp-train build/bin/ddp_train --named-hosts named-hosts.sh
Exits 77 (skip) when named hosts cannot be made here; the PyTorch test skips without torch.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

from named_hosts import SKIP, NamedHosts, unavailable

HERE = os.path.dirname(os.path.abspath(__file__))
STRANGER = os.path.join(HERE, "store_stranger.py")
TORCH_EXAMPLE = os.path.join(HERE, "..", "..", "examples", "torch", "ddp_train.py")
HOSTS = ["node-a", "node-b", "node-c"]
ETCD = shutil.which("etcd") or "/usr/bin/etcd"
ETCD_PORT = "2379"
PORT = "29500"  # the hosts are fresh network namespaces: nothing else holds a port there
RUN_ID = "none"
JOB_TIMEOUT_S = 240
WAIT_S = 90
ARGS = None


def torch_available(python):
    return subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0


class TokenOnNamedHosts(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dist-named-token-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.hosts = NamedHosts(ARGS.named_hosts, HOSTS)
        self.addCleanup(self.hosts.close)
        self.token = self.write_token("token", "the-jobs-token")
        self.logs = {}

    def path(self, name):
        return os.path.join(self.dir, name)

    def write_token(self, name, secret):
        path = self.path(name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret + "\n")
        return path

    def start(self, host, name, argv, env=None):
        log = self.path(name + ".log")
        self.logs[name] = log
        return self.hosts.start(host, argv, env=env or dict(os.environ), log=log)

    def output(self, name):
        with open(self.logs[name]) as f:
            return f.read()

    def node(self, host, rank, nnodes, worker, extra=(), timeout_s=60):
        """A static node of a job whose store node-a's agent hosts."""
        argv = [ARGS.launcher, "--nnodes", str(nnodes), "--node-rank", str(rank),
                "--master-addr", "node-a", "--master-port", PORT,
                "--rdzv-conf", f"timeout={timeout_s}", *extra, "--no-python", *worker]
        return self.start(host, host, argv)

    def waiting_job(self, extra):
        """node-a and node-b with the token, their workers waiting for the file go."""
        procs = []
        for rank, host in enumerate(["node-a", "node-b"]):
            worker = [ARGS.worker, "env", self.path(f"env_{host}"), "wait-file", self.path("go")]
            procs.append(self.node(host, rank, 2, worker, ["--token-file", self.token, *extra]))
        deadline = time.monotonic() + WAIT_S
        while not all(os.path.exists(self.path(f"env_{h}")) for h in ["node-a", "node-b"]):
            for proc, host in zip(procs, ["node-a", "node-b"]):
                self.assertIsNone(proc.poll(), self.output(host))
            self.assertLess(time.monotonic(), deadline, "the workers never started")
            time.sleep(0.05)
        return procs

    def finish(self, procs):
        open(self.path("go"), "w").close()
        for proc, host in zip(procs, ["node-a", "node-b"]):
            self.assertEqual(proc.wait(timeout=JOB_TIMEOUT_S), 0, self.output(host))

    def stranger(self, host, *steps, python=sys.executable):
        """Runs the steps as a client without the token on `host`: {step: result}."""
        code, out = self.hosts_run(host, [python, STRANGER, "node-a", PORT, *steps])
        self.assertEqual(code, 0, out)
        results = {}
        for line in out.splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                results[record["step"]] = record["result"]
        self.assertEqual(set(results), set(steps), out)
        return results

    def hosts_run(self, host, argv):
        proc = subprocess.run([ARGS.named_hosts, "exec", self.hosts.run_id, host, *argv],
                              capture_output=True, text=True, timeout=120)
        return proc.returncode, proc.stdout + proc.stderr

    def test_deny_admits_the_token_alone_and_sdk_workers_have_it(self):
        procs = self.waiting_job(["--unauthenticated", "deny"])
        with open(self.path("env_node-b")) as f:
            env = dict(line.split("=", 1) for line in f.read().splitlines() if "=" in line)
        self.assertEqual(env["DIST_LAUNCH_TOKEN_FILE"], self.token)
        self.assertNotIn("the-jobs-token", "\n".join(env.values()))
        for host in ["node-b", "node-c"]:  # an agent's host or not: nothing without the token
            got = self.stranger(host, "legacy:add:job/x:1", "legacy:numkeys")
            self.assertEqual(got, {"legacy:add:job/x:1": "CLOSED", "legacy:numkeys": "CLOSED"},
                             host)
        self.finish(procs)

        def train(host, rank, nnodes, extra):
            return self.node(host, rank, nnodes,
                             [ARGS.ddp_train, "--epochs", "2", "--global-batch", "48"],
                             extra + ["--nproc-per-node", str(2 if nnodes == 2 else 4)])
        nodes = [train(h, r, 2, ["--token-file", self.token, "--unauthenticated", "deny"])
                 for r, h in enumerate(["node-a", "node-b"])]
        codes = [p.wait(timeout=JOB_TIMEOUT_S) for p in nodes]
        outputs = [self.output(h) for h in ["node-a", "node-b"]]
        self.assertEqual(codes, [0, 0], "\n".join(outputs))
        two_hosts = set(re.findall(r"weights sha256 ([0-9a-f]{64})", "".join(outputs)))
        alone = self.start("node-c", "alone", [ARGS.launcher, "--nproc-per-node", "4",
                                               "--no-python", ARGS.ddp_train, "--epochs", "2",
                                               "--global-batch", "48"])
        self.assertEqual(alone.wait(timeout=JOB_TIMEOUT_S), 0, self.output("alone"))
        one_host = set(re.findall(r"weights sha256 ([0-9a-f]{64})", self.output("alone")))
        self.assertEqual(len(two_hosts), 1, "\n".join(outputs))
        self.assertEqual(two_hosts, one_host)

    def test_a_stranger_on_an_admitted_host_stays_out_of_the_agents_keys(self):
        procs = self.waiting_job([])  # --unauthenticated known-hosts, the default
        round_key = f"rdzv/{RUN_ID}/round"
        got = self.stranger("node-b", "legacy:add:job/x:1", "legacy:numkeys",
                            f"legacy:get:{round_key}", f"legacy:set:rdzv/{RUN_ID}/over:forged",
                            f"legacy:add:{round_key}:1", f"legacy:delete:{round_key}",
                            "current:delete_all_except:job/")
        self.assertEqual(got["legacy:add:job/x:1"], 1)  # the workers' keys: PyTorch's operations
        self.assertEqual(got["legacy:numkeys"], 1)  # the agents' keys are not even counted
        for step, result in got.items():
            if "rdzv/" in step or "delete_all_except" in step:
                self.assertEqual(result, "CLOSED", step)
        if torch_available(ARGS.python):
            # PyTorch's own client is admitted too; it puts "/" before every key, so it cannot
            # even name the agents' keys (the raw requests above are what a hand-made client
            # could try).
            got = self.stranger("node-b", "torch:add:job/x:1", f"torch:get:{round_key}",
                                python=ARGS.python)
            self.assertEqual(got, {"torch:add:job/x:1": 1, f"torch:get:{round_key}": "CLOSED"})
        got = self.stranger("node-c", "legacy:add:job/x:1")  # no agent authenticated there
        self.assertEqual(got["legacy:add:job/x:1"], "CLOSED")
        self.finish(procs)  # the agents' rendezvous was never disturbed

    def test_status_takes_the_token(self):
        procs = self.waiting_job([])
        status = [ARGS.launcher, "status", "--rdzv-endpoint", f"node-a:{PORT}", "--json"]
        code, out = self.hosts_run("node-c", status)
        self.assertEqual(code, 1, out)
        self.assertIn(f"node-a:{PORT}", out)
        self.assertIn("--token-file", out)
        code, out = self.hosts_run("node-c", status + ["--token-file", self.token])
        self.assertEqual(code, 0, out)
        self.assertEqual(len(json.loads(out)["nodes"]), 2, out)
        self.finish(procs)

    def test_a_wrong_or_missing_token_is_a_clear_error(self):
        wrong = self.write_token("wrong", "not-the-jobs-token")
        hosting = self.node("node-a", 0, 3, [ARGS.worker, "exit", "0"],
                            ["--token-file", self.token], timeout_s=60)
        cases = {"node-b": (["--token-file", wrong], "this client's token is not the store's"),
                 "node-c": ([], "requires the job's token")}
        for rank, (host, (extra, said)) in enumerate(cases.items(), start=1):
            proc = self.node(host, rank, 3, [ARGS.worker, "exit", "0"], extra)
            self.assertEqual(proc.wait(timeout=WAIT_S), 1, self.output(host))
            out = self.output(host)
            self.assertIn(said, out)
            self.assertIn(f"node-a:{PORT}", out)
            self.assertIn("--token-file", out)
        hosting.kill()
        hosting.wait()
        self.assertIn("authentication failed", self.output("node-a"))

    def test_torch_workers_train_in_a_job_with_a_token(self):
        if not torch_available(ARGS.python):
            self.skipTest(f"{ARGS.python} has no torch")
        env = dict(os.environ, PYTHON_EXEC=ARGS.python)
        procs = []
        for rank, host in enumerate(["node-a", "node-b"]):
            argv = [ARGS.launcher, "--nnodes", "2", "--node-rank", str(rank), "--master-addr",
                    "node-a", "--master-port", PORT, "--token-file", self.token,
                    "--nproc-per-node", "1", TORCH_EXAMPLE]
            procs.append(self.start(host, host, argv, env))
        codes = [p.wait(timeout=JOB_TIMEOUT_S) for p in procs]
        outputs = [self.output(h) for h in ["node-a", "node-b"]]
        self.assertEqual(codes, [0, 0], "\n".join(outputs))
        with_token = set(re.findall(r"weights in sync sha256 ([0-9a-f]{64})", "".join(outputs)))
        alone = self.start("node-c", "alone", [ARGS.launcher, "--nproc-per-node", "2",
                                               "--generate-token", TORCH_EXAMPLE], env)
        self.assertEqual(alone.wait(timeout=JOB_TIMEOUT_S), 0, self.output("alone"))
        one_host = set(re.findall(r"weights in sync sha256 ([0-9a-f]{64})", self.output("alone")))
        self.assertEqual(len(with_token), 1, "\n".join(outputs))
        self.assertEqual(with_token, one_host)

    def test_torch_workers_train_with_etcd_and_a_token(self):
        if not torch_available(ARGS.python):
            self.skipTest(f"{ARGS.python} has no torch")
        if not os.access(ETCD, os.X_OK):
            self.skipTest("no etcd (Debian's etcd-server)")
        client_url = f"http://node-c:{ETCD_PORT}"
        etcd = self.start("node-c", "etcd", [
            ETCD, "--name=c", f"--data-dir={self.path('etcd')}",
            f"--listen-client-urls=http://0.0.0.0:{ETCD_PORT}",
            f"--advertise-client-urls={client_url}", "--listen-peer-urls=http://127.0.0.1:2380",
            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster=c=http://127.0.0.1:2380", "--listen-metrics-urls=http://127.0.0.1:2381",
            "--logger=zap"])
        env = dict(os.environ, PYTHON_EXEC=ARGS.python)
        procs = []
        for host in ["node-a", "node-b"]:
            argv = [ARGS.launcher, "--nnodes", "2", "--rdzv-backend", "etcd-v3", "--rdzv-endpoint",
                    f"node-c:{ETCD_PORT}", "--rdzv-id", "etcd-job", "--token-file", self.token,
                    "--nproc-per-node", "1", TORCH_EXAMPLE]
            procs.append(self.start(host, host, argv, env))
        codes = [p.wait(timeout=JOB_TIMEOUT_S) for p in procs]
        outputs = [self.output(h) for h in ["node-a", "node-b"]]
        etcd.kill()
        etcd.wait()
        self.assertEqual(codes, [0, 0], "\n".join(outputs))
        self.assertEqual(len(set(re.findall(r"weights in sync sha256 ([0-9a-f]{64})",
                                            "".join(outputs)))), 1, "\n".join(outputs))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--launcher", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--ddp-train", required=True)
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("--named-hosts", required=True)
    ARGS, rest = parser.parse_known_args()
    for name in ("launcher", "worker", "ddp_train"):
        setattr(ARGS, name, os.path.abspath(getattr(ARGS, name)))
    why = unavailable(ARGS.named_hosts)
    if why:
        print(f"skipping: {why}", file=sys.stderr)
        sys.exit(SKIP)
    unittest.main(argv=[sys.argv[0], *rest])
