"""Snapshots the agent holds: a worker's state in shared memory that outlives the worker, so that a
restarted worker resumes from its last step without reading a checkpoint from disk.

    from dist_launch import snapshot
    restored = snapshot.load()                       # (step, obj) or None
    if restored:
        step, state = restored
        model.load_state_dict(state["model"]); optimizer.load_state_dict(state["optim"])
    ...
    snapshot.save(step, {"model": model.state_dict(), "optim": optimizer.state_dict()})

Under `dist-launch --snapshot-memory SIZE` (or `--snapshot-dir DIR`) the agent owns a directory in
/dev/shm, named in DIST_LAUNCH_SNAPSHOT_DIR, and removes it when the job ends. save() writes one
file per save into this rank's folder: tensors (torch or numpy) as their raw bytes, the rest of the
object pickled around them. A save is atomic: it is written under a temporary name and renamed when
complete, so a save torn by a crash is never loaded. Each rank keeps its two newest snapshots (the
older one's memory is reused by the next save: a save is a copy, not an allocation); all of them
together stay within --snapshot-memory, and a save past it raises SnapshotMemoryError. With
--snapshot-dir the agent also copies them to DIR/JOB (JOB: the job's --rdzv-id; in the background,
and at once when a worker fails), and load() reads them there after a restart of the node or in the
job's next run.

Every snapshot names its job (--rdzv-id), global rank and world size, and load() returns only this
rank's, of this job, in this world size: never another rank's (under --virtual-local-rank every
worker is local rank 0), never one another job left in a shared --snapshot-dir. The newest *saved*
wins (a resumed run's step 110 beats the step 5000 an earlier run left). load() prefers the newest
step that every rank here has (so that replicas and shards resume together), else this rank's
newest. State that is the same on every rank (DDP's) may pass replicated=True: any rank's newest
save of this job, whatever rank and world size saved it (an elastic job that reshaped). Across
nodes, agree on a step yourself (an all_reduce of MIN over steps()) and load(step).

Sharded state (torch 2.x DTensor: FSDP2's and tensor parallelism's state_dict(), their optimizers'
state): each rank saves its own shards, with each DTensor's placements, device mesh and global
shape; load() gives the DTensors back on the job's device mesh (`mesh=`, or one made like the
saved one, after init_process_group), ready for load_state_dict(). FSDP1's sharded state dict
(ShardedTensors) comes back as ShardedTensors on the default process group. A sharded snapshot is
a rank's own: load it with this rank's identity (not replicated=True), in the world size that
saved it.

load(mmap=True) maps the file instead of copying it into private memory (as torch.load's mmap):
the tensors are the snapshot's own memory, copy-on-write, and no save rewrites that file while
they live (docs/SNAPSHOTS.md, "Mapped loads").

Outside dist-launch (or without those options) save() saves nothing and returns False, and load()
returns None. Importing this module imports neither torch nor numpy; loading imports whichever
the snapshot holds. The C++ SDK (dist/sdk/snapshot.h) reads and writes the same files; the format
and its rules: docs/SNAPSHOTS.md.
"""
from __future__ import annotations

import ctypes
import fcntl
import json
import operator
import os
import pickle
import struct
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["SnapshotError", "SnapshotMemoryError", "SnapshotShardError", "enabled", "load", "save",
           "steps"]

# The variables and the format (dist/contract/worker_contract.h, snapshot_format.h).
# BEGIN worker contract (contract/python_constants.py; do not edit)
SNAPSHOT_DIR_VARIABLE = "DIST_LAUNCH_SNAPSHOT_DIR"
SNAPSHOT_MEMORY_VARIABLE = "DIST_LAUNCH_SNAPSHOT_MEMORY"
SNAPSHOT_PERSIST_VARIABLE = "DIST_LAUNCH_SNAPSHOT_PERSIST_DIR"
SNAPSHOT_RUN_VARIABLE = "DIST_LAUNCH_SNAPSHOT_RUN"
SNAPSHOT_MAGIC = b"DLSNAP02"
SNAPSHOT_FOOTER_TAG = b"DLSNAPOK"
SNAPSHOT_ALIGN = 64
SNAPSHOT_FORMAT = 2
SNAPSHOT_RANK_FOLDER_PREFIX = "rank_"
SNAPSHOT_RANKS_FILE = ".ranks"
SNAPSHOT_HELD_PREFIX = ".held."
# END worker contract
KEEP = 2  # complete snapshots per rank

_PREFIX = struct.Struct("<8sQ")  # magic, header length
_FOOTER = struct.Struct("<8sQQ")  # "DLSNAPOK", total size, save id (the header's)
_NO_FOOTER = bytes(_FOOTER.size)


class SnapshotError(RuntimeError):
    """A snapshot could not be saved or read."""


class SnapshotShardError(SnapshotError):
    """A sharded (DTensor) snapshot cannot be given back here: no process group, or a device mesh
    other than the one it was saved on. Raised by load(), never skipped past."""


class SnapshotMemoryError(SnapshotError, MemoryError):
    """A save would take the snapshots past --snapshot-memory."""


def _align(n: int) -> int:
    return (n + SNAPSHOT_ALIGN - 1) // SNAPSHOT_ALIGN * SNAPSHOT_ALIGN


def _step_name(step: int) -> str:
    return f"step_{step:020d}.snap"


def _step_of(name: str) -> Optional[int]:
    if name.startswith("step_") and name.endswith(".snap"):
        try:
            return int(name[5:-5])
        except ValueError:
            return None
    return None


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, "") or default)
    except ValueError:
        return default


def _local_rank() -> int:
    return _env_int("LOCAL_RANK", 0)


def _rank() -> int:
    return _env_int("RANK", 0)


def _world_size() -> int:
    return _env_int("WORLD_SIZE", 1)


def _job() -> str:
    return os.environ.get("TORCHELASTIC_RUN_ID") or "none"


def _who() -> str:
    return f"rank {_rank()} (local rank {_local_rank()})"


def _rank_dir(root: str, rank: int) -> str:
    return os.path.join(root, f"rank_{rank}")


def _rank_of_folder(name: str) -> Optional[int]:
    if name.startswith(SNAPSHOT_RANK_FOLDER_PREFIX):
        try:
            return int(name[len(SNAPSHOT_RANK_FOLDER_PREFIX):])
        except ValueError:
            return None
    return None


def enabled() -> bool:
    """Whether this worker runs under an agent that holds snapshots."""
    return bool(os.environ.get(SNAPSHOT_DIR_VARIABLE))


_warned = False


def _warn_disabled() -> None:
    global _warned
    if not _warned:
        _warned = True
        print("dist_launch.snapshot: no snapshot store here (run under dist-launch "
              "--snapshot-memory SIZE): nothing is saved", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Writing

class _Tensor:
    """One tensor's bytes, in place (no copy), and how to rebuild it."""

    def __init__(self, kind: str, dtype: str, shape: List[int], view: Any, keep: Any,
                 requires_grad: bool = False, parameter: bool = False):
        self.kind, self.dtype, self.shape = kind, dtype, shape
        self.view, self.keep = view, keep  # a buffer over the bytes, and what keeps them alive
        self.requires_grad, self.parameter = requires_grad, parameter
        self.name = ""
        self.offset = 0
        self.source: Any = None  # the object while pickling (its id is the key)
        self.dtensor: Optional[dict] = None  # a DTensor's: this is its local shard

    @property
    def nbytes(self) -> int:
        return self.view.nbytes


def _torch_tensor(t: Any, torch: Any) -> Optional[_Tensor]:
    if t.layout != torch.strided or t.is_quantized or getattr(t, "is_nested", False):
        return None  # pickled as torch pickles it
    data = t.detach()
    if data.device.type != "cpu":
        data = data.cpu()
    # (a lazily conjugated or negated view's bytes are the value's before it: resolved first)
    data = data.resolve_conj().resolve_neg().contiguous()
    nbytes = data.numel() * data.element_size()
    view = memoryview((ctypes.c_ubyte * nbytes).from_address(data.data_ptr())) if nbytes else \
        memoryview(b"")
    return _Tensor("torch", str(data.dtype).replace("torch.", ""), list(data.shape), view, data,
                   requires_grad=bool(t.requires_grad),
                   parameter=isinstance(t, torch.nn.Parameter))


def _sharded(header: dict) -> bool:
    """Whether a snapshot holds DTensor or ShardedTensor shards (state that is one rank's own)."""
    if header.get("sharded_tensors"):
        return True
    for entry in header.get("tensors", []):
        for p in (entry.get("dtensor") or {}).get("placements", []):
            if "shard" in p or "partial" in p:
                return True
    return False


def _dtensor_class(torch: Any) -> Any:
    """torch's DTensor class where it is already imported (never imported for it), else None."""
    for name in ("torch.distributed.tensor", "torch.distributed._tensor"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "DTensor"):
            return module.DTensor
    return None


def _placement(p: Any) -> dict:
    name = type(p).__name__
    if name == "_StridedShard":
        return {"shard": int(p.dim), "split_factor": int(p.split_factor)}
    if name == "Shard":
        return {"shard": int(p.dim)}
    if name == "Replicate":
        return {"replicate": True}
    if name in ("Partial", "_Partial"):  # reduce_op: "sum" (torch 2.4+) or ReduceOp.SUM (before)
        return {"partial": str(getattr(p, "reduce_op", "sum")).split(".")[-1].lower()}
    raise SnapshotError(f"a DTensor placement this snapshot cannot keep: {p!r}")


def _dtensor(t: Any, torch: Any) -> _Tensor:
    """A DTensor as its local shard, with what rebuilds it on the same mesh."""
    mesh = t.device_mesh
    local = _torch_tensor(t.to_local(), torch)
    if local is None:
        raise SnapshotError(f"a DTensor whose local shard is not a plain tensor: {t.to_local()!r}")
    local.requires_grad = bool(t.requires_grad)
    local.parameter = isinstance(t, torch.nn.Parameter)
    local.dtensor = {
        "shape": list(t.shape), "stride": list(t.stride()),
        "placements": [_placement(p) for p in t.placements],
        "mesh": {"device_type": mesh.device_type, "shape": list(mesh.shape),
                 "dim_names": list(mesh.mesh_dim_names or []),
                 "ranks": [int(r) for r in mesh.mesh.flatten().tolist()]}}
    return local


def _sharded_tensor_class() -> Any:
    """torch's ShardedTensor (FSDP1's SHARDED_STATE_DICT, torch.distributed.checkpoint's state)
    where it is already imported (never imported for it), else None."""
    module = sys.modules.get("torch.distributed._shard.sharded_tensor")
    return getattr(module, "ShardedTensor", None)


def _sharded_tensor(t: Any, torch: Any, first: int) -> Tuple[dict, List[_Tensor]]:
    """A ShardedTensor as its local shards (table entries from `first` on) and what rebuilds it:
    the global size and every rank's shard offsets, sizes and placement."""
    meta = t.metadata()
    props = meta.tensor_properties
    shards: List[_Tensor] = []
    for shard in t.local_shards():
        local = _torch_tensor(shard.tensor, torch)
        if local is None:
            raise SnapshotError(f"a ShardedTensor whose local shard is not a plain tensor: "
                                f"{shard.tensor!r}")
        shards.append(local)
    record = {
        "size": list(meta.size), "dtype": str(props.dtype).replace("torch.", ""),
        "requires_grad": bool(props.requires_grad),
        "local": list(range(first, first + len(shards))),
        "local_metadata": [_shard_metadata(shard.metadata) for shard in t.local_shards()],
        "shards": [_shard_metadata(m) for m in meta.shards_metadata]}
    return record, shards


def _shard_metadata(m: Any) -> dict:
    return {"offsets": [int(x) for x in m.shard_offsets], "sizes": [int(x) for x in m.shard_sizes],
            "placement": str(m.placement)}


def _as_sharded_tensor(record: dict, tensors: List[Any]) -> Any:
    """A ShardedTensor of the job's default process group, from this rank's local shards."""
    import torch
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        raise SnapshotShardError(
            "this snapshot holds ShardedTensor shards (FSDP1's sharded state dict): call load() "
            "after torch.distributed.init_process_group()")
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
    from torch.distributed._shard.sharded_tensor.metadata import (ShardedTensorMetadata,
                                                                  TensorProperties)

    def metadata(m: dict) -> Any:
        return ShardMetadata(shard_offsets=m["offsets"], shard_sizes=m["sizes"],
                             placement=m["placement"])

    local = [Shard(tensors[i], metadata(m))
             for i, m in zip(record["local"], record["local_metadata"])]
    properties = TensorProperties(dtype=getattr(torch, record["dtype"]),
                                  requires_grad=record["requires_grad"])
    global_metadata = ShardedTensorMetadata(
        shards_metadata=[metadata(m) for m in record["shards"]], size=torch.Size(record["size"]),
        tensor_properties=properties)
    return ShardedTensor._init_from_local_shards_and_global_metadata(local, global_metadata)


def _numpy_array(a: Any, np: Any) -> Optional[_Tensor]:
    if a.dtype.hasobject or a.dtype.fields is not None or a.dtype.subdtype is not None:
        return None  # pickled as numpy pickles it
    data = np.ascontiguousarray(a)
    if data.dtype.kind in "biufc?":  # numbers: named as torch and the C++ SDK name them
        if not data.dtype.isnative:
            data = data.astype(data.dtype.newbyteorder("="))
        dtype = data.dtype.name
    else:
        dtype = data.dtype.str
    return _Tensor("numpy", dtype, list(data.shape), memoryview(data.reshape(-1).view(np.uint8)),
                   data)


class _Pickler(pickle.Pickler):
    """Pickles the object with every tensor replaced by its index in the tensor table."""

    def __init__(self, file: Any, tensors: List[_Tensor]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors = tensors
        self.by_id: Dict[int, int] = {}
        self.torch = sys.modules.get("torch")
        self.np = sys.modules.get("numpy")
        self.dtensor = _dtensor_class(self.torch) if self.torch is not None else None
        self.sharded_tensor = _sharded_tensor_class() if self.torch is not None else None
        self.sharded: List[dict] = []  # ShardedTensors: their local shards are in `tensors`
        self.sharded_by_id: Dict[int, int] = {}
        self.keep: List[Any] = []  # what the ids above name, alive while pickling

    def persistent_id(self, obj: Any) -> Optional[Tuple[str, int]]:
        found = self.by_id.get(id(obj))
        if found is not None:
            return ("tensor", found)
        found = self.sharded_by_id.get(id(obj))
        if found is not None:
            return ("sharded", found)
        if self.sharded_tensor is not None and isinstance(obj, self.sharded_tensor):
            record, shards = _sharded_tensor(obj, self.torch, len(self.tensors))
            self.tensors.extend(shards)
            self.sharded_by_id[id(obj)] = len(self.sharded)
            self.sharded.append(record)
            self.keep.append(obj)
            return ("sharded", len(self.sharded) - 1)
        tensor = None
        if self.dtensor is not None and isinstance(obj, self.dtensor):
            tensor = _dtensor(obj, self.torch)
        elif self.torch is not None and isinstance(obj, self.torch.Tensor):
            tensor = _torch_tensor(obj, self.torch)
        elif self.np is not None and type(obj) is self.np.ndarray:
            tensor = _numpy_array(obj, self.np)
        if tensor is None:
            return None
        self.by_id[id(obj)] = len(self.tensors)
        self.tensors.append(tensor)
        tensor.source = obj  # the id stays valid while pickling
        return ("tensor", len(self.tensors) - 1)


def _name_tensors(obj: Any, tensors: List[_Tensor], by_id: Dict[int, int],
                  sharded: List[dict], sharded_by_id: Dict[int, int]) -> None:
    """Each tensor's path in the object ("model.fc.weight"; a ShardedTensor's local shards
    "model.fc.weight#shard0", ...), for the C++ SDK and for errors."""
    stack = [("", obj)]
    seen = set()
    while stack:
        path, item = stack.pop()
        index = by_id.get(id(item))
        if index is not None:
            if not tensors[index].name:
                tensors[index].name = path
            continue
        index = sharded_by_id.get(id(item))
        if index is not None:
            for j, i in enumerate(sharded[index]["local"]):
                if not tensors[i].name:
                    tensors[i].name = f"{path}#shard{j}"
            continue
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            stack.extend((f"{path}.{k}" if path else str(k), v) for k, v in item.items())
        elif isinstance(item, (list, tuple)):
            stack.extend((f"{path}.{i}" if path else str(i), v) for i, v in enumerate(item))
    for i, t in enumerate(tensors):
        if not t.name:
            t.name = f"#{i}"


class _Plan:
    """The file's layout: header, pickled skeleton, tensors, footer."""

    def __init__(self, step: int, obj: Any):
        import io
        self.saved_at = time.time_ns()
        self.save_id = 0
        while not self.save_id:  # 0 is no save
            self.save_id = int.from_bytes(os.urandom(8), "little")
        self.tensors: List[_Tensor] = []
        buffer = io.BytesIO()
        pickler = _Pickler(buffer, self.tensors)
        pickler.dump(obj)
        self.skeleton = buffer.getvalue()
        self.sharded = pickler.sharded
        _name_tensors(obj, self.tensors, pickler.by_id, pickler.sharded, pickler.sharded_by_id)
        pickler.keep.clear()
        for t in self.tensors:
            t.source = None
        header = self._header(step, 0, 0)
        while True:  # offsets depend on the header's length, which depends on them
            start = _align(_PREFIX.size + len(header))
            self.skeleton_offset = start
            offset = _align(start + len(self.skeleton))
            for t in self.tensors:
                t.offset = offset
                offset = _align(offset + t.nbytes)
            self.size = offset + _FOOTER.size
            new_header = self._header(step, self.skeleton_offset, self.size)
            if len(new_header) <= len(header):
                header = new_header.ljust(len(header))
                break
            header = new_header
        self.header = header

    def _header(self, step: int, skeleton_offset: int, size: int) -> bytes:
        return json.dumps({
            "format": SNAPSHOT_FORMAT, "job": _job(),
            "run": os.environ.get(SNAPSHOT_RUN_VARIABLE, ""),
            "rank": _rank(), "world_size": _world_size(), "local_rank": _local_rank(),
            "generation": _env_int("TORCHELASTIC_RESTART_COUNT", 0), "step": step,
            "saved_at": self.saved_at, "save_id": self.save_id, "writer": "python",
            "skeleton": {"kind": "pickle", "offset": skeleton_offset,
                         "size": len(self.skeleton)},
            "tensors": [dict({"name": t.name, "kind": t.kind, "dtype": t.dtype,
                              "shape": t.shape, "offset": t.offset, "nbytes": t.nbytes,
                              "requires_grad": t.requires_grad, "parameter": t.parameter},
                             **({"dtensor": t.dtensor} if t.dtensor else {}))
                        for t in self.tensors],
            **({"sharded_tensors": self.sharded} if self.sharded else {}),
            "size": size}).encode()

    def write(self, fd: int) -> None:
        """The data, then the header, then the footer (_reserve zeroed the footers first): a
        reader that overlaps the rewrite of a recycled file sees a zeroed footer or two save ids
        (docs/SNAPSHOTS.md)."""
        os.pwrite(fd, self.skeleton, self.skeleton_offset)
        for t in self.tensors:
            written = 0
            while written < t.nbytes:  # a write of more than 2 GiB returns short
                written += os.pwrite(fd, t.view[written:], t.offset + written)
        os.pwrite(fd, _PREFIX.pack(SNAPSHOT_MAGIC, len(self.header)) + self.header, 0)
        os.pwrite(fd, _FOOTER.pack(SNAPSHOT_FOOTER_TAG, self.size, self.save_id),
                  self.size - _FOOTER.size)


def _allocated(path: str) -> int:
    try:
        return os.stat(path).st_blocks * 512
    except OSError:
        return 0


def _usage(root: str) -> int:
    total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            total += _allocated(os.path.join(dirpath, name))
    return total


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep_torn(rank_dir: str) -> None:
    """Removes the partial saves of workers that died while saving, and the held files (below)
    that no load maps any more."""
    for name in os.listdir(rank_dir):
        if name.startswith(SNAPSHOT_HELD_PREFIX):
            _remove_unless_mapped(os.path.join(rank_dir, name))
        elif name.startswith(".tmp."):
            try:
                pid = int(name.rsplit(".", 1)[1])
            except ValueError:
                continue
            if pid != os.getpid() and not _pid_alive(pid):
                try:
                    os.unlink(os.path.join(rank_dir, name))
                except FileNotFoundError:
                    pass


# A load with mmap=True maps its file and holds a shared flock on it for as long as the mapping
# lives. A save rewrites (recycles) a file only under an exclusive flock, taken without waiting and
# kept until the new save is complete; a file it cannot lock is mapped: it leaves the rank's saves
# as SNAPSHOT_HELD_PREFIX + its name (still counted in the memory the snapshots hold) and the save
# allocates anew. A held file goes at the next save once nothing maps it.


def _lock_for_rewrite(path: str) -> Optional[int]:
    """A descriptor of `path` holding its exclusive flock, or None where a load maps it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError:
        os.close(fd)
        raise
    return fd


def _remove_unless_mapped(path: str) -> None:
    try:
        fd = _lock_for_rewrite(path)
    except OSError:
        return  # gone already
    if fd is None:
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def _complete_steps(rank_dir: str) -> List[int]:
    try:
        names = os.listdir(rank_dir)
    except FileNotFoundError:
        return []
    return sorted(s for s in map(_step_of, names) if s is not None)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _header_of(path: str) -> Optional[dict]:
    """The header of a whole snapshot (its footer's save id is the header's), reading only the two
    ends; None for anything else: torn, being rewritten, or not a snapshot of this format."""
    try:
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            if size < _PREFIX.size + _FOOTER.size:
                return None
            magic, header_len = _PREFIX.unpack(f.read(_PREFIX.size))
            if magic != SNAPSHOT_MAGIC or _PREFIX.size + header_len + _FOOTER.size > size:
                return None
            header_bytes = f.read(header_len)
            footer = os.pread(f.fileno(), _FOOTER.size, size - _FOOTER.size)
    except OSError:
        return None
    if len(footer) != _FOOTER.size:
        return None
    tag, total, save_id = _FOOTER.unpack(footer)
    if tag != SNAPSHOT_FOOTER_TAG or total != size or not save_id:
        return None
    try:
        header = json.loads(header_bytes)
    except ValueError:
        return None
    if not isinstance(header, dict) or header.get("format") != SNAPSHOT_FORMAT or \
            header.get("save_id") != save_id:
        return None
    return header


def _saved_at(path: str) -> int:
    header = _header_of(path)
    return int(header.get("saved_at", 0)) if header else -1


def _current_ranks(root: str) -> Optional[set]:
    """The ranks the agent runs on this node now (.ranks), None when it lists none."""
    try:
        with open(os.path.join(root, SNAPSHOT_RANKS_FILE)) as f:
            return {int(line) for line in f if line.strip()}
    except (OSError, ValueError):
        return None


def _evict_other_ranks(root: str, needed: int, limit: int) -> int:
    """Removes snapshots of ranks this node no longer runs (an elastic job that reshaped), oldest
    saved first, until `needed` more bytes fit; returns the usage after."""
    usage = _usage(root)
    current = _current_ranks(root)
    if current is None:
        return usage
    stale = []
    for name in os.listdir(root):
        rank = _rank_of_folder(name)
        if rank is None or rank in current or rank == _rank():
            continue
        folder = os.path.join(root, name)
        stale.extend((_saved_at(os.path.join(folder, n)), os.path.join(folder, n))
                     for n in os.listdir(folder) if _step_of(n) is not None)
    for _, path in sorted(stale):
        if usage + needed <= limit:
            break
        freed = _allocated(path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        usage -= freed
    return usage


def _reserve(root: str, rank_dir: str, step: int,
             size: int) -> Tuple[int, str, Optional[int]]:
    """Under the store's lock: a file of `size` bytes for this save, allocated (the memory of this
    rank's oldest saved snapshot reused when it keeps KEEP of them, or of the same step's, unless a
    load maps it), within the memory limit, its old and new footers zeroed. Returns (descriptor,
    temporary path, the descriptor holding a recycled file's exclusive flock or None): close the
    last once the save is renamed into place."""
    limit = int(os.environ.get(SNAPSHOT_MEMORY_VARIABLE, "0") or 0)
    lock = os.open(os.path.join(root, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    rewrite_lock = None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _sweep_torn(rank_dir)
        complete = _complete_steps(rank_dir)
        recycled = None
        if step in complete:
            recycled = _step_name(step)
        elif len(complete) >= KEEP:
            recycled = min((_step_name(s) for s in complete),
                           key=lambda n: _saved_at(os.path.join(rank_dir, n)))
        temporary = os.path.join(rank_dir, f".tmp.{_step_name(step)}.{os.getpid()}")
        reused = 0
        if recycled is not None:
            path = os.path.join(rank_dir, recycled)
            rewrite_lock = _lock_for_rewrite(path)
            if rewrite_lock is None:  # a load maps it: it leaves the saves, unchanged
                os.rename(path, os.path.join(rank_dir, f"{SNAPSHOT_HELD_PREFIX}{recycled}"))
                recycled = None
            else:
                reused = _allocated(path)
        usage = _usage(root)
        needed = max(0, size - reused)
        if limit and usage + needed > limit:
            usage = _evict_other_ranks(root, needed, limit)
        if limit and usage + needed > limit:
            held = _held_bytes(rank_dir)
            raise SnapshotMemoryError(
                f"snapshot of {_who()} at step {step} needs {_human(size)}: the snapshots hold "
                f"{_human(usage)} of --snapshot-memory {_human(limit)} (each rank keeps {KEEP} "
                f"and writes a third while saving"
                + (f"; {_human(held)} of them still mapped by load(mmap=True): drop the loaded "
                   f"tensors, or load without mmap" if held else "")
                + "); raise --snapshot-memory or save less")
        if recycled is not None:
            os.rename(os.path.join(rank_dir, recycled), temporary)
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            have = os.fstat(fd).st_size  # a reused file's memory is all there already
            if have >= _FOOTER.size:  # whoever still reads the old save sees it is gone
                os.pwrite(fd, _NO_FOOTER, have - _FOOTER.size)
            if have > size:
                os.ftruncate(fd, size)
            elif have < size:
                os.posix_fallocate(fd, have, size - have)
            os.pwrite(fd, _NO_FOOTER, size - _FOOTER.size)
        except OSError as e:
            os.close(fd)
            os.unlink(temporary)
            raise SnapshotMemoryError(f"cannot allocate {_human(size)} for the snapshot of "
                                      f"{_who()} at step {step}: {e}") from e
        return fd, temporary, rewrite_lock
    except BaseException:
        if rewrite_lock is not None:
            os.close(rewrite_lock)
        raise
    finally:
        os.close(lock)


def _held_bytes(rank_dir: str) -> int:
    try:
        return sum(_allocated(os.path.join(rank_dir, n)) for n in os.listdir(rank_dir)
                   if n.startswith(SNAPSHOT_HELD_PREFIX))
    except FileNotFoundError:
        return 0


def _step_number(step: Any) -> int:
    """A step as a snapshot names it: an integer (int, numpy's, a one-element integer tensor, a
    float that is a whole number: 3.0), never a fraction cut to one (save(1.5) was stored as step
    1, which a save(1) then replaced), nor a bool."""
    number = None
    if not isinstance(step, bool):
        try:
            number = operator.index(step)
        except TypeError:
            if isinstance(step, float) and step.is_integer():
                number = int(step)
    if number is None:
        raise TypeError(f"snapshot step must be an integer, got {step!r}")
    if number < 0:
        raise ValueError(f"snapshot step must be >= 0, got {number}")
    return number


def save(step: int, obj: Any) -> bool:
    """Stores `obj` (a state_dict, or any picklable object; its tensors as raw bytes) as this rank's
    snapshot at `step`, atomically. Returns False when no agent holds snapshots here. Raises
    SnapshotMemoryError past --snapshot-memory, SnapshotError when it cannot be written."""
    root = os.environ.get(SNAPSHOT_DIR_VARIABLE)
    if not root:
        _warn_disabled()
        return False
    step = _step_number(step)
    plan = _Plan(step, obj)
    rank_dir = _rank_dir(root, _rank())
    try:
        os.makedirs(rank_dir, exist_ok=True)
        fd, temporary, rewrite_lock = _reserve(root, rank_dir, step, plan.size)
    except SnapshotError:
        raise
    except OSError as e:
        raise SnapshotError(f"cannot save the snapshot of {_who()} at step {step} in "
                            f"{rank_dir}: {e}") from e
    try:
        try:
            plan.write(fd)
        except OSError as e:
            os.close(fd)
            os.unlink(temporary)
            raise SnapshotError(f"cannot write the snapshot of {_who()} at step {step}: "
                                f"{e}") from e
        os.close(fd)
        os.rename(temporary, os.path.join(rank_dir, _step_name(step)))
    finally:
        if rewrite_lock is not None:  # complete (or gone): a load may map it now
            os.close(rewrite_lock)
    return True


# ---------------------------------------------------------------------------------------------
# Reading

def _roots() -> List[Tuple[str, str]]:
    """(where, path) of shared memory, then of --snapshot-dir."""
    roots = (("shared memory", os.environ.get(SNAPSHOT_DIR_VARIABLE)),
             ("--snapshot-dir", os.environ.get(SNAPSHOT_PERSIST_VARIABLE)))
    return [(where, r) for where, r in roots if r]


class _Found:
    """One whole snapshot file of this job, by its header."""

    def __init__(self, where: str, path: str, header: dict):
        self.where, self.path, self.header = where, path, header
        self.step = int(header.get("step", -1))
        self.saved_at = int(header.get("saved_at", 0))
        self.rank = header.get("rank")


def _found(replicated: bool) -> Dict[int, List[_Found]]:
    """This job's whole snapshots here, by rank folder: every folder's with `replicated`, else
    those saved in this world size (this rank's, and its peers', for the steps they share)."""
    job, world = _job(), _world_size()
    by_rank: Dict[int, List[_Found]] = {}
    for where, root in _roots():
        try:
            names = os.listdir(root)
        except FileNotFoundError:
            continue
        for name in names:
            rank = _rank_of_folder(name)
            if rank is None:
                continue
            folder = os.path.join(root, name)
            try:
                files = os.listdir(folder)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for file in files:
                if _step_of(file) is None:
                    continue
                path = os.path.join(folder, file)
                header = _header_of(path)
                if header is None or header.get("job") != job or header.get("rank") != rank:
                    continue  # torn, or foreign: never returned
                if not replicated and header.get("world_size") != world:
                    continue
                by_rank.setdefault(rank, []).append(_Found(where, path, header))
    return by_rank


def steps() -> List[int]:
    """This rank's complete snapshots' steps (of this job, in this world size), oldest saved first
    (the last is the newest save, whatever its step)."""
    newest: Dict[int, int] = {}
    for f in _found(False).get(_rank(), []):
        newest[f.step] = max(newest.get(f.step, f.saved_at), f.saved_at)
    return sorted(newest, key=lambda step: (newest[step], step))


def _buffer(size: int) -> Any:
    """`size` writable bytes, uninitialised where numpy is already there (no zeroing to pay)."""
    np = sys.modules.get("numpy")
    if np is not None:
        return np.empty(size, dtype=np.uint8)
    return bytearray(size)


def _read(path: str, mapped: bool = False, locked: bool = True) -> Tuple[dict, Any]:
    """(header, the file's bytes) of a whole snapshot: a private copy, or `mapped` (copy-on-write,
    holding the file's shared flock while the mapping lives where `locked`: no save rewrites it)."""
    if mapped:
        data = _map(path, locked)
        got = size = len(data)
    else:
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            data = _buffer(size)
            view = memoryview(data).cast("B")
            got = 0
            while got < size:
                n = f.readinto(view[got:])
                if not n:
                    break
                got += n
    if got != size or size < _PREFIX.size + _FOOTER.size:
        raise SnapshotError(f"{path}: truncated")
    magic, header_len = _PREFIX.unpack_from(data, 0)
    footer, total, save_id = _FOOTER.unpack_from(data, size - _FOOTER.size)
    if magic != SNAPSHOT_MAGIC or footer != SNAPSHOT_FOOTER_TAG or total != size or not save_id:
        raise SnapshotError(f"{path}: not a complete dist-launch snapshot")
    header = json.loads(bytes(memoryview(data)[_PREFIX.size:_PREFIX.size + header_len]))
    if header.get("format") != SNAPSHOT_FORMAT:
        raise SnapshotError(f"{path}: snapshot format {header.get('format')}, this reads "
                            f"{SNAPSHOT_FORMAT}")
    if header.get("save_id") != save_id:  # read while it was rewritten
        raise SnapshotError(f"{path}: torn (rewritten while read)")
    if mapped and locked:
        return header, data  # no save rewrites it while it is mapped
    with open(path, "rb", buffering=0) as f:  # the header again: not one read while written
        if f.read(_PREFIX.size + header_len) != bytes(memoryview(data)[:_PREFIX.size + header_len]):
            raise SnapshotError(f"{path}: torn (rewritten while read)")
    return header, data


def _map(path: str, locked: bool) -> Any:
    """The file mapped copy-on-write (the tensors on it are writable; what is written stays in
    this process). Where `locked`, its shared flock is held by the mapping's own descriptor for
    as long as the mapping lives: a save then leaves the file alone (see SNAPSHOT_HELD_PREFIX)."""
    import mmap
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if locked:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                raise SnapshotError(f"{path}: being rewritten by a save") from None
        size = os.fstat(fd).st_size
        if size == 0:
            raise SnapshotError(f"{path}: truncated")
        return mmap.mmap(fd, size, access=mmap.ACCESS_COPY)  # keeps a duplicate of fd
    finally:
        os.close(fd)


class _Meshes:
    """The device meshes a load gives its DTensors: the caller's, or one made like the saved one
    (once per load: making a mesh of several dimensions is collective)."""

    def __init__(self, given: Any):
        self.given = given
        self.made: Dict[str, Any] = {}

    def get(self, saved: dict) -> Any:
        import torch
        import torch.distributed as dist
        shape, names = list(saved["shape"]), list(saved.get("dim_names") or [])
        if self.given is not None:
            mesh = self.given
            if list(mesh.shape) != shape or mesh.mesh.flatten().tolist() != saved["ranks"]:
                raise SnapshotShardError(
                    f"this snapshot's shards were saved on a device mesh of shape {shape} over "
                    f"ranks {saved['ranks']}; the mesh given has shape {list(mesh.shape)} over "
                    f"{mesh.mesh.flatten().tolist()}: load it on the mesh that saved it")
            return mesh
        key = json.dumps(saved, sort_keys=True)
        if key in self.made:
            return self.made[key]
        if not (dist.is_available() and dist.is_initialized()):
            raise SnapshotShardError(
                "this snapshot holds DTensor shards (FSDP2, tensor parallelism): call load() after "
                "torch.distributed.init_process_group(), or pass mesh=")
        count = 1
        for n in shape:
            count *= n
        if saved["ranks"] != list(range(count)) or count != dist.get_world_size():
            raise SnapshotShardError(
                f"this snapshot's shards were saved on a device mesh over ranks {saved['ranks']} "
                f"(world size {dist.get_world_size()} now): pass that mesh as mesh=")
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(saved["device_type"], tuple(shape),
                                mesh_dim_names=tuple(names) if names else None)
        self.made[key] = mesh
        return mesh


def _placements(saved: List[dict]) -> List[Any]:
    try:
        from torch.distributed.tensor import Partial, Replicate, Shard
    except ImportError:  # torch before 2.4
        from torch.distributed._tensor import Replicate, Shard  # type: ignore
        from torch.distributed._tensor.placement_types import _Partial as Partial  # type: ignore
    placements = []
    for p in saved:
        if "split_factor" in p:
            try:
                from torch.distributed.tensor.placement_types import _StridedShard
            except ImportError as e:
                raise SnapshotShardError(f"this snapshot holds strided shards, which this torch "
                                         f"cannot rebuild: {e}") from e
            placements.append(_StridedShard(p["shard"], split_factor=p["split_factor"]))
        elif "shard" in p:
            placements.append(Shard(p["shard"]))
        elif "replicate" in p:
            placements.append(Replicate())
        else:
            placements.append(Partial(p["partial"]))
    return placements


def _as_dtensor(local: Any, saved: dict, meshes: _Meshes) -> Any:
    import torch
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch before 2.4
        from torch.distributed._tensor import DTensor  # type: ignore
    mesh = meshes.get(saved["mesh"])
    if mesh.device_type != "cpu":
        local = local.to(torch.device(mesh.device_type, torch.accelerator.current_device_index())
                         if hasattr(torch, "accelerator") else mesh.device_type)
    return DTensor.from_local(local, mesh, _placements(saved["placements"]), run_check=False,
                              shape=torch.Size(saved["shape"]), stride=tuple(saved["stride"]))


def _rebuild(entry: dict, data: Any, meshes: Optional[_Meshes] = None) -> Any:
    if entry.get("dtensor"):
        import torch
        local = _rebuild(dict(entry, dtensor=None, parameter=False, requires_grad=False), data)
        t = _as_dtensor(local, entry["dtensor"], meshes or _Meshes(None))
        if entry.get("parameter"):
            return torch.nn.Parameter(t, requires_grad=bool(entry.get("requires_grad")))
        if entry.get("requires_grad"):
            t.requires_grad_(True)
        return t
    shape, offset, nbytes = entry["shape"], entry["offset"], entry["nbytes"]
    # "raw" (the C++ SDK's): numpy arrays, or torch tensors where numpy is missing or has no such
    # type (bfloat16).
    if entry["kind"] == "torch" or (entry["kind"] == "raw" and
                                    (not _has("numpy") or entry["dtype"] == "bfloat16")):
        import torch
        dtype = getattr(torch, entry["dtype"])
        if nbytes == 0:
            t = torch.empty(shape, dtype=dtype)
        else:
            count = nbytes // torch.empty((), dtype=dtype).element_size()
            t = torch.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)
        if entry.get("parameter"):
            return torch.nn.Parameter(t, requires_grad=bool(entry.get("requires_grad")))
        if entry.get("requires_grad"):
            t.requires_grad_(True)
        return t
    import numpy as np
    dtype = np.dtype(entry["dtype"])
    count = nbytes // dtype.itemsize if dtype.itemsize else 0
    return np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)


def _has(module: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(module) is not None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: Any, tensors: List[Any], sharded: List[dict]):
        super().__init__(file)
        self.tensors = tensors
        self.sharded = sharded
        self.made: Dict[int, Any] = {}  # ShardedTensors, each made once

    def persistent_load(self, pid: Any) -> Any:
        kind, index = pid
        if kind == "tensor":
            return self.tensors[index]
        if kind == "sharded":
            if index not in self.made:
                self.made[index] = _as_sharded_tensor(self.sharded[index], self.tensors)
            return self.made[index]
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


def _load_file(path: str, meshes: Optional[_Meshes] = None, mapped: bool = False,
               locked: bool = True) -> Tuple[dict, Any]:
    import io
    header, data = _read(path, mapped, locked)
    meshes = meshes or _Meshes(None)
    tensors = [_rebuild(entry, data, meshes) for entry in header["tensors"]]
    skeleton = header["skeleton"]
    if skeleton["kind"] == "pickle":
        start = skeleton["offset"]
        skeleton_bytes = bytes(memoryview(data)[start:start + skeleton["size"]])
        obj = _Unpickler(io.BytesIO(skeleton_bytes), tensors,
                         header.get("sharded_tensors", [])).load()
    else:  # the C++ SDK's: named tensors
        obj = {entry["name"]: t for entry, t in zip(header["tensors"], tensors)}
    return header, obj


def _order(by_rank: Dict[int, List[_Found]], rank: int, replicated: bool) -> List[_Found]:
    """The files to try, best first. Newest saved first (not highest step: an earlier run's step
    5000 loses to this run's 110); for this rank, the steps every rank folder here has before the
    rest (replicas and shards resume at one step)."""
    def newest_first(files: List[_Found]) -> List[_Found]:
        return sorted(files, key=lambda f: (f.saved_at, f.where == "shared memory"), reverse=True)

    if replicated:
        return newest_first([f for files in by_rank.values() for f in files])
    mine = newest_first(by_rank.get(rank, []))
    if not mine:
        return []
    common = {f.step for f in mine}
    for files in by_rank.values():
        common &= {f.step for f in files}
    # Of the run that saved this rank's newest: an earlier run's step that every rank has never
    # beats this run's newer ones.
    run = mine[0].header.get("run")
    preferred = [f for f in mine if f.step in common and f.header.get("run") == run]
    return preferred + [f for f in mine if f not in preferred]


def _say(text: str) -> None:
    print(f"dist_launch.snapshot: {text}", file=sys.stderr, flush=True)


def load(step: Optional[int] = None, *, replicated: bool = False, mesh: Any = None,
         mmap: bool = False) -> Optional[Tuple[int, Any]]:
    """(step, obj) of this rank's newest complete snapshot of this job (preferring a step that
    every rank here has), or of `step`; None when there is none. Only this rank's files, saved in
    this world size, are read, unless `replicated` (state that is the same on every rank, as DDP's):
    then any rank's newest save of this job. Tensors come back as they were saved (torch or numpy,
    on the CPU), sharing one buffer per snapshot; DTensors as DTensors on `mesh` (default: a mesh
    made like the one that saved them; raises SnapshotShardError where none can be). Where it
    resumed from goes to stderr.

    mmap=True (as torch.load's): the tensors are the snapshot file's memory, mapped copy-on-write,
    not a private copy (a load of a state of S bytes then costs about nothing, not S more). Writing
    to them copies the pages written, privately. While any of them lives, no save rewrites that
    file: its memory stays taken (counted in --snapshot-memory) until they are dropped. So load
    into the model and optimizer (load_state_dict copies into parameters; an optimizer's CPU state
    of the same dtype may keep the loaded tensors themselves), then drop what load returned."""
    rank = _rank()
    by_rank = _found(replicated)
    candidates = _order(by_rank, rank, replicated)
    meshes = _Meshes(mesh)  # once: a mesh of several dimensions is made collectively
    if step is not None:
        step = _step_number(step)
        candidates = [f for f in candidates if f.step == step]
    for f in candidates:
        if f.rank != rank and _sharded(f.header):
            _say(f"{_who()}: rank {f.rank}'s snapshot of step {f.step} holds shards (DTensor or "
                 f"ShardedTensor), which are that rank's own: not loaded (replicated=True is for state the same "
                 f"on every rank)")
            continue
        try:
            header, obj = _load_file(f.path, meshes, mapped=mmap,
                                     locked=f.where == "shared memory")
        except SnapshotShardError:
            raise  # not this file's fault: every file of this rank would fail alike
        except (OSError, SnapshotError, ValueError, KeyError):
            continue  # replaced while read, or a damaged copy: the next one
        if header.get("save_id") != f.header.get("save_id"):
            continue  # rewritten (another save) since it was listed
        origin = "" if header.get("rank") == rank else f" of rank {header.get('rank')}"
        _say(f"{_who()} resumes from step {header['step']}{origin} (job {_job()!r}, saved by "
             f"{header.get('run') or 'an agent'} in generation {header.get('generation')}, "
             f"world size {header.get('world_size')}) from {f.where} {os.path.dirname(f.path)}")
        return int(header["step"]), obj
    if not candidates and not replicated and step is None:
        saved = _found(True)  # this job's, whatever rank and world size saved them
        if saved:
            worlds = sorted({f.header.get("world_size") for files in saved.values()
                             for f in files})
            _say(f"no snapshot of {_who()} in world size {_world_size()} here; ranks "
                 f"{sorted(saved)} of job {_job()!r} have some (world size "
                 f"{', '.join(map(str, worlds))}): if the state is the same on every rank (DDP), "
                 f"load(replicated=True) resumes from theirs")
    return None
