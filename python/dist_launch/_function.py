"""A Python function as the workers' entrypoint, as torch's elastic_launch(config, fn)(*args)
takes one: each worker is a fresh interpreter started by dist-launch (torch's "spawn" start
method), which prepares itself from this process the way multiprocessing's spawn does (sys.path,
working directory, the __main__ module re-imported as __mp_main__), unpickles the function and
its arguments, calls it, and leaves its return value in the call's directory for launch() to
collect by global rank. The function must be picklable: defined at a module's top level.

A function that raises writes TORCHELASTIC_ERROR_FILE the way torch's @record does (unless it
wrote it itself) and exits 1, so that the failure report and ChildFailedError carry its message
and traceback."""
from __future__ import annotations

import glob
import multiprocessing.spawn
import os
import pickle
import re
from typing import Any, Callable, Dict, List, Sequence

CALL_FILE = "call.pickle"
PREPARING = "DIST_LAUNCH_PREPARING_WORKER"  # as _function_worker.py sets it
WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_function_worker.py")
# result_<TORCHELASTIC_RESTART_COUNT>_<RANK>.pickle, as _function_worker.py writes it
_RESULT = re.compile(r"^result_(\d+)_(\d+)\.pickle$")


def check_not_preparing() -> None:
    """Refuses a launch from a worker that is still importing the launching process's __main__,
    as multiprocessing refuses to start a process then."""
    if os.environ.get(PREPARING):
        raise RuntimeError(
            "dist_launch: a launch was started while a launched function's worker was importing "
            "the main module; launch from under `if __name__ == \"__main__\":`, as with "
            "multiprocessing's spawn")


def prepare_call(directory: str, function: Callable, args: Sequence[Any]) -> List[str]:
    """Writes what the workers need into `directory` (this process's preparation data, then the
    function and its arguments); returns the script and arguments dist-launch is to run.
    Raises TypeError when the function or its arguments cannot be pickled."""
    preparation = multiprocessing.spawn.get_preparation_data("dist-launch-worker")
    preparation.pop("authkey", None)  # this process's secret: the workers never talk back to it
    try:
        call = pickle.dumps((function, tuple(args)))
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        name = getattr(function, "__qualname__", repr(function))
        raise TypeError(f"dist_launch cannot send {name} and its arguments to the workers "
                        f"(fresh processes): {e}; define the function at a module's top level "
                        f"and pass picklable arguments") from e
    with open(os.path.join(directory, CALL_FILE), "wb") as f:
        pickle.dump(preparation, f)
        f.write(call)
    return [WORKER_SCRIPT, directory]


def collect_results(directory: str) -> Dict[int, Any]:
    """{global rank: return value} of the workers of the last attempt that returned any."""
    by_attempt: Dict[int, Dict[int, str]] = {}
    for path in glob.glob(os.path.join(directory, "result_*.pickle")):
        m = _RESULT.match(os.path.basename(path))
        if m:
            by_attempt.setdefault(int(m.group(1)), {})[int(m.group(2))] = path
    if not by_attempt:
        return {}
    results = {}
    for rank, path in sorted(by_attempt[max(by_attempt)].items()):
        with open(path, "rb") as f:
            results[rank] = pickle.load(f)
    return results
