"""Prints, as one JSON line, what a Python worker sees of itself at its first line: what
tests/warm compares between a cold worker (python -u probe.py) and a warm one (forked from the
zygote), which must not differ. Run as a script or with -m probe."""
import ctypes
import json
import os
import random
import signal
import subprocess
import sys

PR_GET_PDEATHSIG = 2


def descriptors():
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            os.fstat(int(name))
        except OSError:
            continue  # the listing's own
        found.append(int(name))
    return sorted(found)


def pdeathsig():
    value = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(PR_GET_PDEATHSIG, ctypes.byref(value), 0, 0, 0)
    return value.value


def main():
    me = sys.modules["__main__"]
    threads = len(os.listdir("/proc/self/task"))
    umask = os.umask(0)
    os.umask(umask)
    child_env = subprocess.run(["env", "-0"], capture_output=True, check=True).stdout
    state = {
        "argv": sys.argv,
        "orig_argv": getattr(sys, "orig_argv", None),
        "path": sys.path,
        "executable": sys.executable,
        "prefix": sys.prefix,
        "flags": str(sys.flags),
        "main": sorted(vars(me)),
        "name": __name__,
        "file": vars(me).get("__file__"),
        "spec": None if me.__spec__ is None else me.__spec__.name,
        "loader": type(me.__loader__).__name__,
        "package": me.__package__,
        "cached": vars(me).get("__cached__"),
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "child_env": dict(e.split("=", 1) for e in child_env.decode().split("\0") if "=" in e),
        "signals": {n: str(signal.getsignal(n)) for n in range(1, signal.NSIG)
                    if n not in (signal.SIGKILL, signal.SIGSTOP, 32, 33)},
        "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "pgid_is_pid": os.getpgid(0) == os.getpid(),
        "parent": os.path.basename(os.readlink(f"/proc/{os.getppid()}/exe")),
        "same_session_as_parent": os.getsid(0) == os.getsid(os.getppid()),
        "pdeathsig": pdeathsig(),
        "fds": descriptors(),
        "stdin": os.readlink("/proc/self/fd/0"),
        "stdin_object": [sys.stdin.name, sys.stdin.mode, sys.stdin.encoding, sys.stdin.errors,
                         sys.stdin.line_buffering, sys.stdin.write_through,
                         sys.stdin.buffer.seekable(), sys.stdin.isatty(),
                         sys.stdin is sys.__stdin__],
        "stdout": [sys.stdout.line_buffering, sys.stdout.write_through,
                   type(sys.stdout.buffer).__name__, sys.stdout.encoding],
        "threads": threads,
        "cmdline": [a.decode() for a in open("/proc/self/cmdline", "rb").read().split(b"\0")[:-1]],
        "umask": umask,
        "nice": os.nice(0),
        "scheduler": os.sched_getscheduler(0),
        "affinity": sorted(os.sched_getaffinity(0)),
        "random": random.random(),
    }
    import numpy  # noqa: E402 (after the thread count: OpenBLAS may start threads)
    state["numpy_random"] = int(numpy.random.randint(0, 1 << 30))
    torch = sys.modules.get("torch")
    state["torch_seed"] = torch.initial_seed() if torch is not None else None
    print("PROBE " + json.dumps(state), flush=True)


if __name__ == "__main__":
    main()
