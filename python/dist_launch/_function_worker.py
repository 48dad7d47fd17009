"""One worker of a launched Python function (see _function.py): run by dist-launch as a script,
with the call's directory as its argument. Only the standard library is imported before the
launching process's sys.path is in place, and this script's own directory (the package's) is
taken off sys.path first, so nothing of the package shadows the user's modules."""
import os
import sys

if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

import json  # noqa: E402
import multiprocessing.spawn  # noqa: E402
import pickle  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

CALL_FILE = "call.pickle"
# Set while the launching process's __main__ is re-imported here: a launch from its top level
# (not under `if __name__ == "__main__":`) would otherwise launch again from every worker.
PREPARING = "DIST_LAUNCH_PREPARING_WORKER"


def write_error_file(message: str, callstack: str) -> None:
    """TORCHELASTIC_ERROR_FILE in torch's @record format, unless the function's own @record (or
    anything else) wrote it first (dist_launch.elastic writes a stuck rank's with it too)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):
        return
    data = {"message": {"message": message,
                        "extraInfo": {"py_callstack": callstack,
                                      "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError as e:
        print(f"dist-launch worker: cannot write the error file {path}: {e}", file=sys.stderr)


def load_call(directory: str):
    """This process prepared as the launching one was (sys.path, working directory, its __main__
    re-imported as __mp_main__), then the function and its arguments."""
    with open(os.path.join(directory, CALL_FILE), "rb") as f:
        os.environ[PREPARING] = "1"
        try:
            multiprocessing.spawn.prepare(pickle.load(f))
        finally:
            del os.environ[PREPARING]
        try:
            return pickle.load(f)
        except Exception as e:
            raise RuntimeError(
                f"cannot load the launched function here: {type(e).__name__}: {e} (it must be "
                f"importable in a fresh interpreter: defined at a module's top level, not under "
                f"`if __name__ == \"__main__\":`)") from e


def release_process_group() -> None:
    """The torch.distributed group the function left behind, destroyed before the interpreter
    exits (as torch asks of every program): left to the interpreter's teardown, gloo's threads
    can abort the exit ("terminate called without an active exception"), failing a worker that
    has already returned its value."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def main() -> int:
    directory = sys.argv[1]
    try:
        function, args = load_call(directory)
        try:
            result = function(*args)
        except SystemExit as e:
            if e.code not in (None, 0):
                raise
            result = None  # (a rank that exits 0 returned None, as under torch's elastic_launch)
        release_process_group()
    except SystemExit:
        raise
    except BaseException as e:  # noqa: B036 (KeyboardInterrupt too: the worker failed)
        write_error_file(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__,
                         traceback.format_exc())
        traceback.print_exc()
        return 1
    name = f"result_{os.environ['TORCHELASTIC_RESTART_COUNT']}_{os.environ['RANK']}.pickle"
    partial = os.path.join(directory, f".{name}.{os.getpid()}")
    try:
        with open(partial, "wb") as f:
            pickle.dump(result, f)
    except Exception as e:  # noqa: BLE001 (the report says why, not only the worker's stderr)
        write_error_file(f"the function's return value cannot be sent back: "
                         f"{type(e).__name__}: {e}", traceback.format_exc())
        traceback.print_exc()
        os.unlink(partial)
        return 1
    os.replace(partial, os.path.join(directory, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
