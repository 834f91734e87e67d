"""Turning a ``tf.train.Checkpoint`` into a snapshot for the checkpoint service.

Runs in the trainer, at a step boundary (the only moment the loop pays for a checkpoint). It
gathers the same key -> tensor list and serialized object graph that ``Checkpoint.write()`` would
save, so that the service, which has no model, writes a checkpoint that plain
``tf.train.Checkpoint.restore`` loads. The private TF route is feature-detected once
(:func:`self_test`) so that a TF release that moves it fails loudly at start, not silently at the
first save.

Where the bytes go (measured on 2 cores, see scripts/bench_checkpoint.py): numeric tensors are
copied, right here, into a :class:`SnapshotArena` -- one block of shared memory (a memfd) that
lives as long as the trainer, is pre-faulted once by a low-priority thread and reused by every
snapshot. A copy into such memory runs at 7-9 GB/s, about 0.15 s per GiB, and afterwards the
trainer holds no reference to its variables' buffers, so the next update pays no copy-on-write
(holding ``read_value()`` tensors while copying in the background costs more on this machine:
the next update then allocates fresh pages, about 0.4 s per GiB). The service maps the same
memory and writes it to disk without another copy. Strings, variants (a ``tf.data`` iterator's
state, serialized with ``tf.io.serialize_tensor``) and the object graph are small and travel as
ZeroMQ frames.

A TF1 graph program's state (:class:`~procsv.trainer.checkpoint.name_based.NameBasedCheckpoint`)
takes the same path with no object graph to walk: its variables are read with one
``session.run``, arrive as NumPy arrays keyed by their graph names, and the snapshot has no
object-graph entry, so that ``tf.compat.v1.train.Saver`` restores the checkpoint as one of its own.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from procsv.ipc.messages import ArenaRef, TensorSpec
from procsv.ipc.transport import CHECKPOINT_FRAME_MAX
from procsv.common.errors import UnsupportedState
from procsv.common.snapshot_memory import MAX_SLOTS, PAGE, SLOT_COMPLETE, SLOT_WRITING
from procsv.trainer.checkpoint import graph_shape
from procsv.trainer.checkpoint.layout import Layout, arrays_of, graph_spec, make_layout
from procsv.trainer.checkpoint.name_based import NameBasedCheckpoint

GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
MADV_POPULATE_WRITE = 23  # Linux 5.14+: allocate and map every page in one call


def serialize_object_graph(ckpt: Any) -> tuple[list[Any], Any]:
    """``ckpt``'s object graph as TensorFlow's checkpoint writer walks it: its named tensors and the
    graph's proto (what a snapshot, a memory restore and the non-finite scan read)."""
    import tensorflow as tf

    view = tf.__internal__.tracking.ObjectGraphView(ckpt)
    named, graph_proto, _ = view.serialize_object_graph()
    return named, graph_proto


def self_test(ckpt: Any) -> None:
    """Raise UnsupportedState now if this TF release lacks the snapshot route procsv uses."""
    if isinstance(ckpt, NameBasedCheckpoint):  # read by its own session.run: no private route
        return
    try:
        serialize_object_graph(ckpt)
    except (AttributeError, TypeError, ValueError) as exc:
        raise UnsupportedState(
            f"this TensorFlow release does not offer the checkpoint snapshot API procsv needs ({exc})"
        ) from None


class SnapshotArena:
    """Shared memory the trainer copies numeric tensors into; the checkpoint service reads it.

    A memfd: it needs no name, and the kernel frees it when the trainer and the service let go,
    even after a SIGKILL (nothing leaks in /dev/shm). The service opens it as
    ``/proc/<trainer pid>/fd/<fd>``, checks its inode, and maps it.

    Layout: one header page, then ``slots`` slots of ``slot_size`` bytes each (the in-memory tier
    uses three: :mod:`procsv.trainer.checkpoint.memory_tier`). The header holds, per slot, two int64: its
    state (:data:`SLOT_WRITING` while a copy is under way, :data:`SLOT_COMPLETE` after) and the
    step it holds. The trainer writes them before and after each copy, so a copy cut short by a
    kill is visible to the service as a torn slot, which it never persists
    (:mod:`procsv.common.snapshot_memory`).
    """

    def __init__(self, slot_bytes: int, slots: int = 1) -> None:
        if not 1 <= slots <= MAX_SLOTS:
            raise ValueError(f"{slots} slots: from 1 to {MAX_SLOTS}")
        self.slot_size = max(PAGE, -(-slot_bytes // PAGE) * PAGE)
        self.slots = slots
        self.size = PAGE + slots * self.slot_size
        self.fd = os.memfd_create("procsv-snapshot", getattr(os, "MFD_CLOEXEC", 1))
        try:
            os.ftruncate(self.fd, self.size)
            self.mm = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        self.array = np.frombuffer(self.mm, dtype=np.uint8)
        self.header = np.frombuffer(self.mm, dtype=np.int64, count=2 * slots)
        self.ino = os.fstat(self.fd).st_ino
        self._populator: Optional[threading.Thread] = None

    def base(self, slot: int) -> int:
        """The byte offset of ``slot`` in the memory."""
        return PAGE + slot * self.slot_size

    def mark(self, slot: int, state: int, step: int) -> None:
        """Write ``slot``'s header: the state first when starting a copy, last when completing one."""
        if state == SLOT_WRITING:
            self.header[2 * slot] = state
            self.header[2 * slot + 1] = step
        else:
            self.header[2 * slot + 1] = step
            self.header[2 * slot] = state

    def populating(self) -> bool:
        """The background thread is still faulting the pages in."""
        return self._populator is not None and self._populator.is_alive()

    def ref(self) -> ArenaRef:
        return ArenaRef(f"/proc/{os.getpid()}/fd/{self.fd}", self.ino, self.size)

    def populate(self, background: bool) -> None:
        """Fault every page in now (first-touch pages cost about 1 s per GiB here, touched ones nothing).

        In the background the work runs in a thread at nice 19 with the GIL released, so a
        training loop running meanwhile hardly notices.
        """
        if background:
            self._populator = threading.Thread(target=self._populate, args=(True,), name="procsv-arena", daemon=True)
            self._populator.start()
        else:
            self._populate(False)

    def _populate(self, nice: bool) -> None:
        if nice:
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread only
            except OSError:
                pass
        addr = self.array.ctypes.data
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(self.size), MADV_POPULATE_WRITE) == 0:
                return
        except (OSError, AttributeError):
            pass
        self.array[::PAGE] = 0  # an older kernel: touch one byte per page

    def close(self) -> None:
        if self._populator is not None:
            self._populator.join()
        self.array = np.empty(0, np.uint8)
        self.header = np.empty(0, np.int64)
        try:
            self.mm.close()
        except BufferError:  # a view still exported somewhere: the mapping goes with the process
            pass
        os.close(self.fd)


@dataclass
class Snapshot:
    """What :func:`take` gathered: specs (object graph last), frames for the non-arena tensors."""

    specs: list[TensorSpec]
    frames: list[Any]
    arena_bytes: int
    step: Optional[int] = None  # the global step stored in it (a name-based checkpoint's ``step_key``), if known


@dataclass
class Plan:
    """What a snapshot reads, found by walking the object graph: (key, reader) per tensor and the
    serialized object graph. Walking the graph costs far more than reading a small model's
    variables (14 ms against well under 1 ms for a 64-64-10 MLP here), so the in-memory tier reuses
    a plan for a while; that is right only if every reader reads the live value (``reusable``:
    variables, and SaveSpecs that compute their tensor when asked), and as long as the graph has
    the same objects in the same places (``shape``, checked by :mod:`procsv.trainer.checkpoint.graph_shape`
    before each reuse; the caller also walks again every few seconds).
    """

    readers: list[tuple[str, Callable[[], Any]]]
    graph: Optional[bytes]  # None: a name-based checkpoint (no object graph; its values are read in one batch)
    reusable: bool
    layout: Optional[Layout] = None  # where the last snapshot with this plan put each tensor
    shape: Optional[graph_shape.Shape] = None  # the graph's edges when walked (None: never reuse)
    marks: Optional[graph_shape.Marks] = None  # what graph_shape.unchanged checks them by (None: compare shapes)
    named: Optional[list[Any]] = None  # the walk's saveables (the non-finite rules are read from them, no second walk)


def plan(ckpt: Any) -> Plan:
    """Walk ``ckpt``'s object graph now."""
    if isinstance(ckpt, NameBasedCheckpoint):
        return Plan([], None, True, shape=graph_shape.shape(ckpt))
    edges, marks = graph_shape.walk(ckpt)
    named, graph_proto = serialize_object_graph(ckpt)
    readers: list[tuple[str, Callable[[], Any]]] = []
    reusable = True
    for saveable in named:
        for spec in saveable.specs:
            if spec.slice_spec:
                raise UnsupportedState(f"{spec.name}: partitioned (sliced) variables are not supported")
            reader, live = _reader(spec)
            reusable = reusable and live
            readers.append((spec.name, reader))
    return Plan(readers, graph_proto.SerializeToString(), reusable and edges is not None, shape=edges, named=named,
                marks=marks)


def _gather(ckpt: Any, known: Optional[Plan] = None) -> tuple[list[tuple[str, Any]], Optional[bytes]]:
    if isinstance(ckpt, NameBasedCheckpoint):
        return list(ckpt.gather()), None
    p = known if known is not None else plan(ckpt)
    return [(key, read()) for key, read in p.readers], p.graph


def _reader(spec: Any) -> tuple[Callable[[], Any], bool]:
    """How to read the value a SaveSpec would save, and whether that reads the live value.

    A plain variable is read with one ``ReadVariableOp``: TF's own closure runs four eager ops per
    variable (an is-initialized check, a read, two identities), about 0.5 ms each time: 0.3 s per
    snapshot for a model with 600 variables. Another callable goes through the SaveSpec as usual;
    a SaveSpec holding a fixed tensor (computed when the graph was walked) is not live; a ``tf.distribute``
    mirrored variable (a Keras 3 variable's spec holds it) is read with one ``ReadVariableOp`` too.
    """
    import tensorflow as tf

    fn = getattr(spec, "_tensor", None)
    if callable(fn) and getattr(fn, "__name__", "") == "_read_variable_closure" and fn.__closure__:
        for cell in fn.__closure__:
            try:
                var = cell.cell_contents
            except ValueError:
                continue
            if isinstance(var, tf.Variable) and hasattr(var, "handle") and var.dtype == spec.dtype:
                handle, dtype = var.handle, var.dtype
                return (lambda: tf.raw_ops.ReadVariableOp(resource=handle, dtype=dtype)), True
    if callable(fn):
        return (lambda: spec.tensor), True  # the property calls the callable itself
    if isinstance(fn, tf.distribute.DistributedValues) and isinstance(fn, tf.Variable) and fn.dtype == spec.dtype \
            and fn.synchronization != tf.VariableSynchronization.ON_READ:  # (its walk took 5-20 ms under MWMS)
        handle, dtype = fn.handle, fn.dtype  # this process's copy: every replica holds the same value
        return (lambda: tf.raw_ops.ReadVariableOp(resource=handle, dtype=dtype)), True
    value = spec.tensor
    return (lambda: value), False


def arena_bytes_needed(ckpt: Any) -> int:
    """How much snapshot memory ``ckpt`` needs now (reads no tensor data)."""
    tensors, _ = _gather(ckpt)
    return make_layout(tensors).total


def take(ckpt: Any, place: Callable[[int], Optional[tuple[SnapshotArena, int]]], known: Optional[Plan] = None) -> Snapshot:
    """Snapshot ``ckpt``: numeric tensors into the snapshot memory at the base offset that
    ``place(bytes needed)`` gives (the slot's), the rest as frames. ``known``: a :class:`Plan` to
    reuse instead of walking the object graph again.

    When ``place`` gives None every tensor travels as a frame (host copies), as a fallback.
    """
    tensors, graph = _gather(ckpt, known)
    stored = _stored_step(ckpt, tensors)
    layout = known.layout if known is not None else None
    arrays = arrays_of(tensors, layout) if layout is not None else None
    if layout is None or arrays is None:
        layout = make_layout(tensors)
        arrays = arrays_of(tensors, layout)
        if known is not None:
            known.layout = layout
    assert arrays is not None  # the layout was just made from these very tensors
    total = layout.total
    placed = place(total) if total else None
    arena, base = placed if placed is not None else (None, 0)
    if arena is not None and arena.size < base + total:
        raise ValueError(f"snapshot needs {total} bytes at {base}, the arena has {arena.size}")
    specs: list[TensorSpec] = []
    frames: list[Any] = []
    for i, ((key, t), offset, name, src) in enumerate(zip(tensors, layout.offsets, layout.names, arrays)):
        if offset is None:
            _add_frame(specs, frames, key, t)
        elif arena is None:
            arr = src.copy()
            specs.append(TensorSpec(key, name, list(arr.shape)))
            frames.append(arr)
        else:
            offset += base
            if src.nbytes:
                np.copyto(arena.array[offset:offset + src.nbytes], src.reshape(-1).view(np.uint8))
            specs.append(layout.spec(i, key, name, src.shape, offset))
    del tensors, arrays  # drop every reference to the variables' buffers: their next update writes in place
    if graph is not None:  # (a name-based checkpoint has no object graph: TF1's Saver reads it as its own)
        specs.append(graph_spec(GRAPH_KEY, len(graph)))
        frames.append(graph)
    framed = [spec for spec in specs if spec.offset is None]
    for spec, frame in zip(framed, frames):
        size = frame.nbytes if isinstance(frame, np.ndarray) else len(frame)
        if size > CHECKPOINT_FRAME_MAX:  # the service's socket would drop it (and the connection)
            raise UnsupportedState(f"{spec.key}: {size} bytes in one frame, above the checkpoint socket's limit of "
                                   f"{CHECKPOINT_FRAME_MAX} (procsv.ipc.transport.CHECKPOINT_FRAME_MAX)")
    return Snapshot(specs, frames, total if arena is not None else 0, stored)


def _stored_step(ckpt: Any, tensors: list[tuple[str, Any]]) -> Optional[int]:
    """The global step's value among the gathered ``tensors`` of a name-based checkpoint that saves
    one (its ``step_key``), read in the same ``session.run`` as every other variable: the step the
    checkpoint holds, which names it. None for an eager checkpoint or one without a global step."""
    key = getattr(ckpt, "step_key", None) if isinstance(ckpt, NameBasedCheckpoint) else None
    if key is None:
        return None
    for name, value in tensors:
        if name == key:
            return int(np.asarray(value).reshape(()))
    return None


def _add_frame(specs: list[TensorSpec], frames: list[Any], key: str, t: Any) -> None:
    if not isinstance(t, np.ndarray) and t.dtype.name == "variant":
        import tensorflow as tf

        data = tf.io.serialize_tensor(t).numpy()
        specs.append(TensorSpec(key, "variant", t.shape.as_list()))
        frames.append(data)
        return
    arr = t if isinstance(t, np.ndarray) else np.asarray(t.numpy())
    items = [x if isinstance(x, bytes) else x.encode() if isinstance(x, str) else bytes(x)
             for x in arr.reshape(-1).tolist()]
    specs.append(TensorSpec(key, "string", list(arr.shape), [len(x) for x in items]))
    frames.append(b"".join(items))
