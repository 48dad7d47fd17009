"""Gradient compression for torch DDP: the C++ SDK's compressors as communication hooks.

    import dist_launch.compression
    state, hook = dist_launch.compression.hook("powersgd:2")
    ddp.register_comm_hook(state, hook)

SPEC is what `--compression` takes (compression.h): `none`, `fp16`, `bf16`, `topk:RATIO`,
`threshold:T`, `powersgd:RANK[:WARMUP]`. The compressors are the SDK's own, in
libdist_compression.so (built with the package): every lossy mode keeps an error-feedback
residual per bucket; the sparse modes fall back to a dense all-reduce where that is cheaper at the
world size; fp16 scales itself down past its range; and one inf or NaN gradient never poisons the
state: a bucket whose average holds one is not applied (its averaged gradients are zeros, as a
skipped step's), its residual and PowerSGD's Q are reset on every rank, and the event is counted
(`state.stats()`) and said on stderr. torch's own PowerSGD hook stays NaN for good after one inf
gradient. A job with a torch.amp.GradScaler passes `hook(SPEC, nonfinite="nan")`: a skipped
bucket's averaged gradients are then NaN, so that the scaler sees the overflow, skips the step and
lowers its scale, as with DDP's own all-reduce (zeros would hide it from the scaler: its scale
would never come down).

The collectives are torch's, over the bucket's CPU tensor (gloo), on process groups of the
hook's own: hook() makes them over the ranks of `process_group` (default: every rank; like
torch.distributed.new_group, every rank of the job calls hook(); over a subgroup, torch 2.1 or
later, every rank of that subgroup). fp16 and bf16 exchange as
torch's own fp16 hook does: the bucket encoded on the hook's thread, summed by torch's
asynchronous all-reduce on gloo's threads, decoded in its callback. The other modes run each
exchange whole on one of two threads of the state's own (bucket i on thread i % 2, each with its
group). Either way an exchange overlaps the rest of the backward pass and the next bucket's, and
groups of its own keep the collectives in the same order on every rank whatever else the job runs
meanwhile (DDP's unused-parameter map with find_unused_parameters).
CUDA buckets are refused (the SDK's device compressors need its NCCL group).

`state.state_dict()` / `state.load_state_dict(d)` keep the residuals, fp16's scale and PowerSGD's
Q and warm-up count across a restart (each rank its own); a saved residual never carries an inf
or NaN. A compressor holds its parameters by their place in the model, read from DDP's first
layout (_Layout), so DDP's rebuild of its buckets after the first step and a resumed job find
their state: all of it where the layout is the saved one (a resumed job's DDP rebuilds into it
after its first step), the residuals by parameter where a bucket's parameters changed (fp16's
scale and PowerSGD's Q then start again for it), whatever the bucket sizes of either job. Resume
with the same model (saved residuals that find no parameter are dropped, and said).
A state serves one DDP model: a bucket of another model's parameters is refused.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import inspect
import os
import sys
import threading
import warnings
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

LIBRARY = "libdist_compression.so"
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

# The C ABI's numbers (python/native/compression_hook.cc): collectives and DataType's element types.
_ALL_REDUCE_SUM, _ALL_GATHER = 0, 1
_FLOAT32, _FLOAT16, _BFLOAT16, _UINT8, _INT32 = 0, 2, 3, 5, 6

_COLLECTIVE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                               ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int)
_U64P = ctypes.POINTER(ctypes.c_uint64)

_lib: Optional[ctypes.CDLL] = None
_lib_lock = threading.Lock()


class CompressionError(RuntimeError):
    """The compression library could not be found or loaded, or an exchange failed."""


def _library_candidates():
    explicit = os.environ.get("DIST_LAUNCH_COMPRESSION_LIB")
    if explicit:
        return [explicit]
    # Installed: next to this module. A source checkout: the developer build's build/lib.
    return [os.path.join(_PACKAGE_DIR, LIBRARY),
            os.path.join(_PACKAGE_DIR, "..", "..", "build", "lib", LIBRARY)]


def _library() -> ctypes.CDLL:
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in _library_candidates():
            if not os.path.isfile(path):
                tried.append(path)
                continue
            try:
                lib = ctypes.CDLL(os.path.abspath(path))
            except OSError as e:
                raise CompressionError(f"cannot load {path}: {e}") from None
            _declare(lib)
            for dtype, (name, size) in _ELEMENT_TYPES.items():
                if lib.dlc_element_size(dtype) != size:
                    raise CompressionError(f"{path} does not number {name} as {dtype}: a library "
                                           f"of another version of dist-launch")
            _lib = lib
            return lib
        raise CompressionError(
            f"{LIBRARY} not found (looked at {', '.join(tried)}): `pip install .` builds it into "
            f"the package; in a source checkout, scripts/build.sh puts it in build/lib; or set "
            f"DIST_LAUNCH_COMPRESSION_LIB to its path")


def _declare(lib: ctypes.CDLL) -> None:
    lib.dlc_last_error.restype = ctypes.c_char_p
    lib.dlc_last_error.argtypes = []
    lib.dlc_element_size.restype = ctypes.c_uint64
    lib.dlc_element_size.argtypes = [ctypes.c_int]
    lib.dlc_parse.restype = ctypes.c_int
    lib.dlc_parse.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint64,
                              ctypes.POINTER(ctypes.c_int)]
    lib.dlc_state_new.restype = ctypes.c_void_p
    lib.dlc_state_new.argtypes = [ctypes.c_int, ctypes.c_int, _COLLECTIVE, ctypes.c_void_p]
    lib.dlc_state_free.restype = None
    lib.dlc_state_free.argtypes = [ctypes.c_void_p]
    lib.dlc_bucket_new.restype = ctypes.c_void_p
    lib.dlc_bucket_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int,
                                   ctypes.c_uint64, ctypes.c_uint64, _U64P, _U64P, _U64P,
                                   ctypes.c_uint64]
    lib.dlc_bucket_free.restype = None
    lib.dlc_bucket_free.argtypes = [ctypes.c_void_p]
    lib.dlc_exchange.restype = ctypes.c_int
    lib.dlc_exchange.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.dlc_spec_splits.restype = ctypes.c_int
    lib.dlc_spec_splits.argtypes = [ctypes.c_char_p]
    lib.dlc_bucket_begin.restype = ctypes.c_int
    lib.dlc_bucket_begin.argtypes = [ctypes.c_void_p, ctypes.c_void_p, _U64P]
    lib.dlc_bucket_finish.restype = ctypes.c_int
    lib.dlc_bucket_finish.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.dlc_bucket_events.restype = ctypes.c_int
    lib.dlc_bucket_events.argtypes = [ctypes.c_void_p, _U64P]
    lib.dlc_state_format.restype = ctypes.c_int
    lib.dlc_state_format.argtypes = []
    lib.dlc_bucket_save.restype = ctypes.c_int
    lib.dlc_bucket_save.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64, _U64P]
    lib.dlc_bucket_load.restype = ctypes.c_int
    lib.dlc_bucket_load.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64,
                                    ctypes.c_int]
    lib.dlc_bucket_residual.restype = ctypes.c_int
    lib.dlc_bucket_residual.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.dlc_bucket_set_residual.restype = ctypes.c_int
    lib.dlc_bucket_set_residual.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.dlc_bucket_steps_before.restype = ctypes.c_int
    lib.dlc_bucket_steps_before.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
    lib.dlc_copy_spans.restype = ctypes.c_int
    lib.dlc_copy_spans.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p,
                                   ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, _U64P]


def _error(lib: ctypes.CDLL) -> str:
    return lib.dlc_last_error().decode("utf-8", "replace")


def parse(spec: str) -> Tuple[str, bool]:
    """SPEC's canonical form and whether it is lossy; ValueError (one line) on a bad spec."""
    if not isinstance(spec, str):
        raise ValueError(f"a compression spec is a string such as 'fp16', 'topk:0.05' or "
                         f"'powersgd:2', not {spec!r}")
    lib = _library()
    out = ctypes.create_string_buffer(256)
    lossy = ctypes.c_int(0)
    if lib.dlc_parse(spec.encode(), out, len(out), ctypes.byref(lossy)) != 0:
        message = _error(lib)
        if spec.split(":", 1)[0] in ("every-step", "partial", "local-sgd"):
            message += (f"; '{spec}' is a synchronisation strategy (--sync), which changes when "
                        f"parameters are averaged, not a DDP communication hook")
        raise ValueError(message)
    return out.value.decode(), bool(lossy.value)


class _Bucket:
    """One compressor, for one set of parameters of a DDP bucket, in their canonical order
    (_Layout): the lane whose group it exchanges on, the layout (`signature`) it was made for, and
    the staging buffer it exchanges in when DDP's buffer holds them in another order."""

    def __init__(self, lib, handle, lane, signature, elements, staging):
        self.lib, self.handle, self.lane = lib, handle, lane
        self.signature, self.elements, self.staging = signature, elements, staging
        self.skipped = 0  # its exchanges skipped for inf/NaN, as _after last read them

    def free(self):
        if self.handle:
            self.lib.dlc_bucket_free(self.handle)
            self.handle = None


class CompressionState:
    """What `hook()` returns first: pass it to `register_comm_hook` with the hook."""

    def __init__(self, spec: str, process_group=None, nonfinite: str = "zero"):
        import torch.distributed as dist

        self.spec, self.lossy = parse(spec)
        if nonfinite not in ("zero", "nan"):
            raise ValueError(f"nonfinite={nonfinite!r}: 'zero' (a skipped bucket's averaged "
                             f"gradients are zeros) or 'nan' (NaN, for a GradScaler to see)")
        self.nonfinite = nonfinite
        self._lib = _library()
        self.rank = dist.get_rank(process_group)
        if self.rank < 0:
            raise CompressionError(
                f"rank {dist.get_rank()} is not in the process group it was given: only the ranks "
                f"of the DDP's group call hook() for it")
        self.world = dist.get_world_size(process_group)
        # A group of the hook's own: the exchanges' order is then the same on every rank whatever
        # the job's other threads run on its groups. Over the job's ranks every rank makes it, as
        # new_group wants; over a subgroup (data parallelism within model parallelism: DDP over
        # ranks 0-1, another over 2-3) only its ranks do, each subgroup at once: torch names such
        # a group by its ranks (use_local_synchronization), where a group made by every rank is
        # named by a count that each subgroup's would share, and pair processes across them.
        ranks = (list(range(dist.get_world_size())) if process_group is None else
                 [_global_rank(process_group, r) for r in range(self.world)])
        self._local = len(ranks) < dist.get_world_size()
        if self._local and "use_local_synchronization" not in \
                inspect.signature(dist.new_group).parameters:
            import torch
            raise CompressionError(
                f"a hook over a subgroup of the job (ranks {ranks} of "
                f"{dist.get_world_size()}) needs torch 2.1 or later: torch {torch.__version__} "
                f"makes a group only with every rank of the job (new_group has no "
                f"use_local_synchronization)")
        self.process_group = self._new_group(ranks)
        self._buckets: Dict[int, _Bucket] = {}
        # Loaded for buckets not made yet: by layout (_portable_signature), (signature, bytes).
        self._pending: Dict[tuple, tuple] = {}
        self._format = 1  # the pending states' (load_state_dict)
        self._keys: Dict[int, tuple] = {}  # id(parameter): its key (_Layout)
        self._firsts: Dict[int, tuple] = {}  # first layout's bucket index: (element type, count)
        self._layouts: Dict[int, tuple] = {}  # bucket index: (what it was read from, _Layout)
        self._carry: Dict[tuple, Any] = {}  # _portable key: a residual for a bucket not made yet
        # The DDP model the state serves: id() of every parameter its first step's buckets held
        # (None until that step ended, `_first` meanwhile). A state serves one model: two sharing
        # it would share residuals, steps and compressors.
        self._model: Optional[frozenset] = None
        self._first: set = set()
        self._rebuilt = False  # DDP rebuilt its buckets in this step (see _bucket_for)
        self._retired = {"skipped": 0, "cleaned": 0, "dense": 0, "bytes_sent": 0}  # freed ones
        self._skips = 0  # exchanges skipped for inf/NaN, every bucket's, as _after counts them
        self._said_step = -1  # the step _after last saw a skip at
        # DDP steps the hook has exchanged (a bucket that is_last() ends one; torch's PowerSGD
        # counts its iterations so): a compressor made later (DDP's rebuild, a resumed job) goes
        # on from there, PowerSGD's warm-up with it.
        self._steps = 0
        self._reduce_bf16 = True  # torch 1.x's gloo has no bfloat16 (then: in float32)
        # fp16 and bf16 exchange as torch's own fp16 hook does (_begin): encoded on the hook's
        # thread, summed by torch's asynchronous all-reduce on gloo's threads, decoded in its
        # callback there. The other modes run theirs whole on lanes (_Lane): bucket i on lane
        # i % _LANES, each with a thread and a group of its own. Every other call into the library
        # runs with no exchange under way (_on_thread).
        self._splits = self.lossy and self._lib.dlc_spec_splits(self.spec.encode()) == 1
        self._lanes: List[_Lane] = []
        self._spare_groups = []  # (over a subgroup: see below)
        try:
            # A group per lane (made as the first, in the same order on every rank); a
            # split exchange's state only makes its compressors: one lane, whose thread never
            # starts.
            for i in range((1 if self._splits else _LANES) if self.lossy else 0):
                group = self.process_group if i == 0 else self._new_group(ranks)
                self._lanes.append(_Lane(self, i, group))
            # Over a subgroup, as many groups whatever the spec: torch counts every group a rank
            # makes (its next group's name), so that each subgroup's ranks, whose hooks make
            # theirs apart, count alike, and a group the job makes later has one name on every
            # rank (so long as every subgroup makes its hook: a rank that makes none, or another
            # number of them, counts otherwise).
            made = max(1, len(self._lanes))  # the state's group is the first lane's
            while self._local and made < _LANES:
                self._spare_groups.append(self._new_group(ranks))
                made += 1
        except BaseException:
            for lane in self._lanes:
                lane.close()
            raise
        if self._splits and self.spec.startswith("bf16"):
            self._reduce_bf16 = _sums_bfloat16(self.process_group)
        self._flight = threading.Condition()  # guards the two counts below
        self._in_flight = 0  # split exchanges begun and not finished
        self._held = 0  # _on_thread calls under way: no exchange begins meanwhile
        self._control = threading.Lock()  # one _on_thread call at a time
        self._closed = False

    def _new_group(self, ranks):
        import torch.distributed as dist
        local = {"use_local_synchronization": True} if self._local else {}
        return dist.new_group(ranks=ranks, backend="gloo", **local)

    def _on_thread(self, fn, *args):
        """fn(*args) on this thread with no exchange under way: after the exchanges posted before,
        before those posted after, one such call at a time; its result."""
        with self._control:
            if self._closed:
                raise CompressionError("this compression state was closed")
            return self._quiet(fn, *args)

    def _quiet(self, fn, *args):
        """_on_thread's fn(*args), under its lock."""
        with self._flight:
            self._held += 1
            while self._in_flight:
                self._flight.wait()
        try:
            if self._splits or not self._lanes:  # (a split state's lane runs nothing)
                return fn(*args)
            parked = threading.Barrier(len(self._lanes) + 1)
            resume = threading.Event()

            def park():
                parked.wait()
                resume.wait()

            for lane in self._lanes:
                lane.executor.submit(park)
            parked.wait()
            try:
                return fn(*args)
            finally:
                resume.set()
        finally:
            with self._flight:
                self._held -= 1
                self._flight.notify_all()

    # -- what the hook does --------------------------------------------------------------------

    def _exchange(self, bucket) -> Any:
        import torch

        if self._closed:
            raise CompressionError("this compression state was closed: register a new hook")
        buffer = bucket.buffer()
        if buffer.device.type != "cpu":
            raise CompressionError(
                f"dist_launch.compression hooks take CPU buckets (gloo); this bucket is on "
                f"{buffer.device} (the SDK's device compressors run with its own NCCL group)")
        if not self.lossy:  # DDP's own exchange, counted as the SDK counts a dense one
            import torch.distributed as dist
            n = self.world
            self._retired["dense"] += 1
            self._retired["bytes_sent"] += 2 * (n - 1) * buffer.numel() * buffer.element_size() // n
            buffer.div_(self.world)
            fut = dist.all_reduce(buffer, group=self.process_group, async_op=True).get_future()
            return fut.then(lambda f: f.value()[0])
        if buffer.layout != torch.strided:
            raise CompressionError(
                f"rank {self.rank}: {self.spec} compresses dense gradients; this bucket's are "
                f"{buffer.layout} (nn.Embedding(sparse=True) or the like): make them dense "
                f"(sparse=False) or register hook('none') for this model")
        compressor, spans = self._bucket_for(bucket, buffer)
        if bucket.is_last():
            self._steps += 1
            if self._model is None:  # the first step's end: its buckets' parameters are the model
                self._model, self._first = frozenset(self._first), set()
                self._on_thread(self._drop_unmatched)
            if self._rebuilt:  # (saved layouts DDP did not rebuild into: never used now)
                self._rebuilt = False
                self._on_thread(self._pending.clear)
        if self._splits:
            return self._begin(compressor, spans, buffer)
        result = torch.futures.Future()
        compressor.lane.executor.submit(compressor.lane.run, compressor, spans, buffer, result)
        return result

    def _begin(self, compressor: _Bucket, spans, buffer) -> Any:
        """A split exchange (fp16, bf16), as torch's fp16 hook runs its own: the bucket encoded
        here, on the hook's thread; torch's asynchronous collective, on gloo's threads (in the
        hook's order of the buckets, the same on every rank); the average decoded in its
        callback. The future is DDP's."""
        import torch

        lib = self._lib
        with self._flight:
            while self._held:
                self._flight.wait()
            self._in_flight += 1
        try:
            handle = compressor.handle  # (freed meanwhile by a load_state_dict or close: None)
            if not handle:
                raise CompressionError("this compression state was closed or loaded during the "
                                       "backward pass")
            flat = buffer
            if spans is not None:
                flat = compressor.staging
                spans.stage(lib, buffer, flat)
            plan = (ctypes.c_uint64 * 5)()
            if lib.dlc_bucket_begin(handle, flat.data_ptr(), plan) != 0:
                raise CompressionError(f"rank {self.rank}: {self.spec} encoding of a bucket of "
                                       f"{buffer.numel()} elements failed: {_error(lib)}")
            sent = self._sum(*plan)
        except BaseException:
            self._finished()
            raise

        def finish(done) -> Any:
            try:
                if done is not None:
                    done.wait()  # the collective's exception, if it failed
                if lib.dlc_bucket_finish(handle, flat.data_ptr()) != 0:
                    raise CompressionError(f"rank {self.rank}: {self.spec} decoding of a bucket "
                                           f"of {buffer.numel()} elements failed: {_error(lib)}")
                if spans is not None:
                    spans.unstage(lib, flat, buffer)
                self._after(compressor, buffer)
                return buffer
            finally:
                self._finished()

        if sent is None:  # nothing to send (an empty bucket)
            result = torch.futures.Future()
            result.set_result(finish(None))
            return result
        try:
            return sent.then(finish)
        except BaseException:
            sent.wait()  # (the library's memory stays the collective's until it completed)
            self._finished()
            raise

    def _after(self, compressor: _Bucket, buffer) -> None:
        """After an exchange of `compressor` into DDP's `buffer`, on the thread that ran it: with
        nonfinite='nan', the averaged gradients of one that the inf/NaN guard skipped are NaN; and
        it is said on stderr by the hook's rank 0 (every rank skips it), as the SDK's DDP says it
        (a silent zeroed update looks like a model that stopped learning): once per step, or, with
        nonfinite='nan', where a GradScaler's overflows are routine, the 1st, 2nd, 4th, 8th..."""
        events = (ctypes.c_uint64 * 4)()
        if self._lib.dlc_bucket_events(compressor.handle, events) != 0 or \
                events[0] == compressor.skipped:
            return
        count = events[0] - compressor.skipped
        compressor.skipped = events[0]
        with self._flight:
            before, self._skips = self._skips, self._skips + count
            total = self._skips
            said_step, self._said_step = self._said_step, self._steps
        if self.nonfinite == "nan":
            buffer.fill_(float("nan"))
        if self.rank != 0:
            return
        if self.nonfinite == "nan" and total.bit_length() == before.bit_length():
            return  # (no power of two reached: said at the 1st, 2nd, 4th, 8th...)
        if self.nonfinite == "zero" and said_step == self._steps:
            return
        what = ("gradients NaN, for the job's GradScaler" if self.nonfinite == "nan"
                else "gradients zeroed")
        sys.stderr.write(f"dist_launch.compression: rank {self.rank}: step {self._steps}: a "
                         f"bucket of {compressor.elements} gradients averaged to inf or NaN "
                         f"({self.spec}): its update is skipped ({what}), its residual "
                         f"and compression state reset ({total} so far)\n")

    def _finished(self) -> None:
        with self._flight:
            self._in_flight -= 1
            self._flight.notify_all()

    def _sum(self, kind, input_ptr, output_ptr, count, dtype) -> Any:
        """dlc_bucket_begin's collective, asynchronously on the hook's group: its future (None
        when there is nothing to run)."""
        import torch
        import torch.distributed as dist

        if count == 0:
            return None
        group = self.process_group
        if kind == _ALL_GATHER:
            return _future(_gather_bytes(group, self.world, input_ptr, output_ptr, count, dtype,
                                         async_op=True))
        if kind != _ALL_REDUCE_SUM:
            raise CompressionError(f"unknown collective {kind}")
        tensor = _tensor_at(input_ptr, count, dtype)
        if tensor.dtype != torch.bfloat16 or self._reduce_bf16:
            return _future(dist.all_reduce(tensor, group=group, async_op=True))
        wide = tensor.float()  # torch 1.x's gloo: bfloat16 summed in float32
        # (counted as bfloat16 by the library: the other half of what is sent counted here)
        self._retired["bytes_sent"] += 2 * (self.world - 1) * count * 2 // self.world
        summed = _future(dist.all_reduce(wide, group=group, async_op=True))
        return summed.then(lambda done: tensor.copy_(done.value()[0]))

    def _bucket_for(self, bucket, buffer):
        """The compressor of this bucket's parameters, and the spans that stage it (_Layout).
        A bucket's layout is read once: while DDP hands the same parameters in the same buffer,
        it is the one before (reading it again, a Python loop over every parameter, cost a
        quarter of what the hook added to a step)."""
        index = bucket.index()
        parameters = bucket.parameters()
        seen = (buffer.data_ptr(), buffer.numel(), buffer.dtype, tuple(map(id, parameters)))
        cached = self._layouts.get(index)
        if cached is not None and cached[0] == seen:
            layout = cached[1]
        else:
            self._check_model(parameters)
            layout = _Layout(bucket, buffer, self._keys, self._firsts, parameters)
            self._layouts[index] = (seen, layout)
        known = self._buckets.get(index)
        if known is not None and known.signature == layout.signature:
            return known, layout.spans
        if known is not None:
            # DDP rebuilt its buckets (after the first step), with other parameters in this one:
            # the residuals move to the new buckets by parameter. (A resumed job's state saved
            # for a layout (_pending) waits for it: DDP's rebuild after a resumed job's first
            # step, the first layout's one bucket, is the saved layout again. What that step
            # leaves unused is dropped at its end.)
            self._on_thread(self._carry_residuals)
            self._rebuilt = True
        made = self._on_thread(self._install, index, layout.signature, buffer.dtype,
                               layout.spans is not None)
        return made, layout.spans

    def _check_model(self, parameters) -> None:
        """A bucket of a layout not seen before: its parameters are the model's, the one whose
        first step the state saw (gathered in `_first` until that step ends, in _exchange)."""
        ids = {id(p) for p in parameters}
        if self._model is None:
            self._first |= ids
            return
        if not ids <= self._model:
            raise CompressionError(
                f"rank {self.rank}: this compression state serves one DDP model, and a bucket "
                f"holds parameters that model's first step had not ({len(ids - self._model)} "
                f"of {len(ids)}): a second DDP registered with the same state, or the model "
                f"wrapped again. Call dist_launch.compression.hook('{self.spec}') for each DDP")

    def _install(self, index, signature, dtype, staged) -> _Bucket:
        """_make's compressor, as bucket `index`'s (with the lanes idle: stats() and
        state_dict() read the buckets from other threads)."""
        made = self._buckets[index] = self._make(signature, index, dtype, staged)
        return made

    def _drop_unmatched(self) -> None:
        """At the first step's end, every layout of it made: the residuals loaded that found no
        parameter are said and dropped."""
        if self._carry:
            warnings.warn(f"dist_launch.compression: rank {self.rank}: {len(self._carry)} "
                          f"residuals of the state loaded found no parameter of this model "
                          f"(saved for another model, or with other bucket sizes): they are "
                          f"dropped")
            self._carry.clear()

    def _make(self, signature, index, dtype, staged=False) -> _Bucket:
        """A compressor of `signature`'s layout, with the state saved for that layout (_pending)
        or else the residuals carried for its parameters (_carry), on bucket `index`'s lane (the
        first for -1). With the lanes idle (_on_thread)."""
        import torch

        element_type, entries = signature
        offsets, counts, rows, at = [], [], [], 0
        for _key, count, row in entries:
            offsets.append(at)
            counts.append(count)
            rows.append(row)
            at += count
        array = ctypes.c_uint64 * len(entries)
        # PowerSGD's first Q is seeded by the bucket's place in DDP's first layout, the same in
        # every process of the job, this one's first try or a resumed one (of the same bucket
        # sizes: of others, a Q started again is seeded otherwise, the same on every rank).
        seed_index = min((key[3] for key, _, _ in entries), default=max(index, 0))
        lane = self._lanes[max(index, 0) % len(self._lanes)]
        handle = self._lib.dlc_bucket_new(lane.state, self.spec.encode(), element_type, at,
                                          len(entries), array(*offsets), array(*counts),
                                          array(*rows), seed_index)
        if not handle:
            raise CompressionError(f"rank {self.rank}: a compressor for {len(entries)} "
                                   f"parameters: {_error(self._lib)}")
        made = _Bucket(self._lib, handle, lane, signature, at,
                       torch.zeros(at, dtype=dtype) if staged else None)
        saved = self._pending.pop(_portable_signature(signature), (None, None))[1]
        if saved is None:
            self._check(self._lib.dlc_bucket_steps_before(handle, self._steps), made,
                        "the steps before it")
        if saved is not None:
            self._check(self._lib.dlc_bucket_load(handle, saved, len(saved), self._format), made,
                        "its saved state")
        if any(_portable(key) in self._carry for key, _, _ in entries):
            # Residuals carried by parameter: a layout's made anew, or newer than its saved state
            # (they went on in the first layout's bucket: a resumed job's first step).
            residual = torch.zeros(at, dtype=torch.float32)
            if saved is not None:
                self._check(self._lib.dlc_bucket_residual(handle, residual.data_ptr()), made,
                            "its saved residual")
            for (key, count, _), offset in zip(entries, offsets):
                carried = self._carry.pop(_portable(key), None)
                if carried is not None:
                    residual[offset:offset + count].copy_(carried)
            self._check(self._lib.dlc_bucket_set_residual(handle, residual.data_ptr()), made,
                        "its residual")
        return made

    def _check(self, rc, bucket: _Bucket, what) -> None:
        if rc != 0:
            bucket.free()
            raise CompressionError(f"rank {self.rank}: a compressor could not take {what}: "
                                   f"{_error(self._lib)}")

    def _carry_residuals(self) -> None:
        """Every compressor's residual into _carry, by parameter; the compressors freed."""
        for b in self._buckets.values():
            self._carry.update(_residuals(self._lib, b))
        self._retire()

    # -- what a user reads and keeps -----------------------------------------------------------

    def stats(self) -> Dict[str, int]:
        """Since the hook began, summed over the buckets: `skipped` (exchanges whose average held
        an inf or NaN: not applied, state reset), `cleaned` (residuals cleaned of an inf or NaN
        only this rank held), `dense` (exchanges that averaged a bucket whole), `bytes_sent`
        (what this rank sent, by the ring algorithms' formulas)."""
        def read():
            totals = dict(self._retired)
            for b in self._buckets.values():
                for name, value in self._events(b).items():
                    totals[name] += value
            return totals
        return self._on_thread(read)

    def _events(self, bucket: _Bucket) -> Dict[str, int]:
        out = (ctypes.c_uint64 * 4)()
        if self._lib.dlc_bucket_events(bucket.handle, out) != 0:
            raise CompressionError(_error(self._lib))
        return {"skipped": out[0], "cleaned": out[1], "dense": out[2], "bytes_sent": out[3]}

    def _retire(self) -> None:
        """Frees every compressor, its events kept in stats(). On the state's thread."""
        for b in self._buckets.values():
            for name, value in self._events(b).items():
                self._retired[name] += value
            b.free()
        self._buckets.clear()

    def state_dict(self) -> Dict[str, Any]:
        """The residuals, fp16's scale, PowerSGD's Q and warm-up counts, per bucket (bytes:
        torch.save it), with what a load_state_dict() gave buckets not made since, and the steps
        exchanged. This rank's: the residuals differ from rank to rank, so every rank saves its
        own and loads it back (not rank 0's on every rank, as for the model's weights)."""
        def save():
            buckets = {}
            for index, b in self._buckets.items():
                size = ctypes.c_uint64(0)
                if self._lib.dlc_bucket_save(b.handle, None, 0, ctypes.byref(size)) != 0:
                    raise CompressionError(_error(self._lib))
                out = ctypes.create_string_buffer(size.value)
                if self._lib.dlc_bucket_save(b.handle, out, size.value, ctypes.byref(size)) != 0:
                    raise CompressionError(_error(self._lib))
                buckets[index] = (b.signature, out.raw[:size.value])
            for i, (signature, saved) in enumerate(self._pending.values()):
                buckets[-1 - i] = (signature, saved)  # loaded, not made yet: kept as loaded
            return {"spec": self.spec, "format": self._lib.dlc_state_format(), "buckets": buckets,
                    "steps": self._steps}
        return self._on_thread(save)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """What state_dict() returned, for a hook of the same spec; each bucket takes its state at
        its next exchange: all of it where its layout is a saved one, else its parameters'
        residuals (fp16's scale and PowerSGD's Q then start again for it, as at DDP's rebuild;
        PowerSGD's warm-up goes on from the steps saved)."""
        if state.get("spec") != self.spec:
            raise ValueError(f"a compression state of '{state.get('spec')}' cannot be loaded into "
                             f"a hook of '{self.spec}'")
        self._on_thread(self._load, state)

    def _load(self, state: Dict[str, Any]) -> None:
        import torch

        self._retire()
        self._format = int(state.get("format", 1))
        self._steps = int(state.get("steps", 0))  # (a state saved before it counted them: 0)
        # A layout this process has not (yet) got, as a resumed job's first step, DDP's first
        # layout, takes the saved residuals by parameter: each saved bucket loaded once to read
        # them.
        self._pending, self._carry = {}, {}
        signatures = [signature for signature, _ in state["buckets"].values()]
        if any(len(key) != 5 for _, entries in signatures for key, _, _ in entries):
            warnings.warn(f"dist_launch.compression: rank {self.rank}: the state loaded was saved "
                          f"by an older dist_launch, which held parameters by their bucket: its "
                          f"residuals, scales and Q are not taken (they start again)")
            return
        for signature, saved in state["buckets"].values():
            self._pending[_portable_signature(signature)] = (signature, saved)
            loaded = self._make(signature, -1, torch.float32)
            self._pending[_portable_signature(signature)] = (signature, saved)  # _make took it
            self._carry.update(_residuals(self._lib, loaded))
            loaded.free()

    def close(self) -> None:
        """Frees the compressors (after the exchanges posted so far); the hook cannot run after."""
        with self._control:
            if self._closed:
                return
            self._closed = True  # (an exchange that begins meanwhile finds no compressor)
            self._quiet(self._retire)
        for lane in self._lanes:
            lane.close()
        # The hook's groups go too (each holds a socket to every peer and gloo's threads: a job
        # that makes hooks again and again ran out of descriptors). Every rank closes its state,
        # as every rank made it.
        import torch.distributed as dist
        groups = {id(g): g for g in [self.process_group, *(lane.process_group for lane in
                                                             self._lanes), *self._spare_groups]}
        for group in groups.values():
            try:
                dist.destroy_process_group(group)
            except (ValueError, RuntimeError, KeyError):
                pass  # (gone already: the job destroyed every group)

    def __del__(self):
        # Garbage: no exchange is under way or queued (a queued one holds the state through its
        # lane), so nothing is waited for. The collector runs this at any moment, inside another
        # state's exchange too: it must not wait for a lane nor submit to one (a thread pool's
        # submit holds a lock every pool shares, and a collected pool's thread has gone).
        try:
            if self._closed:
                return
            self._closed = True
            try:
                self._retire()
            finally:
                for lane in self._lanes:
                    lane.release()
        except Exception:  # noqa: BLE001 (interpreter teardown)
            pass


# Lanes a state's exchanges run on: two buckets' exchanges overlap, as torch's asynchronous hooks'
# all-reduces do on gloo's two threads.
_LANES = 2


class _Lane:
    """A thread and a process group of their own for a share of the buckets' exchanges (bucket i on
    lane i % _LANES): every rank posts a lane's exchanges in DDP's order of its buckets, so they meet
    in the same order on every rank, and never wait for another lane's. The library's state of the
    lane (its collectives: this group's) is `state`."""

    def __init__(self, owner: "CompressionState", index: int, process_group):
        self.owner, self.process_group = owner, process_group
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"dist-launch-compression-{index}")
        self.error: Optional[BaseException] = None  # the last torch collective's, for its message
        # Kept alive as long as the state. Through a weak reference: the garbage collector cannot
        # see into a ctypes callback, and a lane it held would keep its state (and the cycle of
        # its lanes) alive for good. The library calls it only inside run(), while the lane lives.
        self._callback = _COLLECTIVE(functools.partial(_Lane._collective_of, weakref.ref(self)))
        lib = owner._lib
        self.state = lib.dlc_state_new(owner.rank, owner.world, self._callback, None)
        if not self.state:
            self.executor.shutdown(wait=False)
            raise CompressionError(_error(lib))

    def run(self, compressor: _Bucket, spans, buffer, result) -> None:
        """The exchange, on the lane's thread; `spans` (a _Staging) when the bucket is staged in
        canonical order, else None. `result` is always completed:
        DDP waits for it at the end of the backward pass."""
        owner, lib = self.owner, self.owner._lib
        try:
            self.error = None
            flat = buffer
            if spans is not None:
                flat = compressor.staging
                spans.stage(lib, buffer, flat)
            if lib.dlc_exchange(compressor.handle, flat.data_ptr()) != 0:
                cause = self.error
                raise CompressionError(f"rank {owner.rank}: {owner.spec} exchange of a bucket of "
                                       f"{buffer.numel()} elements failed: {_error(lib)}"
                                       + (f": {cause!r}" if cause is not None else ""))
            if spans is not None:
                spans.unstage(lib, flat, buffer)
            owner._after(compressor, buffer)
        except BaseException as e:  # noqa: B902 (the future carries it to DDP)
            result.set_exception(e)
            return
        result.set_result(buffer)

    @staticmethod
    def _collective_of(lane, *args) -> int:
        alive = lane()
        return alive._collective(*args) if alive is not None else 1

    def _collective(self, _ctx, kind, input_ptr, output_ptr, count, dtype) -> int:
        try:
            import torch.distributed as dist

            if kind == _ALL_REDUCE_SUM:
                # (float32 or int32: the whole exchanges' dense averages and counts, a 16-bit
                # bucket's in its type; the 16-bit casts, which sum in their own type, split.)
                # (A bfloat16 model's DDP needs torch 2.x on gloo, whose all-reduce sums it.)
                dist.all_reduce(_tensor_at(output_ptr, count, dtype), group=self.process_group)
            elif kind == _ALL_GATHER:
                _gather_bytes(self.process_group, self.owner.world, input_ptr, output_ptr, count,
                              dtype)
            else:
                raise CompressionError(f"unknown collective {kind}")
            return 0
        except BaseException as e:  # noqa: B902 (never across the C ABI)
            self.error = e
            return 1

    def close(self) -> None:
        """Ends the thread (after its exchanges) and frees the library's state."""
        self.executor.shutdown(wait=True)
        self.release()

    def release(self) -> None:
        """Frees the library's state; the thread ends by itself, waited for by nobody (no
        exchange is under way: close(), or the state is garbage)."""
        self.executor.shutdown(wait=False)
        if self.state:
            self.owner._lib.dlc_state_free(self.state)
            self.state = None


def _gather_bytes(group, world, input_ptr, output_ptr, count, dtype, async_op=False):
    """The library's all-gather of `count` elements a rank into world x count, as bytes, whatever
    their type (gloo gathers bytes of any)."""
    import torch.distributed as dist

    size = _ELEMENT_TYPES[dtype][1]
    whole = _tensor_at(output_ptr, count * size * world, _UINT8)
    return dist.all_gather(list(whole.chunk(world)), _tensor_at(input_ptr, count * size, _UINT8),
                           group=group, async_op=async_op)


def _future(work) -> Any:
    """A posted collective's future; should torch fail to give it, the collective's end first
    (its buffers are the library's)."""
    try:
        return work.get_future()
    except BaseException:
        work.wait()
        raise


def _sums_bfloat16(group) -> bool:
    """Whether the group's gloo sums bfloat16 (torch 2.x; not 1.x): asked once, of every rank
    together, as the hook is made (torch 1.x refuses it in the collective's future, too late
    for an exchange already encoded)."""
    import torch
    import torch.distributed as dist

    try:
        dist.all_reduce(torch.zeros(1, dtype=torch.bfloat16), group=group)
        return True
    except RuntimeError as e:  # refused before it began, on every rank alike
        if "scalar type" not in str(e):
            raise
        if dist.get_rank(group) == 0:
            which = "buckets past 64 KiB" if dist.get_world_size(group) <= 2 else "buckets"
            warnings.warn(f"dist_launch.compression: torch {torch.__version__}'s gloo "
                          f"cannot all-reduce bfloat16: bf16 {which} are summed in float32 "
                          f"(twice the bytes)")
        return False


def _global_rank(group, rank: int) -> int:
    import torch.distributed as dist

    if hasattr(dist, "get_global_rank"):  # torch 2.x
        return dist.get_global_rank(group, rank)
    return dist.distributed_c10d._get_global_rank(group, rank)  # torch 1.13


def _portable(key: tuple) -> tuple:
    """A parameter's key as another process of the same model finds it, whatever its buckets:
    (element type, place from the model's end, shape) where its first layout told (_Layout),
    else the whole key."""
    return key[:3] if key[1] >= 0 else key


def _portable_signature(signature: tuple) -> tuple:
    element_type, entries = signature
    return element_type, tuple((_portable(key), count, rows) for key, count, rows in entries)


def _residuals(lib, bucket: _Bucket) -> Dict[tuple, Any]:
    """A compressor's residual, by parameter (_portable key)."""
    import torch

    _, entries = bucket.signature
    residual = torch.zeros(sum(count for _, count, _ in entries), dtype=torch.float32)
    if lib.dlc_bucket_residual(bucket.handle, residual.data_ptr()) != 0:
        raise CompressionError(_error(lib))
    out, at = {}, 0
    for key, count, _ in entries:
        out[_portable(key)] = residual[at:at + count].clone()
        at += count
    return out


# The ABI's element types: (torch's name, bytes).
_ELEMENT_TYPES = {_FLOAT32: ("float32", 4), _FLOAT16: ("float16", 2), _BFLOAT16: ("bfloat16", 2),
                  _UINT8: ("uint8", 1), _INT32: ("int32", 4)}


def _tensor_at(address: int, count: int, dtype: int):
    """The `count` elements at `address` (the library's memory) as a tensor, without a copy."""
    import torch

    name, size = _ELEMENT_TYPES[dtype]
    return torch.frombuffer((ctypes.c_char * (count * size)).from_address(address),
                            dtype=getattr(torch, name))


class _Layout:
    """Where a bucket's gradients lie in DDP's flat buffer, and the order the compressor keeps them
    in. DDP rebuilds its buckets after the first step, in the order the gradients became ready
    (usually the reverse of the first), and a resumed job starts again from the first layout: a
    residual kept in DDP's order would then land on other parameters. So the compressor holds
    each parameter by its key, read from the first layout this state saw: (element type, the
    number of parameters of that type after it in the model, shape, then DDP's bucket index and
    position there). DDP's first layout cuts the model's parameters of each type, in order, into
    buckets of bucket_cap_mb (torch 2.x: one), the last ones in bucket 0, and runs the hooks in
    bucket order: so a bucket's parameters count from those of the buckets before it, the same
    in every process of the same model whatever its bucket sizes. (Where a bucket before it was
    not seen, the count is -1: known by its place alone, _portable.) The keys are kept in
    ascending order (the model's reversed: the rebuilt layout's, mostly), and a bucket in another
    order is staged: copied into that order for the exchange and back. `signature` (the element
    type and the keys, counts and rows, as PowerSGD takes a matrix: shape[0] x the rest) names
    the compressor's layout; `spans` is None when DDP's buffer already holds it, else the
    _Staging of its (DDP's offset, the canonical one, count)."""

    def __init__(self, bucket, buffer, keys, firsts, parameters):
        import torch

        dtypes = {torch.float32: _FLOAT32, torch.float16: _FLOAT16, torch.bfloat16: _BFLOAT16}
        if buffer.dtype not in dtypes:
            raise CompressionError(f"dist_launch.compression hooks take float32, float16 or "
                                   f"bfloat16 gradients; this bucket holds {buffer.dtype}")
        size, element_type = buffer.element_size(), dtypes[buffer.dtype]
        entries, at = [], 0
        index = bucket.index()
        if index not in firsts and any(id(p) not in keys for p in parameters):
            firsts[index] = (element_type, len(parameters))  # a bucket of the first layout
        after = sum(n for i, (t, n) in firsts.items() if i < index and t == element_type)
        if not all(i in firsts for i in range(index)):
            after = None  # a bucket before it unseen: not counted
        for position, (grad, param) in enumerate(zip(bucket.gradients(), parameters)):
            offset = (grad.data_ptr() - buffer.data_ptr()) // size
            if not 0 <= offset <= buffer.numel() - grad.numel():
                offset = at  # not a view of the buffer: DDP packs them in this order
            place = -1 if after is None else after + len(parameters) - 1 - position
            key = keys.setdefault(id(param),
                                  (element_type, place, tuple(param.shape), index, position))
            entries.append((key, offset, grad.numel(), param.shape[0] if param.dim() >= 2 else 0))
            at = offset + grad.numel()
        entries.sort()  # from the model's end: the rebuilt layout's order, mostly
        self.signature = (element_type,
                          tuple((key, count, rows) for key, _, count, rows in entries))
        spans, canonical = [], 0
        for _, offset, count, _ in entries:
            spans.append((offset, canonical, count))
            canonical += count
        in_place = canonical == buffer.numel() and all(o == c for o, c, _ in spans)
        self.spans = None if in_place else _Staging(spans, buffer.numel(), canonical, size)


class _Staging:
    """A bucket staged: its spans (DDP's offset, the canonical one, count) copied from DDP's
    buffer into the compressor's order and back, each way in one call into the library."""

    def __init__(self, spans, elements: int, canonical: int, element_size: int):
        self._count, self._elements, self._canonical = len(spans), elements, canonical
        self._size = element_size
        self._into = (ctypes.c_uint64 * (3 * len(spans)))(*(v for span in spans for v in span))
        self._back = (ctypes.c_uint64 * (3 * len(spans)))(
            *(v for at, canonical_at, count in spans for v in (canonical_at, at, count)))

    def stage(self, lib, buffer, flat) -> None:
        self._copy(lib, flat, self._canonical, buffer, self._elements, self._into)

    def unstage(self, lib, flat, buffer) -> None:
        self._copy(lib, buffer, self._elements, flat, self._canonical, self._back)

    def _copy(self, lib, dst, dst_elements, src, src_elements, spans) -> None:
        if lib.dlc_copy_spans(dst.data_ptr(), dst_elements, src.data_ptr(), src_elements,
                              self._size, self._count, spans) != 0:
            raise CompressionError(_error(lib))


def _compression_hook(state: CompressionState, bucket):
    return state._exchange(bucket)


def hook(spec: str, process_group=None,
         nonfinite: str = "zero") -> Tuple[CompressionState, Callable]:
    """(state, hook) for `ddp.register_comm_hook(state, hook)`; torch.distributed must be
    initialised, and every rank of the job calls it (it makes the hook's own group over the ranks
    of `process_group`: the DDP's, default every rank; over a subgroup, every rank of it, with
    torch 2.1 or later). `nonfinite`: what a bucket whose average held an inf or NaN gets, its
    update skipped: "zero" gradients, or "nan" for a job whose torch.amp.GradScaler is to see it
    and skip the step. ValueError on a bad spec, CompressionError when the library is missing
    (or a subgroup's torch is older)."""
    return CompressionState(spec, process_group, nonfinite), _compression_hook
