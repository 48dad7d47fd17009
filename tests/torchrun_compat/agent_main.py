"""Runs the adapted elastic agent tests (agent_run.py prepares them) under the torch 2.x
interpreter: the etcd variants and the tests of torch's agent internals skipped with the reason,
a summary line at the end.

    python agent_main.py WORK_DIR [--json FILE] [TEST ...]
"""
import argparse
import functools
import json
import os
import sys
import unittest

from compat_main import Tally

ETCD = ("upstream's etcd v2 server; dist-launch's etcd backend is etcd-v3, tested in tests/etcd")
# Upstream tests that reach into torch's agent inside the test's process, and why. They pass or
# fail the same way whatever dist-launch does.
INTERNAL = {
    "test_barrier_failed_c10d":
        "mocks torch.distributed.elastic.utils.store.barrier, the exit barrier inside torch's "
        "agent process",
    "test_shutdown_called_c10d":
        "mocks torch's start_processes and LocalElasticAgent._monitor_workers inside the test's "
        "process and asserts the mocked process context was closed",
}

def own_environment(test):
    """Runs `test` with the environment it started with given back afterwards. Upstream's
    healthcheck and watchdog tests set TORCHELASTIC_HEALTH_CHECK_PORT=12345 and
    TORCHELASTIC_TIMER_FILE in os.environ and never unset them: every later test inherits them.
    torch's agent starts a no-op health check server (open-source torch has none), so the leak
    goes unseen there; dist-launch serves the health check, and the two agents of a later
    multi-agent test then contend for port 12345 on one host."""
    @functools.wraps(test)
    def isolated(*args, **kwargs):
        saved = dict(os.environ)
        try:
            return test(*args, **kwargs)
        finally:
            os.environ.clear()
            os.environ.update(saved)

    return isolated


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("work_dir")
    parser.add_argument("--json", help="write each test's outcome there")
    parser.add_argument("tests", nargs="*", help="only these tests")
    args = parser.parse_args()
    sys.path.insert(0, args.work_dir)
    sys.argv = sys.argv[:1]  # torch's common_utils parses the command line when imported
    import local_elastic_agent_test as upstream_test  # the adapted copy
    import torch
    from agent_shim import agent_under_test

    cls = upstream_test.LocalElasticAgentTest
    names = unittest.defaultTestLoader.getTestCaseNames(cls)
    skips = {name: ETCD for name in names if name.endswith(("_etcd", "_etcd_v2"))}
    skips.update(INTERNAL)
    for name in names:
        test = own_environment(getattr(cls, name))
        setattr(cls, name, unittest.skip(skips[name])(test) if name in skips else test)

    if args.tests:
        suite = unittest.TestSuite(cls(name) for name in args.tests)
    else:
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(cls)
    result = unittest.TextTestRunner(resultclass=Tally, verbosity=2).run(suite)
    counts = {k: sum(1 for v in result.outcomes.values() if v.split(":")[0] == k)
              for k in ("passed", "skipped", "failed")}
    agent = agent_under_test()
    print(f"agent_compat: {agent}: {counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['skipped']} skipped of {len(result.outcomes)} upstream tests (torch "
          f"{torch.__version__})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"agent": agent, "torch": torch.__version__, "counts": counts,
                       "tests": result.outcomes}, f, indent=1)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
