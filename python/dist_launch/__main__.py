"""python -m dist_launch [options] SCRIPT [args...]: dist-launch itself (exec'd: its exit code, its
signals), with Python workers run by this interpreter unless PYTHON_EXEC names another, as
`python -m torch.distributed.run` runs them with its own."""
import os
import sys

from ._programs import program


def main() -> None:
    if sys.executable and not os.environ.get("PYTHON_EXEC"):
        os.environ["PYTHON_EXEC"] = sys.executable
    try:
        path = program("dist-launch")
    except FileNotFoundError as e:
        sys.exit(f"python -m dist_launch: {e}")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, [path, *sys.argv[1:]])


if __name__ == "__main__":
    main()
