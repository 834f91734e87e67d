"""Turning one :class:`SaveData` snapshot into TensorFlow checkpoint files in a private folder.

Runs in the checkpoint service, called by :meth:`CheckpointStore.commit` for step 1 of the
commit protocol. A checkpoint is one bundle in two data files (shards) and one ``.index``:

* shard 0, the numeric tensors, straight from the trainer's shared snapshot memory by
  :mod:`procsv.services.checkpoint.bundle` (one ``O_DIRECT`` write, CRC-32C at memory speed, no copy);
* the last shard, what is not in that memory and travelled in frames -- strings (the object graph
  among them) and numeric tensors outside the memory -- laid out by
  :mod:`procsv.services.checkpoint.framed`.

So the result has ``.data-00000-of-00002`` (numeric) and ``.data-00001-of-00002`` (the rest), or
only the second kind when no tensor lies in shared memory, which ``tf.train.Checkpoint.restore``,
``tf.train.load_checkpoint`` and ``CheckpointManager`` read like any sharded checkpoint. All of it
is written without TensorFlow, so the service does not import it (about 3.5 s of CPU and a few
hundred MB per process). A snapshot with a variant tensor (a ``tf.data`` iterator's state) or a
dtype :mod:`~procsv.services.checkpoint.framed` does not know takes TensorFlow's path instead:
the framed shard through ``tf.raw_ops.SaveV2`` (variants parsed back with ``tf.io.parse_tensor``),
the two merged with ``MergeV2Checkpoints``. Both paths give the same bytes for the same snapshot
(tests/test_checkpoint_framed.py).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional, Sequence

import numpy as np

from procsv.ipc.messages import SaveData, TensorSpec
from procsv.common.errors import CheckpointError
from procsv.services.checkpoint.arena import ArenaView
from procsv.services.checkpoint import framed as framed_shard
from procsv.services.checkpoint.bundle import (DIRECT_ALIGN, BundleTensor, IndexEntry, build_index, data_filename,
                                               write_memory_shard, write_small)
from procsv.common import crc32c


def write_snapshot(tmp_prefix: str, msg: SaveData, payload: Sequence[Any], view: Optional[ArenaView]) -> dict[str, int]:
    """Write ``msg``'s tensors as the checkpoint ``tmp_prefix``; return the CRC-32C of files it already knows.

    The keys of the result are file names (no folder); the data files' checksums come for free
    from the per-tensor checksums, so nobody reads those files back.
    """
    in_arena = [t for t in msg.tensors if t.offset is not None]
    framed = [t for t in msg.tensors if t.offset is None]
    if msg.meta_graph and payload:  # graph mode: the MetaGraphDef, last; <prefix>.meta beside the checkpoint
        meta, payload = payload[-1], payload[:-1]
        with open(tmp_prefix + ".meta", "wb") as fh:  # (in the commit's tmp folder: fsynced, renamed, retired with it)
            fh.write(meta.bytes if hasattr(meta, "bytes") else bytes(meta))
    if len(framed) != len(payload):
        raise CheckpointError(f"snapshot has {len(framed)} framed tensors but {len(payload)} frames")
    if in_arena and view is None:
        raise CheckpointError("snapshot refers to shared memory but names none")
    if not needs_tensorflow(msg):
        return _write_native(tmp_prefix, in_arena, framed, payload, view)
    return write_with_tensorflow(tmp_prefix, in_arena, framed, payload, view)


def needs_tensorflow(msg: SaveData) -> str:
    """Why ``msg``'s snapshot takes TensorFlow's path ("" if the native writer writes it all)."""
    framed = [t for t in msg.tensors if t.offset is None]
    odd = sorted({t.dtype for t in msg.tensors if t.offset is not None and t.dtype not in framed_shard.DTYPES})
    if framed_shard.native(framed) and not odd:
        return ""
    if any(t.dtype == "variant" for t in framed):
        return "a variant tensor: a tf.data iterator's state"
    return "a dtype the native writer does not know: " + ", ".join(
        odd or sorted({t.dtype for t in framed if t.dtype not in framed_shard.DTYPES}))


def _write_native(tmp_prefix: str, in_arena: list[TensorSpec], framed: list[TensorSpec], payload: Sequence[Any],
                  view: Optional[ArenaView]) -> dict[str, int]:
    n_shards = (1 if in_arena else 0) + 1
    chunks, entries = framed_shard.encode(framed, payload, shard=n_shards - 1)  # checked before any file is written
    known: dict[str, int] = {}
    if in_arena and view is not None:
        path = data_filename(tmp_prefix, 0, n_shards)
        file_crc, arena_entries = _write_arena_shard(path, in_arena, view)
        known[os.path.basename(path)] = file_crc
        entries = arena_entries + entries
    data = b"".join(chunks)
    path = data_filename(tmp_prefix, n_shards - 1, n_shards)
    write_small(path, data)
    known[os.path.basename(path)] = crc32c.value(data)
    write_small(tmp_prefix + ".index", build_index(entries, n_shards))
    return known


def _write_arena_shard(path: str, in_arena: list[TensorSpec], view: ArenaView) -> tuple[int, list[IndexEntry]]:
    """The tensors lie in one slot of the memory: the data file starts at the slot's first page."""
    base = min(int(t.offset or 0) for t in in_arena) // DIRECT_ALIGN * DIRECT_ALIGN
    bundle = [_rebase(_bundle_tensor(t, view), base) for t in in_arena]
    length = max(b.offset + b.size for b in bundle)
    return write_memory_shard(path, bundle, view.address + base, memoryview(view.mm)[base:], length)


def write_with_tensorflow(tmp_prefix: str, in_arena: list[TensorSpec], framed: list[TensorSpec],
                          payload: Sequence[Any], view: Optional[ArenaView]) -> dict[str, int]:
    """TensorFlow's path (see the module docstring): the framed shard by ``SaveV2``, then ``MergeV2Checkpoints``."""
    import tensorflow as tf

    parts_dir = tmp_prefix + "_temp"
    os.makedirs(parts_dir)
    n_parts = (1 if in_arena else 0) + 1
    parts = [os.path.join(parts_dir, f"part-{i:05d}-of-{n_parts:05d}") for i in range(n_parts)]
    known: dict[str, int] = {}
    if in_arena and view is not None:
        file_crc, entries = _write_arena_shard(data_filename(parts[0]), in_arena, view)
        write_small(parts[0] + ".index", build_index(entries, num_shards=1))
        known[os.path.basename(data_filename(tmp_prefix, 0, 2))] = file_crc
    keys = [spec.key for spec in framed]
    tensors = [_tensor_from_frame(tf, spec, frame) for spec, frame in zip(framed, payload)]
    tf.raw_ops.SaveV2(prefix=parts[-1], tensor_names=keys, shape_and_slices=[""] * len(keys), tensors=tensors)
    del tensors
    tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=parts, destination_prefix=tmp_prefix, delete_old_dirs=True)
    return known


def _bundle_tensor(spec: TensorSpec, view: ArenaView) -> BundleTensor:
    info = framed_shard.DTYPES.get(spec.dtype)
    if info is None:
        import tensorflow as tf  # a dtype the table does not know: TensorFlow's own answer

        try:
            dtype = tf.dtypes.as_dtype(spec.dtype)
        except TypeError:
            raise CheckpointError(f"{spec.key}: unknown dtype {spec.dtype!r}") from None
        info = (dtype.as_datatype_enum, dtype.size)
    if any(d < 0 for d in spec.shape):
        raise CheckpointError(f"{spec.key}: negative dimension in shape {spec.shape}")
    size = int(np.prod(spec.shape, dtype=np.int64)) * info[1]
    offset = int(spec.offset or 0)
    if offset < 0 or offset + size > view.ref.size:
        raise CheckpointError(f"{spec.key}: bytes [{offset}, {offset + size}) lie outside the snapshot memory")
    return BundleTensor(spec.key, info[0], tuple(spec.shape), offset, size)


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


def save_errors() -> tuple[type[BaseException], ...]:
    """What a failed save raises: ours, the system's, and ``tf.errors.OpError`` once TensorFlow is
    imported (only the writer's fallback path imports it: a variant tensor or a rare dtype)."""
    tf = sys.modules.get("tensorflow")
    return (CheckpointError, OSError, ValueError) + ((tf.errors.OpError,) if tf is not None else ())
