"""In-place recovery for torch.distributed jobs, with Horovod Elastic's contract: under
`dist-launch --restart-policy in-place` a failed worker is replaced alone, and the survivors keep
their processes, their imported torch and their state in memory. They catch the failed collective,
wait for the agent's next generation of the group, build a new process group with the
replacement, and every rank takes the state of the most senior survivor (the lowest rank that kept
its state) by broadcast, not from disk. Then the training function runs again from that state.

    import torch.distributed as dist
    from dist_launch import elastic

    elastic.init_process_group("gloo")               # instead of dist.init_process_group
    model = Net(); optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = elastic.TorchState(model=model, optimizer=optimizer, step=0)

    @elastic.run
    def train(state):
        ddp = DistributedDataParallel(state.model)   # what depends on the group: built in here
        while state.step < total_steps:
            loss = ddp(batch(state.step)).sum()       # the data follows from the counters
            state.optimizer.zero_grad(); loss.backward(); state.optimizer.step()
            state.step += 1
            state.commit()                            # the point a recovery rolls back to

    train(state)

The contract: `commit()` saves a copy of the state in memory (model, optimizer, counters); after a
peer's failure every survivor `restore()`s its last commit, then all ranks `sync()` from the root.
Commit after each step for a recovery that loses nothing (the step in flight is redone, so the job
ends with the weights of a run that never failed), or every few steps when a copy costs too much.
The function's arguments and what it builds itself (DDP, data iterators positioned from the
counters) are made again at each entry; `state.register_reset_callbacks([...])` runs callables
after each recovery.

A replacement (DIST_LAUNCH_GENERATION > 0) runs the same script: `init_process_group` joins the
generation the survivors are building instead of the job's first group, and `run` receives the
state before the function starts. (So call `elastic.init_process_group`, not torch's: torch's
would wait for the job's first group, and ours also notes the group's connections, which a
recovery shuts down so that a rank waiting on a live peer fails at once too.) Outside
dist-launch's in-place policy (`--restart-policy group`, torchrun) `init_process_group` is
torch's and `run` calls the function once: a failed collective is raised as usual, and the agent
restarts the group.

When a whole node is lost from an elastic job (`--nnodes MIN:MAX`), nobody replaces its workers:
the survivors go on in a smaller world, each at the rank its agent gives it (RANK, WORLD_SIZE,
GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK and ROLE_WORLD_SIZE in os.environ, and torch's
get_rank()/get_world_size(), change; LOCAL_RANK stays). A script that shards its data by rank
reads the rank inside the function, not once before it. A node that joins the job is taken in the
same way: the watcher aborts the collective in flight when the agents publish the next
generation, the function runs again in the larger world from the committed state, and the
newcomer's workers start as that generation and receive the state, as a replacement does.

A peer failing while the group rebuilds itself (over gloo) is folded into the recovery: the agent
publishes a later generation that replaces both, and every rank gives up the set-up under way
(its store connection and its peers' are shut down when that generation appears: torch 2.x prints
a warning with a C++ stack for the store's) and joins the later one; the survivors restore their
commit again first. A rank whose set-up failed waits FOLD_WAIT (10 s) for such a generation, then
the error stands. NCCL groups cannot give their set-up up: their jobs restart the group instead.

A rank that neither catches the failure nor leaves the failed group once the next generation is
published (the watcher has shut the group's connections down) while its process stays idle for
DIST_LAUNCH_STUCK_COLLECTIVE_S (10 s) is stuck in a collective that will not end: gloo does not
fail a send it had begun to write when its connection fails, and that send waits out the group's
timeout. The rank says so, writes its error file (with its main thread's stack) and exits 75; the
agent counts it as a failed worker (during a regroup: a group restart, saying why). A rank that
computes meanwhile (a long step before its next collective) is not idle and is left alone.

With NCCL (the default backend where CUDA is present) a failed peer leaves the survivors' kernels
waiting on the device, where no socket shutdown reaches them: the watcher aborts the group's
communicators (torch's ProcessGroup.abort, from its own thread) when the agent publishes the next
generation, and `commit()` waits for the step's device work and refuses a step that ran while its
group was aborted (its collectives ended without their peers' data), raising the peer's failure
instead, so the rank rolls back to its last good commit. TORCH_NCCL_ASYNC_ERROR_HANDLING is 0 in
such a worker unless the script's environment says otherwise (torch's default, 3, ends the whole
process when its watchdog sees the lost peer first), and the watchdog's minute of "time for
dumping" after each failed collective, the dump and the heartbeat monitor are off (see
_NCCL_IN_PLACE_ENVIRONMENT). A torch without an abort for NCCL cannot leave
a collective a lost peer never joins: the rank says so and exits at once (STUCK_EXIT_CODE), and the
agent restarts the group rather than wait out the collective's timeout.

The store keys and variables are dist-launch's worker contract
(contract/include/dist/contract/worker_contract.h), shared with the C++ SDK's
dist::sdk::InPlaceRecovery.
"""
from __future__ import annotations

import abc
import atexit
import collections
import copy
import datetime
import functools
import gc
import importlib
import importlib.util
import os
import re
import sys
import threading
import time
import traceback

from . import _sockets

__all__ = ["ObjectState", "State", "TorchState", "init_process_group", "in_place", "run"]

# The worker contract's variables for in-place recovery (dist/contract/worker_contract.h).
# BEGIN worker contract (contract/python_constants.py; do not edit)
_RESTART_POLICY_VARIABLE = "DIST_LAUNCH_RESTART_POLICY"
_IN_PLACE_POLICY = "in-place"
_GENERATION_VARIABLE = "DIST_LAUNCH_GENERATION"
_IN_PLACE_TIMEOUT_VARIABLE = "DIST_LAUNCH_IN_PLACE_TIMEOUT_MS"
_DEFAULT_IN_PLACE_TIMEOUT_MS = 300000
# END worker contract

# How long a survivor waits for the agent's next generation after its collective failed, past
# twice the agent's --in-place-timeout (_generation_timeout): the agent publishes it as soon as it
# reaps the failed worker, or, a node lost, once the nodes regrouped (their round, which may wait
# that timeout for a relaunched node, then the newcomers' workers, at most 4/5 of it), or stops
# every worker instead.
GENERATION_TIMEOUT = datetime.timedelta(seconds=60)
# Building a generation's group and receiving the state, when the agent does not say
# (dist-launch --in-place-timeout: it restarts the group past it, so no rank waits longer).
GROUP_TIMEOUT = datetime.timedelta(milliseconds=_DEFAULT_IN_PLACE_TIMEOUT_MS)


def _group_timeout() -> datetime.timedelta:
    """The agent's --in-place-timeout (read at each use: a warm zygote imports this module before
    a worker's environment is its own), else GROUP_TIMEOUT."""
    text = os.environ.get(_IN_PLACE_TIMEOUT_VARIABLE, "")
    try:
        ms = int(text)
    except ValueError:
        return GROUP_TIMEOUT
    return datetime.timedelta(milliseconds=ms) if ms > 0 else GROUP_TIMEOUT


def _generation_timeout() -> datetime.timedelta:
    """Twice the agent's --in-place-timeout, and GENERATION_TIMEOUT more."""
    return 2 * _group_timeout() + GENERATION_TIMEOUT

# How long a rank may stay in the failed group, idle, once the next generation is published and
# its connections are shut down (DIST_LAUNCH_STUCK_COLLECTIVE_S). Gloo does not fail a send it
# had begun to write when its connection fails (tcp::Pair::signalException fails the pending
# operations but not an unbound buffer's send queued for the socket): that send, and the
# collective around it, wait out the group's timeout. Such a rank leaves instead (see _Group).
STUCK_COLLECTIVE_S = float(os.environ.get("DIST_LAUNCH_STUCK_COLLECTIVE_S", "10"))
# The exit status of a rank that leaves so (any failure's would do: this one says which).
STUCK_EXIT_CODE = 75
# Below this share of a core (the process's CPU time over the wall time) a rank counts as idle.
_IDLE_CPU_SHARE = 0.05

# What a failed collective says when a peer is gone (gloo's transport, NCCL, torch's wrappers):
# the first nine come only from a backend; the others count only where torch raised the error
# (a script's own "read timed out" is its own).
_PEER_FAILURE_MARKERS = (
    "connection closed by peer", "connection reset by peer", "broken pipe", "socket closed",
    "gloo/", "nccl error", "processgroupgloo", "processgroupnccl", "ncclcomm",
    "nccl", "gloo", "timed out", "timeout", "processgroup", "aborted",
)


def in_place() -> bool:
    """True in a worker of a `dist-launch --restart-policy in-place` job."""
    return os.environ.get(_RESTART_POLICY_VARIABLE) == _IN_PLACE_POLICY


def _say(message: str) -> None:
    print(f"[dist_launch.elastic] {message}", file=sys.stderr, flush=True)


class _Group:
    """This worker's place in the job and the generations of its group (one per process)."""

    def __init__(self):
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.generation = int(os.environ.get(_GENERATION_VARIABLE, "0"))
        self.has_state = self.generation == 0  # a replacement receives it
        # A rank of the first generation whose set-up a later one superseded (a peer died in it):
        # its state is synchronised with the replacement's when run() begins (_form_first).
        self.needs_sync = False
        run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        # torch's TCPStore sends every key with "/" before it: these are the contract's
        # "/dist_launch/inplace/..." keys, which the agent and the C++ SDK use as they are.
        self.prefix = f"dist_launch/inplace/{run_id}/attempt_{restart}/"
        self.group_prefix = f"sdk/{run_id}/attempt_{restart}/"
        self.backend = None
        self.timeout = _group_timeout()
        self.last_root = -1
        self._store = None
        self._group_store = None  # the group's store connection (see join)
        # The group's own sockets (inodes: the ones its init opened), which the watcher shuts
        # down when the agent publishes the next generation: a rank whose collective waits on a
        # peer that is alive (it waits on the dead one in turn) fails then too, at once.
        self.sockets = set()
        self.recovering = False
        self.left_failed_group = False  # this generation's recovery has torn the old group down
        # NCCL: set (before the abort) once the group's communicators are aborted for the next
        # generation; a commit after it refuses the step (see _refuse_an_aborted_step).
        self.nccl_aborted = False
        self._aborted_group = None  # the torch group whose communicators were aborted
        self._abort_lock = threading.Lock()
        self.changed = threading.Condition()
        self._watcher = None
        self._watcher_connection = None  # the watcher's own connection to the store
        self._closing = False

    @property
    def store(self):
        """A client of the workers' store (MASTER_ADDR:MASTER_PORT), opened once."""
        if self._store is None:
            self._store = self._connect(self.timeout)
        return self._store

    def _connect(self, timeout):
        import torch.distributed as dist
        return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                             self.world_size, False, timeout=timeout)

    def generation_key(self, generation: int) -> str:
        return f"{self.prefix}gen/{generation}"

    def say_follows_folds(self) -> None:
        """Tells the agent that this rank follows a generation that supersedes the one it sets
        up (the contract's fold/<rank>): over gloo it does (_settle_in); an NCCL group's set-up
        cannot be given up. Said again under a new rank after a regroup."""
        if self.backend == "gloo":
            self.store.set(f"{self.prefix}fold/{self.rank}", "1")

    def init(self, **kwargs) -> None:
        """torch's init_process_group, noting the sockets it opened (the group's)."""
        import torch.distributed as dist
        self.store  # connected first: not one of the group's
        if self.backend == "nccl":  # read when torch builds the group (see the module's doc)
            for name, value in _NCCL_IN_PLACE_ENVIRONMENT.items():
                os.environ.setdefault(name, value)
        before = set(_sockets.socket_inodes())
        dist.init_process_group(self.backend, timeout=self.timeout, **kwargs)
        with self.changed:
            self.sockets = set(_sockets.socket_inodes()) - before

    def join(self, generation: int) -> None:
        """Builds generation `generation`'s process group (its keys apart from every other's),
        over a store connection of its own: a set-up that a later generation supersedes is ended
        by shutting down what it opened, that connection too (_Superseded). Generation 0, the
        job's first group, over env:// as any torchrun worker's (under a test's fault in it, as a
        later generation's: every rank of generation 0 alike)."""
        import torch.distributed as dist
        self.store  # (the shared one first: not the group's)
        if generation == 0 and not _fault_in_first_generation():
            self.init(init_method="env://")
        else:
            # (A store of Python's own lives while the group does: torch holds only its C++ half.)
            self._group_store = _with_fault(self._connect(self.timeout), self.rank, generation)
            store = dist.PrefixStore(f"{self.group_prefix}gen_{generation}/", self._group_store)
            self.init(store=store, rank=self.rank, world_size=self.world_size)
        with self.changed:
            self.generation = generation
            self.recovering = False
            self.left_failed_group = False
            self.nccl_aborted = False
            self.changed.notify_all()

    def watch(self) -> None:
        """Starts the watcher (once): a thread blocked on a connection of its own to the store
        (_sockets.GenerationWaiter, not torch's client: torch prints a warning and a C++ stack
        when the connection it waits on is shut down, which this one is at every exit). It is
        stopped before the interpreter's exit (atexit), while the interpreter still runs threads:
        a daemon thread that wakes once it is finalizing is ended by pthread_exit."""
        if self._watcher is None:
            self._watcher_connection = _sockets.GenerationWaiter(
                os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                _group_timeout().total_seconds())
            self._watcher = threading.Thread(target=self._watch, name="dist_launch.elastic",
                                             daemon=True)
            self._watcher.start()
            atexit.register(self._stop_watching)

    def _watch(self) -> None:
        try:
            while True:
                with self.changed:
                    following = self.generation + 1
                self._watcher_connection.wait(self.generation_key(following))
                with self.changed:
                    if self._closing:
                        return
                    fresh = self.generation < following and not self.recovering
                    if fresh:
                        _sockets.shut_down(self.sockets)  # the peers' own watchers wake them
                        self.nccl_aborted = self.backend == "nccl"
                if fresh and self.backend == "nccl":  # outside the lock: it can take a while
                    self.abort_nccl(following)
                with self.changed:
                    if self._stuck_in_failed_group(following):
                        self._leave_stuck(following)
                    self.changed.wait_for(lambda: self.generation >= following or self._closing)
        except OSError:  # the store went with the job, or the process is leaving
            return

    def _stuck_in_failed_group(self, following: int) -> bool:
        """Waits (holding self.changed) until this rank has left the failed group: True when it
        has not after STUCK_COLLECTIVE_S in a row of an idle process. A rank that computes
        (a long step before its next collective) is not idle, and one that waits in the new
        group has left the old one."""
        def left():
            return self.generation >= following or self.left_failed_group or self._closing

        window_start, cpu_start = time.monotonic(), time.process_time()
        while not left():
            self.changed.wait(timeout=min(1.0, STUCK_COLLECTIVE_S))
            now, cpu = time.monotonic(), time.process_time()
            if left():
                return False
            if cpu - cpu_start > _IDLE_CPU_SHARE * (now - window_start):
                window_start, cpu_start = now, cpu  # it computes: not stuck
            elif now - window_start >= STUCK_COLLECTIVE_S:
                return True
        return False

    def abort_nccl(self, following: int) -> None:
        """Aborts the default group's NCCL communicators (once per group, from any thread): its
        kernels waiting for a lost peer end. Without an abort in this torch the rank leaves."""
        import torch.distributed as dist
        with self._abort_lock:
            if not dist.is_initialized():
                return
            group = dist.distributed_c10d._get_default_group()
            if group is self._aborted_group:
                return
            began = time.monotonic()
            if not _abort_group(group):
                import torch
                self._leave(f"rank {self.rank}: torch {torch.__version__} has no abort for an "
                            f"NCCL group, so a collective that a lost peer never joins cannot "
                            f"end before its timeout ({self.timeout.total_seconds():g} s); "
                            f"leaving, so that the agent restarts the group at once")
            self._aborted_group = group
        _say(f"rank {self.rank}: NCCL communicators of generation {following - 1} aborted in "
             f"{(time.monotonic() - began) * 1000:.0f} ms")

    def _leave_stuck(self, following: int) -> None:
        self._leave(f"rank {self.rank} stayed in a collective of the failed group, idle, "
                    f"{STUCK_COLLECTIVE_S:g} s after generation {following} was published and "
                    f"its connections were shut down (gloo does not fail a send it had begun "
                    f"when its connection fails: it waits out the group's timeout, "
                    f"{self.timeout.total_seconds():g} s); leaving, so that the agent starts it "
                    f"again")

    def _leave(self, message: str) -> None:
        """Says why, writes the error file (torch's @record format: the failure report's root
        cause) and exits: the agent counts this rank as failed, as it would a crashed one."""
        main = sys._current_frames().get(threading.main_thread().ident)
        where = "".join(traceback.format_stack(main)) if main else ""
        _say(message)
        if where:
            _say(f"rank {self.rank}'s main thread:\n{where.rstrip()}")
        from ._function_worker import write_error_file
        write_error_file(f"RuntimeError: {message}", where)
        sys.stdout.flush()
        os._exit(STUCK_EXIT_CODE)

    def _stop_watching(self) -> None:
        """At exit: wakes the watcher (its connection shut down: the wait fails) and joins it."""
        with self.changed:
            self._closing = True
            self.changed.notify_all()
        self._watcher_connection.wake()
        self._watcher.join(timeout=10)
        self._watcher_connection.close()

    def device(self):
        import torch
        if self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")


# Fault injection for the recovery tests (the C++ SDK's DIST_SDK_FAULT=exit-after-publishing):
# with DIST_LAUNCH_FAULT=exit-after-publishing:RANK:GENERATION in its environment, that rank exits
# (code 6) as soon as gloo has published its addresses for that generation's group, before it
# connects to any peer: a peer dying in the one window of a set-up that nothing else can place
# (each survivor on the listening side of its pair with it then waits for a connection that never
# comes).
_FAULT_VARIABLE = "DIST_LAUNCH_FAULT"


def _fault_in_first_generation() -> bool:
    """Whether DIST_LAUNCH_FAULT places a death in generation 0's set-up (of any rank)."""
    return re.fullmatch(r"exit-after-publishing:\d+:0", os.environ.get(_FAULT_VARIABLE, "")) \
        is not None


def _with_fault(store, rank: int, generation: int):
    """`store`, or, where DIST_LAUNCH_FAULT says so for this rank and generation, a store that
    forwards to it and exits once gloo published this rank's addresses through it (the key that
    is the rank's number alone; torch's own keys end otherwise)."""
    if os.environ.get(_FAULT_VARIABLE) != f"exit-after-publishing:{rank}:{generation}":
        return store
    import torch.distributed as dist

    class ExitAfterPublishing(dist.Store):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def set(self, key, value):
            self.inner.set(key, value)
            if key.rsplit("/", 1)[-1] == str(rank):
                sys.stderr.write(f"rank {rank}: exiting after publishing this rank's addresses "
                                 f"({_FAULT_VARIABLE})\n")
                sys.stderr.flush()
                os._exit(6)

        def get(self, key):
            return self.inner.get(key)

        def add(self, key, amount):
            return self.inner.add(key, amount)

        def compare_set(self, key, expected, desired):
            return self.inner.compare_set(key, expected, desired)

        def delete_key(self, key):
            return self.inner.delete_key(key)

        def num_keys(self):
            return self.inner.num_keys()

        def set_timeout(self, timeout):
            return self.inner.set_timeout(timeout)

        def wait(self, keys, timeout=None):
            return self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

    return ExitAfterPublishing(store)


# What a torch NCCL group of an in-place worker is built with, unless the script's environment
# says otherwise (read when torch builds each group). Each default would end or stall a survivor:
# - the watchdog's error handling: 3 ends the whole process when it sees a lost peer, before the
#   survivor can recover; 0 only notes it, and the abort is the watcher's;
# - the watchdog's wait after each failed collective ("time for dumping", 4 x
#   TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC: 60 s, once per collective in flight when the peer was
#   lost): the failed group's destructor joins that thread, so on an H200 a survivor that had
#   trained to the end did not exit;
# - the flight recorder's dump, and the heartbeat monitor, which acts on the dump's signal (a key
#   in the job's store, which the next generation shares: a new rank was told to dump) and ends
#   a process whose watchdog seems stuck (the agent's hang detection is the job's).
_NCCL_IN_PLACE_ENVIRONMENT = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0",
    "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "1",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
    "TORCH_NCCL_ENABLE_MONITORING": "0",
}


def _abort_group(group) -> bool:
    """Aborts `group`'s communicators (torch's ProcessGroup.abort, 2.6 and later, else its NCCL
    backend's): False when this torch has neither."""
    abort = getattr(group, "abort", None)
    if abort is None:
        try:
            import torch
            abort = getattr(group._get_backend(torch.device("cuda")), "abort", None)
        except (AttributeError, RuntimeError):
            abort = None
    if abort is None:
        return False
    abort()
    return True


def _group_error():
    """The default group's NCCL error as torch's watchdog saw it ("SUCCESS", "REMOTE_ERROR",
    "TIMEOUT", ...), or None where this torch cannot say (ProcessGroupNCCL.get_error)."""
    import torch
    import torch.distributed as dist
    try:
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda"))
        error = backend.get_error()
    except (AttributeError, RuntimeError, ValueError):
        return None
    return getattr(error, "name", str(error))


class _StepOfAnAbortedGroup(RuntimeError):
    """A step whose collectives ran while the group's NCCL communicators were aborted."""


def _refuse_an_aborted_step() -> None:
    """Under in-place NCCL: waits for the step's device work, then raises the peer's failure if
    the group was aborted meanwhile, or torch's watchdog saw it fail (its collectives ended
    without the lost peer's data, so the step's gradients are not the job's). The abort is noted
    before it is made, so a step whose device work ended before this check and after the abort
    is always caught."""
    g = _group
    if g is None or g.backend != "nccl":
        return
    import torch
    torch.cuda.current_stream().synchronize()
    with g.changed:
        aborted = g.nccl_aborted
    if aborted or _group_error() not in (None, "SUCCESS"):
        raise _StepOfAnAbortedGroup(
            f"rank {g.rank}: the NCCL group of generation {g.generation} was aborted or failed "
            f"during this step (a peer was lost); the step is not committed")


_group = None


def _this_group() -> _Group:
    global _group
    if _group is None:
        _group = _Group()
    return _group


# What a training script's set-up imports after init_process_group, which a newcomer imports
# before it says it arrived: torch 2.x's optimizers import torch._dynamo when the first one is
# built (4 s of a 2-core machine), which the running workers, already waiting for the newcomer in
# the new group, would otherwise wait out (the --warm-restart zygote preloads it too).
_LAZY_MODULES = ("torch._dynamo",)


def _import_lazy_modules() -> None:
    for name in _LAZY_MODULES:
        try:
            if importlib.util.find_spec(name) is not None:
                importlib.import_module(name)
        except Exception:  # noqa: BLE001 (a module that cannot be imported is the script's)
            pass


def init_process_group(backend: str | None = None, timeout: datetime.timedelta | None = None):
    """torch.distributed.init_process_group for the job's workers: the job's first group (env://),
    or for a replacement the generation the survivors are building."""
    import torch
    import torch.distributed as dist
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if not in_place():
        kwargs = {} if timeout is None else {"timeout": timeout}
        return dist.init_process_group(backend, **kwargs)
    g = _this_group()
    g.backend = backend
    if timeout is not None:
        g.timeout = timeout
    if g.generation > 0:  # a newcomer or a replacement: its set-up imports before it arrives
        _import_lazy_modules()
    # What is alive now (the modules, torch's included) stays alive: frozen, the full collection
    # of each recovery (which frees the failed group's DDP) skips it: 0.2 s less of the
    # survivors' stall with torch 2.x.
    gc.freeze()
    # ... and rejoins the collector for the interpreter's shutdown (atexit: after the handlers
    # registered later, the watcher's stop among them). Left frozen, extension modules that count
    # their objects at shutdown call them leaked (triton's nanobind, imported with torch._dynamo
    # by a replacement: about 30 lines at each exit), as the zygote's workers' were (_zygote.py).
    atexit.register(gc.unfreeze)
    g.say_follows_folds()
    if g.generation == 0:
        return _form_first(g)
    # Here (imports done, the lazy ones too): a regroup's generation is published once every rank
    # of the new world is, so that the running workers train on while this one starts.
    g.store.set(f"{g.generation_key(g.generation)}/arrived/{g.rank}", "1")
    _settle_in(g, None, g.generation)


class State(abc.ABC):
    """What a recovery restores and synchronises: `save`/`restore` keep and bring back a copy in
    memory, `sync(root)` makes every rank's state the root's. Subclasses say what the state is."""

    def __init__(self):
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks) -> None:
        """Callables run on every rank after each recovery (after the state is synchronised)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """The point a recovery rolls back to: a copy of the state, in memory."""
        _refuse_an_aborted_step()
        self.save()

    @abc.abstractmethod
    def save(self) -> None: ...

    @abc.abstractmethod
    def restore(self) -> None: ...

    @abc.abstractmethod
    def sync(self, root: int = 0) -> None: ...

    def describe(self) -> str:
        return ""


def _stateful(value) -> bool:
    """Whether `value` keeps its state behind state_dict()/load_state_dict() (torch's Stateful: an
    LR scheduler, a GradScaler, a stateful data loader): saved and restored through them, so the
    object itself, and what it is bound to (a scheduler's optimizer), stays the one training uses."""
    return callable(getattr(value, "state_dict", None)) and \
        callable(getattr(value, "load_state_dict", None))


def _load(value, state) -> None:
    """`value.load_state_dict(state)`, except for an empty state: nothing to load (what a disabled
    GradScaler saves, and refuses to load)."""
    if state != {}:
        value.load_state_dict(state)


class ObjectState(State):
    """Counters and other picklable values, as attributes: `ObjectState(epoch=0, batch=0)`. A
    value with state_dict() and load_state_dict() (an LR scheduler, a GradScaler) is saved, restored
    and synchronised through them: it stays the same object, bound to the same optimizer. A sync
    gives every rank the root's values: a rank's own (its shard, a DistributedSampler and its
    rank) are made from the rank after it, not kept here."""

    def __init__(self, **values):
        super().__init__()
        self._names = list(values)
        for name, value in values.items():
            setattr(self, name, value)
        self._saved_values = {}
        ObjectState.save(self)

    def _values(self):
        return {name: getattr(self, name) for name in self._names}

    def _state(self):
        """The values as they are saved and sent: a stateful one by its state_dict()."""
        return {name: value.state_dict() if _stateful(value) else value
                for name, value in self._values().items()}

    def _set(self, state) -> None:
        for name, value in state.items():
            current = getattr(self, name)
            if _stateful(current):
                _load(current, value)
            else:
                setattr(self, name, value)

    def save(self) -> None:
        self._saved_values = copy.deepcopy(self._state())

    def restore(self) -> None:
        self._set(copy.deepcopy(self._saved_values))

    def sync(self, root: int = 0) -> None:
        import torch.distributed as dist
        values = _broadcast_object(self._state() if dist.get_rank() == root else None, root)
        if dist.get_rank() != root:
            self._set(values)

    def describe(self) -> str:
        return " ".join(f"{name}={getattr(self, name)}" for name in self._names
                        if isinstance(getattr(self, name), (int, float, str)))


class TorchState(ObjectState):
    """A model, an optimizer and counters: `TorchState(model=m, optimizer=opt, step=0)`. The
    model's parameters and buffers are broadcast in place (the optimizer keeps referring to
    them); the optimizer's state goes as an object; a restore also drops the gradients a failed
    backward left half-reduced.

    With `rng_state` (the default) a commit also keeps this rank's random number generators
    (torch's, CUDA's where CUDA is in use, Python's `random`, numpy's where it is imported) and a
    restore puts them back: the steps a survivor trains again draw the numbers they drew the
    first time (dropout, a DataLoader's shuffle from torch's default generator), as in a run that
    never failed (a generator of the script's own is its own to keep). They are the
    rank's own: a sync sends none (ranks often seed by rank), so a replacement draws from its own.
    (A DataLoader's iterator made again after a recovery draws its workers' seed from torch's
    generator once more than the uninterrupted run: give the DataLoader a generator of its own.)"""

    def __init__(self, model=None, optimizer=None, rng_state=True, **values):
        self.model = model
        self.optimizer = optimizer
        self._saved_model = None
        self._saved_optimizer = None
        self._keeps_rng = rng_state
        self._saved_rng = None
        super().__init__(**values)
        self.save()

    def save(self) -> None:
        """Copies into the buffers of the last save where the tensors kept their shape, type and
        device (every commit after the first, in a training loop): no allocation, one memory copy
        per tensor."""
        import torch
        super().save()
        with torch.no_grad():
            if self.model is not None:
                self._saved_model = _copy_into(self._saved_model, self.model.state_dict())
            if self.optimizer is not None:
                self._saved_optimizer = _copy_into(self._saved_optimizer,
                                                   self.optimizer.state_dict())
        if self._keeps_rng:
            self._saved_rng = _rng_states()

    def restore(self) -> None:
        super().restore()
        if self.model is not None:
            self.model.load_state_dict(self._saved_model)
            for p in self.model.parameters():
                p.grad = None
        if self.optimizer is not None:
            _load_optimizer(self.optimizer, copy.deepcopy(self._saved_optimizer), "the saved")
        if self._saved_rng is not None:
            _set_rng_states(self._saved_rng)

    def sync(self, root: int = 0) -> None:
        import torch
        import torch.distributed as dist
        super().sync(root)
        if self.model is not None:
            device = _this_group().device() if in_place() else None
            entries = self.model.state_dict()
            # A module's extra state (get_extra_state(): any object) goes as an object.
            extra = {k: v for k, v in entries.items() if not isinstance(v, torch.Tensor)}
            if extra:
                extra = _broadcast_object(extra, root)
                if dist.get_rank() != root:
                    self.model.load_state_dict(extra, strict=False)
            with torch.no_grad():
                for tensor in entries.values():
                    if not isinstance(tensor, torch.Tensor):
                        continue
                    if device is not None and tensor.device != device:
                        staged = tensor.to(device)
                        dist.broadcast(staged, src=root)
                        tensor.copy_(staged)
                    else:
                        dist.broadcast(tensor, src=root)
            for p in self.model.parameters():
                p.grad = None
        if self.optimizer is not None:
            state = _broadcast_object(self.optimizer.state_dict() if dist.get_rank() == root
                                      else None, root)
            if dist.get_rank() != root:
                _load_optimizer(self.optimizer, state, f"rank {root}'s")


def _load_optimizer(optimizer, state, whose: str) -> None:
    """optimizer.load_state_dict(state), saying what to do when its groups differ."""
    try:
        optimizer.load_state_dict(state)
    except ValueError as e:
        if len(state["param_groups"]) == len(optimizer.param_groups):
            raise
        raise ValueError(
            f"{whose} optimizer state has {len(state['param_groups'])} parameter groups, this "
            f"one {len(optimizer.param_groups)}: a group added while training (add_param_group) "
            f"is added again in the function elastic.run calls (by the state's counters), and "
            f"committed at once") from e


def _broadcast_object(value, root: int):
    """Rank `root`'s `value` on every rank, through torch.save (torch's broadcast_object_list
    needs numpy, which a job need not have; and puts a CUDA tensor on the root's device: here
    each rank's own)."""
    import ctypes
    import io

    import torch
    import torch.distributed as dist
    if in_place():
        device = _this_group().device()
    elif dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    data = b""
    if dist.get_rank() == root:
        out = io.BytesIO()
        torch.save(value, out)
        data = out.getvalue()
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=root)
    payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
        torch.empty(int(size.item()), dtype=torch.uint8)
    staged = payload.to(device)
    dist.broadcast(staged, src=root)
    if dist.get_rank() == root:
        return value
    raw = staged.cpu()
    # A CUDA tensor onto this rank's device (not the root's); the others stay where they were.
    here = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_initialized() else None
    where = {f"cuda:{i}": here for i in range(torch.cuda.device_count())} if here else None
    return torch.load(io.BytesIO(ctypes.string_at(raw.data_ptr(), raw.numel())),
                      map_location=where, weights_only=False)


def _rng_states():
    """This process's random number generators' states: torch's CPU generator, CUDA's (only
    where CUDA is initialised already: reading them must not start it), Python's, numpy's global
    one (only where numpy is imported)."""
    import random

    import torch
    states = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_initialized():  # is_available() would start the driver on a CPU rank
        states["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        states["numpy"] = numpy.random.get_state()
    return states


def _set_rng_states(states):
    import random

    import torch
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])
    if "numpy" in states:
        sys.modules["numpy"].random.set_state(states["numpy"])


def _copy_into(saved, value):
    """A copy of `value` (a state dict: dicts, lists, tensors, numbers) that reuses `saved`, the
    copy of an earlier one, wherever a tensor has the same shape, type and device: copied into in
    place. Nothing of the result is shared with `value`."""
    import torch
    if isinstance(value, torch.Tensor):
        if (isinstance(saved, torch.Tensor) and saved.shape == value.shape and
                saved.dtype == value.dtype and saved.device == value.device and
                saved.layout == value.layout == torch.strided and not value.is_sparse):
            return saved.copy_(value)
        return value.detach().clone()
    if type(value) in (dict, collections.OrderedDict):  # a state dict's own; others: deepcopy
        old = saved if isinstance(saved, dict) else {}
        return type(value)((k, _copy_into(old.get(k), v)) for k, v in value.items())
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        old = saved if isinstance(saved, type(value)) and len(saved) == len(value) else None
        return type(value)(_copy_into(old[i] if old is not None else None, v)
                           for i, v in enumerate(value))
    return copy.deepcopy(value)


def _raised_in(error: BaseException):
    """Where `error` came from: "data" where the innermost frame of torch's utils/data or
    distributed code in its traceback is utils/data's (a collective a sampler calls from inside a
    DataLoader is still a collective), "torch" where it is distributed's or the innermost frame
    of all is torch's (a backward, DDP), None where the script raised it (in a forward too)."""
    import torch
    torch_root = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    data = os.path.join(torch_root, "utils", "data") + os.sep
    distributed = os.path.join(torch_root, "distributed") + os.sep
    innermost, deepest = None, ""
    tb = error.__traceback__
    while tb is not None:
        deepest = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if deepest.startswith(data):
            innermost = "data"
        elif deepest.startswith(distributed):
            innermost = "torch"
        tb = tb.tb_next
    return innermost or ("torch" if deepest.startswith(torch_root) else None)


def _is_peer_failure(error: BaseException) -> bool:
    """Whether `error` is a collective's failure because a peer is gone: then the rank recovers in
    place; anything else is its own failure and ends it (the agent replaces it)."""
    import torch.distributed as dist
    if isinstance(error, _StepOfAnAbortedGroup):
        return True
    backend_error = getattr(dist, "DistBackendError", None)
    if backend_error is not None and isinstance(error, backend_error):
        return True
    if not isinstance(error, RuntimeError):
        return False
    # A DataLoader that timed out ("DataLoader timed out after 60 seconds") or whose workers died,
    # or the script's own error, is this rank's own: waiting for a generation that no peer's
    # failure will publish would stall the whole job.
    text, part = str(error).lower(), _raised_in(error)
    if part == "data":
        return False
    return any(marker in text for marker in _PEER_FAILURE_MARKERS[:9 if part is None else None])


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def _synchronize(g: _Group, state: State) -> int:
    """Every rank takes the state of the lowest rank that kept its own; returns that rank."""
    import torch
    import torch.distributed as dist
    facts = torch.tensor([g.rank if g.has_state else g.world_size], dtype=torch.int64,
                         device=g.device())
    dist.all_reduce(facts, op=dist.ReduceOp.MIN)
    root = int(facts.item())
    if root >= g.world_size:
        raise RuntimeError(f"in-place recovery of generation {g.generation}: no rank kept its "
                           "state, so there is nothing to recover from")
    state.sync(root)
    state.save()  # the state every rank holds now is the next recovery's restore point
    g.has_state = True
    g.last_root = root
    return root


def _take_new_rank(g: _Group, generation: int) -> None:
    """Generation `generation`'s record: a replacement's changes no rank; a regroup's (a node was
    lost, its survivors go on in a smaller world) moves this rank to where its agent's key says
    (the contract's regroup/<round>/from/<first rank of this node>)."""
    g.store.wait([g.generation_key(generation)], _generation_timeout())
    record = g.store.get(g.generation_key(generation)).decode()
    match = re.match(r"regrouped round=(\d+) world=(\d+)(?: nodes=(\d+))?", record)
    if not match:
        return
    regroup_round, world = int(match.group(1)), int(match.group(2))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    place = f"{g.prefix}regroup/{regroup_round}/from/{g.rank - local_rank}"
    try:
        g.store.wait([place], _generation_timeout())
    except Exception as e:
        raise RuntimeError(f"rank {g.rank}: generation {generation} regrouped the job in round "
                           f"{regroup_round} without a place for this node's workers "
                           f"({_first_line(e)})") from e
    value = g.store.get(place).decode()
    try:
        offset, node_rank = (int(v) for v in value.split())
    except ValueError:
        offset = node_rank = -1
    if offset < 0 or offset + local_world > world:
        raise RuntimeError(f"rank {g.rank}: the regrouped place {place} cannot be read: "
                           f"{value!r} (world {world})")
    _say(f"rank {g.rank} is rank {offset + local_rank} of {world} from generation {generation} "
         f"(the job regrouped in round {regroup_round})")
    g.rank, g.world_size = offset + local_rank, world
    g.say_follows_folds()
    # What the script reads of its place follows (torch's own get_rank() does, from the group).
    os.environ.update(RANK=str(g.rank), WORLD_SIZE=str(world), GROUP_RANK=str(node_rank),
                      ROLE_RANK=str(g.rank), ROLE_WORLD_SIZE=str(world))
    if match.group(3):
        os.environ["GROUP_WORLD_SIZE"] = match.group(3)


# How long a rank whose set-up of a generation failed (a peer's connection closed) waits for the
# generation the agent folds that peer's failure into, before the error stands (the SDK's
# kFoldWait).
FOLD_WAIT = datetime.timedelta(seconds=10)


class _Superseded:
    """While this rank sets up generation `generation` (its group, then the root's state), a
    watch on a connection of its own for the generation after it: the agent publishes one when
    it folds a failure into this recovery (a peer died before the group formed, and the set-up
    would wait for it for the group's timeout). Then what the set-up opened since it began (its
    store connection, its peers') is shut down for reading, and the set-up fails at once. The
    listening side of a pair whose peer died between publishing its address and connecting (or
    left its own set-up before connecting to this rank) waits for a connection: its listening
    socket is connected to in the place of every other rank, the replaced ones first
    (_sockets.connect_in_place_of), and the pair waiting fails. A rank whose set-up still stays idle
    STUCK_COLLECTIVE_S leaves (STUCK_EXIT_CODE): the agent starts it again, or restarts the
    group, at once rather than after the job's --in-place-timeout."""

    def __init__(self, g: _Group, generation: int):
        self.g, self.generation = g, generation
        self.fired = False
        self._over = threading.Event()
        self._lock = threading.Lock()

    def __enter__(self):
        self._waiter = _sockets.GenerationWaiter(os.environ["MASTER_ADDR"],
                                                 int(os.environ["MASTER_PORT"]),
                                                 _group_timeout().total_seconds())
        self._before = set(_sockets.socket_inodes())  # its own connection among them: left alone
        self._thread = threading.Thread(target=self._watch, name="dist_launch.elastic fold",
                                        daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        try:
            self._waiter.wait(self.g.generation_key(self.generation + 1))
        except OSError:  # the set-up is over (__exit__), or the store is gone
            return
        # Superseded: until the set-up gives up, what it has opened and opens next (it may not
        # have begun yet) is shut down, and each listening socket it opens is connected to in
        # the place of the peers it may wait for. A set-up left idle STUCK_COLLECTIVE_S even so
        # waits for what will never come: the rank leaves, and the agent starts it again (or
        # restarts the group) at once. Idle by the main thread's CPU time: the watch's own (a
        # few /proc reads a pass) is not the set-up's work.
        main_cpu = functools.partial(time.clock_gettime,
                                     time.pthread_getcpuclockid(threading.main_thread().ident))
        stand_in_for = None  # the ranks to connect in place of (_sockets.connect_in_place_of)
        handled = set()  # the listening sockets connected to
        fired_at = window_start = time.monotonic()
        cpu_start = main_cpu()
        while True:
            with self._lock:
                if self._over.is_set():
                    return
                self.fired = True
                opened = set(_sockets.socket_inodes()) - self._before
                _sockets.shut_down(opened, store_too=True)
                listening = _sockets.listening(opened)
                if listening and stand_in_for is None:
                    stand_in_for = self._ranks_to_stand_in_for()
                for inode, address in listening.items():
                    if inode in handled:
                        continue
                    handled.add(inode)
                    # One listening socket: a device's, which tells its pairs apart by the
                    # number written; several: a pair's each, which takes any connection.
                    ranks = stand_in_for if len(listening) == 1 else stand_in_for[:1]
                    _sockets.connect_in_place_of(ranks, address, self._over)
            now = time.monotonic()
            if self._over.wait(0.05 if now - fired_at < 1 else 0.25):
                return
            now, cpu = time.monotonic(), main_cpu()
            if cpu - cpu_start > _IDLE_CPU_SHARE * (now - window_start):
                window_start, cpu_start = now, cpu  # it computes: not stuck
            elif now - window_start >= STUCK_COLLECTIVE_S:
                with self._lock:
                    if not self._over.is_set():
                        self._leave_stuck()

    def _ranks_to_stand_in_for(self) -> list[int]:
        """Every rank but this one, those the superseding generation replaces first (its
        record: "replaced=2,5 ..."): a pair of this set-up may wait for any of them, the dead
        peer's or a survivor's that left its set-up at the dead peer's pair (gloo connects the
        pairs in rank order) before connecting to this one."""
        try:
            record = self.g.store.get(self.g.generation_key(self.generation + 1)).decode()
        except Exception:  # noqa: BLE001 (the store is gone: the job is)
            record = ""
        match = re.match(r"replaced=([\d,]+)", record)
        replaced = sorted({int(r) for r in match.group(1).split(",")}) if match else []
        others = [r for r in range(self.g.world_size) if r not in replaced]
        return [r for r in replaced + others if r != self.g.rank]

    def _leave_stuck(self) -> None:
        import torch
        self.g._leave(
            f"rank {self.g.rank}: generation {self.generation}'s set-up stayed idle "
            f"{STUCK_COLLECTIVE_S:g} s after generation {self.generation + 1} superseded it and "
            f"what it had opened was shut down: it waits for a peer that will never come (with "
            f"torch {torch.__version__}'s gloo, that wait may have no end but the group's "
            f"timeout); leaving, so that the agent starts this rank again rather than wait out "
            f"the group's timeout ({self.g.timeout.total_seconds():g} s)")

    def __exit__(self, *_):
        with self._lock:
            self._over.set()
        self._waiter.wake()
        self._thread.join()
        self._waiter.close()
        return False


def _form_first(g: _Group) -> None:
    """Generation 0's group, formed as a later generation's is (_settle_in): a peer that dies in
    its set-up (before it published its address, or before it connected) used to leave every
    other rank waiting for it until --in-place-timeout (the agent replaces it in generation 1,
    which nobody followed), or fail the set-up and so the whole group. Now that generation
    supersedes the set-up and this rank follows it; its state is synchronised with the
    replacement's, and the agent told the group is whole, when run() begins (needs_sync)."""
    _settle_in(g, None, 0)
    g.needs_sync = g.generation > 0


def _settle_in(g: _Group, state: State | None, generation: int, joined: bool = False):
    """Builds generation `generation`'s group (unless `joined`) and, with a `state`, takes the
    root's; returns the root. A set-up that a later generation supersedes (_Superseded), or that
    fails while one comes within FOLD_WAIT (the agent folded a peer's failure into this
    recovery), is given up for that one, as often as it comes; a survivor restores its last
    commit again first (a broadcast cut short may have written part of the root's state). NCCL
    groups do not follow (say_follows_folds): their set-up is as before, its error the job's."""
    import torch.distributed as dist
    if g.backend != "gloo":
        if not joined:
            g.join(generation)
        return _synchronize(g, state) if state is not None else None
    while True:
        later = _generation_to_follow(g, generation, True)  # superseded before it began
        if later is not None:
            _say(f"rank {g.rank}: generation {generation} was superseded before its set-up "
                 f"began; joining generation {later} (a failure folded into the recovery)")
            _follow(g, state, generation, later)
            generation, joined = later, False
            continue
        guard = _Superseded(g, generation)
        try:
            with guard:
                if not joined:
                    g.join(generation)
                return _synchronize(g, state) if state is not None else None
        except Exception as error:  # noqa: BLE001 (followed only when a later generation comes)
            # (An error of the rank's own, not a peer's, is no fold's: it stands at once.)
            later = None
            if guard.fired or _is_peer_failure(error):
                later = _generation_to_follow(g, generation, guard.fired)
            if later is None:
                raise
            _say(f"rank {g.rank}: generation {generation}'s group did not form "
                 f"({_first_line(error)}); joining generation {later}, which supersedes it (a "
                 f"failure folded into the recovery)")
        _follow(g, state, generation, later)
        generation, joined = later, False


def _follow(g: _Group, state: State | None, generation: int, later: int) -> None:
    """Leaves what is left of generation `generation`'s set-up for generation `later`."""
    import torch.distributed as dist
    with g.changed:  # (the watcher: this rank has left that group, and is recovering)
        g.recovering = True
        g.left_failed_group = True
        g.changed.notify_all()
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 (a group that never formed)
            pass
    # torch names each group (and, 1.13, its store barrier's key) by how many this process
    # made since its default group was last destroyed, and counts a set-up cut short before
    # that group existed: the next one must be named as every other rank's is.
    if hasattr(dist.distributed_c10d, "_group_count"):
        dist.distributed_c10d._group_count = 0
    for following in range(generation + 1, later + 1):
        _take_new_rank(g, following)
    if g.has_state and state is not None:
        state.restore()


def _generation_to_follow(g: _Group, generation: int, superseded: bool) -> int | None:
    """The latest generation, once the counter has passed `generation` (at once when it was
    superseded; else within FOLD_WAIT); None when none came."""
    deadline = time.monotonic() + (0 if superseded else FOLD_WAIT.total_seconds())
    while True:
        try:
            latest = int(g.store.add(f"{g.prefix}generation", 0))
        except Exception:  # noqa: BLE001 (the store went with the job: the error stands)
            return None
        if latest > generation:
            return latest
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def _recover(g: _Group, state: State, error: BaseException) -> None:
    import torch.distributed as dist
    failed_at = time.monotonic()
    marks = [("failed", failed_at)]  # where the survivor's stall went, said with its recovery
    following = g.generation + 1
    _say(f"rank {g.rank}: a collective failed ({_first_line(error)}); waiting for generation "
         f"{following} of the group")
    # The failed group's connections are shut down for reading (whatever else of this process
    # still waits on them fails now) but neither closed nor shut down for writing until this
    # rank is in the next generation's group: a peer may still be inside a collective of the
    # failed group, and a send gloo begins to a closed socket (reset) never fails, nor the
    # collective around it. The peers leave when their watchers see the next generation.
    with g.changed:
        g.recovering = True
        _sockets.shut_down(g.sockets)
        g.sockets = set()
    failed_group = dist.distributed_c10d._get_default_group() if dist.is_initialized() else None
    if g.backend == "nccl":  # its kernels may still wait for the lost peer: a destroy would too
        g.abort_nccl(following)
    forget = dist.destroy_process_group
    if g.backend == "nccl" and hasattr(dist.distributed_c10d, "_abort_process_group"):
        forget = dist.distributed_c10d._abort_process_group  # no finalize of aborted communicators
    try:
        forget()
    except Exception:
        pass
    gc.collect()  # what held the old group (a DDP wrapper in the failed frames) goes with it
    with g.changed:
        g.left_failed_group = True
        g.changed.notify_all()
    marks.append(("teardown", time.monotonic()))
    try:
        g.store.wait([g.generation_key(following)], _generation_timeout())
    except Exception as e:
        raise RuntimeError(f"{error}; and no generation {following} of the group came from the "
                           f"agent ({_first_line(e)})") from error
    latest = max(following, g.store.add(f"{g.prefix}generation", 0))
    for generation in range(following, latest + 1):
        _take_new_rank(g, generation)
    marks.append(("generation", time.monotonic()))
    state.restore()
    root = _settle_in(g, state, latest)
    del failed_group  # every peer has left it: it closes now
    marks.append(("group and state", time.monotonic()))
    if g.rank == root:  # the agent's word that the group is whole again
        g.store.set(f"{g.prefix}gen/{g.generation}/recovered",
                    f"root={root} wall_ns={time.time_ns()} {state.describe()}".strip())
    state.on_reset()
    marks.append(("state", time.monotonic()))
    elapsed_ms = (time.monotonic() - failed_at) * 1000
    spent = ", ".join(f"{what} {(t - before) * 1000:.0f}"
                      for (_, before), (what, t) in zip(marks, marks[1:]))
    _say(f"rank {g.rank} recovered in place: generation {g.generation}, state from rank {root} "
         f"({state.describe()}), {elapsed_ms:.1f} ms after its collective failed ({spent} ms)")


def _freed_after(result):
    """Frees what the training function left in reference cycles (a DDP wrapper, its reducer, the
    works of its last collectives) now, while the interpreter runs, and returns `result`. torch
    2.x's works issued in a backward hold a Python object (the context autograd stashes for its
    threads): freed on a gloo thread once the interpreter is finalizing, one aborts a process that
    succeeded ("terminate called without an active exception": 6 of 52 runs of
    examples/torch/elastic_train.py under torch 2.15, 0 of 40 with this)."""
    gc.collect()
    return result


def run(func):
    """Runs `func(state, ...)`, and under the in-place policy runs it again after each recovery
    from a peer's failure (see the module's documentation)."""

    @functools.wraps(func)
    def wrapper(state: State, *args, **kwargs):
        import torch.distributed as dist
        if not in_place():
            if not dist.is_initialized():
                init_process_group()
            return _freed_after(func(state, *args, **kwargs))
        g = _this_group()
        if not dist.is_initialized():
            init_process_group()
        if g.backend is None:
            g.backend = dist.get_backend()
        g.store  # connected now, not when the job is failing
        g.watch()
        if not g.has_state or g.needs_sync:  # a replacement, or a first group superseded
            began = time.monotonic()
            replacement = not g.has_state
            root = _settle_in(g, state, g.generation, joined=True)
            if g.needs_sync and g.rank == root:  # the agent's word, as _recover's root says it
                g.store.set(f"{g.prefix}gen/{g.generation}/recovered",
                            f"root={root} wall_ns={time.time_ns()} {state.describe()}".strip())
            g.needs_sync = False
            state.on_reset()
            took = (time.monotonic() - began) * 1000
            _say(f"rank {g.rank} joined generation {g.generation} as a replacement: state from "
                 f"rank {root} ({state.describe()}) in {took:.1f} ms" if replacement else
                 f"rank {g.rank} recovered in place: generation {g.generation} (its first group's "
                 f"set-up superseded), state from rank {root} ({state.describe()}) in "
                 f"{took:.1f} ms")
        while True:
            # The agent's word that this rank's own work is under way (work/<rank>): failing in
            # it once every other worker has finished is a lost result, not a crash at exit.
            g.store.set(f"{g.prefix}work/{g.rank}", "running")
            try:
                result = func(state, *args, **kwargs)
                g.store.set(f"{g.prefix}work/{g.rank}", "returned")
                return _freed_after(result)
            except Exception as error:  # noqa: BLE001 (only a peer's failure is handled)
                if not _is_peer_failure(error):
                    raise
                error.__traceback__ = None  # let go of the failed frames (and their DDP)
                _recover(g, state, error)

    return wrapper
