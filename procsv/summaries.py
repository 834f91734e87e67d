"""The trainer-side summary buffer: validation at the call site, batching, drop counting.

Runs in the trainer (any thread may log; the main thread sends at step boundaries). A bad tag or
value raises here, in the caller's frame, so the summary service never sees garbage.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Optional

from ipc.messages import SummaryBatch

BATCH_MAX = 512  # rows per message
FLUSH_EVERY = 0.2  # seconds: a partial batch is sent at least this often
BUFFER_MAX = 100_000  # rows kept while the summary service is slow; older ones are dropped


def as_float(tag: str, value: Any) -> float:
    if not isinstance(tag, str) or not tag.strip():
        raise ValueError(f"summary tag must be a non-empty string, got {tag!r}")
    if hasattr(value, "numpy"):
        value = value.numpy()
    if isinstance(value, (str, bytes, bytearray)) or getattr(value, "dtype", None) is not None and value.dtype.kind in "SUO":
        raise TypeError(f"summary {tag!r}: value must be a real number, got {type(value).__name__} {value!r:.60}")
    try:
        if getattr(value, "shape", ()) not in ((), (1,)):
            raise TypeError
        out = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"summary {tag!r}: value must be a real number, got {type(value).__name__} {value!r:.60}") from None
    return out


class SummaryBuffer:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scalars: list[list[Any]] = []
        self._protos: list[tuple[list[Any], bytes]] = []
        self._dropped = 0
        self._last_flush = time.monotonic()

    def scalar(self, tag: str, value: Any, step: int, wall: float) -> None:
        v = as_float(tag, value)
        if math.isnan(v) or math.isinf(v):
            v = float(v)  # TensorBoard shows NaN/inf; keep them, they are real information
        with self._lock:
            if len(self._scalars) >= BUFFER_MAX:
                self._scalars.pop(0)
                self._dropped += 1
            self._scalars.append([tag, step, v, wall])

    def proto(self, summary: Any, step: int, wall: float) -> None:
        if isinstance(summary, (bytes, bytearray)):
            data = bytes(summary)
        elif hasattr(summary, "SerializeToString"):
            data = summary.SerializeToString()
        else:
            raise TypeError(f"summary must be a Summary proto, its bytes, or a mapping of tags to scalars, "
                            f"got {type(summary).__name__}")
        with self._lock:
            self._protos.append(([step, wall], data))

    def count_dropped(self, n: int) -> None:
        with self._lock:
            self._dropped += n

    def take_batch(self, force: bool) -> Optional[tuple[SummaryBatch, list[bytes]]]:
        """The next batch to send, or None if it is not time yet (or nothing is buffered)."""
        now = time.monotonic()
        with self._lock:
            n = len(self._scalars) + len(self._protos)
            if n == 0 or (not force and n < BATCH_MAX and now - self._last_flush < FLUSH_EVERY):
                return None
            scalars, self._scalars = self._scalars, []
            protos, self._protos = self._protos, []
            dropped, self._dropped = self._dropped, 0
            self._last_flush = now
        return SummaryBatch(scalars, [row for row, _ in protos], dropped), [data for _, data in protos]
