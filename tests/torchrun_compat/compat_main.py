"""Runs the adapted upstream tests (run_compat.py prepares them) under the torch 2.x interpreter:
the tests of torchrun's Python internals skipped with the reason, a summary line at the end.

    python compat_main.py WORK_DIR MODULE [--json FILE]     # MODULE: test_run or api_test
"""
import argparse
import importlib
import json
import os
import sys
import unittest

# Upstream tests that do not apply to a launcher run as a program, and why. They pass or fail
# the same way whatever the launcher: they reach into torchrun's own process.
INTERNAL_CLI = {
    "test_min_max_nodes_parse":
        "calls torch.distributed.run.parse_min_max_nnodes, a function of torchrun's Python code",
    "test_launch_shutdown":
        "mocks torchrun's LocalElasticAgent and rendezvous handler inside torchrun's process",
    "test_launch_elastic_agent_raise_exception":
        "mocks LocalElasticAgent.run inside torchrun's process",
    "test_nproc_gpu_launch_configurations":
        "mocks torch.cuda and torch.accelerator device counts in the test's process, which a "
        "launcher run as a program does not see",
    "test_nproc_xpu_launch_configurations":
        "mocks torch.xpu and torch.accelerator device counts in the test's process, which a "
        "launcher run as a program does not see",
}
# Observed through the launcher's event log when it is dist-launch (the job_end event); torchrun
# records the event inside its own process, which a mock in the test's process cannot see.
TORCHRUN_EVENTS_IN_ITS_PROCESS = {
    "test_launch_elastic_worker_raise_exception":
        "asserts that torchrun's in-process torch.distributed.elastic.events.record was called, "
        "which a mock in the test's process cannot see when torchrun runs as a program",
}
# api_test.py's tests that mock torch's agent or call torch's private functions: they test
# torch's own Python code, which neither dist-launch's API nor a program has.
INTERNAL_API = {
    "test_launch_elastic_agent_raise_exception":
        "mocks LocalElasticAgent.run inside torch's launcher",
    "test_launch_shutdown":
        "mocks torch's LocalElasticAgent and rendezvous handler to see shutdown() called",
    "test_get_entrypoint_name":
        "calls torch.distributed.launcher.api._get_entrypoint_name, a private function",
    "test_rdzv_handler_shutdown_on_agent_signal":
        "calls torch's launch_agent with its agent and rendezvous handler mocked",
    "test_rdzv_handler_shutdown_on_agent_error":
        "calls torch's launch_agent with its agent and rendezvous handler mocked",
}
INTERNAL = {"test_run": INTERNAL_CLI, "api_test": INTERNAL_API}
# Applies only where the mock it relies on is also the truth.
ACCELERATOR_MOCKED_AWAY = {
    "test_nproc_launch_auto_configurations":
        "mocks torch.accelerator.is_available to False in the test's process; this machine has "
        "an accelerator, which the launcher (a program) counts",
}


class Tally(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outcomes = {}

    def addSuccess(self, test):
        super().addSuccess(test)
        self.outcomes[test.id()] = "passed"

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.outcomes[test.id()] = "failed"

    def addError(self, test, err):
        super().addError(test, err)
        self.outcomes[test.id()] = "failed"

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.outcomes[test.id()] = "skipped: " + reason


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("work_dir")
    parser.add_argument("module", choices=sorted(INTERNAL))
    parser.add_argument("--json", help="write each test's outcome there")
    args = parser.parse_args()
    test_dir = os.path.join(args.work_dir, "test", "distributed", "launcher")
    sys.path.insert(0, test_dir)
    tests = importlib.import_module(args.module)  # the adapted copy
    import torch

    launcher = os.environ.get("DIST_TORCHRUN_COMPAT_LAUNCHER", "torchrun")
    skips = dict(INTERNAL[args.module])
    if args.module == "test_run" and torch.accelerator.is_available():
        skips.update(ACCELERATOR_MOCKED_AWAY)
    if args.module == "test_run" and launcher == "torchrun":
        skips.update(TORCHRUN_EVENTS_IN_ITS_PROCESS)
    cls = tests.ElasticLaunchTest
    for name, reason in skips.items():
        setattr(cls, name, unittest.skip(reason)(getattr(cls, name)))

    suite = unittest.defaultTestLoader.loadTestsFromTestCase(cls)
    result = unittest.TextTestRunner(resultclass=Tally, verbosity=2).run(suite)
    counts = {k: sum(1 for v in result.outcomes.values() if v.split(":")[0] == k)
              for k in ("passed", "skipped", "failed")}
    print(f"torchrun_compat: {launcher}: {counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['skipped']} skipped of {len(result.outcomes)} upstream tests in "
          f"{args.module}.py (torch "
          f"{torch.__version__})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"launcher": launcher, "module": args.module, "torch": torch.__version__, "counts": counts,
                       "tests": result.outcomes}, f, indent=1)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
