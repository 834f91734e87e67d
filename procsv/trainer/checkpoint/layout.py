"""Where each tensor of a snapshot lies in a slot of the snapshot memory, and the specs that say so.

Runs in the trainer's main thread, at a step boundary, for :mod:`procsv.trainer.checkpoint.snapshot`'s
copy: the layout is computed from the tensors of a walk of the object graph and reused by every
in-memory snapshot that reuses the walk (while each tensor still has its dtype and size), and so
are the :class:`~procsv.ipc.messages.TensorSpec` objects of the tensors whose shape and offset did
not change: the checkpoint service's message then carries the same objects, whose encoding the
codec reuses (:func:`procsv.ipc.codec.encode`; issue 54: the hand-off was 0.18 ms of each snapshot).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from procsv.common.errors import UnsupportedState
from procsv.ipc.messages import TensorSpec

ALIGN = 64  # each tensor's offset in the arena (and in the data file): what TF and dlpack expect
FRAME_DTYPES = ("string", "variant")
_graph_spec: Optional[TensorSpec] = None


def graph_spec(key: str, nbytes: int) -> TensorSpec:
    """The spec of the serialized object graph's frame (``key``, ``nbytes`` long): the last one
    made if the same."""
    global _graph_spec
    if _graph_spec is None or _graph_spec.key != key or _graph_spec.lengths != [nbytes]:
        _graph_spec = TensorSpec(key, "string", [], [nbytes])
    return _graph_spec


@dataclass
class Layout:
    """Where each tensor of a snapshot goes: its offset in the slot (None: it travels as a frame),
    and the NumPy dtype and byte size it had then. Asking TF a tensor's dtype and shape costs
    about 4 us each, more than copying a small tensor, so an in-memory snapshot reusing a
    :class:`~procsv.trainer.checkpoint.snapshot.Plan` reuses its layout too, after checking each tensor against it (:func:`arrays_of`)."""

    offsets: list[Optional[int]]
    names: list[str]  # TF's dtype name, what the service writes into the checkpoint
    dtypes: list[Any]
    nbytes: list[int]
    total: int
    made: dict[int, tuple[tuple[int, ...], TensorSpec]] = field(default_factory=dict)  # i -> the last spec of tensor i

    def spec(self, i: int, key: str, name: str, shape: tuple[int, ...], offset: int) -> TensorSpec:
        """The spec of tensor ``i`` (``key``, of dtype ``name``) of ``shape`` at ``offset`` in the
        snapshot memory: the very object the last snapshot with this layout sent if that is the
        same, so that the codec reuses its encoding (:func:`procsv.ipc.codec.encode`)."""
        held = self.made.get(i)
        if held is not None and held[0] == shape and held[1].offset == offset and held[1].key == key:
            return held[1]
        spec = TensorSpec(key, name, list(shape), offset=offset)
        self.made[i] = (shape, spec)
        return spec


def make_layout(tensors: list[tuple[str, Any]]) -> Layout:
    out = Layout([], [], [], [], 0)
    pos = 0
    for key, t in tensors:
        dtype = _tf_dtype(key, t)
        name = dtype.name
        out.names.append(name)
        if name in FRAME_DTYPES:
            out.offsets.append(None)
            out.dtypes.append(None)
            out.nbytes.append(0)
            continue
        if name == "resource" or not dtype.is_numpy_compatible:
            raise UnsupportedState(f"{key}: tensors of dtype {name} cannot be checkpointed by procsv")
        pos = -(-pos // ALIGN) * ALIGN
        shape = list(t.shape) if isinstance(t, np.ndarray) else t.shape.as_list()
        size = int(np.prod(shape, dtype=np.int64)) * dtype.size
        out.offsets.append(pos)
        out.dtypes.append(np.dtype(dtype.as_numpy_dtype))
        out.nbytes.append(size)
        pos += size
    out.total = pos
    return out


def _tf_dtype(key: str, t: Any) -> Any:
    """The TensorFlow dtype of a tensor, or of a NumPy array read by a session (bytes: string)."""
    if not isinstance(t, np.ndarray):
        return t.dtype
    import tensorflow as tf

    if t.dtype.kind in "OSU":
        return tf.string
    try:
        return tf.as_dtype(t.dtype)
    except TypeError:
        raise UnsupportedState(f"{key}: arrays of dtype {t.dtype} cannot be checkpointed by procsv") from None


def arrays_of(tensors: list[tuple[str, Any]], layout: Layout) -> Optional[list[Any]]:
    """Each arena-bound tensor as an array sharing its buffer (None for a frame), or None if a
    tensor's dtype or size is not the one ``layout`` has for it (a variable was reassigned with
    another shape: the layout is computed again)."""
    if len(tensors) != len(layout.offsets):
        return None
    out: list[Any] = []
    for (_, t), offset, dtype, nbytes in zip(tensors, layout.offsets, layout.dtypes, layout.nbytes):
        if offset is None:
            out.append(None)
            continue
        src = np.asarray(t)  # shares the tensor's buffer on CPU: no copy until the one into the slot
        if src.dtype != dtype or src.nbytes != nbytes:
            return None
        out.append(src)
    return out
