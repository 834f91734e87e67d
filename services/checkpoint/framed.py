"""The tensors that travel as frames, as one bundle data shard, without TensorFlow.

Runs in the checkpoint service, called by :mod:`procsv.services.checkpoint.writer`. The numeric
tensors lie in the trainer's shared snapshot memory (:mod:`procsv.services.checkpoint.bundle`);
what travels in frames is small: the object graph and other strings, and numeric tensors that
were not placed in that memory. This module lays them out as TensorFlow's ``BundleWriter`` does
(in the order given, no alignment; a string tensor as its varint64 lengths, the masked CRC-32C of
those lengths, then the bytes) and computes each entry's CRC-32C as the bundle reader checks it,
so the checkpoint service needs no TensorFlow import for them. ``tests/test_checkpoint_framed.py``
checks the result byte for byte against ``tf.raw_ops.SaveV2`` and ``MergeV2Checkpoints``.

Variant tensors (a ``tf.data`` iterator's state) and dtypes missing from :data:`DTYPES` are not
handled here: :func:`native` says so and the writer takes TensorFlow's path for that checkpoint.
"""

from __future__ import annotations

import struct
from typing import Any, Sequence

from procsv.ipc.messages import TensorSpec
from procsv.common import crc32c
from procsv.common.errors import CheckpointError
from procsv.services.checkpoint.bundle import IndexEntry, varint

DT_STRING = 7
# TensorFlow's DataType enum (tensorflow/core/framework/types.proto) and the size of one element,
# by the dtype name the trainer sends (``tf.DType.name``); tests check it against tf.as_dtype.
DTYPES: dict[str, tuple[int, int]] = {
    "float32": (1, 4), "float64": (2, 8), "int32": (3, 4), "uint8": (4, 1), "int16": (5, 2), "int8": (6, 1),
    "complex64": (8, 8), "int64": (9, 8), "bool": (10, 1), "bfloat16": (14, 2), "uint16": (17, 2),
    "complex128": (18, 16), "float16": (19, 2), "uint32": (22, 4), "uint64": (23, 8),
}


def native(specs: Sequence[TensorSpec]) -> bool:
    """Whether every one of ``specs`` can be written by this module (no variant, no unknown dtype)."""
    return all(s.lengths is not None if s.dtype == "string" else s.dtype in DTYPES for s in specs)


def encode(specs: Sequence[TensorSpec], frames: Sequence[Any], shard: int) -> tuple[list[bytes], list[IndexEntry]]:
    """The data shard ``shard`` of ``specs`` (chunks to write in order) and each tensor's index entry.

    Raises :class:`CheckpointError` for a frame that does not match its spec."""
    if len(specs) != len(frames):
        raise CheckpointError(f"snapshot has {len(specs)} framed tensors but {len(frames)} frames")
    chunks: list[bytes] = []
    entries: list[IndexEntry] = []
    pos = 0
    for spec, frame in zip(specs, frames):
        raw = bytes(frame.buffer if hasattr(frame, "buffer") else memoryview(frame))
        if any(d < 0 for d in spec.shape):
            raise CheckpointError(f"{spec.key}: negative dimension in shape {spec.shape}")
        count = 1
        for d in spec.shape:
            count *= int(d)
        if spec.dtype == "string":
            body, crc = _string_tensor(spec, raw, count)
            enum = DT_STRING
        else:
            info = DTYPES.get(spec.dtype)
            if info is None:
                raise CheckpointError(f"{spec.key}: dtype {spec.dtype!r} is not one this writer knows")
            enum, size = info
            if len(raw) != count * size:
                raise CheckpointError(f"{spec.key}: frame has {len(raw)} bytes, shape {spec.shape} of "
                                      f"{spec.dtype} needs {count * size}")
            body, crc = [raw], crc32c.value(raw)
        n = sum(len(b) for b in body)
        chunks.extend(body)
        entries.append(IndexEntry(spec.key, enum, tuple(int(d) for d in spec.shape), shard, pos, n, crc))
        pos += n
    return chunks, entries


def _string_tensor(spec: TensorSpec, raw: bytes, count: int) -> tuple[list[bytes], int]:
    """TensorFlow's on-disk string tensor: varint64 lengths, their masked checksum, the bytes.

    The entry's checksum covers each length as a little-endian uint32 (uint64 beyond 4 GiB), then
    the four checksum bytes, then the string bytes."""
    lengths = spec.lengths or []
    if len(lengths) != count:
        raise CheckpointError(f"{spec.key}: {len(lengths)} string lengths for shape {spec.shape}")
    if any(n < 0 for n in lengths) or sum(lengths) != len(raw):
        raise CheckpointError(f"{spec.key}: string lengths add up to {sum(lengths)}, frame has {len(raw)}")
    varints = bytearray()
    crc = 0
    for n in lengths:
        varints += varint(n)
        crc = crc32c.extend(crc, struct.pack("<I", n) if n <= 0xFFFFFFFF else struct.pack("<Q", n))
    length_check = struct.pack("<I", crc32c.mask(crc))
    crc = crc32c.extend(crc, length_check)
    crc = crc32c.extend(crc, raw)
    return [bytes(varints), length_check, raw], crc

