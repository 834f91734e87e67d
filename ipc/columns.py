"""The scalar-columns frame of a :class:`~procsv.ipc.messages.SummaryBatch`: both halves in one place.

Run in two processes: the trainer encodes (:func:`encode_columns`, on its step-boundary hand-off,
so it is cheap: no NumPy, one ``bytes.join``), the summary service decodes
(:func:`decode_columns`, which refuses a malformed frame with :class:`BadColumns`).

Layout of the frame for ``n`` rows (little-endian)::

    uint32 L | tag table: UTF-8 JSON list of the distinct tags, L bytes | zero padding to a
    multiple of 8 | wall time float64[n] | value float64[n] | step int64[n] | tag index uint32[n]

``n`` travels in the batch's header (``SummaryBatch.columns``). Scalars travel this way, not as
JSON in the header, because hundreds of tags or rows would cost the codec more than everything
else of a step boundary.
"""

from __future__ import annotations

import json
from array import array
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import numpy.typing as npt

from procsv.ipc.codec import ProtocolError, loads_untrusted

Row = tuple[str, int, float, float]  # tag, step, value, wall time
ROW_BYTES = 28  # 8 (wall) + 8 (value) + 8 (step) + 4 (tag index)

class BadColumns(ProtocolError):
    """A columns frame does not hold what its batch's header announces."""


@dataclass(frozen=True)
class Columns:
    """Decoded scalar rows: row ``i`` is (``tags[index[i]]``, ``steps[i]``, ``values[i]``, ``walls[i]``).

    The arrays are read-only views of the frame (no copy) except ``index`` (int64).
    """

    tags: list[str]
    index: npt.NDArray[np.int64]
    steps: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]
    walls: npt.NDArray[np.float64]

    def __len__(self) -> int:
        return len(self.steps)

    @staticmethod
    def empty() -> Columns:
        i, f = np.zeros(0, np.int64), np.zeros(0, np.float64)
        return Columns([], i, i, f, f)

    def below(self, step: int) -> Columns:
        """The rows at a step below ``step``."""
        keep = self.steps < step
        return Columns(self.tags, self.index[keep], self.steps[keep], self.values[keep], self.walls[keep])


def encode_columns(tags: Sequence[str], steps: Sequence[int], values: Sequence[float],
                   walls: Sequence[float]) -> bytes:
    """The columns frame of the rows ``(tags[i], steps[i], values[i], walls[i])`` (at least one);
    in the machine's byte order, little-endian where procsv runs."""
    table = {tag: i for i, tag in enumerate(dict.fromkeys(tags))}  # each distinct tag's index, first seen first
    index = array("I", map(table.__getitem__, tags))
    names = json.dumps(list(table)).encode()
    pad = b"\0" * (-(4 + len(names)) % 8)
    return b"".join((len(names).to_bytes(4, "little"), names, pad, array("d", walls).tobytes(),
                     array("d", values).tobytes(), array("q", steps).tobytes(), index.tobytes()))


def decode_columns(frame: Any, n: int) -> Columns:
    """The ``n`` rows of a columns frame (bytes, a memoryview or a ZeroMQ frame); :class:`BadColumns` if malformed."""
    if n < 0:
        raise BadColumns(f"a negative row count ({n})")
    buf = memoryview(frame.buffer if hasattr(frame, "buffer") else frame).cast("B")
    if len(buf) < 4:
        raise BadColumns("the columns frame is too short")
    length = int.from_bytes(buf[:4], "little")
    start = 4 + length + (-(4 + length) % 8)
    if len(buf) != start + ROW_BYTES * n:
        raise BadColumns(f"the columns frame has {len(buf)} bytes, not {start + ROW_BYTES * n} for {n} rows")
    try:
        table = loads_untrusted(bytes(buf[4:4 + length]))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadColumns(f"the tag table is not JSON: {exc}") from None
    if not isinstance(table, list) or not all(isinstance(t, str) and t for t in table):
        raise BadColumns("the tag table is not a list of non-empty strings")
    walls = np.frombuffer(buf, "<f8", n, start)
    values = np.frombuffer(buf, "<f8", n, start + 8 * n)
    steps = np.frombuffer(buf, "<i8", n, start + 16 * n)
    index = np.frombuffer(buf, "<u4", n, start + 24 * n)
    if n and int(index.max()) >= len(table):
        raise BadColumns("a scalar row names a tag index outside the batch's tag table")
    return Columns(table, index.astype(np.int64), steps, values, walls)
