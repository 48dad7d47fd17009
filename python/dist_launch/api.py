"""The Python API, in the shape of torch.distributed's launcher: `launch(config, entrypoint, *args)`
(and `elastic_launch(config, entrypoint)(*args)`) runs this node's part of a job with dist-launch
and returns per-rank results or raises with the failure report; `run(argv)` is
`torch.distributed.run.main(argv)` for dist-launch's command line."""
from __future__ import annotations

import os
import signal
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from ._function import check_not_preparing, collect_results, prepare_call
from ._runner import Outcome, run_dist_launch
from .errors import ChildFailedError, LaunchError, SignalException, UsageError

EXIT_USAGE = 2  # dist-launch's exit code for a refused command line

# 0 none, 1 stdout, 2 stderr, 3 both (torch's Std), or one such value per local rank.
Streams = Union[int, str, Mapping[int, int]]


@dataclass
class LaunchConfig:
    """torch.distributed.launcher.api.LaunchConfig's fields that dist-launch implements, with
    torchrun's command-line defaults (torch's dataclass has max_restarts=3, role="default_role"
    and rdzv_backend="etcd", which dist-launch refuses: etcd-v3 is its etcd backend).

    As torchrun does, a static job takes the store's address from rdzv_endpoint (HOST:PORT) and
    this node's rank from rdzv_configs["rank"]. nproc_per_node may be an integer or "gpu", "cpu",
    "auto". `python` runs scripts and modules (default: PYTHON_EXEC, else this interpreter, as
    torchrun runs sys.executable); `extra_args` are further dist-launch options, given as is.

    dist-launch's own: warm_restart (--warm-restart: Python workers forked from a zygote that
    imported `preload`'s modules once, default torch and numpy), snapshot_memory and
    snapshot_dir (--snapshot-memory "8G", --snapshot-dir: dist_launch.snapshot's store).

    torch's other fields are taken too, so that its callers' code runs unchanged: logs_specs (a
    DefaultLogsSpecs: its log directory, redirects, tee and local ranks' filter, where the fields
    above leave them), log_line_prefix_template, duplicate_stdout_filters and
    duplicate_stderr_filters (lists), event_log_handler, numa_options (its affinity_mode, as
    --numa-binding) and metrics_cfg (torch's metrics handler's settings: dist-launch has its own
    metrics, --metrics-port; ignored)."""

    min_nodes: int = 1
    max_nodes: int = 1
    nproc_per_node: Union[int, str] = 1
    run_id: str = ""
    role: str = "default"
    rdzv_endpoint: str = ""
    rdzv_backend: str = "static"
    rdzv_configs: Dict[str, Any] = field(default_factory=dict)
    rdzv_timeout: int = -1  # seconds; legacy, as torch's: rdzv_configs["timeout"]
    max_restarts: int = 0
    monitor_interval: float = 0.1
    start_method: str = "spawn"
    local_addr: Optional[str] = None
    signals_to_handle: str = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    shutdown_timeout: Optional[float] = None  # seconds; default TORCH_ELASTIC_SHUTDOWN_TIMEOUT, 30
    virtual_local_rank: bool = False
    log_dir: Optional[str] = None
    redirects: Streams = 0
    tee: Streams = 0
    local_ranks_filter: Optional[Sequence[int]] = None
    python: Optional[str] = None
    warm_restart: bool = False
    preload: Optional[Sequence[str]] = None
    snapshot_memory: Optional[str] = None
    snapshot_dir: Optional[str] = None
    extra_args: List[str] = field(default_factory=list)
    logs_specs: Optional[Any] = None
    log_line_prefix_template: Optional[str] = None
    duplicate_stdout_filters: Optional[Sequence[str]] = None
    duplicate_stderr_filters: Optional[Sequence[str]] = None
    event_log_handler: str = "null"
    numa_options: Optional[Any] = None
    metrics_cfg: Dict[str, str] = field(default_factory=dict)

    def to_args(self) -> List[str]:
        """The dist-launch options this configuration stands for."""
        if self.min_nodes < 1 or self.max_nodes < self.min_nodes:
            raise UsageError(f"LaunchConfig: min_nodes={self.min_nodes}, max_nodes="
                             f"{self.max_nodes}: need 1 <= min_nodes <= max_nodes", EXIT_USAGE)
        nnodes = (str(self.min_nodes) if self.min_nodes == self.max_nodes
                  else f"{self.min_nodes}:{self.max_nodes}")
        args = ["--nnodes", nnodes, "--nproc-per-node", str(self.nproc_per_node),
                "--rdzv-backend", self.rdzv_backend, "--role", self.role,
                "--max-restarts", str(self.max_restarts),
                "--monitor-interval", str(self.monitor_interval),
                "--start-method", self.start_method,
                "--signals-to-handle", self.signals_to_handle]
        log_dir, redirects, tee, local_ranks_filter = self._logs()
        args += ["--redirects", _streams(redirects), "--tee", _streams(tee)]
        conf = dict(self.rdzv_configs)
        node_rank = conf.pop("rank", None)  # torchrun passes --node-rank this way
        if node_rank is not None:
            args += ["--node-rank", str(node_rank)]
        if self.rdzv_timeout != -1:
            conf["timeout"] = self.rdzv_timeout
        if conf:
            args += ["--rdzv-conf", ",".join(f"{k}={_conf_value(v)}" for k, v in conf.items())]
        if self.run_id:
            args += ["--rdzv-id", self.run_id]
        if self.rdzv_endpoint:
            args += ["--rdzv-endpoint", self.rdzv_endpoint]
        if self.local_addr:
            args += ["--local-addr", self.local_addr]
        shutdown_timeout = self.shutdown_timeout
        if shutdown_timeout is None:
            shutdown_timeout = float(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30"))
        args += ["--shutdown-timeout", str(shutdown_timeout)]
        if self.virtual_local_rank:
            args.append("--virtual-local-rank")
        if log_dir:
            args += ["--log-dir", str(log_dir)]
        if local_ranks_filter is not None:
            args += ["--local-ranks-filter", ",".join(str(r) for r in sorted(local_ranks_filter))]
        if self.log_line_prefix_template is not None:
            args += ["--log-line-prefix-template", self.log_line_prefix_template]
        for flag, filters in (("--duplicate-stdout-filters", self.duplicate_stdout_filters),
                              ("--duplicate-stderr-filters", self.duplicate_stderr_filters)):
            if filters:  # (a comma inside a filter is written twice)
                args += [flag, ",".join(f.replace(",", ",,") for f in filters)]
        if self.event_log_handler != "null":
            args += ["--event-log-handler", self.event_log_handler]
        if self.numa_options is not None:
            mode = getattr(self.numa_options, "affinity_mode", None)
            if mode is None:
                raise UsageError(f"LaunchConfig: numa_options of type "
                                 f"{type(self.numa_options).__qualname__} has no affinity_mode "
                                 f"(dist-launch takes torch's NumaOptions)", EXIT_USAGE)
            args += ["--numa-binding", str(getattr(mode, "value", mode))]
        if self.warm_restart:
            args.append("--warm-restart")
        if self.preload is not None:
            args += ["--preload", ",".join(self.preload)]
        if self.snapshot_memory is not None:
            args += ["--snapshot-memory", str(self.snapshot_memory)]
        if self.snapshot_dir is not None:
            args += ["--snapshot-dir", str(self.snapshot_dir)]
        return args + [str(a) for a in self.extra_args]

    def _logs(self):
        """log_dir, redirects, tee and local_ranks_filter: these fields', or, where they are left
        at their defaults, a torch DefaultLogsSpecs' given as logs_specs."""
        log_dir, redirects, tee = self.log_dir, self.redirects, self.tee
        local_ranks_filter = self.local_ranks_filter
        specs = self.logs_specs
        if specs is None:
            return log_dir, redirects, tee, local_ranks_filter
        if not hasattr(specs, "_root_log_dir"):
            raise UsageError(f"LaunchConfig: logs_specs of type {type(specs).__qualname__}: "
                             f"dist-launch takes torch's DefaultLogsSpecs (a log directory, "
                             f"redirects, tee and a local ranks' filter), or the fields log_dir, "
                             f"redirects, tee and local_ranks_filter", EXIT_USAGE)
        if not log_dir:
            log_dir = specs._root_log_dir
        if not redirects:
            redirects = getattr(specs, "_redirects", 0)
        if not tee:
            tee = getattr(specs, "_tee", 0)
        if local_ranks_filter is None:
            local_ranks_filter = getattr(specs, "_local_ranks_filter", None)
        return log_dir, redirects, tee, local_ranks_filter


def _streams(value: Streams) -> str:
    if isinstance(value, Mapping):
        return ",".join(f"{rank}:{int(v)}" for rank, v in value.items())
    return str(int(value)) if not isinstance(value, str) else value


def _conf_value(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _environment(python: Optional[str]) -> Dict[str, str]:
    env = dict(os.environ)
    if python:
        env["PYTHON_EXEC"] = python
    elif not env.get("PYTHON_EXEC") and sys.executable:
        env["PYTHON_EXEC"] = sys.executable
    return env


def _stop_signals(names: str) -> List[int]:
    found = []
    for name in names.split(","):
        name = name.strip().upper()
        sig = getattr(signal, name if name.startswith("SIG") else "SIG" + name, None)
        # SIGUSR1/2 only pass through to the workers, which keep running: not ours to catch.
        if isinstance(sig, signal.Signals) and sig not in (signal.SIGUSR1, signal.SIGUSR2):
            found.append(sig)
    return found


def _raise_for(outcome: Outcome, name: str, report_name: Optional[str] = None) -> None:
    """Raises what the outcome means; `report_name` names a ChildFailedError instead of the
    report's title (a function's name rather than the script that runs it)."""
    code = outcome.exit_code
    if code == 0:
        return
    errors = "; ".join(outcome.errors)
    if outcome.forwarded_signal is not None:  # the workers' failures follow from it
        sig = signal.Signals(outcome.forwarded_signal).name
        raise SignalException(f"{name} stopped by {sig}" + (f": {errors}" if errors else ""),
                              code, outcome.forwarded_signal)
    if outcome.report is not None:
        report = outcome.report
        failures = {f.rank: f for f in report.failures}
        raise ChildFailedError.of(report_name or report.name, failures, report.root.rank,
                                  report.text, code)
    if code == EXIT_USAGE:
        raise UsageError(errors or "dist-launch refused its command line", code)
    if code < 0:
        raise LaunchError(f"dist-launch ended by signal {-code}", code)
    raise LaunchError(errors or f"dist-launch exited with {code}", code)


def launch(config: LaunchConfig, entrypoint: Union[str, Callable[..., Any]], *args: Any,
           module: bool = False) -> Dict[int, Any]:
    """Runs this node's workers: `entrypoint` is a Python script (*.py), a module with
    module=True (python -m), any other program (a C++ worker, or sys.executable with "-u",
    "train.py" as torch's callers pass it), or a Python function, with `args` after it.

    Returns {global rank: result} for this node's workers of the last round, as torch's
    elastic_launch does: a function's return value, or for a program its exit code, 0 (torch
    gives None there). A program's ranks are the agent's "round N: ... global ranks A..B" line;
    when LOGLEVEL hides it, they are computed for a static job and left out ({}) for an elastic
    one. A function's workers are fresh interpreters (torch's "spawn"): it must be defined at a
    module's top level, and it and its arguments picklable (_function.py).

    Raises ChildFailedError (failures by global rank, root cause, the report) when workers
    failed, UsageError when the configuration is refused, SignalException when a signal this
    process received stopped the job, LaunchError otherwise."""
    check_not_preparing()
    if not isinstance(config, LaunchConfig):
        raise TypeError(f"config is a {type(config).__module__}.{type(config).__qualname__}: "
                        f"dist-launch takes dist_launch.LaunchConfig (the same fields as torch's)")
    if callable(entrypoint) and not isinstance(entrypoint, (str, os.PathLike)):
        return _launch_function(config, entrypoint, args)
    if not isinstance(entrypoint, (str, os.PathLike)):
        raise TypeError(f"entrypoint is of type {type(entrypoint).__qualname__}: dist-launch "
                        f"takes a script or program (a str or path) or a function at a "
                        f"module's top level")
    entry = os.fspath(entrypoint)
    args = [os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in args]
    if module:
        target = ["-m", entry]
    elif entry.endswith(".py"):
        target = [entry]
    else:
        target = ["--no-python", entry]
    # (After a `--`, which dist-launch drops: the arguments are the script's, whatever their
    # names, and not said as the launcher's options written after the script.)
    outcome = _run(config, target + (["--"] if args else []) + args, os.path.basename(entry))
    ranks = outcome.node_ranks
    if ranks is None:
        ranks = _static_ranks(config)
    return {rank: 0 for rank in (ranks or [])}


def _launch_function(config: LaunchConfig, function: Callable[..., Any],
                     args: Sequence[Any]) -> Dict[int, Any]:
    with tempfile.TemporaryDirectory(prefix="dist-launch-call-") as directory:
        target = prepare_call(directory, function, args)
        name = getattr(function, "__qualname__", "function")
        _run(config, target, name, report_name=name)
        return collect_results(directory)


def _run(config: LaunchConfig, target: List[str], name: str,
         report_name: Optional[str] = None) -> Outcome:
    env = _environment(config.python)
    if report_name:  # the report's title: the function, not the script that runs it
        env["DIST_LAUNCH_REPORT_TITLE"] = report_name
    outcome = run_dist_launch(config.to_args() + target, env,
                              _stop_signals(config.signals_to_handle))
    _raise_for(outcome, name, report_name)
    return outcome


def _static_ranks(config: LaunchConfig) -> Optional[range]:
    """A static job's ranks on this node, as dist-launch assigns them (contiguous per node, in
    node-rank order): known when nproc_per_node is a number."""
    if config.min_nodes != config.max_nodes or config.rdzv_backend != "static":
        return None
    try:
        nproc = int(config.nproc_per_node)
    except ValueError:
        return None
    node_rank = int(config.rdzv_configs.get("rank", 0))
    return range(node_rank * nproc, (node_rank + 1) * nproc)


class elastic_launch:  # noqa: N801 (torch's name)
    """torch.distributed.launcher.api.elastic_launch: elastic_launch(config, entrypoint)(*args)
    is launch(config, entrypoint, *args)."""

    def __init__(self, config: LaunchConfig, entrypoint: Union[str, Callable[..., Any]],
                 module: bool = False):
        self._config = config
        self._entrypoint = entrypoint
        self._module = module

    def __call__(self, *args: Any) -> Dict[int, Any]:
        return launch(self._config, self._entrypoint, *args, module=self._module)


def run(argv: Optional[Sequence[str]] = None) -> None:
    """torch.distributed.run.main(argv): dist-launch's command line (default sys.argv[1:]), Python
    workers on this interpreter unless PYTHON_EXEC says otherwise. Returns when the job
    succeeded; raises as launch() does otherwise."""
    if isinstance(argv, (str, bytes)):
        raise TypeError("run() takes the command line as a list of strings, as "
                        "torch.distributed.run.main does: run(['--nproc-per-node', '2', "
                        "'train.py']), not one string")
    argv = list(sys.argv[1:] if argv is None else argv)
    outcome = run_dist_launch(argv, _environment(None),
                              _stop_signals("SIGTERM,SIGINT,SIGHUP,SIGQUIT"))
    _raise_for(outcome, "dist-launch")
