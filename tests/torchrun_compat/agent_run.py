#!/usr/bin/env python3
"""PyTorch's own elastic agent tests (test/distributed/elastic/agent/server/test/
local_elastic_agent_test.py, pinned in upstream.json), run against dist-launch's agent, with
torch 2.x workers, or against torch's LocalElasticAgent through the same harness.

    agent_run.py --agent build/bin/dist-launch --python PY [--upstream DIR] [--json FILE]
    agent_run.py --agent torch --python PY     # torch's LocalElasticAgent, the reference

PY must have torch 2.x, expecttest and pytest. The upstream file comes from --upstream or
DIST_TORCHRUN_COMPAT_UPSTREAM, as fetch_upstream.py lays it out. A copy is adapted where the test
creates its agent, its rendezvous and its etcd server (each changed line marked "# dist-launch
compat:"; agent_shim.py stands in for them) and run by agent_main.py. Exits 77 (skipped, with the
reason) when PY, its packages or the files are missing.
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile

from run_compat import Suite, adapt, ready

HERE = os.path.dirname(os.path.abspath(__file__))
TEST_DIR = os.path.join("test", "distributed", "elastic", "agent", "server", "test")
TEST_FILE = "local_elastic_agent_test.py"
# The whole suite, bounded below ctest's TIMEOUT so that what it leaves is reaped here.
SUITE_TIMEOUT_S = 1500
AGENT = "the agent under test (agent_shim.py)"
# Where the test creates its agent and what stands in; the counts are those of the pinned file,
# so that an upstream change is noticed, not half-adapted.
SUITE = Suite("local_elastic_agent_test", [], [
    ("cls._etcd_server = EtcdServer()", "cls._etcd_server = agent_shim.RendezvousServer()", 1,
     "no etcd v2 server (the etcd tests are skipped); dist-launch's c10d store (agent_shim.py)"),
    ('self._endpoint = f"localhost:{acquire_available_port()}"',
     "self._endpoint = self._etcd_server.c10d_endpoint(acquire_available_port)", 1,
     "the c10d endpoint: upstream's for torch's agent, the store's for dist-launch "
     "(agent_shim.py)"),
    ("rdzv_handler = rdzv_registry.get_rendezvous_handler(rdzv_params)",
     "rdzv_handler = agent_shim.get_rendezvous_handler(rdzv_params)", 1,
     "dist-launch runs its own rendezvous (agent_shim.py)"),
    ("return LocalElasticAgent(", "return agent_shim.LocalElasticAgent(", 1, AGENT),
    ("logs_specs=DefaultLogsSpecs(", "logs_specs=agent_shim.DefaultLogsSpecs(", 1,
     "the log directory and streams, as dist-launch's flags (agent_shim.py)"),
], [("import torch.distributed.rpc as rpc\n", "import agent_shim", AGENT)])


def run_bounded(command, env):
    """Runs the suite in a session of its own, killed whole past SUITE_TIMEOUT_S or when this
    process is stopped (SIGTERM, Ctrl-C): dist-launch stops its workers when its parent dies."""
    proc = subprocess.Popen(command, env=env, start_new_session=True)
    previous = signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))
    try:
        return proc.wait(SUITE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        print(f"agent_compat: the suite ran past {SUITE_TIMEOUT_S} s; killing it", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", required=True, help="dist-launch's path, or torch")
    parser.add_argument("--python", required=True, help="an interpreter with torch 2.x")
    parser.add_argument("--upstream", default=os.environ.get("DIST_TORCHRUN_COMPAT_UPSTREAM"))
    parser.add_argument("--json", help="each test's outcome, as JSON")
    parser.add_argument("tests", nargs="*", help="only these tests (names), for debugging")
    args = parser.parse_args()

    if not ready(args.python, args.upstream, "agent_compat"):
        return 1
    agent = args.agent if args.agent == "torch" else os.path.abspath(args.agent)

    work = tempfile.mkdtemp(prefix="agent-compat-")
    try:
        with open(os.path.join(args.upstream, TEST_DIR, TEST_FILE)) as f:
            adapted = adapt(f.read(), SUITE)
        with open(os.path.join(work, TEST_FILE), "w") as f:
            f.write(adapted)
        env = dict(os.environ, DIST_AGENT_COMPAT_AGENT=agent)
        command = [args.python, os.path.join(HERE, "agent_main.py")]
        if args.json:
            command += ["--json", args.json]
        return run_bounded(command + [work] + args.tests, env)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
