"""The `dist_launch` package dist-launch puts on its Python workers' path (appended to PYTHONPATH,
in the agent's run directory: agent/src/health/python_hook.h), so that `from dist_launch import
snapshot, elastic, progress` works in an interpreter where dist_launch is not installed. Where it is
installed, the installed package is what gets imported: this module finds it further along
sys.path and makes way for it (keeping this directory on its __path__, for an installed version
without those modules).

The agent writes this file as dist_launch/__init__.py next to copies of snapshot.py, elastic.py and
progress.py.
"""
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.realpath(os.path.dirname(_HERE))


def _installed():
    rest = [p for p in sys.path if os.path.realpath(p or os.curdir) != _ROOT]
    return importlib.machinery.PathFinder.find_spec(__name__, rest)


_spec = _installed()
if _spec is not None and _spec.loader is not None and _spec.submodule_search_locations:
    _package = importlib.util.module_from_spec(_spec)
    _package.__path__.append(_HERE)
    sys.modules[__name__] = _package  # what `import dist_launch` returns from here on
    try:
        _spec.loader.exec_module(_package)
    except BaseException:
        sys.modules.pop(__name__, None)
        raise
else:
    __all__ = ["elastic", "progress", "snapshot"]
