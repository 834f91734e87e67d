"""TensorBoard event records, encoded by hand: the summary service's hot path.

Runs in the summary service process. An event file is a sequence of TFRecords (``uint64 length,
uint32 masked crc32c(length), data, uint32 masked crc32c(data)``) whose data are serialized
``Event`` protos. This is the one place procsv encodes them, by hand on purpose: building protobuf
objects and TensorBoard's pure-Python CRC (its ``EventFileWriter``) cost tens of microseconds per
event; here the few ``Event`` shapes procsv writes are packed with ``struct`` (field for field
what protobuf's serializer emits) and the CRC is :mod:`procsv.common.crc32c`'s. All scalars of
one step in a batch share one ``Event`` with several ``Summary.Value`` entries.
tests/test_summary_records.py compares every shape with protobuf's serializer and reads the
files back with TensorBoard's CRC check and its ``EventAccumulator``.
"""

from __future__ import annotations

import struct
from typing import Sequence

import numpy as np

from procsv.common.crc32c import masked

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_F64 = struct.Struct("<d")

# SessionLog.SessionStatus
START, STOP, CHECKPOINT = 1, 2, 3


def frame(data: bytes) -> bytes:
    """One TFRecord holding ``data``."""
    head = _U64.pack(len(data))
    return b"".join((head, _U32.pack(masked(head)), data, _U32.pack(masked(data))))


def varint(n: int) -> bytes:
    """Protobuf varint; negative numbers as 64-bit two's complement (int64 fields)."""
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def _event_head(wall_time: float, step: int) -> bytes:
    """Event fields 1 (wall_time) and 2 (step), omitted when zero as proto3 does."""
    head = b"\x09" + _F64.pack(wall_time) if wall_time != 0.0 else b""
    return head + (b"\x10" + varint(step) if step != 0 else b"")


def summary_event(wall_time: float, step: int, summary: bytes) -> bytes:
    """A serialized ``Event`` carrying a serialized ``Summary``."""
    return _event_head(wall_time, step) + _field(5, summary)


def graph_event(wall_time: float, step: int, graph: bytes, meta: bool = False) -> bytes:
    """A serialized ``Event`` carrying a serialized ``GraphDef`` (field 4), or a ``MetaGraphDef``
    (field 9) when ``meta``: what TensorBoard's graph view reads."""
    return _event_head(wall_time, step) + _field(9 if meta else 4, graph)


def file_version_event(wall_time: float) -> bytes:
    """The first ``Event`` of every event file: ``file_version: "brain.Event:2"``."""
    return _event_head(wall_time, 0) + _field(3, b"brain.Event:2")


def session_log_event(wall_time: float, step: int, status: int, checkpoint_path: str = "") -> bytes:
    """A serialized ``Event`` carrying a ``SessionLog`` (:data:`START`, :data:`STOP` or :data:`CHECKPOINT`)."""
    log = b"\x08" + varint(status) if status else b""
    if checkpoint_path:
        log += _field(2, checkpoint_path.encode())
    return _event_head(wall_time, step) + _field(7, log)


def scalar_summary(tag: str, value: float) -> bytes:
    """A serialized ``Summary`` holding one ``simple_value``."""
    return _field(1, _field(1, tag.encode()) + b"\x15" + struct.pack("<f", value))


class ScalarEncoder:
    """Packs columns of scalars into records, one ``Event`` per run of equal steps.

    Keeps the encoded prefix of every tag it has seen (``Summary.value`` key, length, tag field
    and the ``simple_value`` key), so a row costs one slice and one join.
    """

    def __init__(self) -> None:
        self._prefix: dict[str, bytes] = {}

    def prefix(self, tag: str) -> bytes:
        p = self._prefix.get(tag)
        if p is None:
            tag_field = _field(1, tag.encode())
            p = b"\x0a" + varint(len(tag_field) + 5) + tag_field + b"\x15"
            self._prefix[tag] = p
        return p

    def records(self, tags: Sequence[str], tag_index: np.ndarray, steps: np.ndarray, values: np.ndarray,
                walls: np.ndarray) -> bytes:
        """The records for rows ``i`` = (``tags[tag_index[i]]``, ``steps[i]``, ``values[i]``, ``walls[i]``)."""
        n = len(steps)
        if n == 0:
            return b""
        prefixes = [self.prefix(t) for t in tags]
        packed = values.astype("<f4").tobytes()
        cells = [prefixes[k] + packed[4 * i:4 * i + 4] for i, k in enumerate(tag_index.tolist())]
        cuts = [0, *(np.flatnonzero(np.diff(steps)) + 1).tolist(), n]
        step_list = steps.tolist()
        wall_list = walls.tolist()
        out = []
        for a, b in zip(cuts[:-1], cuts[1:]):
            out.append(frame(summary_event(wall_list[a], step_list[a], b"".join(cells[a:b]))))
        return b"".join(out)
