"""Runs a command and times it to its exit, waiting in a blocking waitpid.

Not subprocess.run(..., timeout=T): with a timeout, Python waits by polling waitpid(WNOHANG)
between sleeps of 0.5, 1, 2, 4, 8 ... ms, so a process is seen to end only at the next poll: a
launch of 10 ms measures 15.5 ms, one of 5 ms 7.5 ms (every figure rounded up to that schedule).
Here the bound is SIGALRM's: the wait blocks, and a command past the timeout is killed.
"""
import contextlib
import signal
import subprocess
import time


class Timeout(Exception):
    pass


def _expired(signum, frame):
    raise Timeout()


@contextlib.contextmanager
def _deadline(timeout, procs):
    """Raises Timeout in the block past `timeout` seconds, once every process of `procs` (a list
    the block may still fill) that still runs is killed and reaped."""
    previous = signal.signal(signal.SIGALRM, _expired)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        yield
    except Timeout:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def blocking_run(cmd, timeout, **popen_kwargs):
    """(seconds from just before the fork to the reap, exit code); raises Timeout (the command
    killed and reaped) past `timeout` seconds."""
    procs = []
    with _deadline(timeout, procs):
        start = time.perf_counter()
        procs.append(subprocess.Popen(cmd, **popen_kwargs))
        code = procs[0].wait()
        return time.perf_counter() - start, code


def wait_all(procs, timeout):
    """Blocking waits for every process of `procs` (started by the caller); their exit codes.
    Past `timeout` seconds, every one still running is killed and Timeout raised."""
    with _deadline(timeout, procs):
        return [p.wait() for p in procs]
