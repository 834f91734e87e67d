"""Restoring the training state in place from the trainer's own in-memory snapshot (issue 41's rollback).

Runs in the trainer's main thread, at a step boundary, called by the non-finite rollback
(:mod:`procsv.trainer.nonfinite.rollback`). Every snapshot the trainer copied into its snapshot
memory (:mod:`procsv.trainer.checkpoint.snapshot`) lies in a slot whose header says ``complete``
and the step, next to the specs and small frames :class:`~procsv.trainer.checkpoint.snapshot_store.SnapshotStore`
keeps for it (:class:`Copy`). The newest such copy before a poisoned step is restored from there,
with no disk read and no round trip to the checkpoint service.

Why not the checkpoint service's held snapshot (``RecoverQuery``)? It is made for a restarted
trainer: asked by the living trainer that handed the snapshot over (same ZeroMQ identity), the
service persists nothing and answers "no in-memory snapshot is held"; and where it does persist,
it commits the snapshot to disk and drops it without telling the trainer (no ``SaveResult`` goes
to it: its newest committed step and its slot bookkeeping go stale). The trainer's own copy is
the same bytes, already in its memory.

A copy is verified before anything is assigned (:func:`problem`), as a restore from disk is
against its manifest: the slot's header still says complete for that step (a copy cut short, or
a slot since overwritten, is never read), every tensor lies within the slot, the object graph the
copy was taken of is the program's object graph now (the same variables under the same keys,
shapes and dtypes), and it holds no poison (the non-finite rules of :mod:`procsv.trainer.nonfinite.scan`).
A copy that fails any of these is not used: the rollback restores from disk instead. A trainer
group's restore from the checkpoint service's copies (:mod:`procsv.trainer.checkpoint.group_restore`)
uses the same check of the object graph (:func:`mismatch`) and the same assignment (:func:`assign`). A TF1 graph
program's state (:class:`~procsv.trainer.checkpoint.name_based.NameBasedCheckpoint`) has no
assign-from-memory ops in its finalized graph: it is always restored from disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from procsv.common.snapshot_memory import slot_problem
from procsv.ipc.messages import TensorSpec
from procsv.trainer.checkpoint.name_based import NameBasedCheckpoint
from procsv.trainer.checkpoint.snapshot import GRAPH_KEY, SnapshotArena, serialize_object_graph


@dataclass(frozen=True)
class Copy:
    """One snapshot in a slot of the snapshot memory: its step, specs and frames (the tensors that
    travel as frames: strings, variants, the object graph)."""

    slot: int
    step: int
    specs: tuple[TensorSpec, ...]
    frames: tuple[Any, ...]


def newest_before(copies: dict[int, Copy], arena: Optional[SnapshotArena], before: int) -> Optional[Copy]:
    """The newest copy of a step before ``before`` whose slot still holds it whole (None: none)."""
    if arena is None:
        return None
    whole = [c for c in copies.values() if c.step < before and not _slot_problem(arena, c)]
    return max(whole, key=lambda c: c.step) if whole else None


def whole_steps(copies: dict[int, Copy], arena: Optional[SnapshotArena]) -> tuple[int, ...]:
    """The steps of the copies whose slots still hold them whole (a trainer group's verdict says them)."""
    if arena is None:
        return ()
    return tuple(sorted(c.step for c in copies.values() if not _slot_problem(arena, c)))


def _slot_problem(arena: SnapshotArena, copy: Copy) -> str:
    if arena.header.size < 2 * (copy.slot + 1):
        return "the snapshot memory was made again since"
    return slot_problem(int(arena.header[2 * copy.slot]), int(arena.header[2 * copy.slot + 1]), copy.step)


def _values(copy: Copy, arena: SnapshotArena) -> dict[str, Any]:
    """Each tensor of ``copy`` as a NumPy array (a copy out of the slot) or, for a variant, its
    serialized bytes; raises ValueError if a tensor lies outside its slot."""
    import tensorflow as tf

    lo, hi = arena.base(copy.slot), arena.base(copy.slot) + arena.slot_size
    framed = iter(copy.frames)
    out: dict[str, Any] = {}
    for spec in copy.specs:
        if spec.offset is None:
            frame = next(framed)
            if spec.dtype == "variant":
                out[spec.key] = bytes(frame)
            elif spec.dtype == "string":
                data, items, pos = bytes(frame), [], 0
                for n in spec.lengths or []:
                    items.append(data[pos:pos + n])
                    pos += n
                out[spec.key] = np.array(items, dtype=object).reshape(spec.shape)
            else:
                out[spec.key] = np.asarray(frame).reshape(spec.shape)
            continue
        dtype = np.dtype(tf.as_dtype(spec.dtype).as_numpy_dtype)
        nbytes = int(np.prod(spec.shape, dtype=np.int64)) * dtype.itemsize
        if spec.offset < lo or spec.offset + nbytes > hi:
            raise ValueError(f"{spec.key} lies outside slot {copy.slot}")
        out[spec.key] = arena.array[spec.offset:spec.offset + nbytes].view(dtype).reshape(spec.shape).copy()
    return out


def problem(ckpt: Any, copy: Copy, arena: SnapshotArena, poison: Any = None) -> str:
    """Why ``copy`` must not be restored into ``ckpt``; empty if it may. ``poison(specs, memory)``:
    the non-finite check (the keys it finds poisoned), None: not checked."""
    if isinstance(ckpt, NameBasedCheckpoint):
        return "a TF1 graph program's state is restored from disk"
    torn = _slot_problem(arena, copy)
    if torn:
        return f"slot {copy.slot} no longer holds it: {torn}"
    framed = iter(copy.frames)
    stored_graph = None
    for spec in copy.specs:
        frame = next(framed) if spec.offset is None else None
        if spec.key == GRAPH_KEY:
            stored_graph = frame
    wrong = mismatch(ckpt, copy.specs, None if stored_graph is None else bytes(stored_graph))
    if wrong:
        return wrong
    if poison is not None:
        keys = poison(list(copy.specs), arena.array)
        if keys:
            return f"non-finite values in {', '.join(keys[:3])}"
    return ""


def mismatch(ckpt: Any, specs: Sequence[TensorSpec], stored_graph: Optional[bytes]) -> str:
    """Why a snapshot of ``specs``, taken of the object graph ``stored_graph`` (serialized), does not
    fit the program's state ``ckpt`` now; empty if it does (the same object graph, the same tensors
    under the same keys and dtypes)."""
    named, graph = serialize_object_graph(ckpt)
    if stored_graph is None or stored_graph != graph.SerializeToString():
        return "the program's object graph changed since it was taken"
    wanted = {s.name: s for saveable in named for s in saveable.specs}
    have = {spec.key: spec for spec in specs if spec.key != GRAPH_KEY}
    if wanted.keys() != have.keys():
        return "it does not hold the same tensors as the program's state"
    for key, spec in wanted.items():
        if spec.dtype.name != have[key].dtype:
            return f"{key} is {have[key].dtype} in it and {spec.dtype.name} in the program"
    return ""


def restore(ckpt: Any, copy: Copy, arena: SnapshotArena) -> None:
    """Assign every tensor of ``copy`` to the object it was read from (checked by :func:`problem`
    first): variables, a ``tf.data`` iterator's state, every saveable ``Checkpoint.restore`` would set."""
    assign(ckpt, _values(copy, arena))


def assign(ckpt: Any, values: dict[str, Any]) -> None:
    """Assign ``values`` (by checkpoint key: NumPy arrays, a variant's serialized bytes) to the
    objects of ``ckpt`` they were read from (checked by :func:`mismatch` first)."""
    import tensorflow as tf

    named, _ = serialize_object_graph(ckpt)
    for saveable in named:
        tensors = []
        for spec in saveable.specs:
            value = values[spec.name]
            if spec.dtype == tf.variant:
                tensors.append(tf.io.parse_tensor(value, tf.variant))
            else:
                tensors.append(tf.constant(value, dtype=spec.dtype))
        saveable.restore(tensors, None)
