"""A worker's progress, for dist-launch's hang and straggler detection.

Nothing to do in a torch script: dist-launch puts a copy of this module on its workers'
PYTHONPATH (``_dist_launch_progress``, loaded by a ``sitecustomize`` that chains the one it
shadows) and, once the script imports torch, counts every optimizer step (torch 2.x:
``torch.optim.optimizer.register_optimizer_step_post_hook``; 1.13: the profiler's per-step call)
and times the forward pass until ``backward()`` (how stragglers are told apart: in a synchronous
job every rank's step takes as long as the slowest one's, its own work does not), and counts the
script's blocking ``torch.distributed`` collectives (a rank that skipped one is behind). On the agent's
stack-dump signal ``faulthandler`` writes every thread's Python stack to the worker's stack file,
even while a thread holds the GIL. ``--no-step-hook`` turns all this off.

A script without an optimizer (or with its own idea of a step) calls ``step()``::

    from dist_launch import progress
    for batch in data:
        ...
        progress.step()

An explicit ``step()`` takes over from the optimizer hook. A step costs a clock read and two
stores into a page the agent shares (the worker's slot, rendezvous/.../worker_contract.h): no
system call. Outside dist-launch every call is a no-op.

Standard library only: the agent writes this file into its run directory for any Python.
"""

import faulthandler
import functools
import os
import stat
import sys
import time

__all__ = ["step", "enabled"]

# The slot (dist/rendezvous/worker_contract.h): 8-byte fields by index, 4-byte ones by index.
_FD_VARIABLE = "DIST_HEARTBEAT_FD"
_STACK_SIGNAL_VARIABLE = "DIST_STACK_SIGNAL"
_STACK_FILE_VARIABLE = "DIST_STACK_FILE"
_MAGIC = 0x3130424854534944  # "DISTHB01"
_BYTES = 4096
_Q_MAGIC, _Q_STEPS, _Q_LAST_STEP, _Q_WORK = 0, 3, 4, 9
_Q_ISSUED, _Q_DONE, _Q_PENDING_SINCE = 5, 6, 7
_I_PENDING_OP, _I_FEATURES, _I_DUMP_PID = 16, 17, 20
# The slot's Collective values, by torch.distributed's function names.
_COLLECTIVES = {
    "all_reduce": 1,
    "broadcast": 2,
    "all_gather": 3,
    "all_gather_into_tensor": 3,
    "all_gather_object": 3,
    "reduce_scatter": 4,
    "reduce_scatter_tensor": 4,
    "barrier": 5,
    "reduce": 6,
    "all_to_all": 6,
    "all_to_all_single": 6,
    "gather": 6,
    "scatter": 6,
    "broadcast_object_list": 2,
}
_STACKS_ON_SIGNAL = 1

_words = None  # the slot as 8-byte words; None outside dist-launch
_halves = None  # and as 4-byte ones
_explicit = False  # step() was called: the optimizer hook no longer counts
_step_end = 0  # when the last step ended (monotonic ns): the next one's work starts there
_stack_file = None  # kept open for faulthandler


def _map_slot():
    """The slot the agent passed, mapped shared; None without one."""
    import mmap

    text = os.environ.get(_FD_VARIABLE, "")
    try:
        fd = int(text)
        st = os.fstat(fd)
    except (ValueError, OSError):
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size < _BYTES:
        return None  # a number a wrapper closed and something else reused
    try:
        area = mmap.mmap(fd, _BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, ValueError):
        return None
    words = memoryview(area).cast("Q")
    if words[_Q_MAGIC] != _MAGIC:
        words.release()
        area.close()
        return None
    os.set_inheritable(fd, False)  # programs this worker runs would beat for it
    return words, memoryview(area).cast("I")


def _count_step():
    global _step_end
    words = _words
    if words is None:
        return
    now = time.monotonic_ns()  # CLOCK_MONOTONIC, the agent's clock; read through the vDSO
    words[_Q_LAST_STEP] = now
    words[_Q_STEPS] += 1
    _step_end = now


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


def _work_done():
    """backward() starts: the step's own work (data, forward, loss) is done."""
    global _step_end
    if _step_end and _words is not None:
        _words[_Q_WORK] += time.monotonic_ns() - _step_end
        _step_end = 0


def _before(function, hook):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        hook()
        return function(*args, **kwargs)

    return wrapper


def _counted(function, op):
    """torch.distributed's blocking collective `function`, counted in the slot: issued, the
    oldest pending one's kind and start, done. (One rank that skipped a collective is the one
    behind the others; async_op=True calls pass uncounted: their end is not seen here.)"""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        words = _words
        if words is None or kwargs.get("async_op"):
            return function(*args, **kwargs)
        words[_Q_ISSUED] += 1
        outer = words[_Q_PENDING_SINCE] == 0
        if outer:
            _halves[_I_PENDING_OP] = op
            words[_Q_PENDING_SINCE] = time.monotonic_ns()
        try:
            return function(*args, **kwargs)
        finally:
            if outer:
                words[_Q_PENDING_SINCE] = 0
                _halves[_I_PENDING_OP] = 0
            words[_Q_DONE] += 1

    return wrapper


def _count_collectives(torch):
    distributed = getattr(torch, "distributed", None)
    if distributed is None or not distributed.is_available():
        return
    for name, op in _COLLECTIVES.items():
        function = getattr(distributed, name, None)
        if callable(function):
            setattr(distributed, name, _counted(function, op))


def _hook_torch(torch):
    """Counts optimizer steps and times forward passes; torch was just imported."""
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
    torch.Tensor.backward = _before(torch.Tensor.backward, _work_done)
    torch.autograd.backward = _before(torch.autograd.backward, _work_done)
    _count_collectives(torch)


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
    """On the agent's signal, every thread's Python stack into the worker's stack file."""
    global _stack_file
    try:
        signal_number = int(os.environ.get(_STACK_SIGNAL_VARIABLE, ""))
        path = os.environ[_STACK_FILE_VARIABLE]
        _stack_file = open(path, "a")
        faulthandler.register(signal_number, file=_stack_file, all_threads=True, chain=False)
    except (KeyError, ValueError, OSError, RuntimeError):
        return
    _halves[_I_DUMP_PID] = os.getpid()
    _halves[_I_FEATURES] |= _STACKS_ON_SIGNAL


def reset():
    """This process is a worker of its own now (a zygote's child, its environment set): map its
    slot and take the agent's stack signal."""
    global _words, _halves, _step_end
    slot = _map_slot()
    _words, _halves = slot if slot else (None, None)
    _step_end = 0
    if _words is not None:
        _install_stack_dump()


def install(hook_torch=True):
    """What the agent's sitecustomize runs at interpreter start, and a warm worker (forked from
    a zygote that imported torch already) once its environment is its own."""
    reset()
    if _words is None or not hook_torch:
        return
    torch = sys.modules.get("torch")
    if torch is None:
        sys.meta_path.insert(0, _AfterTorchImport())
    elif not getattr(torch, "_dist_launch_hooked", False):
        _hook_torch(torch)
        torch._dist_launch_hooked = True


# The package's copy and the agent's are one: a script that imports dist_launch.progress in a
# worker the agent hooked steps the same slot, once. (The agent's copy maps it in install().)
if __name__ != "_dist_launch_progress":
    if "_dist_launch_progress" in sys.modules:
        _agent_copy = sys.modules["_dist_launch_progress"]
        step, enabled = _agent_copy.step, _agent_copy.enabled
    else:
        reset()
