"""A worker's progress, for dist-launch's hang and straggler detection.

Nothing to do in a torch script: dist-launch puts a copy of this module on its workers'
PYTHONPATH (``_dist_launch_progress``, loaded by a ``sitecustomize`` that chains the one it
shadows). Once the script imports torch it

- counts every optimizer step (torch 2.x: torch's own ``register_optimizer_step_post_hook``;
  1.13: the profiler's per-step call), and
- samples the main thread ten times a second from a thread of its own: each process
  group's own sequence number (``ProcessGroup._get_sequence_number_for_group()``: the collectives
  issued on it, the same count on every rank of the group), whether the main thread is blocked in
  a collective (its Python frames inside torch.distributed, DDP or autograd's backward while the
  kernel has the thread asleep), in which one and since when, and what else it is in
  (torch.save, torch.distributed.checkpoint, a DataLoader, a forward pass, backward, compiling).
  The time it is not blocked is the rank's own work: stragglers are told apart by it.

Nothing of torch's is replaced or wrapped: torch.compile (fullgraph too), torch's functional
collectives and DTensor see the torch they would see without dist-launch. A process the worker
forks (a DataLoader worker, a trainer of its own) leaves the slot alone. When the agent asks for
the stacks (a suspected hang), the sampler writes every thread's to the worker's stack file,
holding the GIL; when it cannot answer (a thread keeps the GIL, no torch), the agent's signal has
``faulthandler`` write the main thread's, the thread it interrupts. Never every thread's from a
signal handler: walking the others' states while torch's threads come and go crashes the process.
``--no-step-hook`` turns all this off.

A script without an optimizer (or with its own idea of a step) calls ``step()``; a long pause of
its own (a checkpoint written for minutes, an evaluation on one rank while the others wait) can be
said with ``pause()``, so that nobody takes it for a hang::

    from dist_launch import progress
    for batch in data:
        ...
        progress.step()
    with progress.pause("evaluation"):
        evaluate(model)

An explicit ``step()`` takes over from the optimizer hook. A step costs a clock read and two
stores into a page the agent shares (the worker's slot, store/.../worker_contract.h): no
system call. Outside dist-launch every call is a no-op.

Standard library only: the agent writes this file into its run directory for any Python.
"""

import _thread
import atexit
import datetime
import faulthandler
import functools
import os
import signal
import stat
import sys
import time

__all__ = ["step", "enabled", "pause"]

# The slot's layout and the names of the worker contract (dist/contract/worker_contract.h).
# BEGIN worker contract (contract/python_constants.py; do not edit)
_SLOT_FD_VARIABLE = "DIST_HEARTBEAT_FD"
_STACK_SIGNAL_VARIABLE = "DIST_STACK_SIGNAL"
_STACK_FILE_VARIABLE = "DIST_STACK_FILE"
_SLOT_MAGIC = 0x3130424854534944
_SLOT_BYTES = 4096
_SLOT_OFFSET_MAGIC = 0
_SLOT_OFFSET_STEPS = 24
_SLOT_OFFSET_LAST_STEP_NS = 32
_SLOT_OFFSET_COLLECTIVES_ISSUED = 40
_SLOT_OFFSET_PENDING_SINCE_NS = 56
_SLOT_OFFSET_PENDING_OP = 64
_SLOT_OFFSET_FEATURES = 68
_SLOT_OFFSET_WORK_NS = 72
_SLOT_OFFSET_DUMP_PID = 80
_SLOT_OFFSET_SAMPLED_NS = 88
_SLOT_OFFSET_WAIT_NS = 96
_SLOT_OFFSET_PENDING_GROUP = 104
_SLOT_OFFSET_PENDING_SEQ = 112
_SLOT_OFFSET_PAUSED_SINCE_NS = 120
_SLOT_OFFSET_RESUMED_NS = 128
_SLOT_OFFSET_COLLECTIVE_TIMEOUT_MS = 136
_SLOT_OFFSET_ACTIVITY = 144
_SLOT_OFFSET_GROUP_COUNT = 148
_SLOT_OFFSET_PAUSE_REASON = 152
_SLOT_OFFSET_GROUPS = 216
_SLOT_OFFSET_STACKS_ASKED = 728
_SLOT_OFFSET_SETUP_SINCE_NS = 736
_SLOT_OFFSET_GROUP_SIZES = 744
_SLOT_PAUSE_REASON_BYTES = 64
_SLOT_MAX_GROUPS = 32
_SLOT_STACKS_ON_SIGNAL = 1
_SLOT_SAMPLER = 2
_SLOT_PROGRESS_HOOK = 4
_SLOT_STACKS_ON_ASK = 8
_SLOT_ACTIVITY_SAVE = 1
_SLOT_ACTIVITY_CHECKPOINT = 2
_SLOT_ACTIVITY_DATA = 4
_SLOT_ACTIVITY_FORWARD = 8
_SLOT_ACTIVITY_BACKWARD = 16
_SLOT_ACTIVITY_COMPILE = 32
_SLOT_ACTIVITY_THREADS = 64
_SLOT_ACTIVITY_CHECKPOINT_THREAD = 128
_COLLECTIVE_ALL_REDUCE = 1
_COLLECTIVE_BROADCAST = 2
_COLLECTIVE_ALL_GATHER = 3
_COLLECTIVE_REDUCE_SCATTER = 4
_COLLECTIVE_BARRIER = 5
_COLLECTIVE_OTHER = 6
_COLLECTIVE_REDUCE = 7
_COLLECTIVE_ALL_TO_ALL = 8
_COLLECTIVE_GATHER = 9
_COLLECTIVE_SCATTER = 10
_COLLECTIVE_SEND_RECV = 11
# END worker contract
# The slot through memoryviews: 8-byte fields by index among quads, 4-byte ones among ints.
_Q_MAGIC, _Q_STEPS, _Q_LAST_STEP, _Q_ISSUED, _Q_PENDING_SINCE, _Q_WORK = (
    offset // 8 for offset in (_SLOT_OFFSET_MAGIC, _SLOT_OFFSET_STEPS, _SLOT_OFFSET_LAST_STEP_NS,
                               _SLOT_OFFSET_COLLECTIVES_ISSUED, _SLOT_OFFSET_PENDING_SINCE_NS,
                               _SLOT_OFFSET_WORK_NS))
_Q_SAMPLED, _Q_WAIT, _Q_PENDING_GROUP, _Q_PENDING_SEQ = (
    offset // 8 for offset in (_SLOT_OFFSET_SAMPLED_NS, _SLOT_OFFSET_WAIT_NS,
                               _SLOT_OFFSET_PENDING_GROUP, _SLOT_OFFSET_PENDING_SEQ))
_Q_PAUSED_SINCE, _Q_RESUMED, _Q_TIMEOUT_MS = (
    offset // 8 for offset in (_SLOT_OFFSET_PAUSED_SINCE_NS, _SLOT_OFFSET_RESUMED_NS,
                               _SLOT_OFFSET_COLLECTIVE_TIMEOUT_MS))
_Q_GROUPS = _SLOT_OFFSET_GROUPS // 8  # {id, seq} pairs
_Q_SETUP_SINCE = _SLOT_OFFSET_SETUP_SINCE_NS // 8
_I_GROUP_SIZES = _SLOT_OFFSET_GROUP_SIZES // 4
_I_PENDING_OP, _I_FEATURES, _I_DUMP_PID, _I_ACTIVITY, _I_GROUP_COUNT, _I_STACKS_ASKED = (
    offset // 4 for offset in (_SLOT_OFFSET_PENDING_OP, _SLOT_OFFSET_FEATURES,
                               _SLOT_OFFSET_DUMP_PID, _SLOT_OFFSET_ACTIVITY,
                               _SLOT_OFFSET_GROUP_COUNT, _SLOT_OFFSET_STACKS_ASKED))
# The slot's Collective values, by the names of torch.distributed's functions (distributed_c10d.py).
_COLLECTIVES = {
    "all_reduce": _COLLECTIVE_ALL_REDUCE,
    "all_reduce_coalesced": _COLLECTIVE_ALL_REDUCE,
    "broadcast": _COLLECTIVE_BROADCAST,
    "broadcast_object_list": _COLLECTIVE_BROADCAST,
    "all_gather": _COLLECTIVE_ALL_GATHER,
    "all_gather_into_tensor": _COLLECTIVE_ALL_GATHER,
    "all_gather_object": _COLLECTIVE_ALL_GATHER,
    "all_gather_coalesced": _COLLECTIVE_ALL_GATHER,
    "all_gather_single": _COLLECTIVE_ALL_GATHER,
    "_all_gather_base": _COLLECTIVE_ALL_GATHER,
    "reduce_scatter": _COLLECTIVE_REDUCE_SCATTER,
    "reduce_scatter_tensor": _COLLECTIVE_REDUCE_SCATTER,
    "_reduce_scatter_base": _COLLECTIVE_REDUCE_SCATTER,
    "reduce_scatter_single": _COLLECTIVE_REDUCE_SCATTER,
    "barrier": _COLLECTIVE_BARRIER,
    "monitored_barrier": _COLLECTIVE_BARRIER,
    "reduce": _COLLECTIVE_REDUCE,
    "all_to_all": _COLLECTIVE_ALL_TO_ALL,
    "all_to_all_single": _COLLECTIVE_ALL_TO_ALL,
    "gather": _COLLECTIVE_GATHER,
    "gather_object": _COLLECTIVE_GATHER,
    "gather_single": _COLLECTIVE_GATHER,
    "scatter": _COLLECTIVE_SCATTER,
    "scatter_object_list": _COLLECTIVE_SCATTER,
    "send": _COLLECTIVE_SEND_RECV,
    "recv": _COLLECTIVE_SEND_RECV,
    "send_object_list": _COLLECTIVE_SEND_RECV,
    "recv_object_list": _COLLECTIVE_SEND_RECV,
    "batch_isend_irecv": _COLLECTIVE_SEND_RECV,
}
# A group's set-up, where a rank waits for every rank of the group (not a collective): torch's
# functions that build a process group (distributed_c10d.py), and dist_launch.elastic's, which
# wait for the next generation of the group and build it.
_SETUP_FUNCTIONS = frozenset(("init_process_group", "new_group", "_new_group_with_tag",
                              "new_subgroups", "new_subgroups_by_enumeration"))
_ELASTIC_SETUP_FUNCTIONS = frozenset(("_recover", "_take_new_rank", "init_process_group"))
# Dynamo's and Inductor's files that run what they compiled, or what must not be compiled
# (torch.compiler.disable, which FSDP2 and others put around their functions), without compiling
# anything: a rank in them runs the model (or waits in a collective of a compiled graph).
_NOT_COMPILING = ("_dynamo/eval_frame.py", "_dynamo/external_utils.py",
                  "_inductor/output_code.py", "_inductor/utils.py", "_inductor/runtime/")
# dist_launch's modules (in its package, or the stand-in the agent writes): not the script's code.
_DIST_LAUNCH_MODULES = frozenset((
    "__init__.py", "__main__.py", "api.py", "compression.py", "elastic.py", "errors.py",
    "progress.py", "snapshot.py", "_function.py", "_function_worker.py", "_programs.py",
    "_runner.py", "_sockets.py", "_stand_in.py", "_zygote.py"))
_SAMPLE_SECONDS = 0.1
_DUMP_BYTES = 128 * 1024  # a dump's bound (the agent reads 256 KiB of one)
_ACTIVITY_NS = 2_000_000_000  # what the main thread was in, over this long
_WAKEUP_PASSES = 3  # passes running inside a wait that do not end it

_words = None  # the slot as 8-byte words; None outside dist-launch
_halves = None  # and as 4-byte ones
_area = None  # and as bytes
_explicit = False  # step() was called: the optimizer hook no longer counts
_stack_file = None  # kept open for faulthandler
_sampler = None  # the running _Sampler, if any
_pause_depth = 0
_pause_lock = _thread.allocate_lock()
_fork_handler = False


def _map_slot():
    """The slot the agent passed, mapped shared; None without one."""
    import mmap

    text = os.environ.get(_SLOT_FD_VARIABLE, "")
    try:
        fd = int(text)
        st = os.fstat(fd)
    except (ValueError, OSError):
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size < _SLOT_BYTES:
        return None  # a number a wrapper closed and something else reused
    try:
        area = mmap.mmap(fd, _SLOT_BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, ValueError):
        return None
    words = memoryview(area).cast("Q")
    if words[_Q_MAGIC] != _SLOT_MAGIC:
        words.release()
        area.close()
        return None
    os.set_inheritable(fd, False)  # programs this worker runs would beat for it
    return words, memoryview(area).cast("I"), area


def _count_step():
    words = _words
    if words is None:
        return
    words[_Q_LAST_STEP] = time.monotonic_ns()  # CLOCK_MONOTONIC, the agent's; through the vDSO
    words[_Q_STEPS] += 1


def step():
    """One training step done."""
    global _explicit
    _explicit = True
    _count_step()


def enabled():
    """Whether step() reaches the agent."""
    return _words is not None


def _optimizer_stepped(*_):
    if not _explicit:
        _count_step()


def _pause_enter(reason):
    global _pause_depth
    with _pause_lock:
        _pause_depth += 1
        if _pause_depth != 1 or _area is None:
            return
        text = reason.encode("utf-8", "replace")[:_SLOT_PAUSE_REASON_BYTES - 1]
        text = text.decode("utf-8", "ignore").encode("utf-8")  # no character cut in two
        at = _SLOT_OFFSET_PAUSE_REASON
        _area[at:at + _SLOT_PAUSE_REASON_BYTES] = text.ljust(_SLOT_PAUSE_REASON_BYTES, b"\0")
        _words[_Q_PAUSED_SINCE] = time.monotonic_ns()


def _pause_exit():
    global _pause_depth
    with _pause_lock:
        _pause_depth = max(0, _pause_depth - 1)
        if _pause_depth == 0 and _words is not None:
            _words[_Q_RESUMED] = time.monotonic_ns()
            _words[_Q_PAUSED_SINCE] = 0


class pause:
    """A long pause of the script's own, said to dist-launch: ``with progress.pause("checkpoint"):``
    (or ``@progress.pause("evaluation")`` on a function). While it lasts the rank makes no steps
    and the others may wait for it: the agent reports it as paused (the reason, for how long),
    never as hung, and ends it for no timeout of its own; the collectives' own timeout still holds.
    Nests; any thread."""

    def __init__(self, reason="a pause of the script's own"):
        self.reason = str(reason)

    def __enter__(self):
        _pause_enter(self.reason)
        return self

    def __exit__(self, *_):
        _pause_exit()
        return False

    def __call__(self, function):
        @functools.wraps(function)
        def paused(*args, **kwargs):
            with self:
                return function(*args, **kwargs)

        return paused


class _Sampler:
    """The main thread, seen from a thread of this module's own every _SAMPLE_SECONDS: what it is
    in, whether it is blocked in a collective, and every process group's sequence number, into
    the slot. Reads only: nothing of torch's is called but the groups' counters."""

    def __init__(self, torch, words, halves):
        import threading

        self.words, self.halves = words, halves
        self.c10d = torch.distributed.distributed_c10d
        self.torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
        # Code that is not the script's own, though outside torch: the standard library's (not
        # its site-packages), dist_launch's, and what torch generates (FX, Inductor).
        import sysconfig

        paths = sysconfig.get_paths()
        self.library_dirs = tuple({os.path.abspath(paths[k]) + os.sep
                                   for k in ("stdlib", "platstdlib") if paths.get(k)})
        self.pickling_lines = {}  # (code, line number) -> whether that line pickles
        self.cpu = getattr(torch, "device", None) and torch.device("cpu")
        self.cuda = getattr(torch, "device", None) and torch.device("cuda")
        main = threading.main_thread()
        self.main = main.ident
        try:
            self.state_fd = os.open(f"/proc/self/task/{main.native_id}/stat", os.O_RDONLY)
        except (OSError, AttributeError):
            self.state_fd = None
        self.codes = {}  # code object -> (category, collective kind)
        self.issuing = {}  # code object -> what it says of a thread (thread_frame)
        # id(process group) -> [group id, first seq, last seq, last change ns, ranks in it, its
        # name] (no reference kept: a group the script destroys is freed as it would be without
        # this module)
        self.groups = {}
        self.saw_groups = False  # a process group was seen (read_groups): see _end_sampler
        self.timeout_ms = 0  # the longest of the process groups' timeouts
        self.wait_timeout_ms = 0  # the timeout of the collective waited in now (its argument's)
        self.last = time.monotonic_ns()
        self.waiting_since = 0
        self.waiting_issued = 0
        self.failures = 0
        self.activity_seen = {}  # activity bit -> when the main thread was last seen in it
        self.setup_since = 0  # since when the main thread is seen in a group's set-up
        self.running_passes = 0  # passes in a row that saw the main thread not blocked
        # Held for each pass: the interpreter's exit waits for the pass under way (_end_sampler).
        self.passing = _thread.allocate_lock()
        self.stacks_answered = halves[_I_STACKS_ASKED]  # asks before this sampler are not its own

    # Frame categories.
    USER, TORCH, COLLECTIVE, DIST, SETUP, SAVE, CHECKPOINT, DATA, FORWARD, BACKWARD, COMPILE = (
        range(11))
    ACTIVITY = {SAVE: _SLOT_ACTIVITY_SAVE, CHECKPOINT: _SLOT_ACTIVITY_CHECKPOINT,
                DATA: _SLOT_ACTIVITY_DATA, FORWARD: _SLOT_ACTIVITY_FORWARD,
                BACKWARD: _SLOT_ACTIVITY_BACKWARD, COMPILE: _SLOT_ACTIVITY_COMPILE}

    def classify(self, code):
        file = code.co_filename
        name = code.co_name
        if not file.startswith(self.torch_dir):
            path = file.replace(os.sep, "/")
            if "/dist_launch/" in path and os.path.basename(path) in _DIST_LAUNCH_MODULES:
                if name in _ELASTIC_SETUP_FUNCTIONS and path.endswith("/dist_launch/elastic.py"):
                    return self.SETUP, 0
                return self.TORCH, 0
            if (file.startswith(self.library_dirs) and "-packages/" not in path) or \
                    file.startswith(("<eval_with_key", "<frozen ")) or "torchinductor_" in path:
                return self.TORCH, 0
            return self.USER, 0
        rest = file[len(self.torch_dir):].replace(os.sep, "/")
        if rest == "distributed/distributed_c10d.py":
            kind = _COLLECTIVES.get(name)
            if kind:
                return self.COLLECTIVE, kind
            return (self.SETUP, 0) if name in _SETUP_FUNCTIONS else (self.DIST, 0)
        if rest.startswith("distributed/checkpoint/"):
            return self.CHECKPOINT, 0
        if rest.startswith("distributed/") or rest == "nn/parallel/distributed.py":
            return self.DIST, 0
        if rest == "serialization.py":
            return self.SAVE, 0
        if rest.startswith("utils/data/"):
            return self.DATA, 0
        if rest == "nn/modules/module.py" and name in ("_call_impl", "_wrapped_call_impl"):
            return self.FORWARD, 0
        if rest in ("autograd/__init__.py", "_tensor.py", "autograd/graph.py") and name in (
                "backward", "_engine_run_backward", "grad"):
            return self.BACKWARD, 0
        if rest.startswith(("_dynamo/", "_inductor/")) and not rest.startswith(_NOT_COMPILING):
            return self.COMPILE, 0
        return self.TORCH, 0

    def main_thread(self, frame):
        """(activity bits, the innermost collective frame and its kind, whether the thread is in
        that collective's own call (or a helper of it, but for an object's pickling), in
        torch.distributed or backward, in a group's set-up and no collective inside it) of the
        main thread now. Where the script's own code runs inside torch.distributed or a backward
        pass (a forward inside DDP's, an object's pickling inside broadcast_object_list, a hook
        of its own), the thread is in no wait of theirs: it works, or waits for something of its
        own."""
        activity, collective, kind, distributed, setup = 0, None, 0, False, False
        depth = 0
        codes = self.codes
        innermost = None  # (category, frame) at depth 0
        scripts = False  # a frame of the script's own inside the frames seen so far
        waits = None  # no frame of the script's own inside the innermost torch.distributed one
        while frame is not None and depth < 200:
            found = codes.get(frame.f_code) or self.categorize(frame.f_code)
            category = found[0]
            if innermost is None:
                innermost = category, frame
            if waits is None and category in (self.COLLECTIVE, self.DIST, self.BACKWARD):
                waits = not scripts
            if category == self.COLLECTIVE:
                if collective is None and waits and not scripts:
                    collective, kind = frame, found[1]
                distributed = waits
            elif category == self.DIST:
                distributed = waits
            elif category == self.SETUP:
                setup = setup or collective is None
            elif category == self.USER:
                scripts = True
            elif category >= self.SAVE:
                activity |= self.ACTIVITY[category]
                if category == self.BACKWARD:
                    distributed = distributed or (waits and bool(self.groups))
            frame = frame.f_back
            depth += 1
        own_call = collective is not None and (
            innermost[1] is collective or (innermost[0] == self.DIST and
                                           not self.pickling(innermost[1])))
        del innermost
        # Building a group is no wait in one: the groups it counts may be a failed generation's.
        return activity, collective, kind, own_call, distributed and not setup, setup

    # A thread may issue a collective, beside a blocked main thread, unless it is known not to:
    # one with the script's own code on its stack, a library's (but for a monitor's or a
    # logger's), torch.distributed's, or the standard library's alone (a Timer, sched, an event
    # loop, a pool's result handler: runners of callables the script handed them) may. Idle
    # threads of these loops may not: they run nothing of the script's (module, attribute path).
    # A pool's idle worker is one (a task on it, of the script's, is seen in the frames above:
    # torch.compile leaves such a worker idle for the process's life).
    QUIET_LOOPS = (("concurrent.futures.thread", "_worker"), ("multiprocessing.pool", "worker"),
                   ("multiprocessing.queues", "Queue._feed"),  # a DataLoader's queues' feeders
                   ("multiprocessing.pool", "Pool._handle_workers"),
                   ("multiprocessing.pool", "Pool._handle_tasks"),
                   ("logging.handlers", "QueueListener._monitor"),
                   # a process pool's manager (torch.compile's pool, torch 2.1-2.2), fds' sharer
                   ("concurrent.futures.process", "_ExecutorManagerThread.run"),
                   ("multiprocessing.resource_sharer", "_ResourceSharer._serve"))
    # Libraries whose threads never issue a collective: monitors and loggers (site-packages'
    # top-level names). Any other code of a library's on a thread may (a package the script is,
    # dist-launch -m pkg.train; a framework's own threads).
    QUIET_LIBRARIES = frozenset((
        "tqdm", "wandb", "tensorboard", "tensorboardX", "mlflow", "comet_ml", "neptune",
        "clearml", "aim", "prometheus_client", "sentry_sdk"))
    MAY, STDLIB, QUIET, NOT = 1, 2, 3, 4  # what a frame says of its thread (others_may_issue)

    def codes_of(self, pairs):
        found = set()
        for module, path in pairs:
            attribute = sys.modules.get(module)
            for part in path.split("."):
                attribute = getattr(attribute, part, None)
            code = getattr(attribute, "__code__", None)
            if code is not None:
                found.add(code)
        return found

    def quiet_library(self, file):
        path = file.replace(os.sep, "/")
        at = path.rfind("-packages/")
        if at < 0:
            return False
        top = path[at + len("-packages/"):].split("/", 1)[0]
        return (top[:-3] if top.endswith(".py") else top) in self.QUIET_LIBRARIES

    def thread_frame(self, code, quiet_loops):
        """What one frame of a thread says: MAY (the thread may issue a collective), QUIET (an
        idle loop of a known kind: it does not), STDLIB (the standard library's: the thread may,
        unless something else is found), NOT (torch's own, a quiet library's, dist_launch's)."""
        if code in quiet_loops:
            return self.QUIET
        category = self.classify(code)[0]
        if category in (self.COLLECTIVE, self.DIST, self.SETUP, self.CHECKPOINT):
            return self.MAY
        file = code.co_filename
        if category == self.USER:
            return self.NOT if self.quiet_library(file) else self.MAY
        path = file.replace(os.sep, "/")
        if (file.startswith(self.library_dirs) and "-packages/" not in path) or \
                file.startswith("<frozen "):
            return self.STDLIB
        return self.NOT

    def categorize(self, code):
        """classify(code), kept in self.codes (main_thread reads that first: its hot path)."""
        if len(self.codes) > 20000:
            self.codes.clear()
        found = self.codes[code] = self.classify(code)
        return found

    def other_threads(self, frames):
        """The innermost frame of each thread but the main one and this sampler."""
        me = _thread.get_ident()
        return (frame for ident, frame in frames.items() if ident not in (self.main, me))

    def others_may_issue(self, frames):
        """Whether a thread besides the main thread (and this sampler) may issue a collective
        (QUIET_LOOPS above). The peers the main thread waits for may be waiting for that thread:
        the main thread's wait proves nothing."""
        quiet_loops = self.codes_of(self.QUIET_LOOPS)
        said = self.issuing
        if len(said) > 20000:
            said.clear()
        for frame in self.other_threads(frames):
            depth, stdlib_alone = 0, True
            while frame is not None and depth < 200:
                code = frame.f_code
                what = said.get(code)
                if what is None:
                    what = said[code] = self.thread_frame(code, quiet_loops)
                if what == self.MAY:
                    return True
                if what == self.QUIET:
                    break
                stdlib_alone = stdlib_alone and what == self.STDLIB
                frame = frame.f_back
                depth += 1
            else:
                if stdlib_alone:
                    return True  # a runner of the standard library's (Timer, sched, asyncio)
        return False

    def checkpoint_beside(self, frames):
        """Whether a thread besides the main thread (and this sampler) works inside
        torch.distributed.checkpoint: an async_save's writer, which the main thread may wait for
        (its future's result()) while its peers wait for it. One waiting in a collective of the
        checkpoint's (its peers' plans, their writes' end) waits, and is not counted."""
        if "torch.distributed.checkpoint" not in sys.modules:
            return False
        codes = self.codes
        for frame in self.other_threads(frames):
            depth, in_collective = 0, False
            while frame is not None and depth < 200:
                found = codes.get(frame.f_code) or self.categorize(frame.f_code)
                if found[0] == self.COLLECTIVE:
                    in_collective = True
                elif found[0] == self.CHECKPOINT:
                    if not in_collective:
                        return True
                    break
                frame = frame.f_back
                depth += 1
        return False

    def pickling(self, frame):
        """Whether `frame`, torch.distributed's, may pickle or unpickle an object (an object
        collective's work, in C: no frame of its own), read from its line's text once; True where
        the text cannot be read (then only the thread's state says whether it waits)."""
        key = frame.f_code, frame.f_lineno or 0
        known = self.pickling_lines.get(key)
        if known is None:
            import linecache

            if len(self.pickling_lines) > 1000:
                self.pickling_lines.clear()
            try:
                text = linecache.getline(frame.f_code.co_filename, key[1], frame.f_globals)
            except Exception:
                text = ""
            known = self.pickling_lines[key] = not text or "pickler(" in text
        return known

    def asleep(self):
        """Whether the kernel has the main thread waiting (not running)."""
        if self.state_fd is None:
            return True
        text = os.pread(self.state_fd, 512, 0)
        close = text.rfind(b")")
        return text[close + 2:close + 3] not in (b"R", b"")

    def read_groups(self, now):
        """Every process group's sequence number, into the slot; the sum issued since each was
        first seen."""
        world = getattr(self.c10d, "_world", None)
        current = list(world.pg_map if world is not None else getattr(self.c10d, "_pg_map", {}))
        if len(self.groups) > len(current):  # destroyed groups
            alive = {id(g) for g in current}
            for gone in [key for key in self.groups if key not in alive]:
                del self.groups[gone]
        issued = 0
        words = self.words
        index = 0
        for group in current:
            entry = self.groups.get(id(group))
            name = getattr(group, "group_name", None)
            if entry is not None and entry[5] != name:
                entry = None  # a group made where a destroyed one was, within a pass
            try:
                seq = group._get_sequence_number_for_group()
            except Exception:
                continue
            if entry is None:
                self.saw_groups = True
                try:
                    size = group.size()
                except Exception:
                    size = 0  # unknown: no proof counts on this group's members
                entry = self.groups[id(group)] = [self.name_id(group), seq, seq, 0, size, name]
                self.note_timeout(self.group_timeout_ms(group))
            elif seq < entry[1]:  # torch 1.x sets a new group's count once the group is made
                entry[1], entry[2], entry[3] = seq, seq, now
            elif seq != entry[2]:
                entry[2], entry[3] = seq, now
            issued += seq - entry[1]
            if index < _SLOT_MAX_GROUPS:
                words[_Q_GROUPS + 2 * index] = entry[0]
                words[_Q_GROUPS + 2 * index + 1] = seq
                self.halves[_I_GROUP_SIZES + index] = entry[4]
                index += 1
        self.halves[_I_GROUP_COUNT] = index
        words[_Q_ISSUED] = issued
        return issued

    def name_id(self, group):
        name = getattr(group, "group_name", None)
        if not isinstance(name, str):
            names = getattr(self.c10d, "_pg_names", None)
            world = getattr(self.c10d, "_world", None)
            names = names if names is not None else getattr(world, "pg_names", {})
            name = names.get(group, str(len(self.groups)))
        h = 0xcbf29ce484222325  # FNV-1a, 64 bits
        for byte in name.encode():
            h = ((h ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
        return h or 1

    def group_timeout_ms(self, group):
        for get in (lambda: group.options._timeout,
                    lambda: group._get_backend(self.cpu).options._timeout,
                    lambda: group._get_backend(self.cuda).options._timeout):
            try:
                return int(get().total_seconds() * 1000)
            except Exception:
                pass
        return 0

    def collective_timeout_ms(self, collective):
        """(How long the collective the main thread waits in may wait by its own timeout argument
        (monitored_barrier's; torch 2.x's barrier's: a timedelta, or seconds in 1.13), 0 without
        one; its group's timeout as it is now (a script may change it: set_timeout))."""
        own = group_ms = 0
        try:
            arguments = collective.f_locals
            timeout = arguments.get("timeout")
            if isinstance(timeout, datetime.timedelta):
                own = int(timeout.total_seconds() * 1000)
            elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
                own = int(timeout * 1000)
            group = arguments.get("group")
            group_ms = self.group_timeout_ms(group if group is not None
                                             else self.c10d._get_default_group())
        except Exception:
            pass
        return max(own, 0), group_ms

    def note_wait(self, collective):
        """The slot says the longest collective timeout the worker may wait now (the agent's
        bound for a hang it cannot prove is past it): the groups' longest, which stays, and the
        timeout argument of the collective waited in, for that wait only (one monitored_barrier
        of an hour must not hold every later hang for an hour). Read again at each pass of a
        wait: the argument may be filled in (monitored_barrier's default) after the first."""
        own, group_ms = self.collective_timeout_ms(collective)
        self.note_timeout(group_ms)
        if own > self.wait_timeout_ms:
            self.wait_timeout_ms = own
            self.words[_Q_TIMEOUT_MS] = max(self.timeout_ms, own)

    def end_wait(self):
        if self.wait_timeout_ms:
            self.wait_timeout_ms = 0
            self.words[_Q_TIMEOUT_MS] = self.timeout_ms

    def note_timeout(self, ms):
        """A process group's timeout: the slot keeps the groups' longest."""
        if ms > self.timeout_ms:
            self.timeout_ms = ms
            self.words[_Q_TIMEOUT_MS] = max(ms, self.wait_timeout_ms)

    def pending_group(self, collective):
        """The group a blocked main thread waits in: the collective's own argument, else the
        group whose count moved last."""
        if collective is not None:
            try:
                group = collective.f_locals.get("group")
                if group is None:
                    group = self.c10d._get_default_group()
                entry = self.groups.get(id(group))
                if entry:
                    return entry[0], entry[2]
            except Exception:
                pass
        latest = max(self.groups.values(), key=lambda e: e[3], default=None)
        return (latest[0], latest[2]) if latest else (0, 0)

    def sample(self):
        now = time.monotonic_ns()
        elapsed, self.last = now - self.last, now
        words, halves = self.words, self.halves
        issued = self.read_groups(now) if self.c10d.is_initialized() else 0
        frames = sys._current_frames()
        activity, collective, kind, own_call, distributed, setup = self.main_thread(
            frames.get(self.main))
        if distributed and self.groups and self.others_may_issue(frames):
            activity |= _SLOT_ACTIVITY_THREADS
        if not activity & _SLOT_ACTIVITY_CHECKPOINT and self.checkpoint_beside(frames):
            activity |= _SLOT_ACTIVITY_CHECKPOINT_THREAD
        del frames
        if setup != bool(self.setup_since):
            self.setup_since = now if setup else 0
            words[_Q_SETUP_SINCE] = self.setup_since
        # What it was in over the last _ACTIVITY_SECONDS, not only now: a loop of torch.save calls
        # spends some of each turn outside them.
        seen = self.activity_seen
        bit = 1
        while bit <= activity:
            if activity & bit:
                seen[bit] = now
            bit <<= 1
        halves[_I_ACTIVITY] = sum(b for b, t in seen.items() if now - t < _ACTIVITY_NS)
        # In a collective's own call the thread is blocked in it (issuing one takes microseconds);
        # in a helper inside it (an object collective's pickling), in DDP or backward only while
        # the kernel has it asleep: only then is /proc read (each read hands the GIL over once
        # more).
        blocked = distributed and self.groups and (own_call or self.asleep())
        same_wait = self.waiting_since and issued == self.waiting_issued
        if blocked and self.waiting_since and not same_wait:
            blocked = False  # it issued another one meanwhile: a new wait, from the next pass
        # A wait the kernel woke the thread from for a moment (nothing issued, still in
        # torch.distributed) goes on: a few passes running do not end it.
        self.running_passes = 0 if blocked else self.running_passes + 1
        if not blocked and same_wait and distributed and self.running_passes <= _WAKEUP_PASSES:
            blocked = True
        if blocked:
            if collective is not None:
                self.note_wait(collective)
            if not self.waiting_since:
                group, seq = self.pending_group(collective)
                in_backward = activity & _SLOT_ACTIVITY_BACKWARD
                kind = kind or (_COLLECTIVE_ALL_REDUCE if in_backward else _COLLECTIVE_OTHER)
                halves[_I_PENDING_OP] = kind
                words[_Q_PENDING_GROUP] = group
                words[_Q_PENDING_SEQ] = seq
                self.waiting_since, self.waiting_issued = now, issued
                words[_Q_PENDING_SINCE] = now
            words[_Q_WAIT] += elapsed
        else:
            if self.waiting_since:
                self.waiting_since = 0
                self.end_wait()
                words[_Q_PENDING_SINCE] = 0
                halves[_I_PENDING_OP] = 0
                words[_Q_PENDING_GROUP] = 0
            words[_Q_WORK] += elapsed
        del collective
        words[_Q_SAMPLED] = now

    def stop(self):
        """Nothing this sampler wrote stands: the agent reads the rank without it."""
        self.halves[_I_FEATURES] &= ~(_SLOT_SAMPLER | _SLOT_STACKS_ON_ASK)
        self.words[_Q_PENDING_SINCE] = 0
        self.halves[_I_PENDING_OP] = 0
        self.words[_Q_PENDING_GROUP] = 0
        self.halves[_I_GROUP_COUNT] = 0
        self.words[_Q_SETUP_SINCE] = 0

    @staticmethod
    def thread_block(ident, frame):
        """One thread's stack as faulthandler writes it, innermost first (at most 100 frames)."""
        lines = [f"Thread 0x{ident:016x} (most recent call first):"]
        while frame is not None and len(lines) <= 100:
            code = frame.f_code
            lines.append(f'  File "{code.co_filename}", line {frame.f_lineno} in {code.co_name}')
            frame = frame.f_back
        if frame is not None:
            lines.append("  ...")
        return "\n".join(lines) + "\n\n"

    def dump_stacks(self):
        """Every thread's Python stack, as faulthandler writes them, in one write to the stack
        file: what the agent asked for in the slot. The main thread comes last, and the others
        only as far as _DUMP_BYTES holds them (within what the agent reads of a dump). Threads may
        come and go meanwhile: sys._current_frames() reads their states holding the GIL."""
        frames = sys._current_frames()
        main = frames.pop(self.main, None)
        frames.pop(_thread.get_ident(), None)
        last = self.thread_block(self.main, main) if main is not None else ""
        blocks, size = [], len(last)
        for ident, frame in frames.items():
            block = self.thread_block(ident, frame)
            if size + len(block) > _DUMP_BYTES:
                break
            blocks.append(block)
            size += len(block)
        data = ("".join(blocks) + last).encode(errors="backslashreplace")
        while data:
            data = data[os.write(_stack_file.fileno(), data):]

    def answer(self):
        """The stacks, when the agent asked for them since the last pass."""
        asked = self.halves[_I_STACKS_ASKED]
        if asked == self.stacks_answered:
            return
        self.stacks_answered = asked
        try:
            self.dump_stacks()
        except Exception:  # no file, say: the agent falls back to its signal; the sampler goes on
            pass

    def run(self):
        while True:
            time.sleep(_SAMPLE_SECONDS)
            with self.passing:
                if _sampler is not self:
                    return
                self.answer()
                try:
                    self.sample()
                    self.failures = 0
                except Exception as e:  # a torch this does not know: say so once, train on
                    self.failures += 1
                    if self.failures == 20:
                        self.stop()
                        print(f"dist-launch: the progress sampler stops ({type(e).__name__}: "
                              f"{e}); hangs in this rank are still reported, collectives not "
                              "told apart", file=sys.stderr)
                        return


def _end_sampler():
    """At the interpreter's exit, before it finalizes: no pass starts from now on, and the one
    under way finishes first (bounded). A thread still running then is ended by pthread_exit when
    it next takes the GIL, and one inside torch's C++ (a group's counter is read with the GIL
    released) then aborts the process ("terminate called without an active exception", exit 134
    for a script that succeeded)."""
    global _sampler
    sampler, _sampler = _sampler, None
    if sampler is not None:
        sampler.halves[_I_FEATURES] &= ~_SLOT_STACKS_ON_ASK
        if sampler.passing.acquire(timeout=2.0):
            sampler.passing.release()
        if sampler.saw_groups or sampler.c10d.is_initialized():
            _let_collective_threads_let_go()


# How long the main thread holds back its exit for torch's collective threads (below).
_COLLECTIVE_THREADS_GRACE_S = 0.05


def _let_collective_threads_let_go():
    """torch's gloo worker threads drop a finished collective's tensors after its caller has gone
    on, taking the GIL for it (the tensors' Python objects); one that takes it once the
    interpreter is finalizing is ended by pthread_exit inside torch's C++, and the process aborts
    ("terminate called without an active exception", SIGABRT for a rank that succeeded: 3 of 26
    runs of a test whose healthy torch 2.15 rank 0 exits right after an all_gather_object, 0 of 16
    with this). Here, before the finalizing starts, the main thread lets them have it: a short
    sleep, in a process that made a process group (the sampler saw one)."""
    time.sleep(_COLLECTIVE_THREADS_GRACE_S)


def _start_sampler(torch):
    global _sampler
    distributed = getattr(torch, "distributed", None)
    if _words is None or distributed is None or not distributed.is_available():
        return
    _sampler = _Sampler(torch, _words, _halves)
    _halves[_I_FEATURES] |= _SLOT_SAMPLER
    if _stack_file is not None:
        _halves[_I_FEATURES] |= _SLOT_STACKS_ON_ASK
    # A thread of the interpreter's own, not threading's: no script sees it in
    # threading.enumerate(), and it ends with the interpreter.
    _thread.start_new_thread(_sampler.run, ())
    # Once, and after torch's own exit handlers were registered (they run after this one).
    atexit.unregister(_end_sampler)
    atexit.register(_end_sampler)


def _hook_torch(torch):
    """Counts optimizer steps and samples the main thread; torch was just imported."""
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook
    except ImportError:  # torch 1.x: each step ends in _optimizer_step_code(), for the profiler
        optimizer = torch.optim.Optimizer
        original = optimizer._optimizer_step_code

        def _optimizer_step_code(self):
            original(self)
            _optimizer_stepped()

        optimizer._optimizer_step_code = _optimizer_step_code
    else:
        register_optimizer_step_post_hook(_optimizer_stepped)
    _start_sampler(torch)


class _AfterTorchImport:
    """A meta path finder that hooks torch once its package has run (nothing imports torch here)."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            try:
                _hook_torch(module)
                module._dist_launch_hooked = True
            except Exception as e:  # a torch this hook does not know: say so, train anyway
                print(
                    f"dist-launch: cannot hook torch {getattr(module, '__version__', '?')}'s "
                    f"optimizer steps ({type(e).__name__}: {e}); hang detection needs "
                    "dist_launch.progress.step() in the training loop",
                    file=sys.stderr,
                )

        spec.loader.exec_module = exec_module
        return spec


def _install_stack_dump():
    """On the agent's signal, the Python stack of the thread it interrupts (the main thread) into
    the worker's stack file; the sampler answers the agent's asks with every thread's.

    The signal is ignored before faulthandler takes it: at the interpreter's exit faulthandler
    puts back what it found, and a realtime signal with its default action would end a worker
    that has just succeeded (exit -59)."""
    global _stack_file
    try:
        signal_number = int(os.environ.get(_STACK_SIGNAL_VARIABLE, ""))
        path = os.environ[_STACK_FILE_VARIABLE]
        _stack_file = open(path, "a")
        try:
            if signal.getsignal(signal_number) == signal.SIG_DFL:
                signal.signal(signal_number, signal.SIG_IGN)
        except ValueError:  # not the main thread: only a signal at its exit stays fatal
            pass
        faulthandler.register(signal_number, file=_stack_file, all_threads=False, chain=False)
    except (KeyError, ValueError, OSError, RuntimeError):
        return
    _halves[_I_DUMP_PID] = os.getpid()
    _halves[_I_FEATURES] |= _SLOT_STACKS_ON_SIGNAL


def _forget_slot():
    """In a process the worker forked: the slot is the worker's, not this process's."""
    global _words, _halves, _area, _sampler, _pause_depth, _pause_lock
    _words = _halves = _area = _sampler = None
    _pause_depth = 0
    _pause_lock = _thread.allocate_lock()  # another thread may have held it at the fork


def reset():
    """This process is a worker of its own now (a zygote's child, its environment set): map its
    slot and take the agent's stack signal."""
    global _words, _halves, _area, _sampler, _fork_handler
    if not _fork_handler:
        os.register_at_fork(after_in_child=_forget_slot)
        _fork_handler = True
    slot = _map_slot()
    _words, _halves, _area = slot if slot else (None, None, None)
    _sampler = None
    if _words is not None:
        _install_stack_dump()


def install(hook_torch=True):
    """What the agent's sitecustomize runs at interpreter start, and a warm worker (forked from
    a zygote that imported torch already) once its environment is its own."""
    reset()
    if _words is None:
        return
    _halves[_I_FEATURES] |= _SLOT_PROGRESS_HOOK
    if not hook_torch:
        return
    torch = sys.modules.get("torch")
    if torch is None:
        sys.meta_path.insert(0, _AfterTorchImport())
    elif not getattr(torch, "_dist_launch_hooked", False):
        _hook_torch(torch)
        torch._dist_launch_hooked = True
    else:  # a warm worker: its zygote hooked the steps, the sampler is this process's own
        _start_sampler(torch)


# The package's copy and the agent's are one: a script that imports dist_launch.progress in a
# worker the agent hooked steps the same slot, once. (The agent's copy maps it in install().)
if __name__ != "_dist_launch_progress":
    if "_dist_launch_progress" in sys.modules:
        _agent_copy = sys.modules["_dist_launch_progress"]
        step, enabled, pause = _agent_copy.step, _agent_copy.enabled, _agent_copy.pause
    else:
        reset()
