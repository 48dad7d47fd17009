"""dist-launch from Python: the `dist-launch` and `dist-rendezvous` programs pip put on PATH,
`python -m dist_launch ...`, and an API in the shape of torch.distributed's launcher:

    from dist_launch import LaunchConfig, launch
    results = launch(LaunchConfig(nproc_per_node=2, max_restarts=1), "train.py", "--lr", "0.1")
    # {0: 0, 1: 0}: exit codes by global rank; a failed job raises ChildFailedError

and `dist_launch.run(argv)`, as `torch.distributed.run.main(argv)`. `dist_launch.__version__` is the
package's, which `dist-launch --version` and `python -m dist_launch --version` print too.
"""
from ._programs import program
from .api import LaunchConfig, elastic_launch, launch, run
from .errors import (ChildFailedError, LaunchError, ProcessFailure, SignalException,
                     UsageError)

__all__ = ["ChildFailedError", "LaunchConfig", "LaunchError", "ProcessFailure",
           "SignalException", "UsageError", "elastic_launch", "launch", "program", "run"]


def __getattr__(name):
    # __version__ is looked up when asked for: finding the distribution reads sys.path's metadata,
    # which every `import dist_launch` (a worker's too) need not pay for.
    if name == "__version__":
        from ._programs import version
        return version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
