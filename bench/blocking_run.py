"""Runs a command and times it to its exit, waiting in a blocking waitpid.

Not subprocess.run(..., timeout=T): with a timeout, Python waits by polling waitpid(WNOHANG)
between sleeps of 0.5, 1, 2, 4, 8 ... ms, so a process is seen to end only at the next poll: a
launch of 10 ms measures 15.5 ms, one of 5 ms 7.5 ms (every figure rounded up to that schedule).
Here the bound is SIGALRM's: the wait blocks, and a command past the timeout is killed.
"""
import signal
import subprocess
import time


class Timeout(Exception):
    pass


def _expired(signum, frame):
    raise Timeout()


def blocking_run(cmd, timeout, **popen_kwargs):
    """(seconds from just before the fork to the reap, exit code); raises Timeout (the command
    killed and reaped) past `timeout` seconds."""
    previous = signal.signal(signal.SIGALRM, _expired)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    proc = None
    try:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, **popen_kwargs)
        code = proc.wait()
        return time.perf_counter() - start, code
    except Timeout:
        if proc is not None:
            proc.kill()
            proc.wait()
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def wait_all(procs, timeout):
    """Blocking waits for every process of `procs` (started by the caller); their exit codes.
    Past `timeout` seconds, every one still running is killed and Timeout raised."""
    previous = signal.signal(signal.SIGALRM, _expired)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return [p.wait() for p in procs]
    except Timeout:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
