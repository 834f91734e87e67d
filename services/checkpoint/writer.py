"""Turning one :class:`SaveData` snapshot into TensorFlow checkpoint files in a private folder.

Runs in the checkpoint service, called by :meth:`CheckpointStore.commit` for step 1 of the
commit protocol. A checkpoint is written as two bundles merged into one with TensorFlow's own
``MergeV2Checkpoints`` (which renames data files and writes the merged ``.index``):

* the numeric tensors, straight from the trainer's shared snapshot memory by
  :mod:`procsv.services.checkpoint.bundle` (one ``O_DIRECT`` write, CRC-32C at memory speed, no copy);
* what is not in that memory -- strings, variants (parsed back with ``tf.io.parse_tensor``) and the object graph, which are
  small, through ``tf.raw_ops.SaveV2``.

So the result has ``.data-00000-of-00002`` (numeric) and ``.data-00001-of-00002`` (the rest),
or only the second kind when no tensor lies in shared memory, which ``tf.train.Checkpoint.restore``, ``tf.train.load_checkpoint`` and ``CheckpointManager``
read like any sharded checkpoint.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

import numpy as np

from procsv.ipc.messages import SaveData, TensorSpec
from procsv.common.errors import CheckpointError
from procsv.services.checkpoint.arena import ArenaView
from procsv.services.checkpoint.bundle import DIRECT_ALIGN, BundleTensor, data_filename, write_bundle


def write_snapshot(tmp_prefix: str, msg: SaveData, payload: Sequence[Any], view: Optional[ArenaView]) -> dict[str, int]:
    """Write ``msg``'s tensors as the checkpoint ``tmp_prefix``; return the CRC-32C of files it already knows.

    The keys of the result are file names (no folder); the numeric data file's checksum comes
    for free from the per-tensor checksums, so nobody reads that file back.
    """
    import tensorflow as tf

    in_arena = [t for t in msg.tensors if t.offset is not None]
    framed = [t for t in msg.tensors if t.offset is None]
    if len(framed) != len(payload):
        raise CheckpointError(f"snapshot has {len(framed)} framed tensors but {len(payload)} frames")
    if in_arena and view is None:
        raise CheckpointError("snapshot refers to shared memory but names none")
    parts_dir = tmp_prefix + "_temp"
    os.makedirs(parts_dir)
    n_parts = (1 if in_arena else 0) + 1
    parts = [os.path.join(parts_dir, f"part-{i:05d}-of-{n_parts:05d}") for i in range(n_parts)]
    known: dict[str, int] = {}
    keys: list[str] = []
    tensors: list[Any] = []
    if in_arena and view is not None:
        # the tensors lie in one slot of the memory: the data file starts at the slot's first byte
        base = min(int(t.offset or 0) for t in in_arena) // DIRECT_ALIGN * DIRECT_ALIGN
        bundle = [_rebase(_bundle_tensor(t, view), base) for t in in_arena]
        length = max(b.offset + b.size for b in bundle)
        crc = write_bundle(parts[0], bundle, view.address + base, memoryview(view.mm)[base:], length)
        known[os.path.basename(data_filename(tmp_prefix, 0, 2))] = crc
    for spec, frame in zip(framed, payload):
        keys.append(spec.key)
        tensors.append(_tensor_from_frame(tf, spec, frame))
    tf.raw_ops.SaveV2(prefix=parts[-1], tensor_names=keys, shape_and_slices=[""] * len(keys), tensors=tensors)
    del tensors
    tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=parts, destination_prefix=tmp_prefix, delete_old_dirs=True)
    return known


def _bundle_tensor(spec: TensorSpec, view: ArenaView) -> BundleTensor:
    import tensorflow as tf

    try:
        dtype = tf.dtypes.as_dtype(spec.dtype)
    except TypeError:
        raise CheckpointError(f"{spec.key}: unknown dtype {spec.dtype!r}") from None
    if any(d < 0 for d in spec.shape):
        raise CheckpointError(f"{spec.key}: negative dimension in shape {spec.shape}")
    size = int(np.prod(spec.shape, dtype=np.int64)) * dtype.size
    offset = int(spec.offset or 0)
    if offset < 0 or offset + size > view.ref.size:
        raise CheckpointError(f"{spec.key}: bytes [{offset}, {offset + size}) lie outside the snapshot memory")
    return BundleTensor(spec.key, dtype.as_datatype_enum, tuple(spec.shape), offset, size)


def _rebase(t: BundleTensor, base: int) -> BundleTensor:
    return BundleTensor(t.key, t.dtype_enum, t.shape, t.offset - base, t.size)


def _tensor_from_frame(tf: Any, spec: TensorSpec, frame: Any) -> Any:
    buf = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
    if spec.dtype == "variant":
        return tf.io.parse_tensor(bytes(buf), out_type=tf.variant)
    if spec.lengths is not None:
        raw = bytes(buf)
        if sum(spec.lengths) != len(raw):
            raise CheckpointError(f"{spec.key}: string lengths add up to {sum(spec.lengths)}, frame has {len(raw)}")
        items, pos = [], 0
        for n in spec.lengths:
            items.append(raw[pos:pos + n])
            pos += n
        return tf.constant(np.array(items, dtype=object).reshape(spec.shape))
    try:
        np_dtype = tf.dtypes.as_dtype(spec.dtype).as_numpy_dtype
    except TypeError:
        raise CheckpointError(f"{spec.key}: unknown dtype {spec.dtype!r}") from None
    arr = np.frombuffer(buf, dtype=np_dtype)
    if arr.size != int(np.prod(spec.shape, dtype=np.int64)):
        raise CheckpointError(f"{spec.key}: frame has {arr.size} elements, shape {spec.shape} needs more or fewer")
    return tf.constant(arr.reshape(spec.shape))
