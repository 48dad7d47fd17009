"""dist-launch's zygote (--warm-restart): an interpreter that has imported the heavy modules once
and forks every Python worker of the job, so that a restarted worker trains again without paying
`import torch` (and the rest) a second time.

Started by the agent as `PYTHON -u _zygote.py --control-fd N ...` on the workers' own interpreter,
with their environment (the part every worker shares), in the workers' working directory; the agent
embeds this file in its binary (agent/src/warm/) and writes it next to its snapshots. Standard
library only. The protocol on the control socket (SOCK_SEQPACKET, one message each):

    zygote -> agent   b"ready " + JSON {preloaded, seconds, files}   or  b"failed " + reason
    agent -> zygote   a spawn request (see _parse_request), the worker's descriptors as SCM_RIGHTS
    zygote -> agent   b"pid N"   or  b"error " + reason
    zygote -> agent   b"standby N" (between requests): a worker forked ahead, see below

A worker is forked twice: the zygote forks an intermediate, which forks the worker and exits; the
worker takes a session (and process group) of its own, as a cold worker does, and reports its pid.
The agent is a child subreaper, so the worker is reparented to the agent and the agent waits for
it, sees its exit in SIGCHLD and stops its group, as for a worker it forked itself. Only then (the
zygote has reaped the intermediate) is the worker told to go on: it sets PR_SET_PDEATHSIG (set
earlier, it would fire when the intermediate exits) and checks that its parent is the agent. The
zygote forks such workers ahead ("standbys", as many as the node's workers, whenever no request
came for IDLE_SECONDS): the agent's children already, they wait for a request, so that the next
attempt's spawns are messages, not forks. Then it becomes what `python -u SCRIPT ARGS` would have
been at its first line: the agent's descriptors on 0/1/2 (and the watchdogs' at their numbers), no
other inherited descriptor, its working directory, exactly its environment (os.environ and the C
environ), the signal dispositions and mask of a fresh interpreter, sys.argv, sys.orig_argv,
sys.path[0], a fresh __main__, import caches invalidated, fresh random seeds; and it runs the
script from the zygote's outermost frame, so that it ends as an interpreter ends: atexit handlers,
non-daemon threads joined, SystemExit codes, an uncaught exception printed by sys.excepthook
(without the zygote's frames) and exit status 1, KeyboardInterrupt as SIGINT.

What cannot be made fresh: the string hash seed (PYTHONHASHSEED) is the zygote's, the same in every
worker and attempt; /proc/PID/environ shows the zygote's environment (the worker's own is what
os.environ, getenv() and its children see); objects of the preloaded modules are frozen (gc.freeze)
so that the workers share their memory pages.
"""
import io
import os
import sys

# This file's directory is not the workers' sys.path[0] (set below), and must not shadow anything.
# (Under -P / PYTHONSAFEPATH nothing was put there.)
if not sys.flags.safe_path and sys.path:
    del sys.path[0]

import ctypes  # noqa: E402
import gc  # noqa: E402
import importlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import linecache  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import struct  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402

# When the interpreter has them. torch._dynamo: torch 2.x's optimizers import it when the first
# one is made (over a second: sympy, triton...); it starts no thread and touches no CUDA.
DEFAULT_PRELOAD = ("torch", "torch._dynamo", "numpy")
REQUEST_MAGIC = b"DLZ1"
REQUEST_HEADER = struct.Struct("<4sIIII")  # magic, argc, envc, nfds, agent pid
MAX_REQUEST_BYTES = 1 << 22
MAX_FDS = 64
IDLE_SECONDS = 0.05  # no request for this long: standbys are forked
PR_SET_PDEATHSIG = 1
PR_SET_MM, PR_SET_MM_MAP = 35, 14


class Startup:
    """What a fresh interpreter looks like, recorded before anything here changes it."""

    def __init__(self):
        self.signals = {}
        for number in range(1, signal.NSIG):
            try:
                self.signals[number] = signal.getsignal(number)
            except (OSError, ValueError):
                continue
        self.mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _send(sock, message):
    sock.sendmsg([message])


def _stat_fields():
    """/proc/self/stat's fields from the state on (the command name may hold spaces)."""
    with open("/proc/self/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()


_ARG_AREA = None  # (start, end) of the argument area exec gave the zygote


class _MmMap(ctypes.Structure):
    """struct prctl_mm_map (linux/prctl.h)."""
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "start_code", "end_code", "start_data", "end_data", "start_brk", "brk", "start_stack",
        "arg_start", "arg_end", "env_start", "env_end")] + [
        ("auxv", ctypes.c_void_p), ("auxv_size", ctypes.c_uint32), ("exe_fd", ctypes.c_uint32)]


def set_command_line(args):
    """What ps, pgrep -f and /proc/PID/cmdline show: `args`, written over this process's own
    argument area (the agent gave the zygote's command line room for a worker's), truncated to
    it. argv[0] is the zygote's own, so glibc's program_invocation_name still reads right. The
    area's end then moves to the title's (PR_SET_MM_MAP, which needs no privilege when the
    executable stays), else /proc/PID/cmdline would show the rest of the room as empty
    arguments."""
    global _ARG_AREA
    try:
        fields = _stat_fields()
        if _ARG_AREA is None:  # the area as exec made it: later titles may take all of it again
            _ARG_AREA = (int(fields[45]), int(fields[46]))  # arg_start, arg_end (48 and 49)
    except (OSError, IndexError, ValueError):
        return
    start, end = _ARG_AREA
    size = end - start
    data = b"\0".join(os.fsencode(a) for a in args)[:max(0, size - 1)] + b"\0"
    ctypes.memmove(start, data.ljust(size, b"\0"), size)
    value = [int(fields[n - 3]) for n in (26, 27, 45, 46, 47)]  # code, data, start_brk
    mm = _MmMap(*value, 0, int(fields[28 - 3]), start, start + len(data), int(fields[50 - 3]),
                int(fields[51 - 3]), None, 0, 0xFFFFFFFF)
    libc = _libc()
    libc.sbrk.restype = ctypes.c_void_p
    mm.brk = libc.sbrk(0) or mm.start_brk
    libc.prctl(PR_SET_MM, PR_SET_MM_MAP, ctypes.byref(mm), ctypes.sizeof(mm), 0)


def _thread_count():
    return len(os.listdir("/proc/self/task"))


def _park_thread_pools():
    """Fork-aware libraries (OpenBLAS) stop their thread pools before a fork, and start them again
    on their next call: one throwaway fork parks them, so the zygote forks with one thread."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def preload(modules, default):
    """Imports the preload list; returns (imported names, their files for the staleness check)."""
    names = list(DEFAULT_PRELOAD) if default else [m for m in modules if m]
    imported = []
    for name in names:
        if default and not _installed(name):
            continue
        importlib.import_module(name)
        imported.append(name)
    files = [os.path.realpath(sys.executable)]
    for name in imported:
        path = getattr(sys.modules[name], "__file__", None)
        if path:
            files.append(path)
    return imported, files


def _installed(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a submodule of a package that is not there
        return False


def refuse_unsafe_state():
    """None, or why forking this interpreter would not give the workers a clean one."""
    if _thread_count() > 1:
        _park_thread_pools()
    threads = _thread_count()
    if threads > 1:
        return (f"the preloaded modules started {threads - 1} thread(s), which a fork would not "
                f"carry into the workers")
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        return "the preloaded modules initialised CUDA, which a forked worker cannot use"
    return None


def _parse_request(data):
    """DLZ1 | argc | envc | nfds | agent pid | argv NUL-terminated | env NUL-terminated |
    cwd NUL-terminated | nfds int32 target descriptor numbers."""
    magic, argc, envc, nfds, agent_pid = REQUEST_HEADER.unpack_from(data)
    if magic != REQUEST_MAGIC:
        raise ValueError("not a spawn request")
    strings = argc + envc + 1
    body = data[REQUEST_HEADER.size:]
    parts = body.split(b"\0", strings)
    if len(parts) != strings + 1:
        raise ValueError("truncated spawn request")
    targets = struct.unpack(f"<{nfds}i", parts[strings][:4 * nfds])
    return {"argv": parts[:argc], "env": parts[argc:argc + envc], "cwd": parts[argc + envc],
            "targets": targets, "agent_pid": agent_pid}


def _receive(sock):
    """(request, descriptors), or None at EOF (the agent is done, or gone)."""
    data, ancillary, flags, _ = sock.recvmsg(MAX_REQUEST_BYTES, socket.CMSG_SPACE(4 * MAX_FDS))
    fds = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(struct.unpack(f"<{len(payload) // 4}i", payload[:len(payload) // 4 * 4]))
    if not data:
        for fd in fds:
            os.close(fd)
        return None
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        raise ValueError("spawn request too large")
    return data, fds


def _read_exactly(fd, n):
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            break
        data += chunk
    return data


class Worker:
    """In a forked worker: what it must become, and the zygote's descriptors it must drop.
    go_fd: None for a standby, already the agent's child when it got its request."""

    def __init__(self, request, fds, go_fd, startup, sock):
        self.request = request
        self.fds = fds
        self.go_fd = go_fd
        self.startup = startup
        self.sock = sock


class Standby:
    """In the zygote: a worker forked ahead of its request (the agent's child already), waiting
    on `sock` for it."""

    def __init__(self, pid, sock):
        self.pid = pid
        self.sock = sock


def _fork_reparented(in_worker, own_group):
    """In the zygote: forks a process through an intermediate that exits, so that the agent (a
    child subreaper) becomes its parent; returns its pid once it is the agent's child. In that
    process, returns in_worker(go_fd): the zygote's loop unwinds there."""
    go_r, go_w = os.pipe()
    report_r, report_w = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    middle = os.fork()
    if middle == 0:  # the intermediate: it forks the process and exits, the process reports itself
        try:
            pid = os.fork()
        except BaseException:  # noqa: B036
            os._exit(1)
        if pid != 0:
            os._exit(0)
        try:
            os.close(go_w)
            os.close(report_r)
            if own_group:  # a session (and process group) of its own, as a cold worker's
                os.setsid()
            os.write(report_w, struct.pack("<i", os.getpid()))
            os.close(report_w)
        except BaseException:  # noqa: B036
            os._exit(1)
        return in_worker(go_r)
    os.close(go_r)
    os.close(report_w)
    try:
        data = _read_exactly(report_r, 4)
        os.close(report_r)
        os.waitpid(middle, 0)  # the worker is the agent's child from here on
        if len(data) != 4:
            raise OSError("the intermediate process failed before the worker started")
        os.write(go_w, b"g")
        return struct.unpack("<i", data)[0]
    finally:
        os.close(go_w)


def spawn(request, fds, startup, sock):
    """In the zygote: forks the worker (returns its pid). In the worker, returns a Worker: the
    zygote's loop unwinds and the worker runs from main()."""
    return _fork_reparented(lambda go: Worker(request, fds, go, startup, sock), own_group=True)


def fork_standby(startup, sock, standbys):
    """In the zygote: forks a standby worker, which waits, the agent's child already, for a
    request; returns a Standby. In the standby, once it got its request, returns its Worker."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)

    def in_standby(go_fd):
        ours.close()
        for other in standbys:  # theirs to the zygote only: their EOF tells them it is gone
            other.sock.close()
        return _stand_by(theirs, go_fd, startup, sock)

    result = _fork_reparented(in_standby, own_group=False)
    if isinstance(result, Worker):
        return result
    theirs.close()
    return Standby(result, ours)


def _stand_by(activation, go_fd, startup, sock):
    """In a standby: the agent's child (it dies with the agent), it waits for its request and
    descriptors, takes a session (and process group) of its own, and acknowledges; the zygote then
    tells the agent its pid. EOF: the zygote is gone (or retires it), and it exits."""
    _become_the_agents(_AGENT_PID, go_fd)
    set_command_line([_INTERPRETER_ARGS[0], "(dist-launch standby worker)"])
    try:
        received = _receive(activation)
        if received is None:
            os._exit(0)
        request = _parse_request(received[0])
        os.setsid()
        activation.sendmsg([b"ok"])
    except BaseException:  # noqa: B036: the zygote forks another way
        os._exit(1)
    activation.detach()  # among the descriptors every worker closes
    return Worker(request, received[1], None, startup, sock)


def activate(standbys, data, fds):
    """In the zygote: hands the request to a standby; its pid, or None when none took it."""
    while standbys:
        standby = standbys.pop(0)
        try:
            standby.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                           struct.pack(f"<{len(fds)}i", *fds))])
            ack = standby.sock.recv(16)
        except OSError:
            ack = b""
        standby.sock.close()
        if ack == b"ok":
            return standby.pid
    return None


def _readable(sock, seconds):
    import select
    return bool(select.select([sock], [], [], seconds)[0])


def serve(sock, startup, standby_count):
    """The zygote's loop: one worker per request, a standby's when one waits; between requests
    (none for IDLE_SECONDS), standbys forked up to standby_count. Returns only in a worker."""
    standbys = []
    while True:
        while len(standbys) < standby_count and not _readable(sock, IDLE_SECONDS):
            try:
                result = fork_standby(startup, sock, standbys)
            except OSError:
                break
            if isinstance(result, Worker):
                return result
            standbys.append(result)
            _send(sock, b"standby %d" % result.pid)
        try:
            received = _receive(sock)
        except (OSError, ValueError) as e:
            _send(sock, b"error " + str(e).encode(errors="replace"))
            continue
        if received is None:
            os._exit(0)
        data, fds = received
        result = None
        try:
            request = _parse_request(data)
            if len(fds) != len(request["targets"]):
                raise ValueError(f"{len(fds)} descriptors for {len(request['targets'])} targets")
            result = activate(standbys, data, fds) or spawn(request, fds, startup, sock)
        except (OSError, ValueError, struct.error) as e:
            error = str(e)
        if isinstance(result, Worker):
            return result
        for fd in fds:  # the worker has its copies (the agent's pipes close with the worker)
            os.close(fd)
        _send(sock, b"pid %d" % result if result is not None else
              b"error " + error.encode(errors="replace"))


# ---------------------------------------------------------------------------------------------
# In the worker.

def _become_the_agents(agent_pid, go_fd):
    """Waits until the zygote has reaped the intermediate (this process is the agent's child),
    then dies with the agent, as a worker the agent forked does."""
    go = os.read(go_fd, 1)
    os.close(go_fd)
    if go != b"g":  # the zygote died first: the agent starts this worker some other way
        os.kill(os.getpid(), signal.SIGKILL)
    _libc().prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != agent_pid:  # the agent died meanwhile
        os.kill(os.getpid(), signal.SIGKILL)


def _install_descriptors(worker, keep_open):
    """The agent's descriptors at their numbers (0/1/2, the watchdogs'), no other of the
    zygote's."""
    targets = worker.request["targets"]
    sock_fd = worker.sock.detach()  # closed below by number, never by a finalizer later
    floor = max([*targets, *worker.fds, sock_fd, 2]) + 1
    moved = [_fcntl_dup(fd, floor) for fd in worker.fds]
    for fd in worker.fds:
        os.close(fd)
    for source, target in zip(moved, targets):
        os.dup2(source, target, inheritable=True)
    keep = set(targets) | keep_open
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the directory listing's own descriptor


def _fresh_stdin():
    """sys.stdin made again for the worker's descriptor 0, as the interpreter makes it: the
    zygote's was made for /dev/null and keeps what it learnt of that (seekable() among it)."""
    old = sys.stdin
    if old is None or not hasattr(old, "buffer"):
        return
    buffer = io.open(0, "rb", closefd=False)
    buffer.raw.name = "<stdin>"
    stream = io.TextIOWrapper(buffer, encoding=old.encoding, errors=old.errors, newline="\n",
                              line_buffering=old.line_buffering, write_through=old.write_through)
    stream.mode = "r"
    sys.stdin = sys.__stdin__ = stream


def _open_descriptors():
    """The descriptors open now (not the directory listing's own)."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            os.fstat(int(name))
        except OSError:
            continue
        found.add(int(name))
    return found


def _fcntl_dup(fd, floor):
    import fcntl
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor)


def _parse_environment(entries):
    found = {}
    for entry in entries:
        name, sep, value = entry.partition(b"=")
        if sep and name:
            found[name] = value
    return found


class Wrapper:
    """What the interpreter's start did to the environment the agent gave the zygote (nothing,
    unless PYTHON_EXEC is a wrapper, such as pyenv's shim, that sets or unsets variables before
    it runs the interpreter): done the same to each worker's, where the worker's value is the one
    the zygote got."""

    def __init__(self, given):
        self.given = given
        started = dict(os.environb)
        self.changed = {k: v for k, v in started.items() if given.get(k) != v}
        self.removed = [k for k in given if k not in started]

    def apply(self, wanted):
        for name, value in self.changed.items():
            if wanted.get(name) == self.given.get(name):
                wanted[name] = value
        for name in self.removed:
            if wanted.get(name) == self.given.get(name):
                wanted.pop(name, None)
        return wanted


_WRAPPER = None


def _install_environment(env):
    """os.environ (and through it the C environ: getenv, exec) becomes exactly `env` (as the
    interpreter's start changed the zygote's)."""
    wanted = _parse_environment(env)
    if _WRAPPER is not None:
        wanted = _WRAPPER.apply(wanted)
    for name in list(os.environb):
        if name not in wanted:
            del os.environb[name]
    for name, value in wanted.items():
        if os.environb.get(name) != value:
            os.environb[name] = value


def _install_signals(startup):
    for number, disposition in startup.signals.items():
        if disposition is None:  # not Python's to set (a C handler at start-up)
            continue
        try:
            signal.signal(number, disposition)
        except (OSError, ValueError, TypeError):
            continue
    signal.pthread_sigmask(signal.SIG_SETMASK, startup.mask)


def _reseed():
    """What a fresh interpreter would have fresh: torch's CPU generator and numpy's global one are
    seeded from the OS at import (random reseeds itself at fork); CUDA's generators, created at
    CUDA's initialisation in the worker, are as a cold worker's."""
    torch = sys.modules.get("torch")
    generator = getattr(torch, "default_generator", None) if torch is not None else None
    if generator is not None:
        generator.seed()
    nprandom = sys.modules.get("numpy.random")
    if nprandom is not None:
        nprandom.seed()
    mpprocess = sys.modules.get("multiprocessing.process")
    if mpprocess is not None:
        mpprocess.current_process().authkey = os.urandom(32)


def _script_path0(script):
    """sys.path[0] for `python SCRIPT`: the script's directory, symbolic links resolved."""
    return os.path.dirname(os.path.realpath(script))


def prepare(worker, keep_open):
    """Everything that makes this process the worker `python -u ARGV` would have started."""
    if worker.go_fd is not None:  # (a standby became the agent's before its request)
        _become_the_agents(worker.request["agent_pid"], worker.go_fd)
    _install_descriptors(worker, keep_open)
    _fresh_stdin()
    request = worker.request
    os.chdir(request["cwd"])
    _install_environment(request["env"])
    _install_signals(worker.startup)
    # dist-launch's progress hook (loaded by the zygote's sitecustomize, where it found no slot):
    # this worker's slot and stack signal, and torch's optimizer steps (torch is imported already).
    progress = sys.modules.get("_dist_launch_progress")
    if progress is not None:
        progress.install()
    argv = [os.fsdecode(a) for a in request["argv"]]
    # What the interpreter itself was given, as for the zygote: its argv[0] and options (a
    # wrapper such as pyenv's shim may have put in another argv[0], or options of its own), then
    # the worker's script or -m and arguments.
    given = _INTERPRETER_ARGS + argv[1 + _first_target(argv[1:]):]
    if hasattr(sys, "orig_argv"):
        sys.orig_argv = given
    set_command_line(given)
    importlib.invalidate_caches()
    linecache.clearcache()
    _reseed()
    return argv[1:]


def _first_target(args):
    """The index in the interpreter's arguments (after the executable) of -m or the script."""
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] not in ("-m", "-c", "-"):
        i += 2 if args[i] in ("-X", "-W") else 1
    return i


def _strip_arguments(args):
    """(module or script, its argv) from the interpreter's arguments after the executable: -u
    and other flags the zygote shares, then -m MODULE or the script."""
    i = _first_target(args)
    if i < len(args) and args[i] == "-m":
        return ("module", args[i + 1], args[i + 2:])
    return ("script", args[i], args[i:])


def _fresh_main():
    main = types.ModuleType("__main__")
    main.__dict__["__annotations__"] = {}
    main.__dict__["__builtins__"] = sys.modules["builtins"]
    sys.modules["__main__"] = main
    return main


def _set_path0(path0):
    if sys.flags.safe_path:
        return
    if _ZYGOTE_PATH0 is not None and sys.path and sys.path[0] == _ZYGOTE_PATH0:
        sys.path[0] = path0
    else:
        sys.path.insert(0, path0)


def run_script(script, argv):
    """As `python SCRIPT`: pymain_run_file / _PyRun_SimpleFileObject."""
    sys.argv = argv
    main = _fresh_main()
    if os.path.isdir(script) or _is_zip(script):  # a directory or zip with __main__.py
        _set_path0(script)
        import runpy
        runpy._run_module_as_main("__main__", alter_argv=False)
        return
    _set_path0(_script_path0(script))
    filename = script if os.path.isabs(script) else os.path.join(os.getcwd(), script)
    try:
        with open(script, "rb") as f:
            source = f.read()
    except OSError as e:  # as pymain_run_file says it
        sys.stderr.write(f"{_INTERPRETER_ARGS[0]}: can't open file {filename!r}: "
                         f"[Errno {e.errno}] {e.strerror}\n")
        raise SystemExit(2) from None
    from importlib.machinery import SourceFileLoader, SourcelessFileLoader
    if source[:4] == importlib.util.MAGIC_NUMBER:
        import marshal
        code = marshal.loads(source[16:])
        main.__loader__ = SourcelessFileLoader("__main__", filename)
    else:
        code = compile(source, filename, "exec", dont_inherit=True)
        main.__loader__ = SourceFileLoader("__main__", filename)
    main.__file__ = filename
    main.__cached__ = None
    try:
        exec(code, main.__dict__)
    finally:
        main.__dict__.pop("__file__", None)
        main.__dict__.pop("__cached__", None)


def _is_zip(path):
    import zipfile
    try:
        return zipfile.is_zipfile(path)
    except OSError:
        return False


def run_module(module, argv):
    """As `python -m MODULE`: runpy._run_module_as_main, sys.path[0] the working directory."""
    sys.argv = ["-m", *argv]
    _fresh_main()
    _set_path0(os.getcwd())
    import runpy
    runpy._run_module_as_main(module, alter_argv=True)


_ZYGOTE_PATH0 = None
_INTERPRETER_ARGS = []  # the zygote's argv[0] and interpreter options, as the interpreter got them
_AGENT_PID = 0
_sigint_on_exit = False


def _exit_by_sigint():
    """The last atexit handler (registered first): an uncaught KeyboardInterrupt ends a Python
    process with SIGINT, after the rest of the shutdown, as CPython's exit_sigint() does."""
    if _sigint_on_exit:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


def _user_traceback(tb, code_names):
    """The traceback from the user's first frame on (the zygote's own frames dropped)."""
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__ and \
            tb.tb_frame.f_code.co_name in code_names:
        tb = tb.tb_next
    return tb


def run_worker(worker, keep_open):
    global _sigint_on_exit
    args = prepare(worker, keep_open)
    import atexit
    atexit.register(_exit_by_sigint)
    # Run before it (last in, first out) and after the script's own handlers: the objects the
    # zygote froze rejoin the collector for the interpreter's shutdown, as a cold worker's are.
    # Frozen, extension modules that count their objects at shutdown call them leaked (triton's
    # nanobind, which torch 2.x imports with torch._dynamo: about 30 lines at each exit).
    atexit.register(gc.unfreeze)
    kind, target, argv = _strip_arguments(args)
    error = None
    try:
        if kind == "module":
            run_module(target, argv)
        else:
            run_script(target, argv)
    except SystemExit:
        raise
    except BaseException as e:  # noqa: B036: what the interpreter would print, then exit 1
        error = e
    if error is None:
        return
    tb = _user_traceback(error.__traceback__,
                         {"run_worker", "run_script", "run_module", "main", "<module>"})
    error.__traceback__ = tb
    sys.last_type, sys.last_value, sys.last_traceback = type(error), error, tb
    if sys.version_info >= (3, 12):
        sys.last_exc = error
    try:
        sys.excepthook(type(error), error, tb)
    except BaseException:  # noqa: B036
        pass
    _sigint_on_exit = isinstance(error, KeyboardInterrupt)
    del error, tb
    raise SystemExit(1)


# ---------------------------------------------------------------------------------------------

def _arguments(argv):
    options = {"preload": None, "control_fd": None, "path0": None, "given_env": None,
               "standbys": 0}
    i = 0
    while i < len(argv):
        name = argv[i]
        if name == "--room":  # room for the workers' command lines (set_command_line)
            pass
        elif name == "--control-fd":
            options["control_fd"] = int(argv[i + 1])
        elif name == "--preload":
            options["preload"] = argv[i + 1]
        elif name == "--standbys":  # workers forked ahead of their requests
            options["standbys"] = int(argv[i + 1])
        elif name == "--given-env":  # the environment the agent started the zygote with
            options["given_env"] = argv[i + 1]
        elif name == "--path0":
            options["path0"] = argv[i + 1]
        else:
            raise SystemExit(f"dist-launch zygote: unknown argument {name}")
        i += 2
    return options


def start(options):
    """The zygote's set-up; returns (socket, startup state) once the agent was told it is ready."""
    global _ZYGOTE_PATH0, _WRAPPER
    startup = Startup()
    if options["given_env"]:
        with open(options["given_env"], "rb") as f:
            _WRAPPER = Wrapper(_parse_environment(f.read().split(b"\0")))
    sock = socket.socket(fileno=options["control_fd"])
    os.set_inheritable(sock.fileno(), False)
    if not sys.flags.safe_path and options["path0"] is not None:
        _ZYGOTE_PATH0 = options["path0"]
        sys.path.insert(0, _ZYGOTE_PATH0)  # imports resolve as in the workers
    began = time.monotonic()
    default = options["preload"] is None
    modules = [] if default else options["preload"].split(",")
    try:
        imported, files = preload(modules, default)
        refusal = refuse_unsafe_state()
    except BaseException as e:  # noqa: B036: a failed import of any kind is a refusal
        refusal = f"cannot preload: {type(e).__name__}: {e}"
    if refusal:
        _send(sock, b"failed " + refusal.encode(errors="replace"))
        os._exit(1)
    gc.collect()
    gc.freeze()  # the workers share the preloaded objects' pages (no collection writes to them)
    ready = {"preloaded": imported, "seconds": round(time.monotonic() - began, 3),
             "files": files}
    _send(sock, b"ready " + json.dumps(ready).encode())
    return sock, startup


def main():
    global _INTERPRETER_ARGS, _AGENT_PID
    _AGENT_PID = os.getppid()
    options = _arguments(sys.argv[1:])
    title = sys.orig_argv if hasattr(sys, "orig_argv") else [sys.executable, *sys.argv]
    if hasattr(sys, "orig_argv") and sys.argv[0] in sys.orig_argv:
        _INTERPRETER_ARGS = sys.orig_argv[:sys.orig_argv.index(sys.argv[0])]
    else:
        _INTERPRETER_ARGS = [sys.executable, "-u"]
    set_command_line(title[:title.index("--room")] if "--room" in title else title)
    sock, startup = start(options)
    keep_open = _open_descriptors() - {0, 1, 2, sock.fileno()}
    worker = serve(sock, startup, options["standbys"])
    run_worker(worker, keep_open)


if __name__ == "__main__":
    main()
