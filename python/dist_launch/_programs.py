"""Where pip put dist-launch's programs: the environment's bin/, found through the installed
distribution's file list, so that a --user or --prefix install works as well as a venv."""
from __future__ import annotations

import os
import re
import shutil
import sys
from importlib import metadata

DISTRIBUTION = "dist-launch"
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _installed(name: str) -> str | None:
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    for f in dist.files or []:
        if f.name == name and f.parent.name == "bin":
            path = os.path.abspath(str(dist.locate_file(f)))
            if os.access(path, os.X_OK):
                return path
    return None


def program(name: str) -> str:
    """Absolute path of `name` (dist-launch or dist-rendezvous) as installed with this package;
    outside an installed package (a source checkout on PYTHONPATH), the one on PATH."""
    found = _installed(name) or shutil.which(name)
    if found:
        return found
    raise FileNotFoundError(
        f"{name} not found: `pip install .` in the repository installs it next to the Python it "
        f"runs with (here {sys.executable}); a developer build (scripts/build.sh) puts it in "
        f"build/bin, which then has to be on PATH")


def version() -> str:
    """This package's version: its installed distribution's (pip's metadata, which pyproject.toml
    reads from CMakeLists.txt's project VERSION, as the programs' --version does); in a source
    checkout, CMakeLists.txt's own; "unknown" elsewhere."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
        if os.path.realpath(str(dist.locate_file("dist_launch"))) == os.path.realpath(_PACKAGE_DIR):
            return dist.version
    except metadata.PackageNotFoundError:
        pass
    try:
        with open(os.path.join(_PACKAGE_DIR, "..", "..", "CMakeLists.txt")) as f:
            found = re.search(r"project\(dist_launch VERSION ([0-9.]+)", f.read())
    except OSError:
        found = None
    return found.group(1) if found else "unknown"
