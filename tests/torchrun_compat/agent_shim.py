"""The elastic agent under test, where PyTorch's local_elastic_agent_test.py builds one in its own
process (agent_run.py adapts those lines to call this module): the same arguments, and the agent
is either torch's own LocalElasticAgent (DIST_AGENT_COMPAT_AGENT=torch, the reference) or
dist-launch run as a program through its Python API (DIST_AGENT_COMPAT_AGENT=<dist-launch's path>).

For dist-launch, an agent is one dist-launch process (one node of the job) on a c10d rendezvous
whose store is a standalone dist-rendezvous (RendezvousServer): several agents of a job, each in
its own process, meet there with the test's run id. Its run() returns torch's RunResult: the
return values by global rank, or the failures (torch's ProcessFailure, read from the error files
dist-launch keeps in the log directory), so that upstream's run_agent raises torch's
ChildFailedError and its @record copies the root cause's error file, as with torch's agent.
"""
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Union

AGENT_ENV = "DIST_AGENT_COMPAT_AGENT"
TORCH = "torch"
# The longest a rendezvous round may wait for the job's agents (dist-launch's --rdzv-conf
# join_timeout): an agent that never finds its peers fails instead of hanging the suite.
JOIN_TIMEOUT_S = 120
_ATTEMPT_DIR = re.compile(r"^attempt_(\d+)$")


def agent_under_test() -> str:
    return os.environ.get(AGENT_ENV, TORCH)


def _dist_launch_api():
    """dist-launch's Python API, from the checkout that holds dist-launch's build (the programs
    are in build/bin, the package in python/)."""
    import sys

    launcher = os.path.abspath(agent_under_test())
    bin_dir = os.path.dirname(launcher)
    source = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    package_dir = os.path.join(source, "python")
    if package_dir not in sys.path:
        sys.path.insert(0, package_dir)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    import dist_launch

    return dist_launch


class RendezvousServer:
    """The c10d store of dist-launch's agents, which are all its clients, where upstream starts
    its etcd server: one dist-rendezvous for every test of the class, each job with its own run
    id (each round's workers get a store of their own, hosted by its node rank 0). torch's agent
    hosts its own store (upstream's is_host): for it, nothing is started."""

    def __init__(self):
        self._store = None

    def start(self) -> None:
        if agent_under_test() != TORCH:
            _dist_launch_api()  # dist-rendezvous is found next to dist-launch, on PATH
            from compat_api import RendezvousServer as DistRendezvous

            self._store = DistRendezvous()
            self._store.start()

    def stop(self) -> None:
        if self._store is not None:
            self._store.stop()
            self._store = None

    def c10d_endpoint(self, acquire_available_port: Callable[[], int]) -> str:
        """A test's c10d endpoint: upstream's (a port probed free, which torch's agent then
        binds) for torch's agent; the shared dist-rendezvous for dist-launch."""
        if agent_under_test() == TORCH:
            return f"localhost:{acquire_available_port()}"
        return self._store.get_endpoint()


@dataclass
class _RendezvousHandler:
    """What dist-launch needs of upstream's RendezvousParameters: dist-launch runs the
    rendezvous itself, and each dist-launch leaves it when it ends (nothing to shut down)."""

    backend: str
    endpoint: str
    run_id: str
    min_nodes: int
    max_nodes: int

    def shutdown(self) -> bool:
        return True


def get_rendezvous_handler(params):
    if agent_under_test() == TORCH:
        import torch.distributed.elastic.rendezvous.registry as rdzv_registry

        return rdzv_registry.get_rendezvous_handler(params)
    if params.backend != "c10d":
        raise ValueError(f"dist-launch compat: backend {params.backend}: only c10d is run here")
    return _RendezvousHandler(params.backend, params.endpoint, params.run_id, params.min_nodes,
                              params.max_nodes)


@dataclass
class _LogsSpecs:
    log_dir: str
    redirects: Any
    tee: Any


def DefaultLogsSpecs(log_dir: str, redirects, tee):  # noqa: N802 (torch's name)
    if agent_under_test() == TORCH:
        from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs as torch_specs

        return torch_specs(log_dir=log_dir, redirects=redirects, tee=tee)
    return _LogsSpecs(log_dir, redirects, tee)


def LocalElasticAgent(spec, start_method: str = "spawn",  # noqa: N802 (torch's name)
                      exit_barrier_timeout: float = 300, logs_specs=None,
                      log_line_prefix_template: Optional[str] = None):
    if agent_under_test() == TORCH:
        from torch.distributed.elastic.agent.server.local_elastic_agent import (
            LocalElasticAgent as torch_agent,
        )

        return torch_agent(spec, start_method=start_method,
                           exit_barrier_timeout=exit_barrier_timeout, logs_specs=logs_specs,
                           log_line_prefix_template=log_line_prefix_template)
    return DistLaunchAgent(spec, start_method, exit_barrier_timeout, logs_specs,
                           log_line_prefix_template)


def _streams(value: Union[int, Dict[int, int]]):
    if isinstance(value, dict):
        return {rank: int(v) for rank, v in value.items()}
    return int(value)


class _WorkerGroup:
    def __init__(self, state):
        self.state = state


class DistLaunchAgent:
    """One node of the job: dist-launch with the spec's function as its workers' entrypoint.

    After run(), `_remaining_restarts` and `_total_execution_time` (the two attributes upstream
    reads after a run) and get_worker_group().state hold what was observed from outside: the
    restarts the attempt_<n> log directories show, the run's wall time, and its outcome."""

    def __init__(self, spec, start_method, exit_barrier_timeout, logs_specs,
                 log_line_prefix_template):
        self._spec = spec
        self._start_method = start_method
        self._exit_barrier_timeout = exit_barrier_timeout
        self._logs_specs = logs_specs
        self._log_line_prefix_template = log_line_prefix_template
        self._remaining_restarts = spec.max_restarts
        self._total_execution_time = 0
        self._worker_group = None

    def get_worker_group(self, role: str = "default"):
        return self._worker_group

    def _config(self, dist_launch):
        spec, rdzv = self._spec, self._spec.rdzv_handler
        extra = ["--exit-barrier-timeout", str(self._exit_barrier_timeout)]
        if self._log_line_prefix_template is not None:
            extra += ["--log-line-prefix-template", self._log_line_prefix_template]
        if spec.master_addr is not None:
            extra += ["--master-addr", str(spec.master_addr)]
        if spec.master_port is not None:
            extra += ["--master-port", str(spec.master_port)]
        return dist_launch.LaunchConfig(
            min_nodes=rdzv.min_nodes, max_nodes=rdzv.max_nodes,
            nproc_per_node=spec.local_world_size, run_id=rdzv.run_id, role=spec.role,
            rdzv_backend="c10d", rdzv_endpoint=rdzv.endpoint,
            rdzv_configs={"is_host": False, "join_timeout": JOIN_TIMEOUT_S},
            max_restarts=spec.max_restarts, monitor_interval=spec.monitor_interval,
            start_method=self._start_method, log_dir=self._logs_specs.log_dir,
            redirects=_streams(self._logs_specs.redirects), tee=_streams(self._logs_specs.tee),
            extra_args=extra)

    def _restarts_seen(self) -> int:
        """The last attempt's number: dist-launch writes each attempt's logs and error files to
        LOG_DIR/<run>/<node>/attempt_<n> (torchrun's layout)."""
        attempts = [int(m.group(1)) for _, dirs, _ in os.walk(self._logs_specs.log_dir)
                    for name in dirs if (m := _ATTEMPT_DIR.match(name))]
        return max(attempts, default=0)

    def run(self, role: str = "default"):
        from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
        from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

        dist_launch = _dist_launch_api()
        entrypoint = self._spec.entrypoint
        started = time.monotonic()
        try:
            values = dist_launch.launch(self._config(dist_launch), entrypoint, *self._spec.args)
            result = RunResult(state=WorkerState.SUCCEEDED, return_values=values)
        except dist_launch.ChildFailedError as e:
            failures = {rank: ProcessFailure(local_rank=f.local_rank, pid=f.pid,
                                             exitcode=f.exitcode, error_file=f.error_file)
                        for rank, f in e.failures.items()}
            result = RunResult(state=WorkerState.FAILED, failures=failures)
        finally:
            self._total_execution_time = time.monotonic() - started
            self._remaining_restarts = self._spec.max_restarts - self._restarts_seen()
        self._worker_group = _WorkerGroup(result.state)
        return result
